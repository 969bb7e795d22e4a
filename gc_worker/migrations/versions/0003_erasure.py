"""Erasure: requests, tombstones, and the SQL twin of the content hash.

- ``gc_erasure_requests``: one row per "forget me" request (``kind`` user | memory). An
  application files one by inserting a row (docs/erasure.md); at most one pending request per
  target (a second insert hits ``gc_erasure_requests_pending_key``: use ON CONFLICT DO NOTHING).
- ``gc_erasure_tombstones``: per erased memory its id and sha256 hashes of its normalised content
  (whole, and its first 200 characters, which is what plans and audits preview) — no content.
- ``memory_gc_normalise(text)``, ``memory_gc_content_hash(user_id, content)``,
  ``memory_gc_is_tombstoned(user_id, content[, memory_id])``: for a request path that checks the
  tombstone before writing; ``memory_gc_refuse_tombstoned()`` is a trigger function it may attach.
  The normaliser mirrors ``jobs.similarity.normalise_text``: its character classes are generated
  here from Python's Unicode tables; case folding is full (``casefold`` with the builtin
  ``pg_unicode_fast`` collation) on PostgreSQL 18+, ``lower`` before that.
- ``gc_actions_user_idx``: scrubbing and verification read one user's audit rows.

Revision ID: 0003
"""

import unicodedata
from collections.abc import Callable

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    fold = "casefold(s COLLATE pg_unicode_fast)" if _has_unicode_casefold() else "lower(s)"
    for statement in TABLES:
        op.execute(statement)
    op.execute(normalise_function(fold))
    for statement in FUNCTIONS:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)


def _has_unicode_casefold() -> bool:
    conn = op.get_bind()
    version = int(conn.exec_driver_sql("SHOW server_version_num").scalar())
    collation = conn.exec_driver_sql(
        "SELECT count(*) FROM pg_collation WHERE collname = 'pg_unicode_fast'"
    ).scalar()
    return version >= 180000 and bool(collation)


def _char_class(predicate: Callable[[str], bool]) -> str:
    """A regex bracket expression of every code point ``predicate`` accepts, as ranges."""
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and predicate(chr(c))]
    runs: list[list[int]] = []
    for point in points:
        if runs and runs[-1][1] == point - 1:
            runs[-1][1] = point
        else:
            runs.append([point, point])
    parts = (f"\\U{a:08X}" if a == b else f"\\U{a:08X}-\\U{b:08X}" for a, b in runs)
    return "[" + "".join(parts) + "]"


def normalise_function(fold: str) -> str:
    space = _char_class(str.isspace)
    edge = _char_class(lambda ch: ch.isspace() or unicodedata.category(ch).startswith("P"))
    return f"""
    CREATE FUNCTION memory_gc_normalise(content text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (
        SELECT regexp_replace(
                   regexp_replace(normalize({fold}, NFKC), '{space}+', ' ', 'g'),
                   '^{edge}+|{edge}+$', '', 'g')
        FROM (SELECT normalize(content, NFKC) AS s) AS n
    )
    """


TABLES = [
    """
    CREATE TABLE gc_erasure_requests (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        kind text NOT NULL CHECK (kind IN ('user', 'memory')),
        user_id text NOT NULL,
        memory_id uuid,
        requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        requested_by text NOT NULL DEFAULT 'application',
        purge_now boolean NOT NULL DEFAULT false,
        status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'completed')),
        completed_at timestamptz,
        verified_at timestamptz,
        run_id uuid,
        result jsonb NOT NULL DEFAULT '{}',
        CHECK ((kind = 'memory') = (memory_id IS NOT NULL))
    )
    """,
    # one pending request per target: a repeated request is the same request
    "CREATE UNIQUE INDEX gc_erasure_requests_pending_key ON gc_erasure_requests"
    " (kind, user_id, coalesce(memory_id, '00000000-0000-0000-0000-000000000000'))"
    " WHERE status = 'pending'",
    "CREATE INDEX gc_erasure_requests_user_idx ON gc_erasure_requests (user_id, status)",
    "CREATE INDEX gc_erasure_requests_memory_idx ON gc_erasure_requests (memory_id)"
    " WHERE memory_id IS NOT NULL",
    """
    CREATE TABLE gc_erasure_tombstones (
        id bigserial PRIMARY KEY,
        user_id text NOT NULL,
        memory_id uuid NOT NULL,
        content_hash text NOT NULL,
        preview_hash text NOT NULL,
        request_id uuid REFERENCES gc_erasure_requests (id) ON DELETE SET NULL,
        reason text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        UNIQUE (user_id, memory_id, content_hash)
    )
    """,
    "CREATE INDEX gc_erasure_tombstones_hash_idx ON gc_erasure_tombstones (user_id, content_hash)",
    "CREATE INDEX gc_erasure_tombstones_memory_idx ON gc_erasure_tombstones (memory_id)",
    "CREATE INDEX gc_actions_user_idx ON gc_actions (user_id)",
]

FUNCTIONS = [
    # the SQL twin of jobs.similarity.content_hash: sha256 of user_id, NUL, normalised content
    """
    CREATE FUNCTION memory_gc_content_hash(user_id text, content text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN encode(sha256(convert_to(user_id, 'UTF8') || decode('00', 'hex')
                         || convert_to(memory_gc_normalise(content), 'UTF8')), 'hex')
    """,
    """
    CREATE FUNCTION memory_gc_is_tombstoned(
        p_user_id text, p_content text, p_memory_id uuid DEFAULT NULL
    ) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN EXISTS (
        SELECT 1 FROM gc_erasure_tombstones t
        WHERE t.user_id = p_user_id
          AND (t.content_hash = memory_gc_content_hash(p_user_id, p_content)
               OR t.memory_id = p_memory_id)
    )
    """,
    """
    CREATE FUNCTION memory_gc_refuse_tombstoned() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF memory_gc_is_tombstoned(NEW.user_id, NEW.content, NEW.id) THEN
            RAISE EXCEPTION 'memory-gc: this memory was erased on request; not written again'
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END
    $$
    """,
]

DOWNGRADE = [
    "DROP FUNCTION memory_gc_refuse_tombstoned()",
    "DROP FUNCTION memory_gc_is_tombstoned(text, text, uuid)",
    "DROP FUNCTION memory_gc_content_hash(text, text)",
    "DROP FUNCTION memory_gc_normalise(text)",
    "DROP INDEX gc_actions_user_idx",
    "DROP TABLE gc_erasure_tombstones",
    "DROP TABLE gc_erasure_requests",
]
