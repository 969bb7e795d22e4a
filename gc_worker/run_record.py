"""A run's row in ``gc_runs``, read back: the row itself (``load_run``), the settings the run
was planned with (``settings_of``), how many of its batches are still pending, and the triggers
the daemon's runs carry (gc_worker.scheduler starts them, gc_worker.daemon takes them up again).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from pydantic import ValidationError
from sqlalchemy.engine import Connection

from gc_worker.config import Settings
from gc_worker.errors import NotFoundError, UsageError
from gc_worker.queries import q

NIGHTLY_TRIGGER = "nightly"  # the daemon's runs (gc_worker.scheduler) …
APPLY_TRIGGER = "nightly_apply"  # … and its applies of nightly plans (plan_then_apply)
# Runs a daemon's upkeep takes up again when they are left running with nobody working them
# (gc_worker.daemon): losing the database leaves them so, instead of failing them.
RESUMED_TRIGGERS = (NIGHTLY_TRIGGER, APPLY_TRIGGER)
SWEEP_TRIGGER = "sweep"  # a daemon's on-demand sweep of one user (gc_worker.daemon_sweeps)
# The error of a run an operator cancelled (gc_worker.cancel): a dry run closed so is no plan,
# even once the batch in flight at the cancel committed and left none pending.
CANCELLED = "cancelled by an operator (memory-gc cancel); what it applied stays until restored"


def load_run(conn: Connection, run_id: UUID) -> dict[str, Any]:
    row = conn.execute(q("get_run"), {"run_id": run_id}).mappings().first()
    if row is None:
        raise NotFoundError(f"no run with id {run_id}; `memory-gc runs` lists recent runs")
    return dict(row)


def pending_batches(conn: Connection, run_id: UUID) -> int:
    """How many of the run's batches are still pending."""
    return conn.execute(q("pending_batch_count"), {"run_id": run_id}).scalar_one()


def settings_of(run: dict[str, Any]) -> Settings:
    """The settings a run was planned with (an apply uses its plan's). Settings this version
    refuses (stored by one that accepted them) are a usage error naming the key, not a crash."""
    try:
        return Settings.model_validate(run["settings"])
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise UsageError(
            f"run {run.get('id')} was made with settings this version of memory-gc refuses "
            f"({key}: {first['msg']}); make a new plan (`memory-gc run --dry-run`)"
        ) from None
