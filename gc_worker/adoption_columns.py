"""The shape adoption holds an existing store to (DESIGN.md section 2), read from the catalog.

Used by :mod:`gc_worker.adoption` before migration 0001 runs; each check returns the problems
it finds ([] if none), each with the statement that fixes it:

- ``memories``' columns (``memories_column_problems``): every contract column of ``MEMORIES``,
  of a type ``ACCEPTED`` for it, NOT NULL where the contract says so, nullable where the worker
  writes NULL (``WRITES_NULL``), neither generated nor an identity, the vector dimension equal
  to ``embeddings.dim`` (``dim_mismatch``, also said by every command); no extra NOT NULL
  column without a default; ``id`` unique; owned by the migrating role. A missing column is
  told how to add it (``BACKFILL``, ``UNTRACKED``);
- ``memory_lineage`` (``lineage_problems``): ``derived_id`` and ``source_id`` uuid columns, no
  extra NOT NULL column without a default, no foreign key that blocks purges;
- migrate's index names (``INDEXES``): none invalid, none on another table.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

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


def memories_column_problems(conn: Connection, relation: Any, embedding_dim: int) -> list[str]:
    """What keeps the columns of an application's ``memories`` table (a table: ``relation``)
    from being adopted, and its owner."""
    columns = {col.name: col for col in columns_of(conn, "memories")}
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
        if (col.name not in {spec[0] for spec in MEMORIES} or col.name in DEFAULTED)
        and col.not_null
        and not col.filled
    ]
    problems += _sentinel_default_problems(conn)
    if "id" in columns and not conn.execute(q("id_is_unique")).scalar():
        problems.append("id is not unique on its own: ALTER TABLE memories ADD PRIMARY KEY (id);")
    return problems


def type_fits(column: Any, type_: str) -> bool:
    """Whether ``column`` (a row of ``columns_of``) has a type the contract's ``type_`` takes."""
    if type_ == "vector":
        return column.base_type == "vector"
    return column.type_name in ACCEPTED.get(type_, {type_})


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
    elif not type_fits(column, type_):
        problems.append(
            f"column {name} is {column.type_name}, memory-gc needs {type_}: "
            + _type_change(column, type_)
        )
    if not_null and not column.not_null:
        problems.append(
            f"column {name} allows NULL, memory-gc needs a value in every row: fill its NULLs, "
            f"then ALTER TABLE memories ALTER COLUMN {name} SET NOT NULL;"
        )
    if name in WRITES_NULL and column.not_null:
        why, sentinel = WRITES_NULL[name]
        problems.append(
            f"column {name} is NOT NULL, and memory-gc writes NULL into it ({why}): ALTER TABLE "
            f"memories ALTER COLUMN {name} DROP NOT NULL;{sentinel}"
        )
    if column.nondeterministic is not None:
        problems.append(
            f"column {name} uses the nondeterministic collation {column.nondeterministic}: "
            "texts it holds equal ('Alice', 'alice') are one value to the database and two to "
            "memory-gc, so one batch, cap or group would span two users (or slots): ALTER "
            f'TABLE memories ALTER COLUMN {name} TYPE text COLLATE "default";'
        )
    if column.identity and _uncast(column.type_name, type_):
        return problems  # (the type change drops the identity)
    return problems + _generated_problems(column)


# Contract columns a merged record or summary is inserted without (sql/execute.sql
# insert_records), that migrate gives no default: theirs must have one if NOT NULL.
DEFAULTED = ("decayed_confidence", "status_reason", "status_changed_at")
# Contract columns the worker writes NULL into, why, and what a value standing for NULL in a
# NOT NULL column means to it: adopted NOT NULL, every user_cap batch folding rows into a
# summary failed every night (NotNullViolation), or every erasure putting rows back.
WRITES_NULL = {
    "scope": ("a summary of rows of several scopes has none", ""),
    "slot": (
        "a summary has none; NULL is 'no slot', and a value standing for none is one slot "
        "holding one current row per user: the read path shows one of them, the contradiction "
        "job obsoletes the others",
        " then UPDATE memories SET slot = NULL WHERE slot = ''; (or your value for none)",
    ),
    "valid_from": ("a summary is valid from when it is observed", ""),
    "valid_until": (
        "a summary is open-ended; NULL is 'open', and a row with a valid_until of its own is "
        "a temporary override to the read rule and the contradiction job",
        " then UPDATE memories SET valid_until = NULL WHERE valid_until = 'infinity'; (or your "
        "value for open)",
    ),
    "superseded_by": ("a row an erasure puts back on the read path is replaced by nothing", ""),
    "deleted_at": ("a row an erasure puts back on the read path is not deleted", ""),
}


# Conversions PostgreSQL has no cast for ("cannot cast type bigint to uuid"), from an integer
# column: a serial id becomes the uuid holding its number (the same expression converts a
# column of the application's that names one), a 0/1 flag a boolean.
INTEGERS = {"smallint", "integer", "bigint"}
UNCAST = {"uuid": "lpad(to_hex({name}), 32, '0')::uuid", "boolean": "{name} <> 0"}


