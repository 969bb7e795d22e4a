"""The nightly schedule: cron trigger, due slot within the grace, one run per slot, plan review."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import jobs.ttl_expiry as ttl
from gc_worker import cli, scheduler
from gc_worker import engine as gc_engine
from gc_worker.config import RunSettings, ScheduleSettings, Settings, load_settings
from gc_worker.daemon import Daemon, build_scheduler
from gc_worker.errors import ConfigError, NotFoundError, UsageError
from tests.store import NOW, add, city_pair, days_ago, execute, get, status

SLOT = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)  # a Monday
GRACE = 3600


def with_schedule(settings: Settings, **schedule: object) -> Settings:
    return settings.model_copy(update={"schedule": ScheduleSettings(**schedule)})


def fixed(at: datetime) -> Callable[[], datetime]:
    return lambda: at


@pytest.fixture
def make_daemon(engine: sa.Engine) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(settings: Settings, at: datetime, eng: sa.Engine = engine) -> Daemon:
        made.append(Daemon(eng, settings, clock=fixed(at)))
        return made[-1]

    yield make
    for daemon in made:
        daemon.close()


def runs(engine: sa.Engine) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM gc_runs ORDER BY started_at")).mappings()
        return [dict(r) for r in rows]


def seed(engine: sa.Engine, users: int = 3) -> None:
    """Each user: one expired row (ttl_expiry) and one fresh row."""
    for i in range(users):
        user = f"user-{i:03d}"
        add(engine, user, "expired", expires_at=days_ago(1), importance_assessed_at=NOW)
        add(engine, user, "fresh", created_at=days_ago(1), importance_assessed_at=NOW)


def within(seconds: float, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, failing the test instead of hanging it past ``seconds``."""
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(fn(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"{fn.__name__} did not return within {seconds} s"
    return done[0]


class TestNightlyTrigger:
    def test_default_cron_fires_at_three_utc(self):
        """The default schedule's next fire time is 03:00 UTC, inclusive of 03:00:00 itself."""
        trigger = scheduler.nightly_trigger(ScheduleSettings())
        fire = trigger.get_next_fire_time(None, SLOT - timedelta(seconds=1))
        assert fire == SLOT and fire.utcoffset() == timedelta(0)
        assert trigger.get_next_fire_time(None, SLOT) == SLOT
        assert trigger.get_next_fire_time(None, SLOT + timedelta(seconds=1)) == SLOT + timedelta(
            days=1
        )

    def test_timezone_shifts_the_fire_time(self):
        """03:00 in Europe/Berlin is 01:00 UTC in summer."""
        trigger = scheduler.nightly_trigger(ScheduleSettings(timezone="Europe/Berlin"))
        fire = trigger.get_next_fire_time(None, datetime(2026, 6, 1, 0, 0, tzinfo=UTC))
        assert fire.astimezone(UTC) == datetime(2026, 6, 1, 1, 0, tzinfo=UTC)

    @pytest.mark.parametrize("weekday", ["0", "7", "sun"])
    def test_crontab_weekday_zero_is_sunday(self, weekday):
        """Weekday 0 (and 7) is Sunday as in crontab, not Monday as in APScheduler 3."""
        trigger = scheduler.nightly_trigger(ScheduleSettings(cron=f"0 3 * * {weekday}"))
        fire = trigger.get_next_fire_time(None, SLOT)
        assert fire == datetime(2026, 6, 7, 3, 0, tzinfo=UTC)

    def test_crontab_weekday_ranges_and_steps(self):
        """1-5 is Monday to Friday; */2 is Sunday, Tuesday, Thursday, Saturday."""
        assert scheduler.crontab_weekdays("1-5") == "mon,tue,wed,thu,fri"
        assert scheduler.crontab_weekdays("*/2") == "sun,tue,thu,sat"
        assert scheduler.crontab_weekdays("mon-fri,0") == "mon-fri,sun"

    def test_day_of_month_or_weekday_as_in_crontab(self):
        """With both restricted, a day matching either fires, as crontab(5) says: "0 3 1 * 1"
        is the 1st and every Monday. APScheduler's CronTrigger needs both: its first firing
        after Saturday 31 January 2026 was Monday 1 June."""
        trigger = scheduler.nightly_trigger(ScheduleSettings(cron="0 3 1 * 1"))
        fires, now = [], datetime(2026, 1, 31, 4, 0, tzinfo=UTC)
        for _ in range(4):
            fires.append(trigger.get_next_fire_time(None, now))
            now = fires[-1] + timedelta(seconds=1)
        assert [f.date().isoformat() for f in fires] == [
            "2026-02-01", "2026-02-02", "2026-02-09", "2026-02-16"
        ]  # fmt: skip
        # one of them a wildcard ("*/2" too, as in crontab): both must match
        every_other = scheduler.nightly_trigger(ScheduleSettings(cron="0 3 */2 * 1"))
        fire = every_other.get_next_fire_time(None, datetime(2026, 1, 31, 4, 0, tzinfo=UTC))
        assert fire == datetime(2026, 2, 9, 3, 0, tzinfo=UTC)

    def test_a_fixed_time_in_the_repeated_hour_fires_once(self):
        """02:30 in Berlin happens twice on 25 October 2026 (00:30 and 01:30 UTC); the nightly
        slot is one of them, as in crontab: two slots were two nightly runs an hour apart. A
        wildcard hour still fires in both hours."""
        fixed = scheduler.nightly_trigger(
            ScheduleSettings(cron="30 2 * * *", timezone="Europe/Berlin")
        )
        day = datetime(2026, 10, 24, 12, 0, tzinfo=UTC)
        fire = fixed.get_next_fire_time(None, day)
        assert fire.astimezone(UTC) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
        after = fixed.get_next_fire_time(fire, fire.astimezone(UTC) + timedelta(seconds=1))
        assert after.astimezone(UTC) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
        repeated = datetime(2026, 10, 25, 1, 45, tzinfo=UTC)
        assert within(5, scheduler.due_slot, fixed, repeated, 3600) is None  # no second slot
        hourly = scheduler.nightly_trigger(
            ScheduleSettings(cron="30 * * * *", timezone="Europe/Berlin")
        )
        due = within(5, scheduler.due_slot, hourly, repeated, 3600)
        assert due.astimezone(UTC) == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)

    def test_the_due_slot_in_the_repeated_hour_is_found(self):
        """due_slot looked for the next fire time from `fire + 1 s` on the local wall clock,
        which in the repeated hour is back in its first pass: it found the same fire time
        forever, and the daemon's upkeep thread spun at 100 % CPU (an 02:30 cron in
        Europe/Berlin, from 01:30 to 02:30 UTC on 25 October)."""
        hourly = scheduler.nightly_trigger(
            ScheduleSettings(cron="*/20 * * * *", timezone="Europe/Berlin")
        )
        now = datetime(2026, 10, 25, 1, 50, tzinfo=UTC)  # 02:50 the second time
        due = within(5, scheduler.due_slot, hourly, now, 3600)
        assert due.astimezone(UTC) == datetime(2026, 10, 25, 1, 40, tzinfo=UTC)

    def test_a_fixed_time_in_the_skipped_hour_is_due_for_the_whole_grace(self):
        """02:30 does not happen in Berlin on 29 March 2026 (02:00 jumps to 03:00): the slot
        fires at 01:30 UTC. Found by a review: a search from a later wall time (past 02:30)
        missed it, so it was due for 30 minutes, not the hour of grace — a daemon that could
        not reach the database at 01:30 had that long to catch up."""
        fixed = scheduler.nightly_trigger(
            ScheduleSettings(cron="30 2 * * *", timezone="Europe/Berlin")
        )
        fire = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
        for late in (0, 31, 59, 60):
            due = scheduler.due_slot(fixed, fire + timedelta(minutes=late), 3600)
            assert due is not None and due.astimezone(UTC) == fire, late
        assert scheduler.due_slot(fixed, fire + timedelta(minutes=61), 3600) is None
        assert scheduler.due_slot(fixed, fire - timedelta(minutes=1), 3600) is None

    @pytest.mark.parametrize(
        ("cron", "timezone"), [("0 3 * *", "UTC"), ("0 27 * * *", "UTC"), ("0 3 * * *", "Mars/X")]
    )
    def test_bad_cron_or_timezone_is_a_config_error(self, cron, timezone):
        """A cron with the wrong fields or an unknown timezone is refused with an example when
        the settings load (not when the scheduler first starts), and by the trigger itself."""
        with pytest.raises(ConfigError, match=r'"0 3 \* \* \*"|"UTC"'):
            load_settings(env={"MEMORY_GC_SCHEDULE__CRON": cron,
                               "MEMORY_GC_SCHEDULE__TIMEZONE": timezone})  # fmt: skip
        unchecked = ScheduleSettings.model_construct(cron=cron, timezone=timezone)
        with pytest.raises(ConfigError, match=r"schedule\.cron"):
            scheduler.nightly_trigger(unchecked)


class TestDueSlot:
    trigger = scheduler.nightly_trigger(ScheduleSettings())

    def test_slot_is_due_at_its_fire_time(self):
        """At 03:00:00 the 03:00 slot is due."""
        assert scheduler.due_slot(self.trigger, SLOT, GRACE) == SLOT

    def test_missed_slot_just_inside_the_grace_is_due(self):
        """Exactly misfire_grace_seconds late, the slot still runs."""
        assert scheduler.due_slot(self.trigger, SLOT + timedelta(seconds=GRACE), GRACE) == SLOT

    def test_missed_slot_just_outside_the_grace_is_not_due(self):
        """One second past the grace, the slot is skipped until the next night."""
        assert scheduler.due_slot(self.trigger, SLOT + timedelta(seconds=GRACE + 1), GRACE) is None

    def test_before_the_first_fire_time_nothing_is_due(self):
        """At 02:59:59 yesterday's slot is long past its grace and today's is not yet due."""
        assert scheduler.due_slot(self.trigger, SLOT - timedelta(seconds=1), GRACE) is None

    def test_several_missed_slots_coalesce_into_the_latest(self):
        """After three days down with a long grace, only the latest slot runs."""
        now = SLOT + timedelta(days=3, minutes=30)
        assert scheduler.due_slot(self.trigger, now, 4 * 86400) == SLOT + timedelta(days=3)

    def test_slot_key_is_the_utc_fire_time(self):
        """The slot name is the fire time in UTC, whatever the trigger's timezone."""
        berlin = SLOT.astimezone(
            scheduler.nightly_trigger(ScheduleSettings(timezone="Europe/Berlin")).timezone
        )
        assert scheduler.slot_key(berlin) == "nightly:2026-06-01T03:00:00+00:00"


class TestNightlyRun:
    def test_trigger_at_three_runs_the_slot(self, engine, settings, make_daemon):
        """At 03:00 the daemon runs the slot once: apply mode, now = the fire time."""
        seed(engine)
        run_id = make_daemon(settings, SLOT).nightly()
        (run,) = runs(engine)
        assert run["id"] == run_id and run["slot"] == "nightly:2026-06-01T03:00:00+00:00"
        assert (run["status"], run["mode"], run["trigger"]) == ("completed", "apply", "nightly")
        assert run["now"] == SLOT

    def test_missed_window_within_grace_runs_once(self, engine, settings, make_daemon):
        """A daemon (re)started 59:59 late runs the slot; a second restart does not run it again."""
        seed(engine)
        late = SLOT + timedelta(seconds=GRACE - 1)
        first = make_daemon(settings, late).nightly()
        again = make_daemon(settings, late + timedelta(seconds=1)).nightly()
        assert first is not None and again == first
        assert len(runs(engine)) == 1
        (count,) = execute(engine, "SELECT count(*) FROM gc_actions").one()
        assert count == 3  # one expired row per user, once

    def test_missed_window_outside_grace_does_not_run(self, engine, settings, make_daemon):
        """A daemon started one second past the grace does not run the missed slot."""
        seed(engine)
        assert make_daemon(settings, SLOT + timedelta(seconds=GRACE + 1)).nightly() is None
        assert runs(engine) == []

    def test_overlapping_triggers_make_one_run(self, engine, database_url, settings, make_daemon):
        """Two replicas firing on the same slot at the same moment share one run, once."""
        seed(engine, users=40)
        small = settings.model_copy(update={"run": RunSettings(batch_users=2)})
        other = gc_engine_for(database_url)
        daemons = [make_daemon(small, SLOT), make_daemon(small, SLOT, other)]
        results = run_together([d.nightly for d in daemons])
        other.dispose()
        assert results[0] == results[1] and len(runs(engine)) == 1
        rows = execute(
            engine,
            "SELECT count(*), count(DISTINCT memory_id) FROM gc_actions WHERE run_id = :r",
            r=results[0],
        ).one()
        assert tuple(rows) == (40, 40)
        (pending,) = execute(
            engine, "SELECT count(*) FROM gc_run_batches WHERE state <> 'done'"
        ).one()
        assert pending == 0

    def test_replica_losing_the_insert_race_joins_the_winner(self, engine, settings):
        """A replica whose slot insert waits on another's uncommitted one joins that run."""
        seed(engine)
        slot, winner = scheduler.slot_key(SLOT), gc_engine.uuid4()
        result: list[object] = []
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO gc_runs (id, mode, trigger, now, jobs, slot)"
                    " VALUES (:id, 'apply', 'nightly', :now, '{}', :slot)"
                ),
                {"id": winner, "now": SLOT, "slot": slot},
            )
            loser = threading.Thread(
                target=lambda: result.append(scheduler.nightly_run(engine, settings, SLOT))
            )
            loser.start()
            time.sleep(0.3)  # the loser now waits on gc_runs_slot_key
            assert loser.is_alive()
            conn.commit()
        loser.join(10)
        assert result == [(winner, False)] and len(runs(engine)) == 1

    def test_empty_store_completes_an_empty_run(self, engine, settings, make_daemon):
        """With no memories the slot's run has no batch and completes."""
        make_daemon(settings, SLOT).nightly()
        assert [r["status"] for r in runs(engine)] == ["completed"]


