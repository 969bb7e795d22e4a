"""The read rule for the request path: what is current for a user at an instant.

SQL: ``SELECT * FROM memory_gc_current(user_id, scope, at, known_at)`` (migrations 0012, 0018); the
Python twin is ``current_memories``. A memory is current at ``at`` when all of these hold:

1. Known: with ``known_at``, only records observed by then (``observed_at <= known_at``; a
   record the worker derived — a merge or summary — counts from when it was written), and any
   status change after ``known_at`` is ignored (the row is read as it was: active, with the
   ``valid_until`` it had before the worker closed it, taken from the audit).
2. Standing: status ``active``, or ``obsolete`` with a reason that means "true until replaced"
   (``SUPERSESSION_REASONS``: its validity window was closed at the replacement's start, so it
   stays current for instants before that). Merged rows are represented by their merged record;
   deleted rows never come back, whatever ``known_at`` says (deletions include erasure).
3. Valid: ``coalesce(valid_from, observed_at) <= at < valid_until`` (no valid_until = open) and
   not expired (``expires_at`` null or after ``at``).
4. Not shadowed: no other row current at ``at`` that declares it in ``supersedes`` and is at
   least as trusted (a temporary override shadows what it overrides only inside its window).
   An open-ended declaration replaces its target for good: the target leaves its slot's
   ranking. A temporary override only hides it: the target keeps its slot while hidden, so
   the value it replaced does not come back in its place. Two rows of equal trust declaring
   each other shadow neither (migration 0018).
5. One per slot (per user, whatever the scope; migration 0009 undid 0008's per-scope ranking):
   among the rows of one ``slot``, the most trusted wins, then a bounded override (one with a
   ``valid_until`` of its own — not one the worker closed at its replacement) over an
   open-ended one, then the newest start, ``observed_at``, ``created_at``, and the higher id
   (jobs.contradiction_rules.recency's order).

``scope=None`` means every scope; a scope filters what the rules leave (a scoped read is a
subset of the unscoped one). Rows come back most important first, then newest.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine

from gc_worker.queries import q

SUPERSESSION_REASONS = (
    "superseded",
    "slot_replaced",
    "contradicted",
    "validity_ended",
    "review_superseded",
)


def current_memories(
    conn_or_engine: Connection | Engine,
    user_id: str,
    scope: str | None,
    at: datetime,
    known_at: datetime | None = None,
) -> list[dict[str, Any]]:
    """The user's memories current at ``at`` as known at ``known_at`` (None = now)."""
    if at.tzinfo is None or (known_at is not None and known_at.tzinfo is None):
        raise ValueError("`at` and `known_at` must be timezone-aware")
    params = {"user_id": user_id, "scope": scope, "at": at, "known_at": known_at}
    if isinstance(conn_or_engine, Engine):
        with conn_or_engine.connect() as conn:
            return _read(conn, params)
    return _read(conn_or_engine, params)


def _read(conn: Connection, params: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(q("read_current"), params).mappings()]
