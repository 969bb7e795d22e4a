"""Orphaned nightly runs the daemon must close rather than finish. Found by a review:

- a run left `running` (its replicas scaled to zero after the first batch) was resumed weeks
  later with its own instant: what it retired then was stamped as retired weeks back, so the
  next night purged it past `hard_delete.retention_days` with no restore window left; a
  `plan_then_apply` plan resumed that way finished late, looked fresh to
  `run.max_plan_age_hours` (measured from its end) and was applied: it is closed instead;
- a run made with settings this version refuses (a newer release's, before a rollback) failed
  every upkeep and stood before the orphans after it for ever."""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

import jobs.ttl_expiry as ttl
from gc_worker.daemon import Daemon
from tests.store import execute
from tests.test_schedule import SLOT, runs, seed, with_schedule


def one_at_a_time(settings):
    return settings.model_copy(
        update={"run": settings.run.model_copy(update={"batch_users": 1, "workers": 1})}
    )


def stopped_after_one_batch(engine, settings, monkeypatch, at: datetime) -> UUID:
    """A nightly run whose daemon is stopped (SIGTERM) during its first batch: left running."""
    daemon = Daemon(engine, settings, clock=lambda: at)
    real, seen = ttl.plan, []

    def plan(ctx):
        seen.append(1)
        if len(seen) == 1:
            daemon.request_stop()
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)
    with closing(daemon):
        daemon.nightly()
    monkeypatch.undo()
    night = runs(engine)[-1]
    assert night["status"] == "running"
    return night["id"]


def retired(engine) -> list:
    return execute(engine, "SELECT id, deleted_at FROM memories WHERE status = 'deleted'").all()


def test_a_run_weeks_old_is_closed_and_the_next_night_starts_afresh(engine, settings, monkeypatch):
    seed(engine, users=3)  # each user: one expired row (ttl_expiry retires it), one fresh
    settings = one_at_a_time(settings)
    orphan = stopped_after_one_batch(engine, settings, monkeypatch, SLOT + timedelta(minutes=1))
    assert len(retired(engine)) == 1
    back = SLOT + timedelta(days=40, hours=7)  # scaled up again, 40 days later, no slot due
    with closing(Daemon(engine, settings, clock=lambda: back)) as daemon:
        daemon.upkeep()
        assert daemon.failures == 0
    (closed,) = runs(engine)
    assert (closed["id"], closed["status"]) == (orphan, "failed")
    assert "more than run.max_plan_age_hours = 72" in closed["error"]
    assert len(retired(engine)) == 1  # nothing stamped with the old instant
    night = SLOT + timedelta(days=41, minutes=1)
    with closing(Daemon(engine, settings, clock=lambda: night)) as daemon:
        daemon.nightly()
    # the other two users' rows retired with this night's instant; the first batch's, retired
    # 41 days ago, purged after its 30 days
    assert [deleted_at for _, deleted_at in retired(engine)] == [SLOT + timedelta(days=41)] * 2


def test_a_run_within_the_limit_is_still_finished(engine, settings, monkeypatch):
    seed(engine, users=3)
    settings = one_at_a_time(settings)
    orphan = stopped_after_one_batch(engine, settings, monkeypatch, SLOT + timedelta(minutes=1))
    with closing(Daemon(engine, settings, clock=lambda: SLOT + timedelta(hours=70))) as daemon:
        assert daemon.resume_orphans() == [orphan]
    assert runs(engine)[0]["status"] == "completed" and len(retired(engine)) == 3


def test_a_plan_resumed_weeks_later_is_never_applied(engine, settings, monkeypatch):
    """plan_then_apply, on the server's clock (which measures the review delay)."""
    seed(engine, users=3)
    settings = with_schedule(one_at_a_time(settings), mode="plan_then_apply",
                             apply_delay_minutes=60)  # fmt: skip
    today = datetime.now(UTC)
    slot = today.replace(hour=3, minute=0, second=0, microsecond=0) - timedelta(days=40)
    stopped_after_one_batch(engine, settings, monkeypatch, slot + timedelta(minutes=1))
    with closing(Daemon(engine, settings, clock=lambda: today)) as daemon:
        assert daemon.resume_orphans() == []
    later = today + timedelta(minutes=61)
    with closing(Daemon(engine, settings, clock=lambda: later)) as daemon:
        assert daemon.apply_due_plans() == []
    assert [(r["mode"], r["status"]) for r in runs(engine)] == [("dry_run", "failed")]
    assert retired(engine) == []


