"""The memory store (DESIGN.md section 2) and the worker's run, batch and action tables.

Revision ID: 0001
"""

from alembic import context, op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    dim = int(context.config.attributes.get("embedding_dim", 1536))
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(MEMORIES.format(dim=dim))
    for statement in [*MEMORY_INDEXES, DECAY_FUNCTION, *WORKER_TABLES]:
        op.execute(statement)


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

MEMORY_INDEXES = [
    # every job reads one batch of users' active rows
    "CREATE INDEX memories_user_status_idx ON memories (user_id, status)",
    "CREATE INDEX memories_ttl_idx ON memories (user_id, expires_at)"
    " WHERE status = 'active' AND expires_at IS NOT NULL",
    "CREATE INDEX memories_deleted_idx ON memories (user_id, deleted_at) WHERE status = 'deleted'",
    "CREATE INDEX memories_history_idx ON memories (user_id, status_changed_at)"
    " WHERE status IN ('obsolete', 'merged')",
    "CREATE INDEX memories_slot_idx ON memories (user_id, slot)"
    " WHERE status = 'active' AND slot IS NOT NULL",
    "CREATE INDEX memories_valid_until_idx ON memories (user_id, valid_until)"
    " WHERE status = 'active' AND valid_until IS NOT NULL",
    """
    CREATE TABLE memory_lineage (
        derived_id uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        source_id uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE,
        PRIMARY KEY (derived_id, source_id)
    )
    """,
    "CREATE INDEX memory_lineage_source_idx ON memory_lineage (source_id)",
    """
    CREATE VIEW active_memories AS
    SELECT * FROM memories
    WHERE status = 'active' AND (expires_at IS NULL OR expires_at > now())
    """,
]

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
