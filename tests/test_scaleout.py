"""Scale-out and crashes with real worker processes against one database.

Workers are ``python -c WORKER …``: the real CLI (``gc_worker.cli.main``) with test hooks set by
GC_TEST_* variables — a delay in every batch (so several workers overlap), a marker file naming
the batch being planned, and a hang inside the Nth batch's transaction after its changes were
executed (so a SIGKILL lands mid-batch). The single-worker reference runs in-process on a
byte-identical copy of the seeded database.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gc_worker import db, scheduler
from gc_worker.config import load_settings
from gc_worker.daemon import Daemon
from tests.store import execute, snapshot
from tests.store import run as single_run

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SLOT = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
AT = "2026-06-01T03:00:30+00:00"  # 30 s after the slot: within the grace
SETTINGS_ENV = {
    "MEMORY_GC_EMBEDDINGS__DIM": "8",
    "MEMORY_GC_RUN__BATCH_USERS": "5",
    "MEMORY_GC_USER_CAP__MAX_MEMORIES": "6",
    # deterministic jobs only: no LLM, nothing another test's fake server would answer
    "MEMORY_GC_ERASURE__ENABLED": "false",
    "MEMORY_GC_IMPORTANCE__ENABLED": "false",
    "MEMORY_GC_CONTRADICTION__ENABLED": "false",
    "MEMORY_GC_COMPACTION__ENABLED": "false",
}

WORKER = """
import os, sys, threading, time
from pathlib import Path
import jobs.decay as decay, jobs.ttl_expiry as ttl
from gc_worker import cli

delay = float(os.environ.get("GC_TEST_BATCH_DELAY", "0"))
started = os.environ.get("GC_TEST_STARTED")
hang_at = int(os.environ.get("GC_TEST_HANG_AT", "0"))
hung = os.environ.get("GC_TEST_HUNG")
plan, refresh, batches = ttl.plan, decay.refresh, [0]

def note(path, text):  # atomically: the test may read it at any moment; a temporary file per
    # thread (run.workers: two batches of one process may note at once)
    tmp = f"{path}.{threading.get_ident()}.tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)

def slow_plan(ctx):
    if started:
        note(started, ctx.users[0])
    time.sleep(delay)
    return plan(ctx)

def hanging_refresh(ctx):
    changed = refresh(ctx)
    batches[0] += 1
    if batches[0] == hang_at:  # inside the batch transaction, after the executor ran
        note(hung, ctx.users[0])
        time.sleep(600)
    return changed

ttl.plan, decay.refresh = slow_plan, hanging_refresh
sys.exit(cli.main(sys.argv[1:]))
"""

SEED = """
INSERT INTO memories (id, user_id, content, created_at, updated_at, observed_at,
                      expires_at, importance, importance_assessed_at, status, deleted_at)
SELECT md5('m' || u || '/' || k)::uuid,
       'user-' || lpad(u::text, 4, '0'),
       'memory ' || u || '/' || k,
       t.created, t.created, t.created,
       CASE WHEN (u + k) % 11 = 0 THEN CAST(:now AS timestamptz) - interval '1 hour' END,
       1 + (u + 2 * k) % 5,
       CAST(:now AS timestamptz) - interval '1 day',
       CASE WHEN k = 7 AND u % 4 = 0 THEN 'deleted' ELSE 'active' END,
       CASE WHEN k = 7 AND u % 4 = 0 THEN CAST(:now AS timestamptz) - interval '40 days' END
FROM generate_series(1, :users) AS u, generate_series(0, 7) AS k,
     LATERAL (SELECT CAST(:now AS timestamptz)
                     - make_interval(days => (u * 7 + k * 37) % 300) AS created) t
