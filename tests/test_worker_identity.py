"""A worker process's identity (claims.WORKER_ID) is its own, also across restarts.

In a container memory-gc runs as PID 1, and a Kubernetes pod keeps its host name when it is
restarted: host and pid alone gave a restarted daemon its dead predecessor's identity, and its
metrics (which then selected the batches of `worker = WORKER_ID`; now the batches its own
threads committed, tests/test_daemon_identity.py) counted the predecessor's batches as its
own. The daemons here are real processes whose host name and pid are those of one pod,
restarted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from tests.test_schedule import SLOT, runs, seed

REPO = Path(__file__).resolve().parents[1]
POD = "memory-gc-0"
DAEMON = f"""
import os, socket, sys
os.getpid = lambda: 1  # memory-gc is PID 1 in its container
socket.gethostname = lambda: {POD!r}  # and the pod keeps its host name when it restarts
from contextlib import closing
from datetime import datetime
import jobs.ttl_expiry as ttl
from gc_worker import db
from gc_worker.batch_run import WORKER_ID
from gc_worker.config import EmbeddingSettings, RunSettings, Settings
from gc_worker.daemon import Daemon

engine = db.make_engine(os.environ["MEMORY_GC_DATABASE_URL"])
settings = Settings(embeddings=EmbeddingSettings(dim=8), run=RunSettings(batch_users=1, workers=1))
at = datetime.fromisoformat(sys.argv[1])
daemon = Daemon(engine, settings, clock=lambda: at)
with closing(daemon):
    if sys.argv[2] == "stopped-in-first-batch":  # SIGTERM (or the OOM killer) then a restart
        plan = ttl.plan
        def stopping(ctx):
            daemon.request_stop()
            return plan(ctx)
        ttl.plan = stopping
        daemon.nightly()
    else:
        daemon.resume_orphans()
print(WORKER_ID, int(daemon.metrics.batches.labels("nightly")._value.get()))
engine.dispose()
"""


def daemon_process(database_url: str, what: str) -> tuple[str, int]:
    """Run a daemon of the pod in a process of its own; its WORKER_ID and batches counted."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_GC_", "OPENAI_"))}
    env.update(MEMORY_GC_DATABASE_URL=database_url, PYTHONPATH=str(REPO))
    at = SLOT.replace(minute=1).isoformat()
    done = subprocess.run([sys.executable, "-c", DAEMON, at, what], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    worker, batches = done.stdout.splitlines()[-1].rsplit(" ", 1)
    return worker, int(batches)


def test_a_restarted_daemon_counts_only_the_batches_it_committed(engine, database_url):
    """The first process commits batch 0 of the nightly run and stops; the restarted one (same
    host name, same pid) resumes the run and commits batches 1 and 2: it has an identity of its
    own (host:pid: for the operator, then a random part), records it on its batches, and its
    memory_gc_batches_total is 2, not 3."""
    seed(engine, users=3)
    first, counted_first = daemon_process(database_url, "stopped-in-first-batch")
    (night,) = runs(engine)
    assert (night["status"], counted_first) == ("running", 1)
    restarted, counted_restarted = daemon_process(database_url, "resume")
    (night,) = runs(engine)
    assert night["status"] == "completed"
    assert counted_restarted == 2
    assert first != restarted
    with engine.connect() as conn:
        workers = conn.execute(
            sa.text("SELECT worker FROM gc_run_batches WHERE run_id = :r ORDER BY batch_no"),
            {"r": night["id"]},
        ).scalars()
        assert list(workers) == [first, restarted, restarted]
    assert first.startswith(f"{POD}:1:") and restarted.startswith(f"{POD}:1:")