def gc_engine_for(url: str) -> sa.Engine:
    from gc_worker import db

    return db.make_engine(url)


def run_together(units: list[Callable[[], object]]) -> list[object]:
    """Start every unit in its own thread at the same instant; their results in order."""
    barrier = threading.Barrier(len(units))
    results: list[object] = [None] * len(units)
    errors: list[BaseException] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            results[i] = units[i]()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(units))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return results


class TestScheduler:
    def test_jobs_are_configured_from_settings(self, engine, settings, make_daemon):
        """The nightly job coalesces, runs one instance at a time, with the configured grace."""
        daemon = make_daemon(with_schedule(settings, misfire_grace_seconds=900), SLOT)
        background = build_scheduler(daemon)
        job = background.get_job("nightly")
        assert (job.coalesce, job.max_instances, job.misfire_grace_time) == (True, 1, 900)
        assert job.trigger.get_next_fire_time(None, SLOT - timedelta(hours=1)) == SLOT

    def test_started_scheduler_catches_up_the_due_slot(self, engine, settings, make_daemon):
        """Started at 03:20 (fake clock), the scheduler's start-up firing runs the 03:00 slot."""
        seed(engine)
        daemon = make_daemon(settings, SLOT + timedelta(minutes=20))
        background = build_scheduler(daemon)
        background.start()
        try:
            assert wait_for(lambda: [r["status"] for r in runs(engine)] == ["completed"])
        finally:
            background.shutdown(wait=True)
        assert runs(engine)[0]["slot"] == scheduler.slot_key(SLOT)

    def test_cron_firings_through_the_scheduler_thread(self, engine, settings):
        """With the real clock and a trigger firing every 2 s, APScheduler's own thread starts
        one run per firing (after the start-up catch-up), each on its own slot."""
        from apscheduler.triggers.cron import CronTrigger

        seed(engine)
        daemon = Daemon(engine, with_schedule(settings, misfire_grace_seconds=1))
        daemon.trigger = CronTrigger(second="*/2", timezone="UTC")
        background = build_scheduler(daemon)
        background.start()
        try:
            assert wait_for(lambda: len(runs(engine)) >= 3, timeout=20)
        finally:
            background.shutdown(wait=True)
            daemon.close()
        done = runs(engine)
        assert all(r["status"] == "completed" and r["trigger"] == "nightly" for r in done)
        slots = [datetime.fromisoformat(r["slot"].split(":", 1)[1]) for r in done]
        assert len(set(slots)) == len(slots) and all(s.second % 2 == 0 for s in slots)
        left = execute(engine, "SELECT count(*) FROM memories WHERE content = 'expired'"
                       " AND status = 'active'").scalar()  # fmt: skip
        assert left == 0


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class TestLostFiring:
    """A slot whose firing failed or was skipped still runs, once, within the grace."""

    def test_slot_missed_while_the_database_was_down_runs_at_the_next_upkeep(
        self, engine, settings, make_daemon, unreachable_engine
    ):
        """The fire-time attempt fails (database unreachable); the next upkeep runs the slot."""
        seed(engine)
        daemon = make_daemon(settings, SLOT + timedelta(seconds=10))
        daemon.engine = unreachable_engine
        try:
            assert daemon.attempt(daemon.nightly) is None and daemon.failures == 1
        finally:
            daemon.engine = engine
        assert runs(engine) == []
        daemon.upkeep()
        assert [(r["slot"], r["status"]) for r in runs(engine)] == [
            (scheduler.slot_key(SLOT), "completed")
        ]
        assert active_expired(engine) == 0

    @pytest.mark.parametrize(("late", "ran"), [(GRACE - 1, True), (GRACE + 1, False)])
    def test_upkeep_runs_a_slot_without_a_run_only_within_the_grace(
        self, engine, settings, make_daemon, late, ran
    ):
        """A slot with no run is run by the upkeep 59:59 after its fire time, not 60:01."""
        seed(engine, users=1)
        make_daemon(settings, SLOT + timedelta(seconds=late)).upkeep()
        assert [r["slot"] for r in runs(engine)] == ([scheduler.slot_key(SLOT)] if ran else [])

    def test_upkeep_does_not_rerun_a_failed_slot(self, engine, settings, make_daemon):
        """A slot whose run failed is not run again (the next night runs; or run it by hand)."""
        seed(engine, users=1)
        execute(
            engine,
            "INSERT INTO gc_runs (id, mode, trigger, now, jobs, slot, status)"
            " VALUES (:id, 'apply', 'nightly', :now, '{}', :slot, 'failed')",
            id=gc_engine.uuid4(), now=SLOT, slot=scheduler.slot_key(SLOT),
        )  # fmt: skip
        make_daemon(settings, SLOT + timedelta(minutes=1)).upkeep()
        assert [r["status"] for r in runs(engine)] == ["failed"]
        assert active_expired(engine) == 1

    def test_slot_due_during_a_long_run_runs_after_it(self, engine, settings, monkeypatch):
        """A run still going at the next fire time (APScheduler skips that firing: one instance
        at a time) is followed by the slot that came due meanwhile; the upkeep leaves that slot
        to the busy nightly work instead of starting a second nightly run beside it."""
        seed(engine, users=1)
        nxt = SLOT + timedelta(days=1)
        clock = {"now": SLOT + timedelta(minutes=1)}
        daemon = Daemon(engine, settings, clock=lambda: clock["now"])
        real, seen_by_upkeep = ttl.plan, []

        def plan(ctx):  # the first slot's run outlasts the next fire time
            if clock["now"] < nxt:
                clock["now"] = nxt + timedelta(minutes=1)
                upkeep = threading.Thread(target=daemon.upkeep)
                upkeep.start()
                upkeep.join(30)
                seen_by_upkeep.append(len(runs(engine)))
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", plan)
        try:
            daemon.nightly()
        finally:
            daemon.close()
        assert seen_by_upkeep == [1]
        assert [(r["slot"], r["status"]) for r in runs(engine)] == [
            (scheduler.slot_key(SLOT), "completed"),
            (scheduler.slot_key(nxt), "completed"),
        ]


