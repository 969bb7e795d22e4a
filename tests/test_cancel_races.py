"""`memory-gc cancel` against the work it races: a run cancelled while its last batch is in
flight (the batch commits after the cancel, leaving the run failed with nothing pending), a
restore asked for before the cancelled run's workers have left it."""

from __future__ import annotations

import threading
from contextlib import closing
from datetime import timedelta

import pytest

import jobs.ttl_expiry as ttl
from gc_worker import engine as gc_engine
from gc_worker.cancel import CANCELLED, cancel
from gc_worker.daemon import Daemon
from gc_worker.errors import UsageError
from tests.store import execute
from tests.test_schedule import SLOT, runs, seed, with_schedule
from tests.test_sweep_failures import run_of


def cancelled_in_its_last_batch(monkeypatch, engine) -> None:
    """The operator cancels the run while its (only) batch is planned: the batch commits."""
    real = ttl.plan

    def plan(ctx):
        (run_id,) = execute(engine, "SELECT id FROM gc_runs WHERE status = 'running'").scalars()
        cancel(engine, run_id, wait_seconds=0)
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)


class TestACancelledPlanWhoseBatchesAllCommitted:
    def test_plan_then_apply_does_not_apply_it(self, engine, settings, monkeypatch):
        """It read as a plan failed only by failed batches (none pending), so it was applied."""
        seed(engine)
        review = with_schedule(settings, mode="plan_then_apply", apply_delay_minutes=60)
        cancelled_in_its_last_batch(monkeypatch, engine)
        with closing(Daemon(engine, review, clock=lambda: SLOT)) as daemon:
            daemon.nightly()
        monkeypatch.undo()
        (plan,) = runs(engine)
        assert (plan["status"], plan["error"]) == ("failed", CANCELLED)
        later = plan["finished_at"] + timedelta(hours=2)
        with closing(Daemon(engine, review, clock=lambda: later)) as daemon:
            assert daemon.apply_due_plans() == []
        assert [r["mode"] for r in runs(engine)] == ["dry_run"]

    def test_apply_refuses_it(self, engine, settings, monkeypatch):
        seed(engine)
        cancelled_in_its_last_batch(monkeypatch, engine)
        request = gc_engine.RunRequest(mode="dry_run", now=SLOT, jobs=("ttl_expiry",))
        plan_id = gc_engine.run_once(engine, settings, request)
        monkeypatch.undo()
        assert run_of(engine, plan_id).status == "failed"
        with pytest.raises(UsageError, match="only a completed plan can be applied"):
            gc_engine.apply_plan(engine, plan_id)
        assert [r["mode"] for r in runs(engine)] == ["dry_run"]


def test_a_cancelled_run_still_worked_is_not_restored_yet(engine, settings, monkeypatch):
    """`cancel --wait-seconds 0` returns while a worker is inside a batch; a restore then undid
    the committed batches and reported success, and the batch in flight committed after it and
    stayed applied. It is refused until the workers have left the run."""
    from gc_worker.restore import restore_run
    from tests.test_cancel import apply_request, expired_rows, one_at_a_time, statuses

    settings = one_at_a_time(settings)
    ids = expired_rows(engine)
    run_id = gc_engine.start_run(engine, settings, apply_request())
    in_second, go, real, planned = threading.Event(), threading.Event(), ttl.plan, []

    def plan(ctx):
        planned.append(1)
        if len(planned) == 2:  # the worker is inside its second batch
            in_second.set()
            go.wait(30)
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)
    worker = threading.Thread(target=gc_engine.process_run, args=(engine, run_id, settings))
    worker.start()
    try:
        assert in_second.wait(30)
        assert not cancel(engine, run_id, wait_seconds=0).workers_done
        with pytest.raises(UsageError, match="still work"):
            restore_run(engine, run_id)
    finally:
        go.set()
        worker.join(30)
    assert sorted(statuses(engine, ids).values()) == ["active", "active", "deleted", "deleted"]
    restore_run(engine, run_id)  # they have left: all of it is undone
    assert set(statuses(engine, ids).values()) == {"active"}