def test_a_run_whose_settings_are_refused_does_not_block_the_others(engine, settings, monkeypatch):
    seed(engine, users=4)
    settings = one_at_a_time(settings)
    first = stopped_after_one_batch(engine, settings, monkeypatch, SLOT + timedelta(minutes=1))
    second = stopped_after_one_batch(
        engine, settings, monkeypatch, SLOT + timedelta(days=1, minutes=1)
    )
    # the first was made by a newer release with an option this one does not know
    execute(engine, "UPDATE gc_runs SET settings = jsonb_set(settings, '{run,new_option}', 'true')"
                    " WHERE id = :id", id=first)  # fmt: skip
    at = SLOT + timedelta(days=1, hours=7)
    with closing(Daemon(engine, settings, clock=lambda: at)) as daemon:
        daemon.upkeep()
        daemon.upkeep()
        assert daemon.failures == 0
    by_id = {r["id"]: r for r in runs(engine)}
    assert by_id[first]["status"] == "failed"
    assert "run.new_option" in by_id[first]["error"]
    assert by_id[second]["status"] == "completed"


def test_a_sweep_handed_back_weeks_ago_gets_a_new_run(engine, settings):
    """A daemon stopped before its sweep's batch hands the request back with its run; a daemon
    claiming it 40 days later closes that run and sweeps with a run of its own instant."""
    from gc_worker import sweeps
    from tests.test_schedule_sweeps import NOON, expired

    row = expired(engine, "alice")
    request_id = sweeps.request_sweep(engine, "alice")
    with closing(Daemon(engine, settings, clock=lambda: NOON)) as stopped:
        stopped.request_stop()
        stopped.sweep_next()
    old_run = sweeps.get_sweep(engine, request_id)["run_id"]
    later = NOON + timedelta(days=40)
    with closing(Daemon(engine, settings, clock=lambda: later)) as daemon:
        assert daemon.sweep_next() is True
    done = sweeps.get_sweep(engine, request_id)
    assert done["status"] == "done" and done["run_id"] != old_run
    by_id = {r["id"]: r for r in runs(engine)}
    assert by_id[old_run]["status"] == "failed" and by_id[done["run_id"]]["now"] == later
    deleted_at = execute(engine, "SELECT deleted_at FROM memories WHERE id = :id", id=row)
    assert deleted_at.scalar_one() == later


def test_a_long_plan_keeps_its_whole_review_window(engine, settings):
    """apply_delay_minutes = 4320 (made Friday, reviewed until Monday): the plan's age limit is
    the delay plus an hour, counted from its end like the window. A plan that took 2 hours is
    still due, not rejected, 72.5 hours after it ended. (A review found that counting from its
    start, tried first against late-finishing plans, rejected it an hour before it was due;
    those plans are closed as orphans instead.)"""
    from gc_worker import scheduler

    seed(engine, users=1)
    review = with_schedule(settings, mode="plan_then_apply", apply_delay_minutes=4320)
    with closing(Daemon(engine, review, clock=lambda: SLOT)) as daemon:
        plan = daemon.nightly()
    execute(engine, "UPDATE gc_runs SET started_at = clock_timestamp() - interval '74.5 hours',"
                    " finished_at = clock_timestamp() - interval '72.5 hours' WHERE id = :id",
            id=plan)  # fmt: skip
    assert scheduler.reject_stale_plans(engine, review.plan_age_limit_hours) == []
    assert runs(engine)[0]["status"] == "completed"


@pytest.mark.parametrize(
    ("behind", "closed"),
    [(timedelta(hours=72), False), (timedelta(hours=72, microseconds=1), True)],
)
def test_a_run_exactly_at_the_age_limit_is_still_resumed(
    engine, settings, monkeypatch, behind, closed
):
    """The limit (run.max_plan_age_hours, 72) is inclusive: a run whose instant is 72 hours
    behind the daemon's clock is finished; a microsecond more and it is closed."""
    from gc_worker import scheduler

    seed(engine, users=2)
    orphan = stopped_after_one_batch(
        engine, one_at_a_time(settings), monkeypatch, SLOT + timedelta(minutes=1)
    )
    now = SLOT + behind  # the run's instant is its slot's
    assert scheduler.close_unresumable(engine, orphan, 72, now) is closed
    assert runs(engine)[0]["status"] == ("failed" if closed else "running")
