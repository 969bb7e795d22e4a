"""The practical limit: hand-written set-based SQL making the same changes as memory-gc's
deterministic jobs, one statement per job over the whole store, in one transaction.

Same order and rules as ttl_expiry → decay (forget) → usage_prune → user_cap → hard_delete →
decay (score refresh), each statement seeing what the ones before it changed, exactly as a
memory-gc batch plans each job against what the earlier jobs retired. The end state of
``memories`` (and ``memory_lineage``) is the same as memory-gc's; bench.compare checks it.

Two variants:

- ``audit=False``: the bare statements (what a cron job of UPDATEs would do);
- ``audit=True``: each statement also writes memory-gc's audit row per changed memory into
  ``gc_actions`` in the same statement (``UPDATE … RETURNING old.*`` feeding an INSERT, with the
  row's prior state, version and content preview, as the executor does), and purges scrub the
  audit like memory-gc's. This is the fair comparison: memory-gc always writes its audit.

Decay uses the store's own ``memory_gc_decayed`` SQL function (memory-gc additionally checks the
score in Python in float64; the two agree except within ~1e-8 of the floor).

The statement builders take a ``scope`` so bench.naive can run the same rules per user.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from bench import DETERMINISTIC_JOBS
from gc_worker.actions import ERASURE_REASONS
from gc_worker.config import Settings

ALL_USERS = "TRUE"
ONE_USER = "m.user_id = :user"

DECAYED = """memory_gc_decayed(m.confidence, m.importance,
    greatest(m.created_at, m.updated_at, m.last_accessed_at), :now,
    :half_life_days, :multipliers)"""

PRIOR = """jsonb_build_object('status', old.status, 'status_reason', old.status_reason,
    'status_changed_at', old.status_changed_at, 'superseded_by', old.superseded_by,
    'deleted_at', old.deleted_at, 'valid_until', old.valid_until, 'importance', old.importance,
    'importance_assessed_at', old.importance_assessed_at)"""


@dataclass(frozen=True)
class Retire:
    """One soft-delete rule: which active rows, the audit details, an optional FROM."""

    job: str
    reason: str
    where: str
    details: str
    from_: str = ""


def _cap_ranked(scope: str) -> str:
    inner = scope.replace("m.", "x.")
    return f"""(
    SELECT r.id, r.active FROM (
        SELECT x.id, o.active, row_number() OVER (
                   PARTITION BY x.user_id
                   ORDER BY x.importance, coalesce(x.last_accessed_at, x.created_at),
                            x.created_at, x.id) AS rank
        FROM memories x
        JOIN (SELECT x.user_id, count(*) AS active FROM memories x
              WHERE x.status = 'active' AND {inner}
              GROUP BY x.user_id HAVING count(*) > :cap) o ON o.user_id = x.user_id
        WHERE x.status = 'active' AND NOT x.pinned
    ) r WHERE r.rank <= r.active - :cap) c"""


def retire_rules(scope: str) -> list[Retire]:
    live = "m.status = 'active' AND NOT m.pinned"
    return [
        Retire("ttl_expiry", "ttl_expired", f"{live} AND m.expires_at <= :now",
               "jsonb_build_object('expires_at', old.expires_at)"),
        Retire("decay", "decayed",
               f"{live} AND m.created_at <= :decay_grace"
               f" AND m.importance <= :decay_max_importance AND {DECAYED} < :forget_below",
               f"jsonb_build_object('decayed_confidence', round(({DECAYED})::numeric, 6))"),
        Retire("usage_prune", "unused",
               f"{live} AND coalesce(m.last_accessed_at, m.created_at) <= :unused_cutoff"
               " AND m.created_at <= :usage_grace AND m.importance <= :usage_max_importance",
               "jsonb_build_object('last_used', coalesce(old.last_accessed_at, old.created_at))"),
        Retire("user_cap", "over_cap", "m.id = c.id", "jsonb_build_object('active', c.active)",
               from_=f"FROM {_cap_ranked(scope)}"),
    ]  # fmt: skip


def retire_sql(rule: Retire, scope: str, *, audit: bool) -> str:
    update = f"""UPDATE memories m
SET status = 'deleted', status_reason = '{rule.reason}', status_changed_at = :now, deleted_at = :now
{rule.from_}
WHERE {rule.where} AND {scope}"""
    if not audit:
        return update
    return f"""WITH changed AS (
{update}
RETURNING m.id, m.user_id, old.xmin::text::bigint AS row_version,
          left(m.content, 200) AS preview, {rule.details} AS details, {PRIOR} AS prior
)
INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id, reason, details,
                        row_version, outcome, prior, content_preview)
SELECT :run_id, 0, row_number() OVER (), '{rule.job}', 'soft_delete', id, user_id,
       '{rule.reason}', details, row_version, 'applied', prior, preview
