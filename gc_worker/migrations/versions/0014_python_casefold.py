"""Full case folding in the SQL content hash on PostgreSQL before 18.

Revision ID: 0014

``memory_gc_normalise`` (0003) folds case with ``casefold(… COLLATE pg_unicode_fast)`` on
PostgreSQL 18+, and with ``lower`` before that. ``lower`` is not Python's ``casefold`` (the
hash the worker writes tombstones with): "Straße" keeps its "ß" where casefold makes "ss", a
final "ς" stays, and under a Turkish collation "I" becomes "ı". An erasure's scrub by content
hash, and an application's ``memory_gc_is_tombstoned`` check, then missed such texts. Before
18 the fold is now Python's own table, generated here: a jsonb map of the 1,500-odd characters
that fold, applied character by character, and plain ASCII (most text) only through A-Z.
PostgreSQL 18+ keeps ``casefold``, unless the function folds with ``lower`` (0003 ran before
the server was upgraded to 18; pg_upgrade keeps functions): it gets ``casefold``. Indexes of the
application's on the hash (or on a function calling it) are rebuilt when the function changes.
"""

import json

from alembic import op

from gc_worker.migration_modules import load

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

ASCII_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def upgrade() -> None:
    erasure = load("0003_erasure.py")
    if not erasure._has_unicode_casefold():
        op.execute(_replace(erasure.normalise_function(python_fold("s"))))
        _reindex(op.get_bind())
    elif not _folds_fully(op.get_bind()):  # lower(), from 0003 on a server before 18
        op.execute(_replace(erasure.normalise_function("casefold(s COLLATE pg_unicode_fast)")))
        _reindex(op.get_bind())


def downgrade() -> None:
    erasure = load("0003_erasure.py")
    if not erasure._has_unicode_casefold():
        op.execute(_replace(erasure.normalise_function("lower(s)")))
        _reindex(op.get_bind())


def _folds_fully(bind) -> bool:
    """The installed normaliser folds "ß" to "ss", as casefold does and lower() does not."""
    return bind.exec_driver_sql("SELECT memory_gc_normalise('ß') = 'ss'").scalar()


def hash_indexes(bind) -> list[str]:
    """Indexes whose expressions or predicates call the normaliser, directly or through any
    function with a SQL-standard body that calls it (memory_gc_content_hash, or a wrapper of
    the application's): pg_depend records such calls. A function with a quoted (plpgsql or
    SQL) body records none, and a stored generated column holds values, not an index: those
    are the application's to recompute (docs/operations.md)."""
    rows = bind.exec_driver_sql(
        "WITH RECURSIVE calls (oid) AS ("
        "  SELECT p.oid FROM pg_proc p WHERE p.proname = 'memory_gc_normalise'"
        "    AND p.pronamespace = current_schema()::regnamespace"
        "  UNION"
        "  SELECT d.objid FROM pg_depend d JOIN calls ON d.refobjid = calls.oid"
        "  WHERE d.refclassid = 'pg_proc'::regclass AND d.classid = 'pg_proc'::regclass"
        ")"
        " SELECT DISTINCT d.objid::regclass::text FROM pg_depend d"
        " JOIN calls ON d.refobjid = calls.oid AND d.refclassid = 'pg_proc'::regclass"
        " JOIN pg_class c ON c.oid = d.objid AND d.classid = 'pg_class'::regclass"
        " WHERE c.relkind = 'i'"
        " ORDER BY 1"
    )
    return [row[0] for row in rows]


def _reindex(bind) -> None:
    """An index on the hash holds the old function's values: rebuilt in the same transaction."""
    for index in hash_indexes(bind):
        bind.exec_driver_sql(f"REINDEX INDEX {index}")  # a regclass text: quoted as needed


def _replace(create: str) -> str:
    return create.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def python_fold(value: str) -> str:
    """A SQL expression equal to Python's ``value.casefold()`` (its Unicode tables), whatever
    the server's version or collation: folding is per character, so a text that is not plain
    ASCII is folded character by character from a jsonb map of the 1,500-odd characters that
    fold (to one character or several; a key lookup, not a scan of the map), and plain ASCII
    (most text) only through A-Z."""
    table = {
        chr(point): chr(point).casefold()
        for point in range(0x110000)
        if not 0xD800 <= point <= 0xDFFF and chr(point).casefold() != chr(point)
    }
    mapping = json.dumps(table, ensure_ascii=True, separators=(",", ":")).replace("'", "''")
    per_char = (
        f"(SELECT string_agg(coalesce(CAST('{mapping}' AS jsonb) ->> c, c), '' ORDER BY n)"
        f" FROM regexp_split_to_table({value}, '') WITH ORDINALITY AS chars(c, n))"
    )
    ascii_only = f"translate({value}, '{ASCII_UPPER}', '{ASCII_UPPER.lower()}')"
    ascii_test = f"octet_length({value}) = char_length({value})"
    return f"(CASE WHEN {ascii_test} THEN {ascii_only} ELSE {per_char} END)"
