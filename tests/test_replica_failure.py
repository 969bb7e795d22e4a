"""One replica's database trouble (a batch that keeps conflicting, a lost connection) does not
stop the other replicas working the same nightly run: the run is marked failed only by its last
participant (it stopped everyone; nothing resumes a failed nightly run). Found by a review."""

from __future__ import annotations

import threading

import jobs.ttl_expiry as ttl
from gc_worker import engine as gc_engine
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.errors import WriteConflict
from tests.store import NOW
from tests.test_faults import (  # noqa: F401  (fixtures)
    BATCHED,
    USERS,
    batch_outcome,
    databases,
    engine,
    lifecycle_rows,
    seed,
    twin,
)


def test_other_replica_finishes_the_night_after_one_replica_blips(engine, monkeypatch):  # noqa: F811
    seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
    users = sorted(USERS)
    request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], BATCHED))
    run_id = start_run(engine, BATCHED, request)
    real = ttl.plan
    in_b, release = threading.Event(), threading.Event()

    def plan(ctx):
        me = threading.current_thread().name
        if me == "replica-a":  # replica A's connection keeps failing (a blip on its host)
            raise WriteConflict("deadlock detected (40P01); rolled back whole")
        if me == "replica-b" and list(ctx.users) == [users[1]]:
            in_b.set()
            assert release.wait(30)  # B is inside batch 1 meanwhile
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)
    errors: list[BaseException] = []

    def work():
        try:
            gc_engine.process_run(engine, run_id, BATCHED)
        except BaseException as exc:
            errors.append(exc)

    b = threading.Thread(target=work, name="replica-b")
    b.start()
    assert in_b.wait(20)
    a = threading.Thread(target=work, name="replica-a")
    a.start()
    a.join(30)  # A fails batch 2 three times and fails the run
    release.set()
    b.join(30)
    states = [state for state, _ in batch_outcome(engine).values()]
    assert states[2] == "done", f"replica B stopped with users left: {states} ({errors})"
