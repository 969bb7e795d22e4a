"""Two daemons in one process (a test process, an application embedding the worker): each is a
worker of its own. They shared the process's WORKER_ID, which is what a sweep request's holder
is checked by (`claimed_by`) and what each daemon's metrics read as "batches I committed": a
daemon handed back a request another daemon of the process had taken over, and counted the
other's batches of a run they both worked as its own (the registries summed to more batches
than the run had)."""

from __future__ import annotations

from contextlib import closing
from datetime import timedelta

import jobs.ttl_expiry as ttl
from gc_worker import sweeps
from gc_worker.config import RunSettings
from gc_worker.daemon import Daemon
from tests.store import execute
from tests.test_schedule import SLOT, runs, seed

AT = SLOT + timedelta(minutes=1)


def batches(daemon: Daemon) -> int:
    return int(daemon.metrics.batches.labels("nightly")._value.get())


def actions(daemon: Daemon) -> int:
    return int(daemon.metrics.actions.labels("ttl_expiry", "soft_delete", "applied")._value.get())


def test_two_daemons_of_one_process_count_only_their_own_batches(engine, settings, monkeypatch):
    """Daemon A commits batch 0 of the nightly run and stops; daemon B, same process, resumes
    it and commits batches 1 and 2: B counts 2, not 3, and the two count the run's 3 once."""
    seed(engine, users=3)
    one_by_one = settings.model_copy(update={"run": RunSettings(batch_users=1, workers=1)})
    with closing(Daemon(engine, one_by_one, clock=lambda: AT)) as a:
        plan = ttl.plan

        def stopping(ctx):
            a.request_stop()
            return plan(ctx)

        monkeypatch.setattr(ttl, "plan", stopping)
        a.nightly()
        monkeypatch.setattr(ttl, "plan", plan)
        with closing(Daemon(engine, one_by_one, clock=lambda: AT)) as b:
            (night,) = runs(engine)
            assert b.resume_orphans() == [night["id"]]
            assert (batches(a), batches(b)) == (1, 2)
            assert (actions(a), actions(b)) == (1, 2)
    (night,) = runs(engine)
    assert night["status"] == "completed"


def test_a_daemon_does_not_hand_back_a_request_another_daemon_took_over(engine, settings):
    """A claims a sweep and stalls before it starts the run; its lease runs out and B, in the
    same process, takes the request over. A, stopping, hands back what it holds: not B's."""
    seed(engine, users=1)
    request_id = sweeps.request_sweep(engine, "user-000")
    with (
        closing(Daemon(engine, settings, clock=lambda: AT)) as a,
        closing(Daemon(engine, settings, clock=lambda: AT)) as b,
    ):
        claims: dict[str, sweeps.SweepClaim] = {}
        a._serve_sweep = lambda claim: claims.setdefault("a", claim)  # stalls
        assert a.sweep_next()
        execute(
            engine,
            "UPDATE gc_sweep_requests SET claimed_at = claimed_at - interval '1 day' WHERE id = :i",
            i=request_id,
        )
        b._serve_sweep = lambda claim: claims.setdefault("b", claim)  # works it, still
        assert b.sweep_next() and claims["b"].attempts == 2
        a.request_stop()
        Daemon._serve_sweep(a, claims["a"])
        row = sweeps.get_sweep(engine, request_id)
        assert row is not None and row["status"] == "running", "B's request was handed back"
        assert row["attempts"] == 2
        assert a.worker_id != b.worker_id
        assert row["claimed_by"] == b.worker_id
