"""What the application's own rules on an existing store would make the worker do wrong.

Used by :mod:`gc_worker.adoption` before migration 0001 runs; each returns the problems it
finds ([] if none), each with the statement that fixes it. ``behaviour_problems`` refuses, on
``memories``:

- CHECKs or defaults that refuse a row the worker writes (probed: :mod:`gc_worker.adoption_probes`);
- unique indexes and exclusion constraints a merged record would violate;
- row-level security that can hide rows from the role (``row_security_hides_rows``, also
  checked by every command for the role it runs as: ``ROW_SECURITY``);
- foreign keys that would make a purge fail, followed through every ``ON DELETE CASCADE``;
- BEFORE UPDATE row triggers on any column, BEFORE INSERT / DELETE row triggers, write rules.

``clashing_name_problems`` refuses objects of the application's under a name a migration
creates (``created_names``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from sqlalchemy.engine import Connection

from gc_worker.adoption_columns import INDEXES, MEMORIES
from gc_worker.adoption_probes import check_problems
from gc_worker.queries import q


def behaviour_problems(conn: Connection) -> list[str]:
    """What the application's own rules on memories would make the worker do wrong."""
    problems = check_problems(conn) + _unique_index_problems(conn)
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
    merging batch. A trigger is refused when its function's source can skip the row (RETURN
    NULL) or, on DELETE, refuse it (RAISE EXCEPTION): one that fills columns (a search vector)
    is adopted; a rule when it is DO INSTEAD (a DO ALSO audit rule adds a statement)."""
    problems = [
        f"trigger {row.tgname} fires BEFORE "
        f"{' OR '.join(['INSERT'] * row.on_insert + ['DELETE'] * row.on_delete)} on each row "
        "of memories, and can skip or change a row the worker inserts (a merged record) or "
        "purges (a soft-delete or dedupe trigger returning NULL): every such batch would fail, "
        f"every night. DROP TRIGGER {row.tgname} ON memories; then soft-delete or dedupe in "
        "the application's own statements (or make the function return the row it is given)"
        for row in conn.execute(q("row_write_triggers"))
    ]
    return problems + [
        f"rule {row.rulename} rewrites every {row.event} on memories (DO INSTEAD: the worker's "
        f"{row.event} … RETURNING fails, or does nothing), so every batch writing one would "
        f"fail, every night: DROP RULE {row.rulename} ON memories; (and soft-delete in the "
        "application's own statements)"
        for row in conn.execute(q("write_rules"))
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


def clashing_name_problems(conn: Connection) -> list[str]:
    return [
        f"{row.kind} {row.name} is yours, and memory-gc creates one of that name (its own "
        f"tables are gc_*, its functions and views memory_gc_*): rename yours (ALTER "
        f"{'TABLE' if row.kind == 'table' else row.kind.upper()} {row.name} RENAME TO …;) or "
        f"drop it"
        for row in conn.execute(q("clashing_names"), {"names": sorted(created_names())})
    ]
