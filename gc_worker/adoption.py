"""What ``memory-gc migrate`` checks before it creates the store, or adopts an existing one.

Run inside the migration transaction, before any DDL, on a database without memory-gc's version
table (``prepare``). Every refusal is a :class:`ConfigError` (exit 2) that says how to fix it:

- the role may create tables in the target schema (``GRANT CREATE ON SCHEMA …``);
- pgvector is installed on the server and created in the database (a superuser may have to run
  ``CREATE EXTENSION vector``);
- no object of the application's has a name a migration creates (``created_names``); adopting,
  the role may create temporary tables (the CHECK probes use them);
- a ``memories`` table the application already made fits DESIGN.md section 2: every contract
  column, of a compatible type, NOT NULL where the contract says so; ``id`` unique; the vector
  dimension equal to ``embeddings.dim``; no extra NOT NULL column without a default (the worker
  inserts merged records); no contract column generated or an identity; a CHECK under a name
  of migrate's saying what migrate's says; owned by the migrating role; no rule of the
  application's that would make the worker's writes fail (CHECKs, unique indexes, foreign keys
  through every cascade, BEFORE INSERT/UPDATE/DELETE row triggers, write rules:
  ``_behaviour_problems``). An existing ``memory_lineage`` has
  ``derived_id`` and ``source_id`` uuid columns and no foreign key that blocks purges.

Migration 0001 then keeps the rows and adds what the worker needs (defaults, CHECKs, indexes,
lineage keys, the view). Rows that break a CHECK or key it adds roll the whole migration back;
``translated_violations`` turns that into a ConfigError naming the constraint.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gc_worker.errors import ConfigError
from gc_worker.queries import q

# DESIGN.md section 2: (column, type, NOT NULL, default)
MEMORIES: tuple[tuple[str, str, bool, str | None], ...] = (
    ("id", "uuid", True, "gen_random_uuid()"),
    ("user_id", "text", True, None),
    ("content", "text", True, None),
    ("embedding", "vector", False, None),
    ("memory_type", "text", True, "'semantic'"),
    ("source", "text", True, "'explicit_user_statement'"),
    ("scope", "text", False, None),
    ("slot", "text", False, None),
    ("supersedes", "uuid[]", True, "'{}'"),
    ("importance", "smallint", True, "3"),
    ("importance_assessed_at", "timestamptz", False, None),
    ("confidence", "real", True, "1.0"),
    ("decayed_confidence", "real", False, None),
    ("pinned", "boolean", True, "false"),
    ("created_at", "timestamptz", True, "now()"),
    ("updated_at", "timestamptz", True, "now()"),
    ("last_accessed_at", "timestamptz", False, None),
    ("access_count", "integer", True, "0"),
    ("observed_at", "timestamptz", True, "now()"),
    ("valid_from", "timestamptz", False, None),
    ("valid_until", "timestamptz", False, None),
    ("expires_at", "timestamptz", False, None),
    ("status", "text", True, "'active'"),
    ("status_reason", "text", False, None),
    ("status_changed_at", "timestamptz", False, None),
    ("superseded_by", "uuid", False, None),
    ("deleted_at", "timestamptz", False, None),
    ("metadata", "jsonb", True, "'{}'"),
)
LINEAGE = (("derived_id", "uuid"), ("source_id", "uuid"))
# format_type() spellings each contract type accepts (a varchar(n) is refused: ALTER … TYPE text
# is a catalog-only change, while a bound could reject a merged record's text)
ACCEPTED = {
    "text": {"text", "character varying"},
    "timestamptz": {"timestamp with time zone"},
    "integer": {"integer", "bigint"},
}
# the indexes migration 0001 creates; one an operator built CONCURRENTLY beforehand is kept
INDEXES = (
    "memories_user_status_idx",
    "memories_ttl_idx",
    "memories_deleted_idx",
    "memories_history_idx",
    "memories_slot_idx",
    "memories_valid_until_idx",
    "memory_lineage_source_idx",
    "memory_lineage_pair_key",
)
RELATION_KINDS = {"r": "table", "p": "table", "v": "view", "m": "materialized view",
                  "f": "foreign table"}  # fmt: skip
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
        *_misplaced_index_problems(conn),
        *_clashing_name_problems(conn),
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
    if who.can_create_temp or _relation(conn, "memories") is None:
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
    relation = _relation(conn, "memories")
    if relation is None:
        return []
    if relation.relkind not in ("r", "p"):
        kind = RELATION_KINDS.get(relation.relkind, "relation")
        return [f"memories is a {kind}; memory-gc needs a table (DESIGN.md section 2)"]
    columns = {col.name: col for col in _columns(conn, "memories")}
    problems = _owner_problem(relation, "memories")
    for name, type_, not_null, default in MEMORIES:
        column = columns.get(name)
        if column is None:
            fix = _add_column(name, type_, not_null, default, embedding_dim)
            problems.append(f"missing column {name}: {fix}")
            continue
        problems += _column_problems(column, type_, not_null, embedding_dim)
    problems += [
        f"column {col.name} is NOT NULL without a default, and memory-gc inserts merged "
        f"records without it: ALTER TABLE memories ALTER COLUMN {col.name} SET DEFAULT …; "
        f"(or DROP NOT NULL)"
        for col in columns.values()
        if col.name not in {spec[0] for spec in MEMORIES} and col.not_null and not col.filled
    ]
    if "id" in columns and not conn.execute(q("id_is_unique")).scalar():
        problems.append("id is not unique on its own: ALTER TABLE memories ADD PRIMARY KEY (id);")
    return [
        *problems,
        *_contract_check_problems(conn),
        *_invalid_index_problems(conn),
        *_behaviour_problems(conn),
    ]


# What brings rows inside each CHECK migration 0001 adds (it names the rows outside one).
CONTRACT_FIXES = {
    "memories_importance_check": "UPDATE memories SET importance = least(greatest(importance, "
    "1), 5) WHERE NOT importance BETWEEN 1 AND 5;",
    "memories_confidence_check": "UPDATE memories SET confidence = least(greatest(confidence, "
    "0), 1) WHERE NOT confidence BETWEEN 0 AND 1;",
    "memories_status_check": "UPDATE memories SET status = … WHERE status NOT IN ('active', "
    "'obsolete', 'merged', 'deleted'); (deleted with its deleted_at, or active)",
}


def _contract_check_problems(conn: Connection) -> list[str]:
    """A CHECK of the application's under a name of migrate's (PostgreSQL names an inline
    CHECK on importance memories_importance_check) is kept in place of migrate's: one wider
    than the contract (importance BETWEEN 0 AND 10) let rows with importance 0 or 7 in, whose
    decay score then stayed NULL forever. Each must say what migrate's says, as PostgreSQL
    prints both, and be validated; the rows outside the contract's are counted."""
    from gc_worker import schema  # it imports this module

    checks = schema.migration("0001").CHECKS
    found = list(conn.execute(q("contract_check_definitions"), {"names": list(checks)}))
    problems = [
        f"CHECK {r.conname} is NOT VALID, and migrate would keep it in place of its own, with "
        f"the rows it never checked: ALTER TABLE memories VALIDATE CONSTRAINT {r.conname};"
        for r in found
        if not r.validated
    ]
    ours = _printed_checks(conn, {r.conname: checks[r.conname] for r in found})
    for row in found:
        if not row.validated or ours.get(row.conname, row.definition) == row.definition:
            continue  # (pg_get_constraintdef prints NOT VALID: named above)
        check = checks[row.conname]
        outside = conn.exec_driver_sql(f"SELECT count(*) FROM memories WHERE NOT ({check})")
        count = outside.scalar()
        problems.append(
            f"CHECK {row.conname} is yours ({row.definition}), and migrate would keep it in "
            f"place of its own ({check}), so rows outside that (which the worker cannot score "
            f"or read) could stay or come in: ALTER TABLE memories DROP CONSTRAINT "
            f"{row.conname}; (migrate adds its own; keep a rule of yours under another name)"
            + (f". {count} rows are outside it: {CONTRACT_FIXES[row.conname]}" if count else "")
        )
    return problems


