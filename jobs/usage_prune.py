"""usage_prune: forget what nobody has used for a long time.

Options (``[usage_prune]``):
    unused_days = 90     not put into a model context for this long
                         (last_accessed_at, else created_at)
    grace_days = 14      never prune rows younger than this
    max_importance = 3   only rows at or below this importance

Emits ``soft_delete`` with reason ``unused``. Boundaries are inclusive: a row last used exactly
``unused_days`` ago is unused.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from gc_worker.actions import Action, soft_delete
from gc_worker.batch import BatchContext
from gc_worker.config import Settings, UsagePruneSettings

NAME = "usage_prune"
REASON = "unused"


def last_used(row: Any) -> datetime:
    return row.last_accessed_at or row.created_at


def plan_usage_prune(
    rows: Iterable[Any],
    policy: UsagePruneSettings,
    *,
    now: datetime,
    importance: dict | None = None,
) -> list[Action]:
    """Soft-delete rows unused since the cutoff, past grace, at or below the importance limit."""
    importance = importance or {}
    unused_cutoff = now - timedelta(days=policy.unused_days)
    grace_cutoff = now - timedelta(days=policy.grace_days)
    return [
        soft_delete(NAME, row, REASON, last_used=last_used(row).isoformat())
        for row in rows
        if last_used(row) <= unused_cutoff
        and row.created_at <= grace_cutoff
        and importance.get(row.id, row.importance) <= policy.max_importance
    ]


def rule_params(policy: UsagePruneSettings, now: datetime) -> dict[str, Any]:
    return {
        "unused_cutoff": now - timedelta(days=policy.unused_days),
        "grace_cutoff": now - timedelta(days=policy.grace_days),
        "max_importance": policy.max_importance,
    }


PICK = "pick_usage_prune"  # gc_worker.triage: its candidate rows (sql/triage.sql)


def work_params(settings: Settings, now: datetime) -> dict[str, Any]:
    return rule_params(settings.usage_prune, now)


def plan(ctx: BatchContext) -> list[Action]:
    policy = ctx.settings.usage_prune
    params = ctx.params(**rule_params(policy, ctx.now))
    rows = ctx.conn.execute(*ctx.candidates_query(NAME, "usage_prune_candidates", params))
    return plan_usage_prune(rows, policy, now=ctx.now, importance=ctx.importance)
