"""The memory store (DESIGN.md section 2) and the worker's run, batch and action tables.

Revision ID: 0001

On a database where the application already made ``memories`` (and perhaps ``memory_lineage``
and ``active_memories``), the tables and their rows are kept (gc_worker.adoption checked their
shape first) and what the worker relies on is added: the contract's column defaults, the CHECKs
(in one ALTER: one scan), the indexes (IF NOT EXISTS: one built CONCURRENTLY beforehand
under the same name is kept), lineage's foreign keys and pair key, the view if it is missing.
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    dim = int(context.config.attributes.get("embedding_dim", 1536))
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    if _exists("memories"):
        _complete_memories()
    else:
        op.execute(MEMORIES.format(dim=dim))
    _create_missing(MEMORY_INDEXES)
    if _exists("memory_lineage"):
        _complete_lineage()
    else:
        op.execute(LINEAGE)
    _create_missing(LINEAGE_INDEXES)
    if not _exists("active_memories"):
        op.execute(ACTIVE_VIEW)
    for statement in [DECAY_FUNCTION, *WORKER_TABLES]:
        op.execute(statement)


def _exists(name: str) -> bool:
    found = sa.text("SELECT to_regclass(:name) IS NOT NULL")
    return op.get_bind().execute(found, {"name": name}).scalar()


def _create_missing(indexes: dict[str, str]) -> None:
    """Each index unless one of its name exists: an operator may have built it CONCURRENTLY
    beforehand (it is kept, and its table is not locked again for it)."""
    for name, statement in indexes.items():
        if not _exists(name):
            op.execute(statement)


def _complete_memories() -> None:
    """An application's table: add the defaults and CHECKs the worker relies on."""
    bind = op.get_bind()
    undefaulted = set(
        bind.execute(
            sa.text(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'memories'::regclass"
                " AND attnum > 0 AND NOT attisdropped AND NOT atthasdef"
            )
        ).scalars()
    )
    for column, default in DEFAULTS.items():
        if column in undefaulted:
            op.execute(f"ALTER TABLE memories ALTER COLUMN {column} SET DEFAULT {default}")
    missing = [(name, check) for name, check in CHECKS.items()
               if not _has_constraint("memories", name)]  # fmt: skip
    if missing:  # one ALTER: the table is scanned once to check them all
        added = ", ".join(f"ADD CONSTRAINT {name} CHECK ({check})" for name, check in missing)
        op.execute(f"ALTER TABLE memories {added}")


def _complete_lineage() -> None:
    """An application's lineage table: cascading foreign keys and one row per pair."""
    bind = op.get_bind()
    for column in ("derived_id", "source_id"):
        keyed = bind.execute(
            sa.text(
                "SELECT EXISTS (SELECT 1 FROM pg_constraint c JOIN pg_attribute a"
                " ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)"
                " WHERE c.conrelid = 'memory_lineage'::regclass AND c.contype = 'f'"
                " AND c.confrelid = 'memories'::regclass AND a.attname = :column)"
            ),
            {"column": column},
        ).scalar()
        if not keyed:
            name = f"memory_lineage_{column}_fkey"
            op.execute(
                f"ALTER TABLE memory_lineage ADD CONSTRAINT {name} FOREIGN KEY ({column})"
                " REFERENCES memories (id) ON DELETE CASCADE NOT VALID"
            )
            op.execute(f"ALTER TABLE memory_lineage VALIDATE CONSTRAINT {name}")
    paired = bind.execute(
        sa.text(
            "SELECT EXISTS (SELECT 1 FROM pg_index i"
            " WHERE i.indrelid = 'memory_lineage'::regclass AND i.indisunique"
            " AND i.indisvalid AND i.indimmediate"  # a failed CONCURRENTLY build enforces nothing
            " AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = 2"
            " AND (SELECT array_agg(attname ORDER BY attname) FROM pg_attribute"
            "      WHERE attrelid = i.indrelid AND attnum = ANY(i.indkey))"
            "     = ARRAY['derived_id', 'source_id']::name[])"
        )
    ).scalar()
    if not paired:
        op.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS memory_lineage_pair_key"
            " ON memory_lineage (derived_id, source_id)"
        )


def _has_constraint(table: str, name: str) -> bool:
    found = sa.text(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint"
        " WHERE conrelid = to_regclass(:table) AND conname = :name)"
    )
    return op.get_bind().execute(found, {"table": table, "name": name}).scalar()


MEMORIES = """
CREATE TABLE memories (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id text NOT NULL,
    content text NOT NULL,
    embedding vector({dim}),
    memory_type text NOT NULL DEFAULT 'semantic',
    source text NOT NULL DEFAULT 'explicit_user_statement',
    scope text,
    slot text,
    supersedes uuid[] NOT NULL DEFAULT '{{}}',
    importance smallint NOT NULL DEFAULT 3 CHECK (importance BETWEEN 1 AND 5),
    importance_assessed_at timestamptz,
    confidence real NOT NULL DEFAULT 1.0 CHECK (confidence BETWEEN 0 AND 1),
    decayed_confidence real,
    pinned boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    last_accessed_at timestamptz,
    access_count integer NOT NULL DEFAULT 0,
    observed_at timestamptz NOT NULL DEFAULT now(),
    valid_from timestamptz,
    valid_until timestamptz,
    expires_at timestamptz,
    status text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'obsolete', 'merged', 'deleted')),
    status_reason text,
    status_changed_at timestamptz,
    superseded_by uuid,
    deleted_at timestamptz,
    metadata jsonb NOT NULL DEFAULT '{{}}'
)
"""

