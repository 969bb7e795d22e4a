"""The nightly schedule in a zone with daylight saving time: slots of the hour that repeats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jobs.ttl_expiry as ttl
from gc_worker import scheduler
from gc_worker.config import ScheduleSettings
from gc_worker.daemon import Daemon
from tests.test_schedule import runs, seed

# 02:30 in Berlin happens twice on 25 October 2026: 00:30 UTC (CEST), then 01:30 UTC (CET)
FIRST, SECOND = (datetime(2026, 10, 25, h, 30, tzinfo=UTC) for h in (0, 1))


class TestTheRepeatedHour:
    def test_a_slot_due_during_a_run_in_its_first_pass_runs_after_it(
        self, engine, settings, monkeypatch
    ):
        """An hourly cron's 02:30 of the second pass is another slot than the 02:30 of the
        first: when the first pass's run ends past it, the nightly job goes on with it. The
        two compared equal (same zone: Python compares their wall times), and the job
        stopped, leaving the slot to the next upkeep."""
        hourly = ScheduleSettings(cron="30 * * * *", timezone="Europe/Berlin")
        settings = settings.model_copy(update={"schedule": hourly})
        seed(engine, users=1)
        clock = {"now": FIRST + timedelta(minutes=1)}
        real = ttl.plan

        def plan(ctx):  # the first slot's run ends in the second pass of 02:30
            clock["now"] = SECOND + timedelta(minutes=1)
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", plan)
        daemon = Daemon(engine, settings, clock=lambda: clock["now"])
        try:
            daemon.nightly()
        finally:
            daemon.close()
        assert [(r["slot"], r["status"]) for r in runs(engine)] == [
            (scheduler.slot_key(FIRST), "completed"),
            (scheduler.slot_key(SECOND), "completed"),
        ]
