"""The LLM jobs' tables: decision cache and review queue.

Revision ID: 0002
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


STATEMENTS = [
    """
    CREATE TABLE gc_llm_cache (
        key text PRIMARY KEY,
        kind text NOT NULL,
        user_id text NOT NULL,
        memory_ids uuid[] NOT NULL DEFAULT '{}',
        value jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    "CREATE INDEX gc_llm_cache_user_idx ON gc_llm_cache (user_id)",
    "CREATE INDEX gc_llm_cache_memories_idx ON gc_llm_cache USING gin (memory_ids)",
    """
    CREATE TABLE gc_review_items (
        id bigserial PRIMARY KEY,
        run_id uuid REFERENCES gc_runs (id) ON DELETE SET NULL,
        user_id text NOT NULL,
        kind text NOT NULL,
        memory_ids uuid[] NOT NULL,
        reason text NOT NULL,
        details jsonb NOT NULL DEFAULT '{}',
        status text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
        resolution jsonb,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        resolved_at timestamptz
    )
    """,
    "CREATE INDEX gc_review_items_open_idx ON gc_review_items (user_id) WHERE status = 'open'",
    "CREATE INDEX gc_review_items_memories_idx ON gc_review_items USING gin (memory_ids)",
]
