"""The nightly schedule: cron trigger, the slot that is due, one run per slot across replicas.

Options (``[schedule]``):
    cron = "0 3 * * *"            standard five-field crontab (0 or 7 = Sunday), in ``timezone``
                                  (CrontabTrigger: read as crontab(5) reads it)
    timezone = "UTC"
    misfire_grace_seconds = 3600  a slot missed by at most this (deploy, restart) still runs once
    mode = "plan_and_apply"       or "plan_then_apply": the nightly run is a dry run, applied
                                  ``apply_delay_minutes`` after it completed unless rejected
    apply_delay_minutes = 60
    hold_above_share = 0.25       plan_then_apply: a plan retiring more than this share of the
    hold_min_rows = 1000          active memories, and at least this many, is held for a person

A slot is one fire time of the cron, named ``nightly:<fire time in UTC, ISO 8601>``. The run of
a slot has ``gc_runs.slot`` set (unique): the replica whose insert takes the slot starts the
run, the others find it and join it (batches are shared, see gc_worker.engine). The run's
``now`` is the fire time, so every replica, and a late start within the grace, plans the same.
Decisions here take the clock as a parameter; gc_worker.daemon supplies it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa
import structlog
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy.engine import Engine

from gc_worker.apply_start import applying, check_plan_age
from gc_worker.config import ScheduleSettings, Settings
from gc_worker.db import transaction
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.errors import ConfigError, UsageError
from gc_worker.queries import q
from gc_worker.run_record import (
    APPLY_TRIGGER,
    CANCELLED,
    NIGHTLY_TRIGGER,
    RESUMED_TRIGGERS,
    SWEEP_TRIGGER,
    load_run,
    settings_of,
)

log = structlog.get_logger("memory_gc")

SLOT_PREFIX = "nightly"
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_NUMERIC_DOW = re.compile(r"^(\*|\d+)(?:-(\d+))?(?:/(\d+))?$")


class CrontabTrigger(BaseTrigger):
    """A crontab line as crontab reads it, where APScheduler's CronTrigger differs:

    - with both the day of the month and the weekday restricted (neither starting with ``*``),
      a day matching *either* fires (``0 3 1 * 1``: the 1st and every Monday), where
      CronTrigger needs both (only a Monday the 1st);
    - a fixed time (hour not starting with ``*``) in the hour that repeats when daylight saving
      time ends fires once, not twice.
    """

    def __init__(self, triggers: list[CronTrigger], once_in_repeated_hour: bool) -> None:
        self.triggers, self.once_in_repeated_hour = triggers, once_in_repeated_hour

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        while True:
            fires = [t.get_next_fire_time(previous_fire_time, now) for t in self.triggers]
            fire = min((f for f in fires if f is not None), default=None)
            if fire is None or not (self.once_in_repeated_hour and fire.fold == 1):
                return fire
            previous_fire_time, now = None, fire.astimezone(UTC) + timedelta(seconds=1)

    @property
    def timezone(self) -> Any:
        return self.triggers[0].timezone

    def __str__(self) -> str:
        return " or ".join(str(t) for t in self.triggers)


def nightly_trigger(schedule: ScheduleSettings) -> CrontabTrigger:
    """The cron trigger of ``schedule`` (crontab weekday numbers, 0 = Sunday)."""
    try:
        return cron_trigger(schedule.cron, schedule.timezone)
    except ValueError as exc:
        raise ConfigError(
            f"schedule.cron = {schedule.cron!r} / schedule.timezone = {schedule.timezone!r}: {exc}"
        ) from None


def cron_trigger(cron: str, timezone: str) -> CrontabTrigger:
    """A crontab line as a trigger; ValueError saying what is wrong with it."""
    fields = cron.split()
    if len(fields) != 5:
        raise ValueError('a cron line has five fields (minute hour day month weekday): "0 3 * * *"')
    minute, hour, day, month, weekday = fields
    either = not day.startswith("*") and not weekday.startswith("*")  # crontab(5)
    days = [(day, "*"), ("*", weekday)] if either else [(day, weekday)]
    try:
        triggers = [
            CronTrigger(minute=minute, hour=hour, day=d, month=month,
                        day_of_week=crontab_weekdays(w), timezone=timezone)
            for d, w in days
        ]  # fmt: skip
    except (ValueError, LookupError) as exc:
        raise ValueError(f'not a valid cron line ({exc}); e.g. "0 3 * * *"') from None
    # crontab takes "0 3 30 2 *" and never runs it: a nightly job that silently never runs is
    # worse than a refused line. Of an either-line ("0 3 31 2 mon"), a half that never fires
    # is dropped: asking it for its next fire time searches to year 9999, at every slot
    firing = [t for t in triggers if t.get_next_fire_time(None, NEVER_CHECK_FROM) is not None]
    if not firing:
        raise ValueError(
            f"the cron line {cron!r} never fires: no month has that day (e.g. 30 2 = February "
            'the 30th); use a day every month has, e.g. "0 3 * * *" or "0 3 28 2 *"'
        )
    return CrontabTrigger(firing, once_in_repeated_hour=not hour.startswith("*"))


NEVER_CHECK_FROM = datetime(2000, 1, 1, tzinfo=UTC)


def crontab_weekdays(field: str) -> str:
    """A crontab weekday field in APScheduler's terms (its 3.x numbers start at Monday)."""
    if field == "*":
        return field
    parts = []
    for part in field.split(","):
        match = _NUMERIC_DOW.match(part)
        if match is None:  # names (mon-fri) mean the same in both
            parts.append(part)
            continue
        start, end, step = match.groups()
        first, last = (0, 6) if start == "*" else (int(start), int(end or start))
        if start != "*" and end is None and step is not None:
            last = 6
        if not (0 <= first <= 7 and 0 <= last <= 7 and first <= last):
            raise ConfigError(f"schedule.cron weekday {part!r} is out of range 0-7 (0, 7 = Sunday)")
        parts += [_WEEKDAYS[d % 7] for d in range(first, last + 1, int(step or 1))]
    return ",".join(dict.fromkeys(parts))


