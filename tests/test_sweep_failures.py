"""On-demand sweeps that go wrong: a failing sweep among others, a database lost mid-sweep, a
daemon that dies between creating a sweep's run and recording it. Found by a review; each test
failed before its fix."""

from __future__ import annotations

from contextlib import closing
from uuid import UUID

import jobs.ttl_expiry as ttl
from gc_worker import sweeps
from gc_worker.daemon import Daemon
from tests.store import execute, status
from tests.test_schedule_sweeps import NOON, expired, request_row


def failing_for(monkeypatch, user: str) -> None:
    """The TTL job raises while planning ``user`` (a row it cannot handle): that run fails."""
    real = ttl.plan

    def plan(ctx):
        if user in ctx.users:
            raise RuntimeError("a row the job cannot handle")
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)


def run_of(engine, run_id: UUID):
    return execute(engine, "SELECT status, error FROM gc_runs WHERE id = :r", r=run_id).one()


class TestAFailedSweepDoesNotHoldUpTheQueue:
    def test_a_once_due_pass_serves_the_requests_after_a_failed_one(
        self, engine, settings, monkeypatch
    ):
        """`schedule --once-due` stopped serving the queue at the first sweep that failed: the
        requests after it waited for the next pass (cron: maybe the next day)."""
        expired(engine, "alice")
        bob = expired(engine, "bob")
        failing_for(monkeypatch, "alice")
        first = sweeps.request_sweep(engine, "alice")
        second = sweeps.request_sweep(engine, "bob")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.run_once() == 1  # the failed sweep is a failed unit, counted once
            assert daemon.metrics.unit_failures.labels("sweep_next")._value.get() == 1
        assert request_row(engine, first)["status"] == "failed"
        assert "a row the job cannot handle" in request_row(engine, first)["error"]
        assert request_row(engine, second)["status"] == "done"
        assert status(engine, bob) == "deleted"

    def test_the_sweep_loop_goes_on_after_a_failed_sweep(self, engine, settings, monkeypatch):
        """The daemon's loop (`_sweep_step`) reports a served request even when it failed, so it
        goes on with the queue instead of waiting `poll_seconds` first."""
        expired(engine, "alice")
        failing_for(monkeypatch, "alice")
        sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon._sweep_step() is True
            assert daemon.failures == 1
            assert daemon._sweep_step() is False  # the failed request is not taken again
