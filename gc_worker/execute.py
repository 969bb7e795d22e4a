"""The one executor: carries out a batch's actions inside the caller's transaction.

1. Lock every row the actions name and compare its version (xmin; for merges, contradiction
   obsoletes, importance scores and erasures its content version:
   gc_worker.actions.CONTENT_VERSIONED) with the one recorded when the action was planned. A
   row that is gone or changed has *drifted*: its action — and every action of the same group
   — is skipped and reported, never applied. A row an application transaction holds right now
   is skipped too (``SKIP LOCKED``), never waited for, so the worker cannot deadlock with the
   request path; it is planned again next run. An action whose decision rested on other rows
   (``broken_premises``) drifts if those changed. (gc_worker.drift; the purges held back while
   what they rest on does not apply: gc_worker.purge_holds.)
2. Apply the rest with set-based statements, each checked against the count it was given
   (a mismatch raises, and the caller's transaction rolls back whole).
3. Return what was applied with each row's prior state, for the audit and for restore.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection

from gc_worker.actions import CONTENT_VERSIONED, ERASURE_REASONS, TARGET_STATUS, Action, Kind
from gc_worker.drift import broken_premises, lock_rows
from gc_worker.errors import RunFailed
from gc_worker.purge_holds import hold_purges
from gc_worker.queries import q

# The columns a row's prior state records (the lock_rows query builds them as JSON:
# gc_worker.drift.lock_rows).
PRIOR_FIELDS = (
    "status",
    "status_reason",
    "status_changed_at",
    "superseded_by",
    "deleted_at",
    "valid_until",
    "importance",
    "importance_assessed_at",
)


@dataclass
class Outcome:
    applied: list[Action] = field(default_factory=list)
    drifted: list[Action] = field(default_factory=list)
    prior: dict[UUID, str] = field(default_factory=dict)  # each locked row's prior state, JSON


def execute(
    conn: Connection, actions: Sequence[Action], *, now: datetime, run_id: UUID | None = None
) -> Outcome:
    """Apply ``actions`` (in plan order) in ``conn``'s transaction; see the module docstring."""
    versions, prior = lock_rows(conn, actions)
    broken = broken_premises(conn, actions, versions)
    splices: list[tuple[UUID, UUID]] = []
    drifted = hold_purges(conn, actions, versions, broken, splices)
    outcome = Outcome(prior=prior)
    for action in actions:
        (outcome.drifted if id(action) in drifted else outcome.applied).append(action)
    _apply(conn, outcome.applied, now=now, splices=splices)
    _queue_reviews(conn, [a for a in outcome.applied if a.action is Kind.REVIEW], run_id)
    return outcome


def _apply(
    conn: Connection, actions: list[Action], *, now: datetime,
    splices: Sequence[tuple[UUID, UUID]] = (),
) -> None:  # fmt: skip
    by_kind: dict[Kind, list[Action]] = {}
    for action in actions:
        by_kind.setdefault(action.action, []).append(action)
    _create_records(conn, by_kind.get(Kind.CREATE_MERGED, []), now=now)
    _set_importance(conn, by_kind.get(Kind.SET_IMPORTANCE, []), now=now)
    statuses = [a for kind in TARGET_STATUS for a in by_kind.get(kind, [])]
    _set_status(conn, statuses, now=now)
    _purge(conn, by_kind.get(Kind.HARD_DELETE, []), splices)


def _checked(conn: Connection, name: str, params: dict[str, Any], expected: int) -> None:
    touched = len(conn.execute(q(name), params).all())
    if touched != expected:
        raise RunFailed(
            f"{name} touched {touched} rows where {expected} were planned and locked; "
            "the batch was rolled back"
        )


def _set_status(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    params = {
        "now": now,
        "ids": [a.memory_id for a in actions],
        "statuses": [TARGET_STATUS[a.action] for a in actions],
        "reasons": [a.reason for a in actions],
        "superseded": [_uuid_or_none(a.details.get("superseded_by")) for a in actions],
        "valid_until": [a.details.get("close_valid_until") for a in actions],
        "erasure_reasons": list(ERASURE_REASONS),
    }
    _checked(conn, "apply_status", params, len(actions))


def _set_importance(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    params = {
        "now": now,
        "ids": [a.memory_id for a in actions],
        "importance": [int(a.details["importance"]) for a in actions],
    }
    _checked(conn, "apply_importance", params, len(actions))


def _create_records(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    records = [dict(a.details["record"], id=str(a.memory_id), user_id=a.user_id) for a in actions]
    _checked(conn, "insert_records", {"records": json.dumps(records), "now": now}, len(actions))
    derived = [a.memory_id for a in actions for _ in a.details["sources"]]
    sources = [UUID(str(s)) for a in actions for s in a.details["sources"]]
    conn.execute(q("insert_lineage"), {"derived": derived, "sources": sources})
    # a read of a member since planning does not drift a merge (content version): the record
    # takes its members' access bookkeeping as it is now, not as planned
    merged = [a.memory_id for a in actions if (a.job, Kind.MERGE) in CONTENT_VERSIONED]
    if merged:
        conn.execute(q("merged_access"), {"ids": merged})


def _purge(
    conn: Connection, actions: list[Action], splices: Sequence[tuple[UUID, UUID]] = ()
) -> None:
    """Delete the rows, then every copy of their content the worker keeps: their own audit and
    plan rows, deferred groups' previews, records merged or summarised from them in plans and
    audit (cut to ids and codes, as an erasure scrubs), cached model decisions about them."""
    if not actions:
        return
    from gc_worker.erasure_scrub import KEEP_DETAILS  # (it imports this module)

    ids = [a.memory_id for a in actions]
    id_texts = [str(i) for i in ids]
    if splices:  # their rows are key-share locked (purge_holds): the inserts wait on nothing
        derived, sources = zip(*splices, strict=True)
        conn.execute(q("insert_lineage"), {"derived": list(derived), "sources": list(sources)})
    _checked(conn, "purge_rows", {"ids": ids}, len(ids))
    conn.execute(q("scrub_audit"), {"ids": ids, "id_texts": id_texts})
    params = {"id_texts": id_texts, "keep_details": list(KEEP_DETAILS)}
    conn.execute(q("scrub_created_from_purged"), params)
    conn.execute(q("drop_llm_cache_of_purged"), {"ids": ids})


def _queue_reviews(conn: Connection, actions: list[Action], run_id: UUID | None) -> None:
    if not actions:
        return
    items = [
        {
            "user_id": a.user_id,
            "kind": a.details.get("kind", a.job),
            "memory_ids": [str(m) for m in a.details.get("memory_ids", [a.memory_id])],
            "reason": a.reason,
            "details": dict(a.details),
        }
        for a in actions
    ]
    _checked(conn, "insert_reviews", {"run_id": run_id, "items": json.dumps(items)}, len(items))


def _uuid_or_none(value: Any) -> UUID | None:
    return None if value is None else UUID(str(value))