"""


def seed(engine: sa.Engine, users: int) -> None:
    """``users`` users with 8 memories each: TTL, decay, unused, over-cap and purge work."""
    execute(engine, SEED, users=users, now=SLOT)


@pytest.fixture
def twin(pg_server: Any, database_url: str, engine: sa.Engine) -> Iterator[Callable[[], sa.Engine]]:
    """A byte-identical copy of this test's database, made when called (after seeding)."""
    made: list[tuple[str, sa.Engine]] = []

    def make() -> sa.Engine:
        engine.dispose()  # CREATE DATABASE … TEMPLATE needs the source without sessions
        source = sa.engine.make_url(database_url).database
        name = f"{source}_twin"
        pg_server.psql(f"CREATE DATABASE {name} TEMPLATE {source};")
        made.append((name, db.make_engine(pg_server.get_uri(name, driver="psycopg"))))
        return made[-1][1]

    yield make
    for name, eng in made:
        eng.dispose()
        pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);")


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start worker processes on this test's database; any left running are killed."""
    procs: list[subprocess.Popen] = []
    logs: list[Any] = []

    def start(*args: str, stdout: Any = None, **hooks: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_GC_", "OPENAI_"))}
        env.update(SETTINGS_ENV, MEMORY_GC_DATABASE_URL=database_url, **hooks)
        logs.append((tmp_path / f"worker-{len(procs)}.log").open("w"))
        command = [sys.executable, "-c", WORKER, *args]
        procs.append(
            subprocess.Popen(
                command, cwd=REPO, env=env, stdout=stdout or logs[-1], stderr=logs[-1], text=True
            )
        )
        return procs[-1]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    for log in logs:
        log.close()


def run_due(engine: sa.Engine, at: datetime | str = AT) -> None:
    """One replica, in this process, doing what is due at ``at`` (``schedule --once-due``)."""
    settings = load_settings(env=SETTINGS_ENV)
    now = datetime.fromisoformat(at) if isinstance(at, str) else at
    daemon = Daemon(engine, settings, clock=lambda: now)
    try:
        assert daemon.run_once() == 0
    finally:
        daemon.close()


def actions(engine: sa.Engine, *, run_ids: list[Any] | None = None) -> Counter:
    """The applied actions as a multiset (job, action, memory, reason)."""
    rows = execute(
        engine,
        "SELECT job, action, memory_id, user_id, reason FROM gc_actions"
        " WHERE outcome = 'applied' AND (CAST(:runs AS uuid[]) IS NULL OR run_id = ANY(:runs))",
        runs=run_ids,
    ).all()
    return Counter(tuple(r) for r in rows)


def duplicated_actions(engine: sa.Engine) -> list[Any]:
    return execute(
        engine,
        "SELECT job, action, memory_id, count(*) FROM gc_actions"
        " WHERE memory_id IS NOT NULL AND outcome = 'applied'"
        " GROUP BY job, action, memory_id HAVING count(*) > 1",
    ).all()


def batches(engine: sa.Engine, run_id: Any) -> list[Any]:
    return execute(
        engine,
        "SELECT batch_no, users, state, worker FROM gc_run_batches WHERE run_id = :r"
        " ORDER BY batch_no",
        r=run_id,
    ).all()


def only_run(engine: sa.Engine) -> Any:
    (run,) = execute(engine, "SELECT * FROM gc_runs").all()
    return run


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def no_open_transaction(engine: sa.Engine) -> bool:
    """True once the server has rolled back every batch a dead worker held."""
    return not execute(
        engine,
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
        " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
    ).first()


class TestThreeWorkers:
    def test_every_user_once_and_same_end_state(self, engine, twin, workers):
        """Three processes share one nightly run: each batch once, state equal to one worker."""
        seed(engine, users=300)
        reference = twin()
        procs = [
            workers("schedule", "--once-due", "--now", AT, GC_TEST_BATCH_DELAY="0.05")
            for _ in range(3)
        ]
        assert [p.wait(60) for p in procs] == [0, 0, 0]
        run = only_run(engine)
        assert (run.slot, run.status) == (scheduler.slot_key(SLOT), "completed")
        done = batches(engine, run.id)
        users = [u for b in done for u in b.users]
        assert len(done) == 60 and {b.state for b in done} == {"done"}
        assert sorted(users) == [f"user-{i:04d}" for i in range(1, 301)]  # each user once
        assert len({b.worker for b in done}) >= 2, "the workers did not overlap"
        assert duplicated_actions(engine) == []
        run_due(reference)
        assert actions(engine) == actions(reference) and sum(actions(engine).values()) > 300
        assert snapshot(engine) == snapshot(reference)


class TestKilledWorker:
    def kill_mid_batch(self, engine, workers, tmp_path, *args: str) -> int:
        """Start a worker that hangs inside its 4th batch, SIGKILL it; the batch it held."""
        hung = tmp_path / "hung"
        # one thread: its 4th batch is the run's 4th (batches 0-2 done before it); scores
        # refreshed in each batch (the hook hangs in that refresh), not in a pass after them
        victim = workers(
            *args,
            GC_TEST_HANG_AT="4",
            GC_TEST_HUNG=str(hung),
            MEMORY_GC_RUN__WORKERS="1",
            MEMORY_GC_RUN__SCORE_PASS="false",
        )
        wait_for(hung.exists, 120, "the worker to hang in its 4th batch")
        (held,) = execute(
            engine, "SELECT batch_no FROM gc_run_batches WHERE :u = ANY(users)", u=hung.read_text()
        ).scalars()
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        wait_for(lambda: no_open_transaction(engine), 60, "the server to roll back")
        return held

    def test_resumed_run_completes_without_lost_or_duplicated_actions(
        self, engine, twin, workers, tmp_path
    ):
        """A nightly run whose worker was SIGKILLed mid-batch is resumed and ends as if whole."""
        seed(engine, users=100)
        reference = twin()
        held = self.kill_mid_batch(engine, workers, tmp_path, "schedule", "--once-due", "--now", AT)
        run = only_run(engine)
        states = {b.batch_no: b.state for b in batches(engine, run.id)}
        assert [n for n, s in states.items() if s == "done"] == [0, 1, 2] and held == 3
        rolled_back = execute(
            engine, "SELECT count(*) FROM gc_actions WHERE batch_no = :b", b=held
        ).scalar()
        assert rolled_back == 0  # the killed batch's executed changes were never committed
        run_due(engine)  # the next daemon pass resumes the orphaned run
        after = batches(engine, run.id)
        assert only_run(engine).status == "completed" and {b.state for b in after} == {"done"}
        assert len({b.worker for b in after}) == 2  # the victim's 3 batches, this process's rest
        assert duplicated_actions(engine) == []
        run_due(reference)
        assert actions(engine) == actions(reference)
        assert snapshot(engine) == snapshot(reference)

    def test_new_run_after_a_kill_reaches_the_same_end_state(self, engine, twin, workers, tmp_path):
        """A killed `memory-gc run` followed by a fresh run: committed batches stay, the rest is
        re-planned, and together they did exactly what one uninterrupted run does."""
        seed(engine, users=100)
        reference = twin()
        self.kill_mid_batch(engine, workers, tmp_path, "run", "--now", AT)
        killed = only_run(engine).id
        single_run(engine, load_settings(env=SETTINGS_ENV), now=datetime.fromisoformat(AT))
        runs = execute(engine, "SELECT id FROM gc_runs WHERE id <> :k", k=killed).scalars().all()
        assert duplicated_actions(engine) == []
        single_run(reference, load_settings(env=SETTINGS_ENV), now=datetime.fromisoformat(AT))
        assert actions(engine, run_ids=[killed, *runs]) == actions(reference)
        assert snapshot(engine) == snapshot(reference)


class TestSigterm:
    def test_sigterm_finishes_the_batch_and_exits_zero(self, engine, workers, tmp_path):
        """SIGTERM: the batch in progress commits, the daemon exits 0, a restart finishes the run;
        meanwhile /healthz and /metrics answer over HTTP."""
        seed(engine, users=100)
        started = tmp_path / "started"
        daemon = workers(
            "schedule", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
            stdout=subprocess.PIPE, GC_TEST_BATCH_DELAY="0.3", GC_TEST_STARTED=str(started),
            MEMORY_GC_SCHEDULE__CRON="* * * * *",
        )  # fmt: skip
        url = re.search(r"http://\S+/metrics", daemon.stdout.readline()).group(0)
        run_id = wait_for(lambda: execute(engine, "SELECT id FROM gc_runs").scalar(), 120, "a run")
        wait_for(lambda: done_count(engine, run_id) >= 3, 120, "three batches")
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=5) as health:
            assert health.status == 200
        with urllib.request.urlopen(url, timeout=5) as page:
            assert 'memory_gc_batches_total{trigger="nightly"}' in page.read().decode()
        in_progress = started.read_text()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(15) == 0
        (state,) = execute(
            engine, "SELECT state FROM gc_run_batches WHERE :u = ANY(users)", u=in_progress
        ).scalars()
        assert state == "done"  # the batch it was in when told to stop was finished
        pending = len(batches(engine, run_id)) - done_count(engine, run_id)
        status = execute(engine, "SELECT status FROM gc_runs WHERE id = :r", r=run_id).scalar()
        assert pending > 0 and status == "running"
        now = execute(engine, "SELECT now FROM gc_runs WHERE id = :r", r=run_id).scalar()
        run_due(engine, now)  # the restarted daemon resumes the run
        assert done_count(engine, run_id) == len(batches(engine, run_id)) == 20
        assert duplicated_actions(engine) == []


def done_count(engine: sa.Engine, run_id: Any) -> int:
    return execute(
        engine, "SELECT count(*) FROM gc_run_batches WHERE run_id = :r AND state = 'done'", r=run_id
    ).scalar()