def _printed_checks(conn: Connection, checks: dict[str, str]) -> dict[str, str]:
    """The CHECKs as PostgreSQL prints them on memories' column types (on a temporary copy of
    its columns, rolled back); {} when a column has another type (listed with the columns)."""
    if not checks:
        return {}
    conn.exec_driver_sql("SAVEPOINT memory_gc_contract")
    try:
        added = "".join(
            f"ALTER TABLE memory_gc_contract ADD CONSTRAINT {name} CHECK ({check});"
            for name, check in checks.items()
        )
        conn.exec_driver_sql(
            f"CREATE TEMP TABLE memory_gc_contract (LIKE memories) ON COMMIT DROP;{added}"
        )
        printed = conn.execute(q("contract_check_definitions"), {"names": list(checks)})
        return {r.conname: r.definition for r in printed if not r.theirs}
    except sa.exc.DBAPIError as exc:
        state = str(getattr(exc.orig, "sqlstate", None))
        if state[:2] in SESSION_TROUBLE or state == "25P04" or exc.connection_invalidated:
            raise
        return {}
    finally:
        if not conn.invalidated:
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT memory_gc_contract")


# What the worker writes into the enum-like columns: each must pass the table's CHECKs.
# Every status change the worker writes, as it writes it: (status, reason). A CHECK is probed
# with whole rows, not one value at a time: the application's own rule may tie columns together
# ("a deleted row has its deleted_at", "status_reason is one of ours").
STATUS_WRITES = (
    [("deleted", reason) for reason in (
        "ttl_expired", "decayed", "unused", "over_cap", "over_cap_summarized", "erasure",
        "erasure_tombstone", "restored")]
    + [("obsolete", reason) for reason in (
        "superseded", "slot_replaced", "contradicted", "validity_ended", "review_superseded",
        "review_rejected")]
    + [("merged", reason) for reason in ("exact_duplicates", "near_duplicates")]
    + [("active", "erasure_reactivated")]
)  # fmt: skip


