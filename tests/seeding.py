"""Seeding and comparing stores for the reliability tests (real SQL, real databases).

- ``seed(engine, rows)`` inserts rows in ``tests.strategies`` format in one statement;
  ``row(user, label, **columns)`` builds one with an id derived from (user, label), so twin
  databases hold the same ids; ``lifecycle_rows(user)`` gives every deterministic rule work.
- ``full_snapshot`` reads every column, the embedding and the row version included;
  ``end_state`` names the records the worker created by their lineage, so two databases can
  be compared; ``state_diff`` says where they differ.
- ``Reusable`` / ``reusable_database``: a database cloned once per module and emptied before
  each use; ``scratch_database``: a clone dropped afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

import sqlalchemy as sa

from gc_worker import db
from tests.store import NOW
from tests.strategies import BASES

INSERT = sa.text(
    "INSERT INTO memories (id, user_id, content, embedding, source, slot, supersedes, importance,"
    " importance_assessed_at, confidence, pinned, created_at, updated_at, last_accessed_at,"
    " access_count, observed_at, valid_from, valid_until, expires_at, metadata, status,"
    " status_reason, status_changed_at, deleted_at, superseded_by)"
    " VALUES (:id, :user_id, :content, CAST(:embedding AS vector), :source, :slot,"
    " CAST(:supersedes AS uuid[]), :importance, :importance_assessed_at, :confidence, :pinned,"
    " :created_at, :updated_at, :last_accessed_at, :access_count, :observed_at, :valid_from,"
    " :valid_until, :expires_at, CAST(:metadata AS jsonb), :status, :status_reason,"
    " :status_changed_at, :deleted_at, :superseded_by)"
)


def seed(engine: sa.Engine, rows: list[dict[str, Any]]) -> None:
    """Insert generated rows in one statement."""
    params = [
        row | {"embedding": _vector(row["embedding"]), "metadata": json.dumps(row["metadata"])}
        for row in rows
    ]
    with engine.begin() as conn:
        conn.execute(INSERT, params)


def _vector(values: list[float] | None) -> str | None:
    return None if values is None else "[" + ",".join(repr(float(v)) for v in values) + "]"


def full_snapshot(engine: sa.Engine) -> dict[UUID, dict[str, Any]]:
    """Every memory row with every column, the embedding as text and the row version."""
    query = "SELECT m.*, m.xmin::text::bigint AS row_xmin FROM memories m ORDER BY id"
    with engine.connect() as conn:
        return {row["id"]: dict(row) for row in conn.execute(sa.text(query)).mappings()}


def lineage(engine: sa.Engine) -> dict[UUID, tuple[str, ...]]:
    """derived id → its sorted source ids."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT derived_id, source_id FROM memory_lineage")).all()
    sources: dict[UUID, list[str]] = {}
    for derived, source in rows:
        sources.setdefault(derived, []).append(str(source))
    return {derived: tuple(sorted(ids)) for derived, ids in sources.items()}


def end_state(engine: sa.Engine, original: set[UUID]) -> dict[Any, dict[str, Any]]:
    """A comparable snapshot: created records keyed by their sources instead of a fresh uuid;
    retired rows without their (no longer maintained) decay score."""
    rows, sources = full_snapshot(engine), lineage(engine)

    def name(memory_id: Any) -> Any:
        if memory_id is None or memory_id in original:
            return memory_id
        return ("created", sources.get(memory_id, ()))

    state = {}
    for memory_id, row in rows.items():
        row = {k: v for k, v in row.items() if k not in ("row_xmin", "id")}
        row["superseded_by"] = name(row["superseded_by"])
        if row["status"] != "active":  # decay scores are kept for active rows only
            row.pop("decayed_confidence")
        state[name(memory_id)] = row
    return state


_databases = itertools.count()


@contextlib.contextmanager
def scratch_database(pg_server: Any, template: str, label: str) -> Iterator[sa.Engine]:
    """A clone of the migrated template, dropped afterwards (for a test's second database)."""
    name = f"memory_gc_{label}_{os.getpid()}_{next(_databases)}"
    pg_server.psql(f"CREATE DATABASE {name} TEMPLATE {template};")
    engine = db.make_engine(pg_server.get_uri(name, driver="psycopg"))
    try:
        yield engine
    finally:
        engine.dispose()
        pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);")


