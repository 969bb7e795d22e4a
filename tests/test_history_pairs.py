"""Pruning a plan and the run that applied it (gc_worker.history): the pair goes together, also
when one of them was busy at a prune."""

from __future__ import annotations

from uuid import UUID

import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker import history
from tests.store import add, days_ago, execute, run
from tests.test_history import DAY, RETENTION, clock, counts, ended


def test_a_plan_busy_at_a_prune_goes_at_the_next_one(engine, settings):
    """The plan's row was held by another transaction when the prune reached it (busy: left),
    the run that applied it was not: the next prune takes the plan too, not leaves it for
    ever behind an applier that is gone."""
    m = add(engine, "u1", "expired", expires_at=days_ago(1))
    plan = UUID(run(engine, settings, jobs=["ttl_expiry"], dry_run=True)["run_id"])
    applied = gc_engine.apply_plan(engine, plan)
    execute(engine, "DELETE FROM memories WHERE id = :id", id=m)
    now = clock()
    ended(engine, plan, now - RETENTION - 2 * DAY)
    ended(engine, applied, now - RETENTION - DAY)
    with engine.connect() as other:
        other.execute(sa.text("SELECT id FROM gc_runs WHERE id = :id FOR UPDATE"), {"id": plan})
        first = history.prune(engine, settings, now=now)
        other.rollback()
    assert plan in first.busy_runs
    history.prune(engine, settings, now=now)
    assert counts(engine, plan) == {"gc_runs": 0, "gc_actions": 0, "gc_run_batches": 0,
                                    "gc_run_llm_spend": 0}  # fmt: skip
    assert counts(engine, applied)["gc_runs"] == 0
