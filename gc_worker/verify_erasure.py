"""Prove an erasure: scan the store and every worker table for what was erased.

``verify(engine, user_id=… | memory_id=…)`` looks, in ``memories``, ``memory_lineage`` and every
``gc_*`` table (``all_tables=True``: every table of the schema), at each text, varchar, json,
jsonb, uuid and array column — discovered through information_schema, so a table added later is
covered without a code change — for

- the erased ids (any UUID inside a value, json keys included); the audit (``gc_actions``) and
  the erasure's own records keep ids by design, as do other memories' ``supersedes`` /
  ``superseded_by`` pointers and a pending batch's picked candidates (``gc_run_batches.work``):
  ids carry no content;
- the erased content: every string is normalised and hashed with the row's user and compared with
  the tombstones' hashes (whole content, and its first 200 characters as previews show it), so
  the check needs no copy of what it looks for. A content quoted inside a longer text is not seen
  by this check (the id check covers records that name the memory);
- for a forgotten user, anything the worker still keeps about them from before the request was
  completed: cached model decisions, review items, audit rows not scrubbed (``user``) — these
  can hold text derived from memories no longer in the store (no tombstone, no id to find).

A pending request is a residue too (nothing was erased yet). Rows of a table that has a
``user_id`` column are read for the erased user only; other tables are read whole. The result is
recorded on the covered requests (``result.verification``); a clean one sets ``verified_at``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from gc_worker.config import check_clock
from gc_worker.db import transaction
from gc_worker.erasure_scrub import KEEP_DETAILS, audited_reach, gone_ids
from gc_worker.errors import NotFoundError, UsageError
from gc_worker.queries import q
from jobs.similarity import content_hash

# Where an erased id may stay: the audit skeleton and the erasure's own records.
ID_EXEMPT_TABLES = frozenset({"gc_actions", "gc_erasure_requests", "gc_erasure_tombstones"})
ID_EXEMPT_COLUMNS = frozenset(
    {
        ("memories", "supersedes"),
        ("memories", "superseded_by"),
        (
            "gc_run_batches",
            "work",
        ),  # a pending (or failed) batch's picked candidates (dropped when done)
    }
)
UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
MAX_RECORDED = 100  # findings kept in the request's result (all are returned and printed)


@dataclass(frozen=True)
class Residue:
    table: str
    column: str
    row: str  # the row's id, else its ctid
    match: str  # "id" | "content" | "pending"

    def describe(self) -> str:
        what = {
            "id": "an erased id",
            "content": "erased content",
            "pending": "request pending",
            "user": "kept about the forgotten user",
        }
        return f"{self.table}.{self.column} row {self.row}: {what[self.match]}"


@dataclass
class Verification:
    target: str
    user_id: str
    request_ids: list[UUID]
    residues: list[Residue] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)  # the users the requests name, oldest first
    tables: int = 0
    columns: int = 0

    @property
    def clean(self) -> bool:
        return not self.residues

    def record(self, now: datetime) -> dict[str, Any]:
        return {
            "checked_at": now.isoformat(),
            "residues": len(self.residues),
            "tables": self.tables,
            "columns": self.columns,
            "findings": [vars(r) for r in self.residues[:MAX_RECORDED]],
        }


@dataclass(frozen=True)
class Needles:
    """What to look for: erased ids, and the user's tombstone hashes."""

    user_id: str
    ids: frozenset[str]
    hashes: frozenset[str]

    def matches(self, value: Any, *, ids: bool) -> set[str]:
        found: set[str] = set()
        for leaf in _leaves(value):
            if isinstance(leaf, UUID):
                leaf = str(leaf)
            if ids and any(m.lower() in self.ids for m in UUID_TEXT.findall(leaf)):
                found.add("id")
            if content_hash(self.user_id, leaf) in self.hashes:
                found.add("content")
        return found


def _leaves(value: Any) -> Iterator[Any]:
    """Every string (or UUID) inside a column value: json keys and values, array elements."""
    if isinstance(value, str | UUID):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)


def verify(
    engine: Engine,
    *,
    now: datetime,
    user_id: str | None = None,
    memory_id: UUID | None = None,
    all_tables: bool = False,
) -> Verification:
    """Scan for residues of the erasures of a user (or of one memory) and record the result."""
    if (user_id is None) == (memory_id is None):
        raise UsageError("verify-erasure takes a user id or --memory ID")
    check_clock(now, f"the verification's `now` ({now.isoformat()})")
    with transaction(engine) as conn:
        result = _verification(conn, user_id, memory_id)
        # one memory's requests may name different users (one filed under the wrong user, which
        # completes once the row is gone): each user's rows and hashes are checked
        for owner in result.owners:
            result.user_id = owner
            needles = _needles(conn, result, memory_id)
            _scan(conn, result, needles, all_tables=all_tables)
            result.residues += _audit_kept(conn, needles)
        result.user_id = result.owners[0]
        result.residues = list(dict.fromkeys(result.residues))
        if user_id is not None:
            result.residues += [
                Residue(row.table_name, row.column_name, row.row_key, "user")
                for row in conn.execute(q("erasure_user_leftovers"), {"user_id": user_id})
            ]
        params = {
            "ids": result.request_ids,
            "verification": json.dumps(result.record(now)),
            "clean": result.clean,
            "now": now,
        }
        conn.execute(q("erasure_record_verification"), params)
    return result


