"""The daemon's nightly apply participates twice (apply_run_of, then work): its own database
trouble marks the apply failed at once (it was left `running` "to the others" — itself — and
the same upkeep's resume_orphans worked it again). Found by a review."""

from __future__ import annotations

from contextlib import closing
from datetime import timedelta

from gc_worker import batch_run
from gc_worker.config import ScheduleSettings
from gc_worker.daemon import Daemon
from gc_worker.errors import WriteConflict
from tests.test_schedule import SLOT, runs, seed


def test_daemon_apply_with_db_trouble_is_marked_failed_by_apply_due_plans(
    engine, settings, monkeypatch
):
    seed(engine, users=2)
    review = settings.model_copy(
        update={"schedule": ScheduleSettings(mode="plan_then_apply", apply_delay_minutes=60)}
    )
    d = Daemon(engine, review, clock=lambda: SLOT)
    d.nightly()  # the plan
    d.close()

    def conflict(*a, **k):
        raise WriteConflict("deadlock detected (40P01); rolled back whole")

    monkeypatch.setattr(batch_run, "_commit_batch", conflict)
    (plan,) = runs(engine)
    with closing(
        Daemon(engine, review, clock=lambda: plan["finished_at"] + timedelta(hours=2))
    ) as later:
        later.attempt(later.apply_due_plans)
    apply = next(r for r in runs(engine) if r["trigger"] == "nightly_apply")
    assert apply["status"] == "failed", (
        f"apply left {apply['status']!r} (error={apply['error']!r}) by its only daemon"
    )
