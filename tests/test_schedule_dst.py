"""The nightly schedule in a zone with daylight saving time: slots of the hour that repeats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jobs.ttl_expiry as ttl
from gc_worker import cli, scheduler
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


class TestTheSkippedHour:
    def test_once_due_passes_at_any_offset_run_the_skipped_slot_once(
        self, engine, cli_env, monkeypatch
    ):
        """02:30 does not happen in Berlin on 29 March 2026: the slot is 01:30 UTC (03:30
        CEST), the same whatever offset `--now` is written in, due up to the end of the grace
        (the last pass is exactly at it) and run once."""
        monkeypatch.setenv("MEMORY_GC_SCHEDULE__CRON", "30 2 * * *")
        monkeypatch.setenv("MEMORY_GC_SCHEDULE__TIMEZONE", "Europe/Berlin")
        seed(engine, users=1)
        for at in (
            "2026-03-29T03:40:00+02:00",
            "2026-03-29T02:20:00Z",
            "2026-03-28T21:30:00-05:00",
        ):
            assert cli.main(["schedule", "--once-due", "--now", at]) == 0
        fire = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
        assert [(r["slot"], r["now"], r["status"]) for r in runs(engine)] == [
            (scheduler.slot_key(fire), fire, "completed")
        ]