def _status_rows(status: str, reason: str) -> list[dict[str, str]]:
    """SQL values of the rows the worker writes when it moves one to ``status`` for ``reason``
    (each way it can: a review's loser may have no winner to point at)."""
    row = {"status": f"'{status}'", "status_reason": f"'{reason}'", "status_changed_at": "now()"}
    if status == "deleted":
        row["deleted_at"] = "now()"
    replaced = {"superseded_by": "gen_random_uuid()"}
    closed = {"valid_until": "now()"}
    if reason == "over_cap_summarized" or status == "merged":
        return [row | replaced]
    if reason == "validity_ended":  # its own window ran out: nothing replaced it
        return [row | {"valid_until": "now() - interval '1 day'"}]
    if reason == "review_rejected":  # never held: its window is left as it was
        return [row | replaced, row]
    if status == "obsolete":  # replaced: closed at the replacement's start, which may be the
        # row's own start, or before it (a more trusted value that began earlier wins)
        starts = [{"valid_from": "now()", "valid_until": until}
                  for until in ("now()", "now() - interval '1 day'")]  # fmt: skip
        return [row | replaced | closed] + [row | replaced | start for start in starts]
    return [row]


WORKER_VALUES = (
    [row for status, reason in STATUS_WRITES for row in _status_rows(status, reason)]
    + [{"importance": str(i)} for i in (1, 5)]
    + [{"confidence": str(c), "decayed_confidence": str(c)} for c in (0.0, 1.0)]
)  # fmt: skip
# The records the worker inserts (merges, summaries), whole, as gc_worker/sql/execute.sql's
# insert_records writes them: the application's own columns get their defaults.
CREATED_RECORDS = [
    {"id": "gen_random_uuid()", "user_id": "'u'", "content": "'a merged memory'",
     "memory_type": f"'{kind}'", "source": "'gc_merge'", "importance": "3",
     "importance_assessed_at": "now()", "confidence": "1.0", "created_at": "now()",
     "updated_at": "now()", "access_count": "0", "observed_at": "now()",
     "metadata": "'{\"merge_depth\": 1}'", "status": "'active'", "pinned": "false",
     "supersedes": "'{}'"}
    for kind in ("semantic", "summary")
]  # fmt: skip


# SQLSTATE classes of errors that say nothing about the row probed: connection exception,
# insufficient resources, operator intervention (a statement_timeout); and 25P04, a
# transaction_timeout, which ends the session. (A program limit, class 54, is the CHECK's own:
# a function of the application's that recurses past the stack depth limit.)
SESSION_TROUBLE = {"08", "53", "57"}