FROM changed"""


PURGEABLE = """(m.status = 'deleted' AND m.status_reason = ANY(:erasure_reasons)
       AND coalesce(m.deleted_at, m.status_changed_at) <= :erasure_cutoff)
   OR (m.status = 'deleted' AND (NOT m.pinned OR m.status_reason = ANY(:erasure_reasons))
       AND coalesce(m.deleted_at, m.status_changed_at) <= :deleted_cutoff)
   OR (m.status IN ('obsolete', 'merged') AND NOT m.pinned
       AND coalesce(m.status_changed_at, m.updated_at) <= :history_cutoff)"""

PURGE_REASON = """CASE
    WHEN m.status = 'deleted' AND m.status_reason = ANY(:erasure_reasons)
         AND coalesce(m.deleted_at, m.status_changed_at) <= :erasure_cutoff
    THEN 'retention_erasure'
    WHEN m.status = 'deleted' THEN 'retention_deleted' ELSE 'retention_history' END"""


def purge_sql(scope: str, *, audit: bool) -> str:
    delete = f"DELETE FROM memories m WHERE ({PURGEABLE}) AND {scope}"
    if not audit:
        return delete
    prior = PRIOR.replace("old.", "m.")
    return f"""WITH gone AS (
{delete}
RETURNING m.id, m.user_id, m.xmin::text::bigint AS row_version, {PURGE_REASON} AS reason,
          jsonb_build_object('status', m.status, 'status_reason', m.status_reason) AS details,
          {prior} AS prior
), scrubbed AS (
UPDATE gc_actions a SET content_preview = NULL, details = a.details - 'record' - 'content'
FROM gone WHERE a.memory_id = gone.id
  AND (a.content_preview IS NOT NULL OR a.details ?| array['record', 'content'])
RETURNING 1
)
INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id, reason, details,
                        row_version, outcome, prior)
SELECT :run_id, 0, row_number() OVER (), 'hard_delete', 'hard_delete', id, user_id, reason,
       details, row_version, 'applied', prior
FROM gone"""


def refresh_sql(scope: str) -> str:
    return f"""UPDATE memories m SET decayed_confidence = {DECAYED}
WHERE m.status = 'active' AND NOT m.pinned AND {scope}
  AND (m.decayed_confidence IS NULL OR abs(m.decayed_confidence - {DECAYED}) > :epsilon)"""


def statements(scope: str, *, audit: bool) -> Iterator[tuple[str, sa.TextClause]]:
    """(label, statement) in memory-gc's order; labels are job names, ``refresh`` last."""
    for rule in retire_rules(scope):
        yield rule.job, sa.text(retire_sql(rule, scope, audit=audit))
    yield "hard_delete", sa.text(purge_sql(scope, audit=audit))
    yield "refresh", sa.text(refresh_sql(scope))


def params(settings: Settings, now: datetime) -> dict[str, Any]:
    """Every bind the statements take, from the same settings memory-gc runs with."""
    decay, usage = settings.decay, settings.usage_prune
    hard = settings.hard_delete
    return {
        "now": now,
        "half_life_days": decay.half_life_days,
        "multipliers": list(decay.importance_multipliers),
        "forget_below": decay.forget_below,
        "decay_grace": now - timedelta(days=decay.grace_days),
        "decay_max_importance": decay.forget_max_importance,
        "epsilon": decay.epsilon,
        "unused_cutoff": now - timedelta(days=usage.unused_days),
        "usage_grace": now - timedelta(days=usage.grace_days),
        "usage_max_importance": usage.max_importance,
        "cap": settings.user_cap.max_memories,
        "deleted_cutoff": now - timedelta(days=hard.retention_days),
        "history_cutoff": now - timedelta(days=hard.history_retention_days),
        "erasure_cutoff": now - timedelta(days=settings.erasure.retention_days),
        "erasure_reasons": list(ERASURE_REASONS),
    }


def _insert_run(conn: Connection, run_id: UUID, now: datetime) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO gc_runs (id, mode, status, trigger, now, jobs, finished_at)"
            " VALUES (:id, 'apply', 'completed', 'bench_set_based', :now, :jobs, now())"
        ),
        {"id": run_id, "now": now, "jobs": list(DETERMINISTIC_JOBS)},
    )


def apply_set_based(
    engine: Engine, settings: Settings, *, now: datetime, audit: bool
) -> dict[str, int]:
    """Run the set-based statements in one transaction; rows changed per step."""
    binds = params(settings, now)
    counts: dict[str, int] = {}
    with engine.begin() as conn:
        if audit:
            binds["run_id"] = uuid4()
            _insert_run(conn, binds["run_id"], now)
        for label, statement in statements(ALL_USERS, audit=audit):
            counts[label] = conn.execute(statement, binds).rowcount
    return counts
