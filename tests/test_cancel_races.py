"""`memory-gc cancel` against the work it races: a run cancelled while its last batch is in
flight (the batch commits after the cancel, leaving the run failed with nothing pending), a
restore asked for before the cancelled run's workers have left it."""

from __future__ import annotations

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

