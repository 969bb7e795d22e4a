"""ttl_expiry: active rows whose ``expires_at`` has passed are soft-deleted.

Options (``[ttl_expiry]``):
    enabled = true    run the job at all

Emits ``soft_delete`` with reason ``ttl_expired`` for every active, unpinned row with
``expires_at <= now``. A row expiring exactly at ``now`` is expired (the TTL is an instant).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gc_worker.actions import Action, soft_delete
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.queries import q

NAME = "ttl_expiry"
REASON = "ttl_expired"


def plan_ttl_expiry(rows: Iterable[Any], *, now: datetime) -> list[Action]:
    """Soft-delete every row whose TTL is at or before ``now``."""
    return [
        soft_delete(NAME, row, REASON, expires_at=row.expires_at.isoformat())
        for row in rows
        if row.expires_at is not None and row.expires_at <= now
    ]


WORK = "work_ttl_expiry"  # gc_worker.triage: which users have work (sql/triage.sql)


def work_params(settings: Settings, now: datetime) -> dict[str, Any]:
    return {}


def plan(ctx: BatchContext) -> list[Action]:
    rows = ctx.conn.execute(q("ttl_expiry_candidates"), ctx.params())
    return plan_ttl_expiry(rows, now=ctx.now)