def active_expired(engine: sa.Engine) -> int:
    return execute(engine, "SELECT count(*) FROM memories WHERE content = 'expired'"
                   " AND status = 'active'").scalar()  # fmt: skip


class TestPlanThenApply:
    @pytest.fixture
    def review(self, settings):
        return with_schedule(settings, mode="plan_then_apply", apply_delay_minutes=60)

    def plan(self, engine, review, make_daemon):
        seed(engine, users=1)
        expired = execute(engine, "SELECT id FROM memories WHERE content = 'expired'").scalar()
        plan_id = make_daemon(review, SLOT).nightly()
        (run,) = runs(engine)
        return plan_id, run["finished_at"], expired

    def test_nightly_run_is_a_dry_run(self, engine, review, make_daemon):
        """In plan_then_apply mode the nightly run writes a plan and changes nothing."""
        _, _, expired = self.plan(engine, review, make_daemon)
        assert runs(engine)[0]["mode"] == "dry_run" and status(engine, expired) == "active"

    def test_plan_is_applied_after_the_delay(self, engine, review, make_daemon):
        """The plan applies at finished_at + 60 min, not one second before."""
        plan_id, finished, expired = self.plan(engine, review, make_daemon)
        early = make_daemon(review, finished + timedelta(minutes=60) - timedelta(seconds=1))
        assert early.apply_due_plans() == []
        on_time = make_daemon(review, finished + timedelta(minutes=60))
        (apply_id,) = on_time.apply_due_plans()
        assert status(engine, expired) == "deleted"
        plan, applied = runs(engine)
        assert plan["applied_by"] == apply_id and applied["plan_run_id"] == plan_id
        assert (applied["trigger"], applied["status"]) == ("nightly_apply", "completed")
        assert on_time.apply_due_plans() == []

    def test_a_clock_ahead_of_the_server_keeps_the_review_window(self, engine, review, make_daemon):
        """`schedule --once-due --now` a day ahead of the server's clock: the plan made at that
        slot is not applied in the same pass (its finished_at, on the server's clock, was
        already "an hour ago" for that clock) but an hour after the plan's end on its own."""
        seed(engine, users=1)
        ahead = datetime.now(UTC).replace(hour=3, minute=0, second=0, microsecond=0)
        ahead += timedelta(days=2)
        make_daemon(review, ahead).nightly()
        (plan,) = runs(engine)
        ended = ahead + (plan["finished_at"] - plan["started_at"])
        assert make_daemon(review, ahead + timedelta(minutes=5)).apply_due_plans() == []
        assert make_daemon(review, ended + timedelta(minutes=59)).apply_due_plans() == []
        assert len(make_daemon(review, ended + timedelta(minutes=60)).apply_due_plans()) == 1

    def test_a_stale_fact_read_during_the_review_window_is_still_closed(
        self, engine, review, make_daemon
    ):
        """The application keeps retrieving the stale fact while the plan waits: the apply
        closes it anyway (contradictions compare content versions, not xmin:
        tests/test_content_version.py). With xmin every read drifted it, night after night."""
        old, new = city_pair(engine, "user-000")
        make_daemon(review, SLOT).nightly()
        (plan,) = runs(engine)
        execute(engine, "UPDATE memories SET last_accessed_at = :at,"
                " access_count = access_count + 1 WHERE id = ANY(:ids)",
                at=plan["finished_at"], ids=[old, new])  # fmt: skip
        make_daemon(review, plan["finished_at"] + timedelta(minutes=60)).apply_due_plans()
        closed = get(engine, old)
        assert (closed["status"], closed["superseded_by"]) == ("obsolete", new)
        assert closed["access_count"] == 1

    def test_rejected_plan_is_never_applied(self, engine, review, make_daemon):
        """`memory-gc reject RUN_ID` stops the apply; the plan's rows stay as they are."""
        plan_id, finished, expired = self.plan(engine, review, make_daemon)
        scheduler.reject_plan(engine, plan_id)
        assert make_daemon(review, finished + timedelta(days=1)).apply_due_plans() == []
        assert status(engine, expired) == "active" and runs(engine)[0]["status"] == "rejected"

    def test_a_plan_not_applied_in_time_is_rejected_not_retried(self, engine, review, make_daemon):
        """The daemon was down past run.max_plan_age_hours: `apply` would refuse the plan
        (its changes would carry its old instant), so the daemon closes it as rejected, saying
        why, instead of trying it at every upkeep; its rows stay as they are."""
        _, finished, expired = self.plan(engine, review, make_daemon)
        execute(engine, "UPDATE gc_runs SET finished_at = finished_at - interval '73 hours'")
        assert make_daemon(review, finished + timedelta(days=4)).apply_due_plans() == []
        (plan,) = runs(engine)
        assert plan["status"] == "rejected" and "max_plan_age_hours (72)" in plan["error"]
        assert status(engine, expired) == "active"

    def test_two_replicas_apply_a_plan_once(self, engine, database_url, review, make_daemon):
        """Replicas that find the same due plan make one apply run between them."""
        _, finished, _ = self.plan(engine, review, make_daemon)
        other = gc_engine_for(database_url)
        late = finished + timedelta(hours=2)
        daemons = [make_daemon(review, late), make_daemon(review, late, other)]
        results = run_together([d.apply_due_plans for d in daemons])
        other.dispose()
        assert len({r for res in results for r in res}) == 1 and len(runs(engine)) == 2