def _check_problems(conn: Connection) -> list[str]:
    """CHECKs of the application's that would refuse what the worker writes (a status it
    retires rows to, a merged record's source, a summary's type): every batch writing one
    would fail, every night. Probed on a temporary copy of the table's CHECKs, rolled back."""
    checks = conn.execute(q("foreign_checks")).all()
    if not checks:
        return []
    updated = {row.conname for row in checks if row.on_updated_columns}
    refused: set[str] = set()
    failing: dict[str, None] = {}
    conn.exec_driver_sql("SAVEPOINT memory_gc_probe")
    try:
        conn.exec_driver_sql(
            "CREATE TEMP TABLE memory_gc_probe"
            " (LIKE memories INCLUDING CONSTRAINTS INCLUDING DEFAULTS) ON COMMIT DROP"
        )
        present = set()
        for column in _columns(conn, "memory_gc_probe"):  # only the CHECKs are probed
            present.add(column.name)
            if column.not_null:
                conn.exec_driver_sql(
                    f'ALTER TABLE memory_gc_probe ALTER COLUMN "{column.name}" DROP NOT NULL'
                )
        for name in conn.execute(q("probe_sequence_defaults")).scalars():  # the application's
            conn.exec_driver_sql(  # sequences are not probed: nextval is never rolled back
                f'ALTER TABLE memory_gc_probe ALTER COLUMN "{name}" DROP DEFAULT'
            )
        probes = [(row, False) for row in WORKER_VALUES] + [(r, True) for r in CREATED_RECORDS]
        for values, whole in probes:
            columns = {c: v for c, v in values.items() if c in present}  # missing: listed apart
            sql = (f"INSERT INTO memory_gc_probe ({', '.join(columns)})"
                   f" VALUES ({', '.join(columns.values())})")  # fmt: skip
            conn.exec_driver_sql("SAVEPOINT memory_gc_value")
            try:
                conn.exec_driver_sql(sql)
            except sa.exc.IntegrityError as exc:
                name = getattr(exc.orig.diag, "constraint_name", None) or "?"
                if whole or name in updated:  # an update keeps the other columns' values
                    refused.add(name)
            except sa.exc.DBAPIError as exc:  # a default or CHECK of the application's raising
                state = str(getattr(exc.orig, "sqlstate", None))
                if state[:2] in SESSION_TROUBLE or state == "25P04" or exc.connection_invalidated:
                    raise  # not the row's fault: a timeout, a cancel, the server going away
                failing[str(exc.orig).splitlines()[0]] = None
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT memory_gc_value")
    finally:
        if not conn.invalidated:  # a session that ended (a transaction_timeout) has no savepoint
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT memory_gc_probe")
    return [
        f"a row the worker writes fails in a default or CHECK of yours ({error}): give the "
        "column a default, and the CHECK a rule, that work in any session"
        for error in failing
    ] + [
        f"CHECK {row.conname} ({row.definition}) refuses a row the worker writes (statuses "
        "active/obsolete/merged/deleted with their reasons and instants — "
        f"{', '.join(sorted({r for _, r in STATUS_WRITES}))} — source 'gc_merge', memory_type "
        "'summary', importance 1..5, confidence 0..1 — or a merged record, whose columns of "
        "yours take their defaults): ALTER TABLE memories DROP CONSTRAINT "
        f"{row.conname}; (or widen it, or give the columns it reads a default it accepts)"
        for row in checks
        if row.conname in refused
    ]


def _unique_index_problems(conn: Connection) -> list[str]:
    """Unique indexes of the application's that a merged record would violate: it copies a
    member's text (an exact-duplicate merge), scope and slot while the member still exists, so
    every batch merging would fail, every night."""
    contract = [spec[0] for spec in MEMORIES]
    return [
        f"{'exclusion constraint' if row.exclusion else 'unique index'} {row.index_name} "
        f"({row.definition}) can refuse a merged record, which copies a member's text, scope, "
        "slot and validity while the member still exists (retired, not deleted): "
        + (
            f"ALTER TABLE memories DROP CONSTRAINT {row.constraint_name};"
            if row.constraint_name
            else f"DROP INDEX {row.index_name};"
        )
        + " (compaction merges exact duplicates itself), or add a column of yours to its key"
        for row in conn.execute(q("colliding_unique_indexes"), {"contract": contract})
    ]


