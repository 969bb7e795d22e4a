"""Differential property test of the read rule: memory_gc_current against a plain Python reading
of the documented rules (gc_worker.read_rule's docstring; docs/llm-jobs.md "The read rule").

Generated stores of one or two users: rows of every status (obsolete with and without a
supersession reason), a tiny set of slots and scopes (and none), `supersedes` naming rows of
the same and of the other user (and the row itself), sources of every trust, and timestamps
drawn from a handful of instants around NOW with exact boundaries and ties (ids too decide
ties). For every user, scope and instant of the grid the SQL result set must equal the
reference's, and the invariants must hold (scoped ⊆ unscoped, one row per slot, only the asked
user's rows, never deleted; never merged without known_at). known_at only in its simple form:
with no audit and no lineage (a status change after it reads as active with the row's own
valid_until; worker-derived records and the audit's prior valid_until are not exercised).

Rules 4 and 5 as migrations 0012 and 0018 read them (two current rows of equal trust that
declare each other shadow neither): an open-ended declaration replaces its target for
good (out of its slot's ranking), a temporary override hides it while the override runs (it
keeps its slot, so the value it replaced does not come back); "bounded" is the row's own
valid_until (no audit here, so no window the worker closed).

``READ_RULE_EXAMPLES`` (default 60; 2,000 in the session that added it) sets the number of
generated stores.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict
from datetime import timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from gc_worker.read_rule import SUPERSESSION_REASONS, current_memories
from tests.store import NOW

EXAMPLES = int(os.environ.get("READ_RULE_EXAMPLES", "60"))
USERS = ("u1", "u2")
SLOTS = (None, "a", "b")
SCOPES = (None, "x", "y")
US = timedelta(microseconds=1)
INSTANTS = (
    NOW - timedelta(hours=2),
    NOW - timedelta(hours=1),
    NOW - US,
    NOW,
    NOW + US,
    NOW + timedelta(hours=1),
)
SOURCES = (
    ("explicit_user_statement", {}),
    ("model_inference", {}),
    ("external", {}),
    ("something_else", {}),
    ("gc_merge", {}),
    ("gc_merge", {"trust_source": "explicit_user_statement"}),
    ("gc_merge", {"trust_source": "external"}),
)
STATUSES = (
    [("active", None)]
    + [("obsolete", r) for r in SUPERSESSION_REASONS]
    + [("obsolete", "review_rejected"), ("obsolete", None), ("merged", "exact_duplicates")]
    + [("deleted", "ttl_expired")]
)
INSERT = sa.text(
    "INSERT INTO memories (id, user_id, content, source, metadata, scope, slot, supersedes,"
    " importance, pinned, created_at, updated_at, observed_at, valid_from, valid_until,"
    " expires_at, status, status_reason, status_changed_at)"
    " VALUES (:id, :user_id, :content, :source, CAST(:metadata AS jsonb), :scope, :slot,"
    " CAST(:supersedes AS uuid[]), :importance, :pinned, :created_at, :created_at,"
    " :observed_at, :valid_from, :valid_until, :expires_at, :status, :status_reason,"
    " :status_changed_at)"
)

instant = st.sampled_from(INSTANTS)
maybe_instant = st.none() | instant


@st.composite
def stores(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 10))
    # small ids shrink well and make id ties easy to read; any uuid order is PostgreSQL's
    ids = draw(st.lists(st.integers(1, 2**128 - 1), min_size=n, max_size=n, unique=True))
    # starts, observed_at and created_at come from a few instants per store: ties are common
    pool = st.sampled_from(draw(st.lists(instant, min_size=1, max_size=3, unique=True)))
    sources = st.sampled_from(draw(st.lists(st.sampled_from(SOURCES), min_size=1, max_size=3)))
    statuses = st.sampled_from(STATUSES) | st.just(("active", None))  # half of them active
    rows = []
    for i, raw_id in enumerate(ids):
        status, reason = draw(statuses)
        source, metadata = draw(sources)
        rows.append(
            {
                "id": UUID(int=raw_id),
                "user_id": draw(st.sampled_from(USERS)),
                "content": f"row {i}",
                "source": source,
                "metadata": metadata,
                "scope": draw(st.sampled_from(SCOPES)),
                "slot": draw(st.sampled_from(SLOTS)),
                "supersedes_idx": draw(st.lists(st.integers(0, n - 1), max_size=2)),
                "importance": draw(st.integers(1, 5)),
                "pinned": draw(st.booleans()),
                "created_at": draw(pool),
                "observed_at": draw(pool),
                "valid_from": draw(st.none() | pool),
                "valid_until": draw(maybe_instant),
                "expires_at": draw(maybe_instant),
                "status": status,
                "status_reason": reason,
                "status_changed_at": draw(st.none() | instant)
                if status == "active"
                else draw(instant),
            }
        )
    for row in rows:
        row["supersedes"] = [rows[j]["id"] for j in row.pop("supersedes_idx")]
    return rows


# --- the reference: the documented rules, read literally ------------------------------------


def trust(row: dict[str, Any]) -> int:
    ranks = {"explicit_user_statement": 3, "model_inference": 2, "external": 1}
    if row["source"].startswith("gc_"):
        return ranks.get(row["metadata"].get("trust_source"), 2)
    return ranks.get(row["source"], 1)


def starts(row: dict[str, Any]) -> Any:
    return row["valid_from"] if row["valid_from"] is not None else row["observed_at"]


def as_known(row: dict[str, Any], known_at: Any) -> dict[str, Any]:
    """The row as it read at ``known_at``: a status change after it is ignored (no audit here,
    so the valid_until is the row's own); deleted rows stay deleted."""
    changed = row["status_changed_at"] is not None and row["status_changed_at"] > known_at
    if changed and row["status"] != "deleted":
        return row | {"status": "active"}
    return row


def reference(
    rows: list[dict[str, Any]], user: str, scope: str | None, at: Any, known_at: Any = None
) -> set[UUID]:
    mine = [r for r in rows if r["user_id"] == user]
    if known_at is not None:  # no lineage here: every row counts from its observed_at
        mine = [as_known(r, known_at) for r in mine if r["observed_at"] <= known_at]
    standing = [
        r for r in mine
        if r["status"] == "active"
        or (r["status"] == "obsolete" and r["status_reason"] in SUPERSESSION_REASONS)
    ]  # fmt: skip
    valid = [
        r for r in standing
        if starts(r) <= at
        and (r["valid_until"] is None or at < r["valid_until"])
        and (r["expires_at"] is None or at < r["expires_at"])
    ]  # fmt: skip

    def declarers(r: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            o for o in valid
            if o["id"] != r["id"] and r["id"] in o["supersedes"] and trust(o) >= trust(r)
            and not (o["id"] in r["supersedes"] and trust(o) == trust(r))  # declared back
        ]  # fmt: skip

    # an open-ended declaration replaces for good (out of the slot's ranking); a temporary
    # override (its own valid_until) hides the row while it runs, the row keeping its slot
    replaced = {r["id"] for r in valid if any(o["valid_until"] is None for o in declarers(r))}
    hidden = {r["id"] for r in valid if any(o["valid_until"] is not None for o in declarers(r))}
    ranked = [r for r in valid if r["id"] not in replaced]
    slots: dict[str, list[dict[str, Any]]] = defaultdict(list)
    kept = []
    for r in ranked:
        if r["slot"] is None:
            kept.append(r)
        else:
            slots[r["slot"]].append(r)
    for members in slots.values():
        kept.append(max(members, key=lambda r: (
            trust(r), r["valid_until"] is not None, starts(r), r["observed_at"], r["created_at"],
            r["id"],
        )))  # fmt: skip
    return {
        r["id"] for r in kept if r["id"] not in hidden and (scope is None or r["scope"] == scope)
    }


PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    # the test's database is emptied per example, so the per-test fixture is harmless
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(rows=stores(), known=st.none() | instant)
def test_memory_gc_current_matches_the_documented_rules(engine, rows, known):
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memories"))
        conn.execute(INSERT, [r | {"metadata": json.dumps(r["metadata"])} for r in rows])
    by_id = {r["id"]: r for r in rows}
    with engine.connect() as conn:
        for user, known_at, at in itertools.product(USERS, {None, known}, INSTANTS):
            unscoped: set[UUID] = set()
            for scope in (None, "x", "y", "z"):
                ids = [m["id"] for m in current_memories(conn, user, scope, at, known_at)]
                note(f"{user=} {scope=} at={at - NOW} {known_at=} got={sorted(ids)}")
                assert len(ids) == len(set(ids))
                assert all(by_id[i]["user_id"] == user for i in ids)
                assert all(by_id[i]["status"] != "deleted" for i in ids)
                if known_at is None:
                    assert all(by_id[i]["status"] != "merged" for i in ids)
                else:
                    assert all(by_id[i]["observed_at"] <= known_at for i in ids)
                if scope is None:
                    unscoped = set(ids)
                    slot_values = [by_id[i]["slot"] for i in ids if by_id[i]["slot"]]
                    assert len(slot_values) == len(set(slot_values))
                else:
                    assert set(ids) <= unscoped
                assert set(ids) == reference(rows, user, scope, at, known_at)