def _verification(conn: Connection, user_id: str | None, memory_id: UUID | None) -> Verification:
    params = {"user_id": user_id, "memory_id": memory_id}
    requests = conn.execute(q("erasure_requests_for"), params).mappings().all()
    if not requests:
        target = f"user {user_id!r}" if user_id is not None else f"memory {memory_id}"
        hint = f"forget-user {user_id}" if user_id is not None else f"forget {memory_id}"
        raise NotFoundError(f"no erasure request for {target}; file one with `memory-gc {hint}`")
    # a memory's check is its memory requests': a forget-user that erased the row too (its id
    # on the tombstone) would widen it to every row of the user, and a clean result would set
    # the user request's verified_at without the user's own check
    covered = [r for r in requests if user_id is not None or r["kind"] == "memory"]
    result = Verification(
        target=f"user {user_id}" if user_id is not None else f"memory {memory_id}",
        user_id=requests[0]["user_id"],
        request_ids=[r["id"] for r in covered],
        owners=list(dict.fromkeys(r["user_id"] for r in requests)),
    )
    result.residues += [
        Residue("gc_erasure_requests", "status", str(r["id"]), "pending")
        for r in requests
        if r["status"] == "pending"
    ]
    return result


def _needles(conn: Connection, result: Verification, memory_id: UUID | None) -> Needles:
    params = {
        "user_id": result.user_id if memory_id is None else None,
        "request_ids": result.request_ids,
        "memory_id": memory_id,
    }
    tombstones = conn.execute(q("erasure_tombstones_for"), params).all()
    ids = {str(t.memory_id) for t in tombstones}
    asked = _requested_memories(conn, result.request_ids)
    # and the records the audit says they were made into or from, gone since (the application
    # deleted a summary of a merge of the memory): what is kept about them states its facts
    ids |= {str(r) for r in [*(m for m, _ in asked), *audited_reach(conn, asked)]}
    if memory_id is not None:
        ids.add(str(memory_id))
    hashes = {h for t in tombstones for h in (t.content_hash, t.preview_hash)}
    return Needles(result.user_id, frozenset(ids), frozenset(hashes))


def _audit_kept(conn: Connection, needles: Needles) -> list[Residue]:
    """What any user's rows still hold about an erased id no longer stored (or erased), as the
    scrub reaches it: audit and plan rows with text, cached decisions and review items naming
    it. Under a user the memory belonged to before the application moved it, the hash check
    does not recognise the text, and those tables are read for the request's user only."""
    gone = gone_ids(conn, [UUID(i) for i in sorted(needles.ids)])
    params = {"gone": gone, "gone_texts": [str(g) for g in gone],
              "keep_details": list(KEEP_DETAILS)}  # fmt: skip
    rows = conn.execute(q("erasure_audit_kept"), params) if gone else []
    return [
        Residue(row.table_name, row.column_name, row.row_key,
                "content" if row.table_name == "gc_actions" else "id")
        for row in rows
    ]  # fmt: skip


def _requested_memories(conn: Connection, request_ids: Sequence[UUID]) -> list[tuple[UUID, str]]:
    """(memory id, user) of the memory requests among ``request_ids``."""
    rows = conn.execute(
        text("SELECT memory_id, user_id FROM gc_erasure_requests WHERE id = ANY(:ids)"),
        {"ids": request_ids},
    )
    return [(r.memory_id, r.user_id) for r in rows if r.memory_id is not None]


def _scan(conn: Connection, result: Verification, needles: Needles, *, all_tables: bool) -> None:
    tables: dict[str, list[Any]] = {}
    for row in conn.execute(q("erasure_scanned_columns"), {"all_tables": all_tables}):
        tables.setdefault(row.table_name, []).append(row)
    result.tables = len(tables)
    result.columns = sum(map(len, tables.values()))
    for table, columns in tables.items():
        result.residues += _scan_table(conn, table, columns, needles)


def _scan_table(
    conn: Connection, table: str, columns: list[Any], needles: Needles
) -> list[Residue]:
    names = [c.column_name for c in columns]
    residues = []
    sql, params = _table_query(conn, table, columns, needles)
    for row in conn.execute(sql.execution_options(yield_per=1000), params):
        key, values = row[0], row[1:]
        for column, value in zip(names, values, strict=True):
            if value is None:
                continue
            check_ids = table not in ID_EXEMPT_TABLES and (table, column) not in ID_EXEMPT_COLUMNS
            for match in sorted(needles.matches(value, ids=check_ids)):
                residues.append(Residue(table, column, str(key), match))
    return residues


def _table_query(
    conn: Connection, table: str, columns: list[Any], needles: Needles
) -> tuple[Any, dict[str, Any]]:
    """Rows worth reading: the user's (tables with a user_id column), rows naming an erased id
    (tables whose scanned columns are all ids), else every row."""
    quote = conn.dialect.identifier_preparer.quote
    present = set(
        conn.execute(
            text(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = :t"
            ),
            {"t": table},
        ).scalars()
    )
    key = "CAST(id AS text)" if "id" in present else "CAST(ctid AS text)"
    select = f"SELECT {key}, {', '.join(quote(c.column_name) for c in columns)} FROM {quote(table)}"
    params: dict[str, Any] = {"ids": sorted(needles.ids), "user_id": needles.user_id}
    if "user_id" in present:
        where = ["CAST(user_id AS text) = :user_id"]
        if table == "memories":
            where.append("id = ANY(CAST(:ids AS uuid[]))")
    elif all(c.data_type == "uuid" or c.udt_name == "_uuid" for c in columns):
        where = [
            f"{quote(c.column_name)} && CAST(:ids AS uuid[])"
            if c.udt_name == "_uuid"
            else f"{quote(c.column_name)} = ANY(CAST(:ids AS uuid[]))"
            for c in columns
        ]
    else:
        where = ["true"]
    return text(f"{select} WHERE {' OR '.join(where)}"), params