ROW_SECURITY = (
    "row-level security on memories can hide rows from this role, and the worker would act on "
    "what it sees as if it were the whole store (e.g. complete a forget-me request of a user "
    "whose rows it cannot see): run memory-gc as a role that bypasses it (ALTER ROLE … "
    "BYPASSRLS, or the table's owner without FORCE ROW LEVEL SECURITY)"
)


def row_security_hides_rows(conn: Connection) -> bool:
    """Whether row-level security on memories can hide rows from this session's role (checked
    by migrate for its role, and by every command for the role it runs as)."""
    return bool(conn.execute(q("row_security_hides_rows")).scalar())


def _behaviour_problems(conn: Connection) -> list[str]:
    """What the application's own rules on memories would make the worker do wrong."""
    problems = _check_problems(conn) + _unique_index_problems(conn)
    if row_security_hides_rows(conn):
        problems.append(ROW_SECURITY)
    problems += [_blocking_key_problem(row) for row in conn.execute(q("keys_blocking_purge"))
                 if not row.sets or row.not_null_column is not None]  # fmt: skip
    problems += [
        f"trigger {name} fires BEFORE UPDATE of any column of memories: if it stamps "
        f"updated_at, every score the worker writes would look like an edit and reset decay. "
        f"Limit it to the application's columns (CREATE OR REPLACE TRIGGER {name} BEFORE "
        f"UPDATE OF content, metadata, … ON memories …) or drop it"
        for name in conn.execute(q("row_update_triggers")).scalars()
    ]
    return problems + _write_trigger_problems(conn)


def _blocking_key_problem(row: Any) -> str:
    """A key that refuses a purge: onto memories, or onto a table a purge empties by cascade
    (memory_citations ON DELETE CASCADE, answers → memory_citations NO ACTION: adopted, every
    purge of a cited memory failed, every night)."""
    target = row.chain.rpartition(" → ")[2]
    via = "" if target == "memories" else f" (whose rows a purge deletes by cascade: {row.chain})"
    if not row.sets:
        return (
            f"{row.tab}.{row.conname} references {target}{via} without ON DELETE CASCADE / "
            f"SET NULL, so purging a memory it names would fail (every night, for that "
            f"batch): ALTER TABLE {row.tab} DROP CONSTRAINT {row.conname}, ADD … ON DELETE "
            f"CASCADE (or SET NULL);"
        )
    return (
        f"{row.tab}.{row.conname} sets {row.not_null_column} to NULL when the {target} row it "
        f"names{via} is purged, but {row.tab}.{row.not_null_column} is NOT NULL, so that purge "
        f"would fail (every night, for that batch): ALTER TABLE {row.tab} ALTER COLUMN "
        f"{row.not_null_column} DROP NOT NULL; or make the key ON DELETE CASCADE"
    )


def _write_trigger_problems(conn: Connection) -> list[str]:
    """BEFORE INSERT / DELETE row triggers and write rules on memories: a soft-delete trigger
    returning NULL, or a DO INSTEAD rule, turned every purge into nothing (the batch failed every
    night, a forget-user --purge-now never completed); a dedupe trigger returning NULL every
    merging batch. Refused whatever they do, as a BEFORE UPDATE trigger on any column is: what a
    trigger function does with the worker's rows cannot be read from the catalog."""
    problems = [
        f"trigger {row.tgname} fires BEFORE "
        f"{' OR '.join(['INSERT'] * row.on_insert + ['DELETE'] * row.on_delete)} on each row "
        "of memories, and can skip or change a row the worker inserts (a merged record) or "
        "purges (a soft-delete or dedupe trigger returning NULL): every such batch would fail, "
        f"every night. DROP TRIGGER {row.tgname} ON memories; then soft-delete or dedupe in "
        "the application's own statements (a column default, or an AFTER trigger, which "
        "cannot skip the row, does what a trigger filling columns did)"
        for row in conn.execute(q("row_write_triggers"))
    ]
    return problems + [
        f"rule {row.rulename} rewrites every {row.event} on memories (DO INSTEAD: the worker's "
        f"{row.event} … RETURNING fails, or does nothing), so every batch writing one would "
        f"fail, every night: DROP RULE {row.rulename} ON memories; (and soft-delete in the "
        "application's own statements)"
        for row in conn.execute(q("write_rules"))
    ]


