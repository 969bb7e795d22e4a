"""decay: half-life confidence scores, and forgetting what decayed below the floor.

Options (``[decay]``, defaults in config/default.toml):
    half_life_days = 30.0          base half-life
    importance_multipliers = [...] half-life × this for importance 1..5
    forget_below = 0.05            decayed confidence under this → soft delete …
    forget_max_importance = 2      … only for importance ≤ this
    grace_days = 14                … and only for rows created at least this long ago
    epsilon = 0.01                 rewrite decayed_confidence only when it moved more than this

decayed = confidence × 0.5^(age / (half_life × multiplier[importance])), age measured from
greatest(created_at, updated_at, last_accessed_at) and never negative. It is a pure function
of stored columns and ``now``: re-running never compounds. Emits ``soft_delete`` with reason
``decayed``; score refreshes are counted as ``refreshed`` in the job, not listed. Pinned rows
are neither scored nor forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from gc_worker.actions import Action, soft_delete
from gc_worker.batch import BatchContext
from gc_worker.config import DecaySettings, Settings
from gc_worker.queries import q

NAME = "decay"
REASON = "decayed"
SECONDS_PER_DAY = 86_400.0
MAX_HALF_LIVES = 64  # beyond this the score is 0 (PostgreSQL `real` would underflow)
MIN_CONFIDENCE = 1e-6
EARLIEST = datetime.min.replace(tzinfo=UTC)  # gc_worker.db: what -infinity and BC load as


def decay_anchor(row: Any) -> datetime:
    return max(t for t in (row.created_at, row.updated_at, row.last_accessed_at) if t is not None)


def decayed_confidence(
    confidence: float, importance: int, anchor: datetime, *, now: datetime, policy: DecaySettings
) -> float:
    """The Python twin of the SQL function memory_gc_decayed (0 past 64 half-lives). An
    anchor at the earliest instant Python holds stands for one it cannot (-infinity, BC:
    gc_worker.db's loader), which SQL scores 0: so does this."""
    if anchor <= EARLIEST:
        return 0.0
    age_days = max((now - anchor).total_seconds(), 0.0) / SECONDS_PER_DAY
    half_lives = age_days / (policy.half_life_days * policy.importance_multipliers[importance - 1])
    if confidence < MIN_CONFIDENCE or half_lives >= MAX_HALF_LIVES:
        return 0.0
    return confidence * 0.5**half_lives


def plan_decay(
    rows: Iterable[Any], policy: DecaySettings, *, now: datetime, importance: dict | None = None
) -> list[Action]:
    """Soft-delete low-importance rows past the grace period whose score fell under the floor."""
    importance = importance or {}
    grace_cutoff = now - timedelta(days=policy.grace_days)
    actions = []
    for row in rows:
        level = importance.get(row.id, row.importance)
        if level > policy.forget_max_importance or row.created_at > grace_cutoff:
            continue
        score = decayed_confidence(row.confidence, level, decay_anchor(row), now=now, policy=policy)
        if score < policy.forget_below:
            actions.append(soft_delete(NAME, row, REASON, decayed_confidence=round(score, 6)))
    return actions


def rule_params(policy: DecaySettings, now: datetime) -> dict[str, Any]:
    """The binds of the candidates, refresh and triage queries, from the policy."""
    return {
        "half_life_days": policy.half_life_days,
        "multipliers": list(policy.importance_multipliers),
        "epsilon": policy.epsilon,
        "grace_cutoff": now - timedelta(days=policy.grace_days),
        "max_importance": policy.forget_max_importance,
        "forget_below": policy.forget_below,
    }


WORK = "work_decay"  # gc_worker.triage: users with scores to refresh (sql/triage.sql)
PICK = "pick_decay"  # … and the candidate rows to forget


def work_params(settings: Settings, now: datetime) -> dict[str, Any]:
    return rule_params(settings.decay, now)


def refresh_params(ctx: BatchContext) -> dict[str, Any]:
    return ctx.params(**rule_params(ctx.settings.decay, ctx.now))


def plan(ctx: BatchContext) -> list[Action]:
    policy = ctx.settings.decay
    rows = ctx.conn.execute(*ctx.candidates_query(NAME, "decay_candidates", refresh_params(ctx)))
    return plan_decay(rows, policy, now=ctx.now, importance=ctx.importance)


def refresh(ctx: BatchContext) -> int:
    """Rewrite moved scores (or, in a dry run, count them); runs after the batch's actions."""
    if ctx.dry_run:
        return int(ctx.conn.execute(q("decay_refresh_count"), refresh_params(ctx)).scalar_one())
    return ctx.conn.execute(q("decay_refresh"), refresh_params(ctx)).rowcount