def empty_tables(engine: sa.Engine) -> list[str]:
    """The tables of a freshly migrated database that hold no rows (what ``reset`` empties)."""
    query = "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
    with engine.connect() as conn:
        tables = list(conn.execute(sa.text(query)).scalars())
        return [
            t for t in tables if not conn.execute(sa.text(f"SELECT EXISTS (TABLE {t})")).scalar()
        ]


class Reusable:
    """A database cloned once per module and emptied before each use: milliseconds per fresh
    store instead of the seconds a CREATE DATABASE … TEMPLATE takes on a busy machine."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.tables = empty_tables(engine)
        with engine.begin() as conn:  # commits need not wait for the disk: nothing here must last
            name = conn.execute(sa.text("SELECT current_database()")).scalar()
            conn.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        engine.dispose()

    def fresh(self, rows: list[dict[str, Any]] | None = None) -> sa.Engine:
        reset(self.engine, self.tables)
        if rows:
            seed(self.engine, rows)
        return self.engine


@contextlib.contextmanager
def reusable_database(pg_server: Any, template: str, label: str) -> Iterator[Reusable]:
    with scratch_database(pg_server, template, label) as engine:
        yield Reusable(engine)


def reset(engine: sa.Engine, tables: list[str]) -> None:
    """Empty ``tables`` again: the database is as fresh as its template, in milliseconds."""
    with engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))  # no FK ordering
        for table in tables:
            conn.execute(sa.text(f"DELETE FROM {table}"))


def row(user_id: str, label: str, **columns: Any) -> dict[str, Any]:
    """One memory row in ``seed``'s format; the id is derived from (user, label), so two
    databases seeded with the same rows hold the same ids."""
    created = columns.pop("created_at", NOW - timedelta(days=3))
    base = {
        "id": uuid5(NAMESPACE_URL, f"memory-gc-test/{user_id}/{label}"),
        "user_id": user_id,
        "content": label,
        "embedding": None,
        "source": "explicit_user_statement",
        "slot": None,
        "supersedes": [],
        "importance": 3,
        "importance_assessed_at": created,
        "confidence": 1.0,
        "pinned": False,
        "created_at": created,
        "updated_at": created,
        "last_accessed_at": None,
        "access_count": 0,
        "observed_at": created,
        "valid_from": None,
        "valid_until": None,
        "expires_at": None,
        "metadata": {},
        "status": "active",
        "status_reason": None,
        "status_changed_at": None,
        "deleted_at": None,
        "superseded_by": None,
    }
    return base | columns


def lifecycle_rows(user_id: str) -> list[dict[str, Any]]:
    """Something for every deterministic rule to do for one user, and rows none may touch."""
    ago = lambda n: NOW - timedelta(days=n)  # noqa: E731
    dup = list(BASES[0])
    return [
        row(user_id, "expired", expires_at=ago(1)),
        row(user_id, "stale", created_at=ago(200), importance=2),
        row(user_id, "pinned stale", created_at=ago(500), importance=1, pinned=True),
        row(user_id, "fresh", created_at=ago(2)),
        row(
            user_id,
            "old deleted",
            status="deleted",
            status_reason="ttl_expired",
            deleted_at=ago(45),
            status_changed_at=ago(45),
        ),
        row(user_id, "Drinks green tea every morning.", embedding=dup),
        row(user_id, "drinks green tea every morning", embedding=dup, created_at=ago(4)),
        row(user_id, "Lives in Paris.", slot="profile.city", created_at=ago(30)),
        row(user_id, "Lives in Berlin.", slot="profile.city", created_at=ago(5)),
        *[row(user_id, f"filler {i}", created_at=ago(10 + i), importance=4) for i in range(3)],
    ]


def state_diff(left: dict[Any, dict[str, Any]], right: dict[Any, dict[str, Any]]) -> list[str]:
    """Where two end states differ, one line per row and column (for assertion messages)."""
    lines = [
        f"{key}: only {'left' if key in left else 'right'}"
        for key in sorted(set(left) ^ set(right), key=str)
    ]
    for key in sorted(set(left) & set(right), key=str):
        lines += [
            f"{key}.{column}: {left[key][column]!r} != {right[key].get(column)!r}"
            for column in left[key]
            if left[key][column] != right[key].get(column)
        ]
    return lines
