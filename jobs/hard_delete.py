"""hard_delete: physically remove what stayed retired past its retention window.

Options:
    [hard_delete] retention_days = 30            deleted → purged this long after deleted_at
    [hard_delete] history_retention_days = 365   obsolete / merged → purged this long after
    [erasure] retention_days = 1                 rows erased on request → purged this soon

The only irreversible step. A row is purged only if it has been retired for at least its
window (inclusive); lineage rows go with it; the audit keeps the action but its content
preview is scrubbed, and so is the text of every merged record or summary planned or made from
it (``create_merged`` rows naming it in ``details.sources``); cached model decisions about it
are dropped. Pinned rows are never purged, except rows erased on request.
Emits ``hard_delete`` with the row's previous status as reason (``retention_deleted``,
``retention_history`` or ``retention_erasure``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from gc_worker.actions import ERASURE_REASONS, Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.config import ErasureSettings, HardDeleteSettings, Settings
from gc_worker.queries import q

NAME = "hard_delete"


def purge_reason(
    row: Any, policy: HardDeleteSettings, erasure: ErasureSettings, *, now: datetime
) -> str | None:
    """Why this row may be purged now, or None if it must stay."""
    erased = row.status == "deleted" and row.status_reason in ERASURE_REASONS
    if row.pinned and not erased:
        return None
    if erased and _since(row.deleted_since, now) >= timedelta(days=erasure.retention_days):
        return "retention_erasure"
    if row.status == "deleted":
        window = timedelta(days=policy.retention_days)
        return "retention_deleted" if _since(row.deleted_since, now) >= window else None
    if row.status in ("obsolete", "merged"):
        window = timedelta(days=policy.history_retention_days)
        return "retention_history" if _since(row.retired_since, now) >= window else None
    return None


def _since(instant: datetime | None, now: datetime) -> timedelta:
    return now - instant if instant is not None else timedelta.min


def plan_hard_delete(
    rows: Iterable[Any], policy: HardDeleteSettings, erasure: ErasureSettings, *, now: datetime
) -> list[Action]:
    actions = []
    for row in rows:
        reason = purge_reason(row, policy, erasure, now=now)
        if reason is not None:
            actions.append(
                Action(
                    job=NAME,
                    action=Kind.HARD_DELETE,
                    user_id=row.user_id,
                    reason=reason,
                    memory_id=row.id,
                    row_version=row.row_version,
                    details={"status": row.status, "status_reason": row.status_reason},
                )
            )
    return actions


def rule_params(settings: Settings, now: datetime) -> dict[str, Any]:
    return {
        "deleted_cutoff": now - timedelta(days=settings.hard_delete.retention_days),
        "history_cutoff": now - timedelta(days=settings.hard_delete.history_retention_days),
        "erasure_cutoff": now - timedelta(days=settings.erasure.retention_days),
        "erasure_reasons": list(ERASURE_REASONS),
    }


WORK = "work_hard_delete"  # gc_worker.triage: which users have work (sql/triage.sql)


def work_params(settings: Settings, now: datetime) -> dict[str, Any]:
    return rule_params(settings, now)


def plan(ctx: BatchContext) -> list[Action]:
    policy, erasure = ctx.settings.hard_delete, ctx.settings.erasure
    params = ctx.params(**rule_params(ctx.settings, ctx.now))
    rows = ctx.conn.execute(q("hard_delete_candidates"), params)
    return plan_hard_delete(rows, policy, erasure, now=ctx.now)