class TestReject:
    def test_reject_twice_is_refused(self, engine, settings, make_daemon):
        """A plan already rejected cannot be rejected again (exit 2 with its status)."""
        seed(engine, users=1)
        plan_id = gc_engine.run_once(engine, settings, request(dry_run=True))
        scheduler.reject_plan(engine, plan_id)
        with pytest.raises(UsageError, match="rejected"):
            scheduler.reject_plan(engine, plan_id)

    def test_applied_plan_cannot_be_rejected(self, engine, settings):
        """Rejecting an applied plan says which run applied it and how to undo it."""
        seed(engine, users=1)
        plan_id = gc_engine.run_once(engine, settings, request(dry_run=True))
        apply_id = gc_engine.apply_plan(engine, plan_id)
        with pytest.raises(UsageError, match=f"restore --run {apply_id}"):
            scheduler.reject_plan(engine, plan_id)

    def test_apply_run_cannot_be_rejected(self, engine, settings):
        """Only a dry run is a plan."""
        seed(engine, users=1)
        run_id = gc_engine.run_once(engine, settings, request(dry_run=False))
        with pytest.raises(UsageError, match="not a dry run"):
            scheduler.reject_plan(engine, run_id)

    def test_cli_reject(self, engine, settings, cli_env, capsys):
        """`memory-gc reject` exits 0 for a plan, 2 for an unknown run id."""
        seed(engine, users=1)
        plan_id = gc_engine.run_once(engine, settings, request(dry_run=True))
        assert cli.main(["reject", str(plan_id)]) == 0
        assert "rejected" in capsys.readouterr().out
        assert cli.main(["reject", "00000000-0000-0000-0000-000000000000"]) == 2
        assert "no run with id" in capsys.readouterr().err

    def test_unknown_run_is_not_found(self, engine):
        """Rejecting a run that does not exist is a NotFoundError."""
        with pytest.raises(NotFoundError):
            scheduler.reject_plan(engine, gc_engine.uuid4())


