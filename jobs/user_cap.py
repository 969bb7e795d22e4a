"""user_cap: keep each user's active memories at or under ``max_memories``.

Options (``[user_cap]``):
    max_memories = 500     active rows allowed per user (pinned rows count but are never evicted)
    overflow = "evict"     or "summarize": fold the evicted rows into one summary first
    fallback_to_evict = false   with "summarize": evict anyway when the LLM can't summarise
    max_summary_depth = 1  a summary is not folded into a summary-of-summaries beyond this

Eviction order: lowest importance first, then least recently used (last_accessed_at, else
created_at), then oldest, then id. Emits ``soft_delete`` with reason ``over_cap``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from gc_worker.actions import Action, soft_delete
from gc_worker.batch import BatchContext
from gc_worker.queries import q

NAME = "user_cap"
REASON = "over_cap"


def eviction_key(row: Any, importance: Mapping) -> tuple:
    return (
        importance.get(row.id, row.importance),
        row.last_accessed_at or row.created_at,
        row.created_at,
        str(row.id),
    )


def choose_evictions(
    rows: Iterable[Any], *, active: int, cap: int, importance: Mapping | None = None
) -> list[Any]:
    """The least valuable ``active - cap`` of one user's evictable rows (fewer if not enough)."""
    importance = importance or {}
    excess = max(active - cap, 0)
    return sorted(rows, key=lambda row: eviction_key(row, importance))[:excess]


def plan_user_cap(
    rows: Iterable[Any],
    active_counts: Mapping[str, int],
    *,
    cap: int,
    importance: Mapping | None = None,
) -> list[Action]:
    """Evict per user down to the cap; ``active_counts`` includes pinned rows."""
    by_user: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_user[row.user_id].append(row)
    actions = []
    for user_id in sorted(active_counts):
        chosen = choose_evictions(
            by_user[user_id], active=active_counts[user_id], cap=cap, importance=importance
        )
        actions += [soft_delete(NAME, r, REASON, active=active_counts[user_id]) for r in chosen]
    return actions


def over_cap_counts(ctx: BatchContext) -> dict[str, int]:
    """Active rows per over-cap user, counting records created earlier in this batch."""
    cap = ctx.settings.user_cap.max_memories
    floor = cap - max(ctx.created.values(), default=0)
    rows = ctx.conn.execute(q("user_cap_counts"), ctx.params(floor=floor))
    counts = {row.user_id: row.active + ctx.created[row.user_id] for row in rows}
    return {user: n for user, n in counts.items() if n > cap}


def plan(ctx: BatchContext) -> list[Action]:
    counts = over_cap_counts(ctx)
    if not counts:
        return []
    rows = ctx.conn.execute(q("user_cap_candidates"), ctx.params() | {"users": list(counts)})
    return plan_user_cap(
        rows, counts, cap=ctx.settings.user_cap.max_memories, importance=ctx.importance
    )