DST_MARGIN = timedelta(hours=3)  # more than any zone's clock change (Antarctica/Troll: 2 h)


def due_slot(trigger: BaseTrigger, now: datetime, grace_seconds: float) -> datetime | None:
    """The latest fire time in ``[now - grace, now]``, or None: missed earlier ones coalesce.

    The search starts ``DST_MARGIN`` before the window: a fixed time in the hour that clocks
    skip (02:30 in Europe/Berlin on the last Sunday of March) fires at that wall time plus the
    jump (01:30 UTC), which a search from a later wall time (02:40 UTC = 04:40, past 02:30)
    no longer finds: the slot was due for 30 minutes instead of the grace."""
    earliest = now - timedelta(seconds=grace_seconds)
    fire = trigger.get_next_fire_time(None, earliest - DST_MARGIN)
    latest = None
    while fire is not None and fire <= now:
        if fire >= earliest:
            latest = fire
        # from the next second in UTC: in the hour that repeats, the local wall clock (and
        # APScheduler's `previous + 1 µs`) goes back to the first pass, and found this again
        fire = trigger.get_next_fire_time(None, fire.astimezone(UTC) + timedelta(seconds=1))
    return latest


def slot_key(fire_time: datetime) -> str:
    return f"{SLOT_PREFIX}:{fire_time.astimezone(UTC).isoformat()}"


def run_of_slot(engine: Engine, slot: str) -> UUID | None:
    with engine.connect() as conn:
        row = conn.execute(q("run_by_slot"), {"slot": slot}).first()
    return None if row is None else row.id


def nightly_run(engine: Engine, settings: Settings, fire_time: datetime) -> tuple[UUID, bool]:
    """The run of the slot at ``fire_time``: (run id, True if this call started it)."""
    slot = slot_key(fire_time)
    existing = run_of_slot(engine, slot)
    if existing is not None:
        return existing, False
    request = RunRequest(
        mode="dry_run" if settings.schedule.mode == "plan_then_apply" else "apply",
        now=fire_time.astimezone(UTC),
        jobs=resolve_jobs([], settings),
        trigger=NIGHTLY_TRIGGER,
    )
    try:
        run_id = start_run(engine, settings, request, slot=slot)
    except sa.exc.IntegrityError:  # another replica took the slot while we listed users
        found = run_of_slot(engine, slot)
        if found is None:
            raise
        return found, False
    log.info("gc.schedule.slot_started", slot=slot, run_id=str(run_id))
    return run_id, True