# the contract's defaults and CHECKs, for an application's table (MEMORIES has them inline,
# where PostgreSQL names the CHECKs the same way)
DEFAULTS = {
    "id": "gen_random_uuid()",
    "memory_type": "'semantic'",
    "source": "'explicit_user_statement'",
    "supersedes": "'{}'",
    "importance": "3",
    "confidence": "1.0",
    "pinned": "false",
    "created_at": "now()",
    "updated_at": "now()",
    "access_count": "0",
    "observed_at": "now()",
    "status": "'active'",
    "metadata": "'{}'",
}
CHECKS = {
    "memories_importance_check": "importance BETWEEN 1 AND 5",
    "memories_confidence_check": "confidence BETWEEN 0 AND 1",
    "memories_status_check": "status IN ('active', 'obsolete', 'merged', 'deleted')",
}

MEMORY_INDEXES = {
    # every job reads one batch of users' active rows
    "memories_user_status_idx": "CREATE INDEX IF NOT EXISTS memories_user_status_idx"
    " ON memories (user_id, status)",
    "memories_ttl_idx": "CREATE INDEX IF NOT EXISTS memories_ttl_idx"
    " ON memories (user_id, expires_at) WHERE status = 'active' AND expires_at IS NOT NULL",
    "memories_deleted_idx": "CREATE INDEX IF NOT EXISTS memories_deleted_idx"
    " ON memories (user_id, deleted_at) WHERE status = 'deleted'",
    "memories_history_idx": "CREATE INDEX IF NOT EXISTS memories_history_idx"
    " ON memories (user_id, status_changed_at) WHERE status IN ('obsolete', 'merged')",
    "memories_slot_idx": "CREATE INDEX IF NOT EXISTS memories_slot_idx"
    " ON memories (user_id, slot) WHERE status = 'active' AND slot IS NOT NULL",
    "memories_valid_until_idx": "CREATE INDEX IF NOT EXISTS memories_valid_until_idx"
    " ON memories (user_id, valid_until) WHERE status = 'active' AND valid_until IS NOT NULL",
}

LINEAGE = """
CREATE TABLE memory_lineage (
    derived_id uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    source_id uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
    PRIMARY KEY (derived_id, source_id)
)
"""
LINEAGE_INDEXES = {
    "memory_lineage_source_idx": "CREATE INDEX IF NOT EXISTS memory_lineage_source_idx"
    " ON memory_lineage (source_id)",
}

ACTIVE_VIEW = """
CREATE VIEW active_memories AS
SELECT * FROM memories
WHERE status = 'active' AND (expires_at IS NULL OR expires_at > now())
"""

# The decay rule, defined once for SQL (jobs.decay.decayed_confidence is its Python twin; a test
# checks they agree). A pure function of stored columns and `at`. Past 64 half-lives (factor
# < 5e-20) or for confidence < 1e-6 the score is 0: `real` cannot hold the underflow.
DECAY_FUNCTION = """
CREATE FUNCTION memory_gc_decayed(
    confidence real, importance smallint, anchor timestamptz, at timestamptz,
    half_life_days float8, multipliers float8[]
) RETURNS real
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (
    CASE
        WHEN confidence < 1e-6
          OR greatest(extract(epoch FROM (at - anchor)), 0) / 86400.0
             / (half_life_days * multipliers[importance]) >= 64
        THEN 0
        ELSE confidence * power(
            0.5::float8,
            greatest(extract(epoch FROM (at - anchor)), 0) / 86400.0
                / (half_life_days * multipliers[importance]))
    END
)::real
"""

WORKER_TABLES = [
    """
    CREATE TABLE gc_runs (
        id uuid PRIMARY KEY,
        mode text NOT NULL CHECK (mode IN ('dry_run', 'apply', 'restore')),
        status text NOT NULL DEFAULT 'running'
            CHECK (status IN ('running', 'completed', 'failed', 'rejected')),
        trigger text NOT NULL DEFAULT 'cli',
        now timestamptz NOT NULL,
        started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        finished_at timestamptz,
        users text[],
        jobs text[] NOT NULL,
        settings jsonb NOT NULL DEFAULT '{}',
        plan_run_id uuid REFERENCES gc_runs (id),
        applied_by uuid,
        llm jsonb NOT NULL DEFAULT '{}',
        error text
    )
    """,
    "CREATE INDEX gc_runs_started_idx ON gc_runs (started_at)",
    """
    CREATE TABLE gc_run_batches (
        run_id uuid NOT NULL REFERENCES gc_runs (id) ON DELETE CASCADE,
        batch_no integer NOT NULL,
        users text[] NOT NULL,
        state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done')),
        worker text,
        finished_at timestamptz,
        stats jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, batch_no)
    )
    """,
    "CREATE INDEX gc_run_batches_pending_idx ON gc_run_batches (run_id) WHERE state = 'pending'",
    """
    CREATE TABLE gc_actions (
        id bigserial PRIMARY KEY,
        run_id uuid NOT NULL REFERENCES gc_runs (id) ON DELETE CASCADE,
        batch_no integer NOT NULL,
        seq integer NOT NULL,
        job text NOT NULL,
        action text NOT NULL,
        memory_id uuid,
        user_id text NOT NULL,
        reason text NOT NULL,
        details jsonb NOT NULL DEFAULT '{}',
        row_version bigint,
        outcome text NOT NULL
            CHECK (outcome IN ('planned', 'applied', 'drifted', 'restored')),
        prior jsonb,
        content_preview text,
        recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    "CREATE INDEX gc_actions_run_idx ON gc_actions (run_id, batch_no, seq)",
    "CREATE INDEX gc_actions_memory_idx ON gc_actions (memory_id)",
]
