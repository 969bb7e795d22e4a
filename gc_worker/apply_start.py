"""Starting an apply run of a stored dry-run plan (``apply RUN_ID``), or taking up one that
stopped: the checks that refuse a plan (not a completed dry run, already applied, too old), the
apply run's row and its copy of the plan's batches, and ``applying``, which makes the caller a
participant of the run before it is committed. Working its batches is gc_worker.engine's.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID, uuid4

import structlog
from sqlalchemy.engine import Connection, Engine

from gc_worker.claims import participating
from gc_worker.db import transaction
from gc_worker.errors import UsageError
from gc_worker.queries import q
from gc_worker.run_record import (
    APPLY_TRIGGER,
    CANCELLED,
    load_run,
    pending_batches,
    settings_of,
)

log = structlog.get_logger("memory_gc")


def start_apply(
    engine: Engine,
    plan_run_id: UUID,
    *,
    trigger: str = "cli",
    participate: Callable[[UUID], None] | None = None,
    max_age_hours: float | None = None,
) -> UUID:
    """Record an apply run of a completed dry run (refused if it was already applied, or if
    it finished more than ``max_age_hours`` ago — default: the plan's run.max_plan_age_hours).

    If an earlier apply of the same plan stopped with batches still pending (the process was
    killed, the database lost) and nobody is working it, that apply run is taken up again
    instead: its committed batches stay, its pending ones are applied, as if it had never
    stopped. One that ended failed with nothing pending (failed batches) is refused: failed
    batches are left to a new plan.

    ``participate(run_id)``, if given, is called before the new (or resumed) run is committed
    and must make this process a participant of it (``applying``): no other process can then
    take the run up as stopped in the moment before this one starts working it.
    """
    with transaction(engine) as conn:
        conn.execute(q("lock_run_row"), {"run_id": plan_run_id})  # one starter at a time
        plan = load_run(conn, plan_run_id)
        check_plan_age(conn, plan, max_age_hours)
        if plan["mode"] == "dry_run" and plan["applied_by"] is not None:
            return _resume_apply(conn, plan, participate)
        _check_plan(conn, plan)
        if plan["held"] is not None and trigger == APPLY_TRIGGER:
            # held (scheduler.hold_if_large) by another replica after this daemon listed it
            raise UsageError(f"run {plan['id']} is held for a person: it {plan['held']}")
        return _new_apply(conn, plan, trigger, participate)


def _new_apply(
    conn: Connection, plan: dict[str, Any], trigger: str,
    participate: Callable[[UUID], None] | None,
) -> UUID:  # fmt: skip
    """The apply run's row, its claim on the plan (``applied_by``) and its copy of the plan's
    batches, in the caller's transaction."""
    plan_run_id, run_id = plan["id"], uuid4()
    if participate is not None:
        participate(run_id)
    row = {
        "id": run_id, "mode": "apply", "trigger": trigger, "now": plan["now"],
        "users": plan["users"], "jobs": plan["jobs"], "plan_run_id": plan_run_id,
        "settings": json.dumps(plan["settings"]),
    }  # fmt: skip
    conn.execute(q("insert_run"), row)
    claim = {"plan_run_id": plan_run_id, "apply_run_id": run_id}
    if conn.execute(q("claim_plan"), claim).first() is None:
        raise UsageError(f"run {plan_run_id} is already being applied; see `memory-gc report`")
    conn.execute(q("copy_batches"), {"run_id": run_id, "plan_run_id": plan_run_id})
    enabled = settings_of(plan).run.score_pass
    conn.execute(q("set_score_pass"), {"run_id": run_id, "enabled": enabled})
    return run_id


def check_plan_age(conn: Connection, plan: dict[str, Any], max_age_hours: float | None) -> None:
    """Refuse a plan older than the limit (the server's clock against its finish)."""
    if plan["mode"] != "dry_run" or plan["finished_at"] is None:
        return
    limit = max_age_hours or settings_of(plan).plan_age_limit_hours
    age = conn.execute(q("plan_age_hours"), {"run_id": plan["id"]}).scalar()
    age = None if age is None else float(age)
    if age is not None and age > limit:
        raise UsageError(
            f"run {plan['id']} is a plan made {age:.0f} hours ago, older than "
            f"run.max_plan_age_hours = {limit:g}: applied now, its changes would carry the "
            "plan's instant (retention would count from then) and the store has moved on. "
            "Make a new plan (`memory-gc run --dry-run`), or raise the limit for this apply "
            f"(MEMORY_GC_RUN__MAX_PLAN_AGE_HOURS={age + 1:.0f})"
        )


@contextlib.contextmanager
def applying(
    engine: Engine, plan_run_id: UUID, *, trigger: str = "cli", max_age_hours: float | None = None
) -> Iterator[UUID]:
    """``start_apply``, participating in the apply run (new or taken up) from before it is
    committed until the block ends: a second apply of the plan started meanwhile is refused as
    being applied right now, instead of taking the run up as stopped."""
    with contextlib.ExitStack() as held:

        def participate(run_id: UUID) -> None:
            held.enter_context(participating(engine, run_id))

        yield start_apply(
            engine, plan_run_id, trigger=trigger, participate=participate,
            max_age_hours=max_age_hours,
        )  # fmt: skip


def _resume_apply(
    conn: Connection, plan: dict[str, Any], participate: Callable[[UUID], None] | None
) -> UUID:
    apply_id = plan["applied_by"]
    apply = load_run(conn, apply_id)
    status = apply["status"]
    if status not in ("running", "failed"):
        raise UsageError(f"run {plan['id']} was already applied by run {apply_id}")
    if status == "failed" and not pending_batches(conn, apply_id):
        raise UsageError(
            f"run {plan['id']} was applied by run {apply_id}, which ended failed: "
            f"{apply['error']}. The failed batches' users were left as they were; make a new "
            "plan for them (`memory-gc run --dry-run`)"
        )
    if not conn.execute(q("try_run_exclusive"), {"run_id": apply_id}).scalar():
        raise UsageError(
            f"run {plan['id']} is being applied by run {apply_id} right now; see `memory-gc report`"
        )
    conn.execute(q("unlock_run_exclusive"), {"run_id": apply_id})
    if participate is not None:  # before the commit: the plan's row lock keeps others waiting
        participate(apply_id)
    conn.execute(q("resume_run"), {"run_id": apply_id})
    log.info("gc.apply_resumed", run_id=str(apply_id), plan_run_id=str(plan["id"]), was=status)
    return apply_id


def _check_plan(conn: Connection, plan: dict[str, Any]) -> None:
    """A completed dry run can be applied; so can one that failed only because some of its
    batches failed (none pending: the others were planned, and are applied) — not one an
    operator cancelled, even once the batch in flight at the cancel committed."""
    if plan["mode"] != "dry_run":
        raise UsageError(f"run {plan['id']} is not a dry run; only a dry run's plan can be applied")
    if plan["status"] == "failed" and plan["error"] == CANCELLED:
        raise UsageError(
            f"run {plan['id']} was cancelled (`memory-gc cancel`); only a completed plan can be "
            "applied: make a new one (`memory-gc run --dry-run`)"
        )
    if plan["status"] == "failed" and not pending_batches(conn, plan["id"]):
        return
    if plan["status"] == "running":  # or stopped: a dry run nobody works is left running
        raise UsageError(
            f"run {plan['id']} has not completed (it is running, or was stopped: `memory-gc "
            "runs` shows which); only a completed plan can be applied"
        )
    if plan["status"] != "completed":
        raise UsageError(
            f"run {plan['id']} is {plan['status']}; only a completed plan can be applied"
        )