def due_plans(engine: Engine, now: datetime, delay_minutes: float) -> list[UUID]:
    """Nightly plans whose review delay has passed and that were neither applied nor rejected."""
    with engine.connect() as conn:
        cutoff = now - timedelta(minutes=delay_minutes)
        params = {"cutoff": cutoff, "cancelled": CANCELLED}
        return list(conn.execute(q("due_plans"), params).scalars())


def hold_if_large(engine: Engine, plan_run_id: UUID, schedule: ScheduleSettings) -> bool:
    """Whether the daemon must leave the due plan ``plan_run_id`` to a person: it retires more
    than ``schedule.hold_above_share`` of the active memories, and at least
    ``schedule.hold_min_rows``. Such a plan is marked held (``gc_runs.held`` says why, with the
    commands), once, by whichever replica gets there first; it waits for `memory-gc apply` or
    `reject`, and goes stale as any plan. An erasure's retirements are not counted.

    The plan's row is locked first (as ``start_apply`` does): a plan another replica held since
    this one listed it stays held whatever this replica would count; one another replica
    started applying is not (this one joins that apply)."""
    with transaction(engine) as conn:
        conn.execute(q("lock_run_row"), {"run_id": plan_run_id})
        plan = load_run(conn, plan_run_id)
        if plan["applied_by"] is not None:
            return False
        if plan["held"] is not None:
            return True
        size = conn.execute(q("plan_size"), {"run_id": plan_run_id}).one()
        if size.retiring < schedule.hold_min_rows or size.retiring <= (
            schedule.hold_above_share * size.active
        ):
            return False
        share = size.retiring / size.active if size.active else 1.0
        reason = (
            f"retires {size.retiring:,} of the {size.active:,} active memories ({share:.1%}), "
            f"more than schedule.hold_above_share = {schedule.hold_above_share:g}: review it "
            f"(`memory-gc report {plan_run_id}`), then `memory-gc apply {plan_run_id}` or "
            f"`memory-gc reject {plan_run_id}`"
        )
        marked = conn.execute(q("hold_plan"), {"run_id": plan_run_id, "reason": reason}).first()
    if marked is not None:
        log.warning(
            "gc.schedule.plan_held", run_id=str(plan_run_id), retiring=size.retiring,
            active=size.active, hold_above_share=schedule.hold_above_share,
        )  # fmt: skip
    return True


def held_plan_count(engine: Engine) -> int:
    """Nightly plans held for a person and still waiting (not applied, rejected or stale)."""
    with engine.connect() as conn:
        return conn.execute(q("held_plan_count")).scalar_one()


def erasure_pending_users(engine: Engine) -> list[str]:
    """Users with a pending erasure request no erasure run has tried since it was filed."""
    with engine.connect() as conn:
        return list(conn.execute(q("erasure_pending_users")).scalars())


@contextlib.contextmanager
def apply_run_of(
    engine: Engine, plan_run_id: UUID, *, max_age_hours: float | None = None
) -> Iterator[UUID | None]:
    """For the block: the apply run of a due plan, started (or taken up) by this process, which
    participates in it from before its commit (``applying``); or the one another replica is
    working, to join; None if the plan was rejected or refused (logged)."""
    with contextlib.ExitStack() as held:
        try:
            run_id = held.enter_context(
                applying(engine, plan_run_id, trigger=APPLY_TRIGGER, max_age_hours=max_age_hours)
            )
        except UsageError as exc:
            with engine.connect() as conn:
                run_id = load_run(conn, plan_run_id)["applied_by"]
            if run_id is None:
                log.warning("gc.schedule.plan_refused", run_id=str(plan_run_id), error=str(exc))
        yield run_id