def lineage_problems(conn: Connection) -> list[str]:
    """What keeps an existing ``memory_lineage`` table from being adopted ([] if none)."""
    relation = _relation(conn, "memory_lineage")
    if relation is None:
        return []
    if relation.relkind not in ("r", "p"):
        return ["memory_lineage is not a table; memory-gc needs (derived_id uuid, source_id uuid)"]
    columns = {col.name: col for col in _columns(conn, "memory_lineage")}
    problems = _owner_problem(relation, "memory_lineage")
    for name, type_ in LINEAGE:
        if name not in columns or columns[name].type_name != type_:
            problems.append(
                f"memory_lineage.{name} must be a uuid column (the id of a memory): "
                f"ALTER TABLE memory_lineage ADD COLUMN {name} uuid; (or ALTER … TYPE uuid)"
            )
    problems += [
        f"memory_lineage.{col.name} is NOT NULL without a default, and memory-gc records "
        f"lineage as (derived_id, source_id) only: ALTER TABLE memory_lineage ALTER COLUMN "
        f"{col.name} SET DEFAULT …; (or DROP NOT NULL)"
        for col in columns.values()
        if col.name not in {name for name, _ in LINEAGE} and col.not_null and not col.filled
    ]
    problems += [
        f"memory_lineage's foreign key {name} does not cascade deletes, so purging a memory "
        f"would fail: ALTER TABLE memory_lineage DROP CONSTRAINT {name}; (migrate adds one "
        "with ON DELETE CASCADE)"
        for name in conn.execute(q("lineage_keys_without_cascade")).scalars()
    ]
    return problems


def _column_problems(column: Any, type_: str, not_null: bool, embedding_dim: int) -> list[str]:
    name, problems = column.name, []
    if type_ == "vector":
        stored = _vector_dim(column.type_name)
        if column.base_type != "vector":
            problems.append(
                f"column embedding is {column.type_name}, memory-gc needs vector({embedding_dim})"
            )
        elif stored is not None and stored != embedding_dim:
            problems.append(dim_mismatch(embedding_dim, stored))
    elif column.type_name not in ACCEPTED.get(type_, {type_}):
        problems.append(
            f"column {name} is {column.type_name}, memory-gc needs {type_}: "
            f"ALTER TABLE memories ALTER COLUMN {name} TYPE {type_};"
        )
    if not_null and not column.not_null:
        problems.append(
            f"column {name} allows NULL, memory-gc needs a value in every row: fill its NULLs, "
            f"then ALTER TABLE memories ALTER COLUMN {name} SET NOT NULL;"
        )
    return problems + _generated_problems(column)


def _generated_problems(column: Any) -> list[str]:
    """A contract column the database computes refuses the worker's writes (a merged record
    names slot: GENERATED ALWAYS … STORED failed every merging batch, every night), and a
    VIRTUAL one (PostgreSQL 18) refuses migrate's own indexes (exit 1, FeatureNotSupported),
    and an identity column (access_count) the worker's value or migrate's default."""
    name = column.name
    plain = (
        f"ALTER TABLE memories RENAME COLUMN {name} TO {name}_generated; ALTER TABLE memories "
        f"ADD COLUMN {name} {column.type_name}; UPDATE memories SET {name} = {name}_generated; "
        f"ALTER TABLE memories DROP COLUMN {name}_generated;"
    )
    if column.generated:
        fix = f"ALTER TABLE memories ALTER COLUMN {name} DROP EXPRESSION;"
        return [
            f"column {name} is generated by the database, and memory-gc writes and indexes it "
            f"(merged records, status changes): make it a plain column the application writes: "
            + (fix if column.generated == "s" else plain)
        ]
    if column.identity:  # ALWAYS refuses the worker's value; either refuses migrate's default
        return [
            f"column {name} is an identity column, and memory-gc writes it and gives it the "
            f"contract's default: ALTER TABLE memories ALTER COLUMN {name} DROP IDENTITY;"
        ]
    return []


def dim_mismatch(embedding_dim: int, stored: int) -> str:
    return (
        f"embeddings.dim = {embedding_dim} but the store's embedding column is "
        f"vector({stored}); set embeddings.dim = {stored} (MEMORY_GC_EMBEDDINGS__DIM={stored})"
    )


def _vector_dim(type_name: str) -> int | None:
    inside = type_name.partition("(")[2].rstrip(")")
    return int(inside) if inside.isdigit() else None


