"""What ``memory-gc migrate`` checks before it creates the store, or adopts an existing one.

Run inside the migration transaction, before any DDL, on a database without memory-gc's version
table (``prepare``). Every refusal is a :class:`ConfigError` (exit 2) that says how to fix it:

- the role may create tables in the target schema (``GRANT CREATE ON SCHEMA …``);
- pgvector is installed on the server and created in the database (a superuser may have to run
  ``CREATE EXTENSION vector``);
- no object of the application's has a name a migration creates (``created_names``); adopting,
  the role may create temporary tables (the CHECK probes use them);
- a ``memories`` table the application already made fits DESIGN.md section 2: every contract
  column, of a compatible type, NOT NULL where the contract says so, with no default a CHECK
  of migrate's refuses; ``id`` unique; the vector
  dimension equal to ``embeddings.dim``; no extra NOT NULL column without a default (the worker
  inserts merged records); no contract column generated or an identity; a CHECK under a name
  of migrate's saying what migrate's says; owned by the migrating role; no rule of the
  application's that would make the worker's writes fail (CHECKs, unique indexes, foreign keys
  through every cascade, BEFORE INSERT/UPDATE/DELETE row triggers, write rules:
  ``behaviour_problems``). An existing ``memory_lineage`` has
  ``derived_id`` and ``source_id`` uuid columns and no foreign key that blocks purges.

Migration 0001 then keeps the rows and adds what the worker needs (defaults, CHECKs, indexes,
lineage keys, the view). Rows that break a CHECK or key it adds roll the whole migration back;
``translated_violations`` turns that into a ConfigError naming the constraint.

This module checks the privileges and placement first, and puts the rest together: the
tables' columns, types, owners and index names are checked in :mod:`gc_worker.adoption_columns`,
the CHECKs probed in :mod:`gc_worker.adoption_probes`, the application's other rules and the
names a migration creates in :mod:`gc_worker.adoption_guards`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gc_worker.adoption_columns import (
    RELATION_KINDS,
    invalid_index_problems,
    lineage_problems,
    memories_column_problems,
    misplaced_index_problems,
    relation_of,
)
from gc_worker.adoption_guards import behaviour_problems, clashing_name_problems
from gc_worker.adoption_probes import CONTRACT_FIXES, contract_check_problems, default_problems
from gc_worker.errors import ConfigError
from gc_worker.queries import q

# SQLSTATEs of CREATE EXTENSION
INSUFFICIENT_PRIVILEGE, NOT_AVAILABLE, NO_CONTROL_FILE = "42501", "0A000", "58P01"
RERUN = "then re-run `memory-gc migrate`"


def prepare(conn: Connection, embedding_dim: int) -> None:
    """Refuse (ConfigError) unless migration 0001 can create or adopt the store here."""
    who = _require_schema_privilege(conn)
    _ensure_pgvector(conn, who)
    _require_one_schema(conn, who)
    _require_temp_privilege(conn, who)
    problems = [
        *memories_problems(conn, embedding_dim),
        *lineage_problems(conn),
        *misplaced_index_problems(conn),
        *clashing_name_problems(conn),
    ]
    if problems:
        listed = "".join(f"\n  - {problem}" for problem in problems)
        raise ConfigError(
            "the existing store does not fit what memory-gc needs (DESIGN.md section 2; "
            f"docs/operations.md, 'Adopting an existing store'):{listed}\n"
            f"nothing was changed; fix these, {RERUN}"
        )


def _require_schema_privilege(conn: Connection) -> Any:
    """Role, database and schema, once the role may create tables where migrate puts them."""
    who = conn.execute(q("migrate_prerequisites")).one()
    if who.schema_name is None:
        raise ConfigError(
            f"no schema of the search_path of role {who.role_name} exists in database "
            f"{who.database_name}; set search_path (e.g. ?options=-csearch_path%3Dpublic in "
            f"MEMORY_GC_DATABASE_URL), {RERUN}"
        )
    if not who.can_create:
        raise ConfigError(
            f"role {who.role_name} may not create tables in schema {who.schema_name} of "
            f"database {who.database_name}: grant CREATE on schema {who.schema_name} to "
            f"{who.role_name} (GRANT CREATE ON SCHEMA {who.schema_name} TO {who.role_name};), "
            f"{RERUN}"
        )
    return who


def _require_temp_privilege(conn: Connection, who: Any) -> None:
    """Adopting probes the application's CHECKs on temporary copies of memories: a role
    without TEMPORARY on the database (REVOKE TEMPORARY … FROM PUBLIC, a common hardening)
    failed there, exit 1. A store migrate creates itself needs no probe."""
    if who.can_create_temp or relation_of(conn, "memories") is None:
        return
    raise ConfigError(
        f"role {who.role_name} may not create temporary tables in database "
        f"{who.database_name}, and adopting the existing memories table checks its rules on "
        f"a temporary copy (rolled back): GRANT TEMPORARY ON DATABASE {who.database_name} TO "
        f"{who.role_name};, {RERUN}"
    )


def _require_one_schema(conn: Connection, who: Any) -> None:
    """memory-gc makes its tables, view and functions in the first schema of its search_path,
    and the functions name the tables unqualified: memories must be there, and pgvector's type
    visible. Otherwise the application's reads through memory_gc_current and its inserts under
    the tombstone trigger fail, or migrate fails half-way with a raw error."""
    placed = conn.execute(q("schemas_of_the_store")).one()
    path = f"?options=-csearch_path%3D{who.schema_name}"
    if placed.vector_schema is not None and not placed.vector_visible:
        raise ConfigError(
            f"pgvector is installed in schema {placed.vector_schema}, which is not on the "
            f"search_path of role {who.role_name}: add it after {who.schema_name} (e.g. "
            f"{path},{placed.vector_schema} in MEMORY_GC_DATABASE_URL), {RERUN}"
        )
    if placed.memories_schema is not None and placed.memories_schema != who.schema_name:
        raise ConfigError(
            f"memories is in schema {placed.memories_schema}, but memory-gc would put its "
            f"tables, view and functions in {who.schema_name} (the first schema of its "
            f"search_path), where the application's session would not find them together: "
            f"put {placed.memories_schema} first (e.g. ?options=-csearch_path%3D"
            f"{placed.memories_schema} in MEMORY_GC_DATABASE_URL), {RERUN}"
        )


def _ensure_pgvector(conn: Connection, who: Any) -> None:
    try:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    except sa.exc.DBAPIError as exc:
        state = getattr(exc.orig, "sqlstate", None)
        if state in (NOT_AVAILABLE, NO_CONTROL_FILE):
            raise ConfigError(
                "the PostgreSQL server has no pgvector extension: install pgvector on the "
                "server (e.g. the postgresql-<version>-pgvector package, or an image that "
                f"ships it), {RERUN}"
            ) from None
        if state == INSUFFICIENT_PRIVILEGE:
            raise ConfigError(
                f"role {who.role_name} may not create the pgvector extension: have a superuser "
                f"run CREATE EXTENSION vector; in database {who.database_name}, {RERUN}"
            ) from None
        raise


def memories_problems(conn: Connection, embedding_dim: int) -> list[str]:
    """What keeps an application's ``memories`` table from being adopted ([] if none)."""
    relation = relation_of(conn, "memories")
    if relation is None:
        return []
    if relation.relkind not in ("r", "p"):
        kind = RELATION_KINDS.get(relation.relkind, "relation")
        return [f"memories is a {kind}; memory-gc needs a table (DESIGN.md section 2)"]
    return [
        *memories_column_problems(conn, relation, embedding_dim),
        *contract_check_problems(conn),
        *default_problems(conn),
        *invalid_index_problems(conn),
        *behaviour_problems(conn),
    ]


@contextlib.contextmanager
def translated_violations() -> Iterator[None]:
    """Existing rows that break a constraint migration 0001 adds: exit 2 with the fix."""
    try:
        yield
    except sa.exc.IntegrityError as exc:
        from gc_worker.db import describe_error

        constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None) or ""
        raise ConfigError(
            f"existing rows do not satisfy what memory-gc adds to the store "
            f"({describe_error(exc)}){_hint(constraint)}; nothing was changed: fix those rows, "
            f"{RERUN}"
        ) from None


def _hint(constraint: str) -> str:
    hints = {
        "memories_importance_check": "importance must be 1..5: "
        + CONTRACT_FIXES["memories_importance_check"],
        "memories_confidence_check": "confidence must be 0..1: "
        + CONTRACT_FIXES["memories_confidence_check"],
        "memories_status_check": "status must be active, obsolete, merged or deleted: "
        + CONTRACT_FIXES["memories_status_check"],
        "memory_lineage_derived_id_fkey": "every derived_id must be the id of a memory",
        "memory_lineage_source_id_fkey": "every source_id must be the id of a memory",
        "memory_lineage_pair_key": "each (derived_id, source_id) pair must appear once",
    }
    return f": {hints[constraint]}" if constraint in hints else ""