def request(*, dry_run: bool) -> gc_engine.RunRequest:
    jobs = gc_engine.resolve_jobs([], Settings())
    return gc_engine.RunRequest(mode="dry_run" if dry_run else "apply", now=NOW, jobs=jobs)


class TestScheduleCommand:
    def test_once_due_runs_the_slot_and_exits_zero(self, engine, cli_env):
        """`schedule --once-due --now` runs the slot due at that instant and exits 0."""
        seed(engine)
        at = (SLOT + timedelta(minutes=5)).isoformat()
        assert cli.main(["schedule", "--once-due", "--now", at]) == 0
        assert [(r["slot"], r["status"]) for r in runs(engine)] == [
            (scheduler.slot_key(SLOT), "completed")
        ]

    def test_now_without_once_due_is_refused(self, cli_env, capsys):
        """A fixed clock only makes sense for one pass (exit 2)."""
        assert cli.main(["schedule", "--now", SLOT.isoformat()]) == 2
        assert "--once-due" in capsys.readouterr().err

    def test_bad_metrics_port_is_refused(self, cli_env, capsys):
        """A port outside 0-65535 is a usage error."""
        assert cli.main(["schedule", "--once-due", "--metrics-port", "70000"]) == 2
        assert "not a port" in capsys.readouterr().err

    def test_bad_cron_is_a_config_error(self, cli_env, monkeypatch, capsys):
        """An invalid schedule.cron stops the daemon before it starts (exit 2)."""
        monkeypatch.setenv("MEMORY_GC_SCHEDULE__CRON", "0 3 * *")
        assert cli.main(["schedule", "--once-due"]) == 2
        assert "five fields" in capsys.readouterr().err
