"""A review a dry run planned is queued when its plan is applied, which may be days later
(`plan_then_apply`, or `memory-gc apply`). A review changes no row, so no row version drifts
it. Found by a review: a stale plan queued its question again after a person had dismissed it
or resolved it, or beside the open item a later run had queued, breaking what planning
promises (docs/llm-jobs.md: a dismissed pair is left alone; no second open review for a
pair). Such a review now drifts."""

from __future__ import annotations

from uuid import UUID

import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker.reviews import list_reviews, resolve_review
from tests.store import NOW, run
from tests.test_reviews import seed_conflict


def open_items(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        return list_reviews(conn, status="open")


def plan_and_queue(engine: sa.Engine, settings) -> tuple[UUID, int]:
    """A dry run plans the review; a plain run then queues the same question."""
    plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
    assert [a["action"] for a in plan["actions"]] == ["review"]
    run(engine, settings, jobs=["contradiction"])
    [item] = open_items(engine)
    return UUID(plan["run_id"]), item.id


def review_outcome(engine: sa.Engine, run_id: UUID) -> str:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT outcome FROM gc_actions WHERE run_id = :r AND action = 'review'"),
            {"r": run_id},
        ).scalar_one()


def test_a_dismissed_question_is_not_asked_again(engine, settings):
    seed_conflict(engine)
    plan, item = plan_and_queue(engine, settings)
    resolve_review(engine, item, dismiss=True, now=NOW)
    applied = gc_engine.apply_plan(engine, plan)
    assert open_items(engine) == [] and review_outcome(engine, applied) == "drifted"


def test_an_open_question_is_not_asked_twice(engine, settings):
    seed_conflict(engine)
    plan, _ = plan_and_queue(engine, settings)
    applied = gc_engine.apply_plan(engine, plan)
    assert len(open_items(engine)) == 1 and review_outcome(engine, applied) == "drifted"


def test_a_question_resolved_by_keeping_one_side_is_moot(engine, settings):
    """--keep retired the other row: a question about it is moot."""
    said, _ = seed_conflict(engine)
    plan, item = plan_and_queue(engine, settings)
    resolve_review(engine, item, keep=said, now=NOW)
    applied = gc_engine.apply_plan(engine, plan)
    assert open_items(engine) == [] and review_outcome(engine, applied) == "drifted"


def test_two_due_plans_ask_once(engine, settings):
    """plan_then_apply after the daemons were down a night: two due plans hold the same
    question and are applied in order; the first queues it, the second's drifts."""
    seed_conflict(engine)
    first = run(engine, settings, jobs=["contradiction"], dry_run=True)
    second = run(engine, settings, jobs=["contradiction"], dry_run=True)
    gc_engine.apply_plan(engine, UUID(first["run_id"]))
    applied = gc_engine.apply_plan(engine, UUID(second["run_id"]))
    assert len(open_items(engine)) == 1 and review_outcome(engine, applied) == "drifted"


def test_a_question_lifted_since_is_asked(engine, settings):
    """A dismissal taken back (`reviews lift`) no longer holds the question back."""
    from gc_worker.reviews import lift_dismissal

    seed_conflict(engine)
    plan, item = plan_and_queue(engine, settings)
    resolve_review(engine, item, dismiss=True, now=NOW)
    lift_dismissal(engine, item, now=NOW)
    applied = gc_engine.apply_plan(engine, plan)
    assert len(open_items(engine)) == 1 and review_outcome(engine, applied) == "applied"