def close_unresumable(engine: Engine, run_id: UUID, max_age_hours: float, now: datetime) -> bool:
    """If the orphaned ``run_id`` must not be finished, mark it failed with the reason (what its
    committed batches did stays) and say so:

    - the apply of a plan now older than ``max_age_hours``, or a run whose instant is more than
      ``max_age_hours`` behind ``now`` (the daemon's clock; the replicas were scaled to zero for
      weeks, say): what it changes would carry that instant — soft deletes stamped weeks back,
      so the retention window would be spent before anyone could restore them;
    - a run made with settings this version refuses (a newer release's, before a rollback):
      it could never be resumed, and would stand before the orphans after it at every upkeep.
    """
    with transaction(engine) as conn:
        run = load_run(conn, run_id)
        try:
            settings_of(run)
            if run["plan_run_id"] is not None:
                check_plan_age(conn, load_run(conn, run["plan_run_id"]), max_age_hours)
            else:
                _check_run_age(run, max_age_hours, now)
        except UsageError as exc:  # failed only if still nobody's (another replica may have
            # taken it up meanwhile: it is left to it); not resumed here either way
            params = {"run_id": run_id, "error": str(exc), "own_pids": []}
            if conn.execute(q("fail_run_if_alone"), params).first() is not None:
                log.warning("gc.schedule.run_not_resumed", run_id=str(run_id), error=str(exc))
            return True
    return False


STOPPED = (
    "stopped: no process has worked this run since its process was killed or lost the "
    "database; the batches it committed stay applied, the others were never applied. For an "
    "apply, `memory-gc apply PLAN_ID` takes up the rest; otherwise start a new run"
)


def close_stopped_runs(engine: Engine, *, lease_seconds: float) -> list[UUID]:
    """Fail the runs nothing resumes (not the daemon's, not a sweep's) left running by a
    process that died, a lease after they started (``close_stopped_runs``). Returns them."""
    kept = [*RESUMED_TRIGGERS, SWEEP_TRIGGER]
    params = {"kept": kept, "lease": lease_seconds, "error": STOPPED}
    with transaction(engine) as conn:
        closed = list(conn.execute(q("close_stopped_runs"), params).scalars())
    for run_id in closed:
        log.warning("gc.schedule.stopped_run_closed", run_id=str(run_id))
    return closed


def _check_run_age(run: dict[str, Any], max_age_hours: float, now: datetime) -> None:
    age = (now - run["now"]).total_seconds() / 3600
    if age > max_age_hours:
        raise UsageError(
            f"run {run['id']} was made for {run['now']:%Y-%m-%d %H:%M} UTC, {age:.0f} hours "
            f"ago, more than run.max_plan_age_hours = {max_age_hours:g}: resumed now, its "
            "changes would carry that instant (retention would count from then). It is closed; "
            "the next nightly run starts afresh"
        )


def reject_stale_plans(engine: Engine, max_age_hours: float) -> list[UUID]:
    """Reject the nightly plans not applied within ``max_age_hours`` of being made (the daemon
    was down, say): `apply` would refuse them, so they are closed, not retried for ever."""
    with transaction(engine) as conn:
        rejected = list(
            conn.execute(q("reject_stale_plans"), {"max_age_hours": max_age_hours}).scalars()
        )
    for run_id in rejected:
        log.warning("gc.schedule.plan_too_old", run_id=str(run_id), max_age_hours=max_age_hours)
    return rejected


def reject_plan(engine: Engine, run_id: UUID, *, who: str = "cli") -> None:
    """Mark a completed, unapplied dry run rejected; it will never be applied."""
    with transaction(engine) as conn:
        if conn.execute(q("reject_plan"), {"run_id": run_id, "who": who}).first() is not None:
            log.info("gc.schedule.plan_rejected", run_id=str(run_id), by=who)
            return
        run = load_run(conn, run_id)
    if run["mode"] != "dry_run":
        raise UsageError(f"run {run_id} is not a dry run; only a plan can be rejected")
    if run["applied_by"] is not None:
        raise UsageError(
            f"run {run_id} was already applied by run {run['applied_by']}; "
            f"undo it with `memory-gc restore --run {run['applied_by']}`"
        )
    raise UsageError(
        f"run {run_id} is {run['status']}; only a completed plan (or one failed only by failed "
        "batches) can be rejected"
    )
