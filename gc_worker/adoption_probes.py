"""The CHECKs on an existing ``memories`` table that adoption probes on temporary copies of it.

Used by :mod:`gc_worker.adoption` when the application already has a ``memories`` table. Every
probe runs under a savepoint that is rolled back; an error that says nothing about what was
probed (``SESSION_TROUBLE``: a timeout, a cancel, the server going away) is raised as it is:

- ``contract_check_problems``: a CHECK of the application's under a name of migrate's
  (``CONTRACT_FIXES``) must say what migrate's says, as PostgreSQL prints both (on a copy of
  the table's columns), and be validated;
- ``default_problems``: no default of the application's on a column a CHECK of migrate's
  reads may be outside it (``CHECKED_COLUMNS``);
- ``check_problems``: no CHECK, or default, of the application's may refuse a row the worker
  writes: every status change (``STATUS_WRITES``), importance and confidence at their bounds
  (``WORKER_VALUES``) and the records it inserts (``CREATED_RECORDS``), on a copy of the table
  with its CHECKs and defaults.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gc_worker.adoption_columns import MEMORIES, columns_of, type_fits
from gc_worker.queries import q

# What brings rows inside each CHECK migration 0001 adds (it names the rows outside one).
CONTRACT_FIXES = {
    "memories_importance_check": "UPDATE memories SET importance = least(greatest(importance, "
    "1), 5) WHERE NOT importance BETWEEN 1 AND 5;",
    "memories_confidence_check": "UPDATE memories SET confidence = least(greatest(confidence, "
    "0), 1) WHERE NOT confidence BETWEEN 0 AND 1;",
    "memories_status_check": "UPDATE memories SET status = … WHERE status NOT IN ('active', "
    "'obsolete', 'merged', 'deleted'); (deleted with its deleted_at, or active)",
}


def contract_check_problems(conn: Connection) -> list[str]:
    """A CHECK of the application's under a name of migrate's (PostgreSQL names an inline
    CHECK on importance memories_importance_check) is kept in place of migrate's: one wider
    than the contract (importance BETWEEN 0 AND 10) let rows with importance 0 or 7 in, whose
    decay score then stayed NULL forever. Each must say what migrate's says, as PostgreSQL
    prints both, and be validated; the rows outside the contract's are counted."""
    from gc_worker import schema  # it imports this module (through gc_worker.adoption)

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


# The column each CHECK of migrate's reads: a default of the application's outside it is kept
# (migrate sets a default only where there is none), and the CHECK then refuses every insert
# of the application's that leaves the column to it.
CHECKED_COLUMNS = {
    "memories_importance_check": "importance",
    "memories_confidence_check": "confidence",
    "memories_status_check": "status",
}


def default_problems(conn: Connection) -> list[str]:
    """Defaults of the application's that a CHECK migrate adds refuses (status 'live'):
    adopted, every insert of the application's relying on one failed from then on. Each
    default is evaluated under a savepoint (one drawing from a sequence is not: nextval is
    never rolled back); one that fails to evaluate is left to the column checks."""
    from gc_worker import schema  # it imports this module (through gc_worker.adoption)

    migration = schema.migration("0001")
    names = list(CHECKED_COLUMNS.values())
    defaults = {r.name: r.expression for r in conn.execute(q("column_defaults"), {"names": names})}
    problems = []
    for check_name, column in CHECKED_COLUMNS.items():
        expression = defaults.get(column)
        if expression is None or "nextval(" in expression:
            continue
        check = migration.CHECKS[check_name]
        if not _default_refused(conn, column, expression, check):
            continue
        problems.append(
            f"column {column} defaults to {expression}, which the CHECK migrate adds "
            f"({check}) refuses: every insert of the application's leaving {column} to its "
            f"default would fail from then on: ALTER TABLE memories ALTER COLUMN {column} SET "
            f"DEFAULT {migration.DEFAULTS[column]}; (or a value of yours inside it)"
        )
    return problems


def _default_refused(conn: Connection, column: str, expression: str, check: str) -> bool:
    conn.exec_driver_sql("SAVEPOINT memory_gc_default")
    try:
        accepted = conn.exec_driver_sql(
            f"SELECT ({check}) IS NOT FALSE FROM (SELECT {expression} AS {column}) AS d"
        ).scalar()
    except sa.exc.DBAPIError as exc:
        if _session_trouble(exc):
            raise
        accepted = True  # (a type the contract does not take: named with the columns)
    finally:
        if not conn.invalidated:
            conn.exec_driver_sql("ROLLBACK TO SAVEPOINT memory_gc_default")
    return not accepted


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
        if _session_trouble(exc):
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


def check_problems(conn: Connection) -> list[str]:
    """CHECKs of the application's that would refuse what the worker writes (a status it
    retires rows to, a merged record's source, a summary's type): every batch writing one
    would fail, every night. Probed on a temporary copy of the table's CHECKs, rolled back."""
    checks = conn.execute(q("foreign_checks")).all()
    if not checks:
        return []
    updated = {row.conname for row in checks if row.on_updated_columns}
    conn.exec_driver_sql("SAVEPOINT memory_gc_probe")
    try:
        refused, failing = _probe_rows(conn, _probe_table(conn), updated)
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


def _probe_table(conn: Connection) -> set[str]:
    """memory_gc_probe, a temporary copy of memories with its CHECKs and defaults but not its
    NOT NULLs (only the CHECKs are probed); the names of its columns, less the contract's of
    another type (a bigint id refused the worker's uuid: named again as a CHECK's failure)."""
    conn.exec_driver_sql(
        "CREATE TEMP TABLE memory_gc_probe"
        " (LIKE memories INCLUDING CONSTRAINTS INCLUDING DEFAULTS) ON COMMIT DROP"
    )
    present = set()
    contract = {spec[0]: spec[1] for spec in MEMORIES}
    for column in columns_of(conn, "memory_gc_probe"):  # only the CHECKs are probed
        if column.name not in contract or type_fits(column, contract[column.name]):
            present.add(column.name)  # (one of another type: listed apart, not probed)
        if column.not_null:
            conn.exec_driver_sql(
                f'ALTER TABLE memory_gc_probe ALTER COLUMN "{column.name}" DROP NOT NULL'
            )
    for name in conn.execute(q("probe_sequence_defaults")).scalars():  # the application's
        conn.exec_driver_sql(  # sequences are not probed: nextval is never rolled back
            f'ALTER TABLE memory_gc_probe ALTER COLUMN "{name}" DROP DEFAULT'
        )
    return present


def _probe_rows(
    conn: Connection, present: set[str], updated: set[str]
) -> tuple[set[str], dict[str, None]]:
    """Each row the worker writes, inserted into memory_gc_probe (its columns in ``present``)
    and rolled back: the CHECKs that refuse one (a value it updates is refused only by a CHECK
    on the columns it updates, ``updated``), and the errors a default or CHECK raised."""
    refused: set[str] = set()
    failing: dict[str, None] = {}
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
            if _session_trouble(exc):
                raise  # not the row's fault: a timeout, a cancel, the server going away
            failing[str(exc.orig).splitlines()[0]] = None
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT memory_gc_value")
    return refused, failing


def _session_trouble(exc: sa.exc.DBAPIError) -> bool:
    """Whether ``exc`` says nothing about what was probed (``SESSION_TROUBLE``, a
    transaction_timeout, a connection lost)."""
    state = str(getattr(exc.orig, "sqlstate", None))
    return state[:2] in SESSION_TROUBLE or state == "25P04" or exc.connection_invalidated