def _type_change(column: Any, type_: str) -> str:
    """The statement that converts ``column`` to the contract's ``type_``."""
    name, stored = column.name, column.type_name
    alter = f"ALTER COLUMN {name} "
    if not _uncast(stored, type_):
        return f"ALTER TABLE memories {alter}TYPE {type_} " + _converted(name, stored, type_)
    # the column's default (a serial's nextval, a 0) cannot be cast either: swapped for the
    # contract's, in the same statement; an identity (no type but integers) goes first
    default = {spec[0]: spec[3] for spec in MEMORIES}[name]
    steps = [
        *(["DROP DEFAULT"] * (column.filled and not column.identity)),
        f"TYPE {type_} USING {UNCAST[type_].format(name=name)}",
        *([f"SET DEFAULT {default}"] if default else []),
    ]
    unidentified = f"ALTER TABLE memories {alter}DROP IDENTITY; " if column.identity else ""
    return (
        unidentified + "ALTER TABLE memories " + ", ".join(alter + step for step in steps) + ";"
        + (" (convert the columns of yours that name a memory the same way, their foreign keys"
           " dropped first and added again)" if type_ == "uuid" else "")
    )  # fmt: skip


def _uncast(stored: str, type_: str) -> bool:
    return stored in INTEGERS and type_ in UNCAST


# Contract columns without a default whose NULL means something ("no slot", "open-ended"): a
# default of the application's there stands for none, and every row it writes without the
# column takes it. Adopted, a slot defaulting to '' made all of a user's new rows one slot:
# the next run obsoleted all of them but the latest.
SENTINEL_DEFAULTS = {
    "slot": "every row the application writes without a slot would take it, and memory-gc "
    "reads it as one slot: the read path shows one of those rows per user, the contradiction "
    "job obsoletes the others",
    "valid_until": "every row the application writes without one would take it, and "
    "memory-gc reads a valid_until of a row's own as a temporary override (read rule, "
    "contradiction job)",
}


def _sentinel_default_problems(conn: Connection) -> list[str]:
    names = list(SENTINEL_DEFAULTS)
    return [
        f"column {row.name} defaults to {row.expression}, where memory-gc's contract has none "
        f"(NULL): {SENTINEL_DEFAULTS[row.name]}: ALTER TABLE memories ALTER COLUMN {row.name} "
        f"DROP DEFAULT; UPDATE memories SET {row.name} = NULL WHERE {row.name} = "
        f"{row.expression}; (the rows holding it, if it stands for none)"
        for row in conn.execute(q("column_defaults"), {"names": names})
        if row.name == "slot" or row.expression.startswith("'infinity'")
    ]  # (a valid_until default of now() + an interval is a window of the application's)


def _converted(name: str, stored: str, type_: str) -> str:
    """The USING expression that converts a column to the contract's type: explicitly (a text
    id has no implicit cast to uuid), and a timestamp without time zone read as UTC, not in the
    zone of the session that runs it (where an instant written in UTC moved by hours)."""
    if stored == "timestamp without time zone":
        return f"USING {name} AT TIME ZONE 'UTC'; (or the zone your application wrote them in)"
    return f"USING {name}::{type_};"


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
    "importance_assessed_at": (
        " (NULL is 'never assessed': the first importance run would have the model re-score "
        "every row, replacing the application's own importance — a score it lowers lets decay, "
        "usage_prune and user_cap retire the row from the next run. To keep the application's "
        "scores, also run UPDATE memories SET importance_assessed_at = now() WHERE importance "
        "<> 3; (without the WHERE: every row's) — or start with [importance] enabled = false)"
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


def invalid_index_problems(conn: Connection) -> list[str]:
    return [
        f"index {name} is invalid (a CREATE INDEX CONCURRENTLY that failed) and migrate keeps "
        f"an index of that name: DROP INDEX {name}; and build it again (or let migrate build it)"
        for name in conn.execute(q("invalid_indexes"), {"names": list(INDEXES)}).scalars()
    ]


def misplaced_index_problems(conn: Connection) -> list[str]:
    """An index of one of migrate's names on another table (a leftover memories_old): migrate
    would take it for its own and the store would go without it."""
    return [
        f"index {row.index_name} is on {row.table_name}, and migrate names one of its own "
        f"indexes so: ALTER INDEX {row.index_name} RENAME TO …; (or drop it)"
        for row in conn.execute(q("misplaced_indexes"), {"names": list(INDEXES)})
    ]


def lineage_problems(conn: Connection) -> list[str]:
    """What keeps an existing ``memory_lineage`` table from being adopted ([] if none)."""
    relation = relation_of(conn, "memory_lineage")
    if relation is None:
        return []
    if relation.relkind not in ("r", "p"):
        return ["memory_lineage is not a table; memory-gc needs (derived_id uuid, source_id uuid)"]
    columns = {col.name: col for col in columns_of(conn, "memory_lineage")}
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


def relation_of(conn: Connection, name: str) -> Any:
    return conn.execute(q("relation_of"), {"name": name}).one_or_none()


def columns_of(conn: Connection, name: str) -> list[Any]:
    return list(conn.execute(q("columns_of"), {"name": name}))