# Columns whose existing rows should start from another column's value, not from the default:
# observed_at defaulting to now() would stamp every existing row with one instant, and the
# read rule and the contradiction job would then rank a slot's values by creation time alone.
BACKFILL = {"observed_at": "created_at"}
# Columns an application that never tracked them leaves NULL, and what that would mean.
UNTRACKED = {
    "last_accessed_at": (
        " (NULL is 'never used': the first usage_prune would then retire every row older than "
        "usage_prune.unused_days at or below its max_importance, the default importance 3 "
        "included. To count use from the adoption on instead, also run UPDATE memories SET "
        "last_accessed_at = now(); — or start with [usage_prune] enabled = false)"
    ),
}


def _add_column(name: str, type_: str, not_null: bool, default: str | None, dim: int) -> str:
    """The statements that add a missing contract column."""
    base = f"{name} {f'vector({dim})' if type_ == 'vector' else type_}"
    source = BACKFILL.get(name)
    if source is None:
        ddl = base + (" NOT NULL" if not_null else "") + (f" DEFAULT {default}" if default else "")
        return f"ALTER TABLE memories ADD COLUMN {ddl};" + UNTRACKED.get(name, "")
    tail = ", ".join(
        [f"ALTER COLUMN {name} SET DEFAULT {default}"] * bool(default)
        + [f"ALTER COLUMN {name} SET NOT NULL"] * not_null
    )
    return (
        f"ALTER TABLE memories ADD COLUMN {base}; UPDATE memories SET {name} = {source}; "
        f"ALTER TABLE memories {tail};"
    )


def _owner_problem(relation: Any, name: str) -> list[str]:
    if relation.owned:
        return []
    return [
        f"{name} belongs to role {relation.owner}, and migrate alters it: run "
        f"`memory-gc migrate` as {relation.owner} (or GRANT {relation.owner} TO the role it "
        "runs as)"
    ]


def _invalid_index_problems(conn: Connection) -> list[str]:
    return [
        f"index {name} is invalid (a CREATE INDEX CONCURRENTLY that failed) and migrate keeps "
        f"an index of that name: DROP INDEX {name}; and build it again (or let migrate build it)"
        for name in conn.execute(q("invalid_indexes"), {"names": list(INDEXES)}).scalars()
    ]


def _misplaced_index_problems(conn: Connection) -> list[str]:
    """An index of one of migrate's names on another table (a leftover memories_old): migrate
    would take it for its own and the store would go without it."""
    return [
        f"index {row.index_name} is on {row.table_name}, and migrate names one of its own "
        f"indexes so: ALTER INDEX {row.index_name} RENAME TO …; (or drop it)"
        for row in conn.execute(q("misplaced_indexes"), {"names": list(INDEXES)})
    ]


# What a migration creates, by name (a trigger's name is its table's: those tables are new).
CREATED = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?(?:TABLE|INDEX|VIEW|FUNCTION)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?(\w+)"
)
ADOPTED = {"memories", "memory_lineage", "active_memories", *INDEXES}  # checked apart, or kept


@functools.cache
def created_names() -> frozenset[str]:
    """The names memory-gc's migrations create objects under, read from the migrations (so a
    new one is covered): an application's object of one made migrate fail half-way (a gc_runs
    table: DuplicateTable; a memory_gc_trust function: DuplicateFunction), exit 1."""
    from gc_worker import schema  # it imports this module

    sources = (path.read_text() for path in (schema.MIGRATIONS / "versions").glob("*.py"))
    return frozenset(name for text in sources for name in CREATED.findall(text)) - ADOPTED


def _clashing_name_problems(conn: Connection) -> list[str]:
    return [
        f"{row.kind} {row.name} is yours, and memory-gc creates one of that name (its own "
        f"tables are gc_*, its functions and views memory_gc_*): rename yours (ALTER "
        f"{'TABLE' if row.kind == 'table' else row.kind.upper()} {row.name} RENAME TO …;) or "
        f"drop it"
        for row in conn.execute(q("clashing_names"), {"names": sorted(created_names())})
    ]


def _relation(conn: Connection, name: str) -> Any:
    return conn.execute(q("relation_of"), {"name": name}).one_or_none()


def _columns(conn: Connection, name: str) -> list[Any]:
    return list(conn.execute(q("columns_of"), {"name": name}))


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
