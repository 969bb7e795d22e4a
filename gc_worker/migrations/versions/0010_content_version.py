"""A memory's content version: what a merge, a contradiction, an importance score or an erasure
was decided on, without the access bookkeeping.

Revision ID: 0010

``memory_gc_content_version(memories)`` hashes every contract column of a row except the ones
a mere read or the worker's score refresh writes (``last_accessed_at``, ``access_count``,
``decayed_confidence``), the embedding included (a merge copies or averages it); an adopted
store's own extra columns are not in it. The actions of gc_worker.actions.CONTENT_VERSIONED
record it as their row version (and a contradiction's newer fact's, as its premise) instead of
``xmin``: the application putting a stale fact into a model context between a plan and its
apply no longer drifts the plan that retires the fact — before, a fact read more often than
plans were applied was never closed under ``plan_then_apply`` (nor erased, nor scored). Any
other write to a contract column (content, embedding, slot, validity, pin, status, metadata …)
still drifts it.

Text is hashed by its bytes (``COLLATE "C"``): under a nondeterministic collation of the
application's a case-only edit would otherwise hash the same. The body is a string, not a
SQL-standard body: no dependency on the columns is recorded, so an operator's
``ALTER TABLE memories`` is never refused on its account.
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

CONTENT_VERSION = """
CREATE OR REPLACE FUNCTION memory_gc_content_version(m memories) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hash_record_extended(ROW(
        m.user_id COLLATE "C", m.content COLLATE "C", CAST(m.embedding AS real[]),
        m.memory_type COLLATE "C", m.source COLLATE "C", m.scope COLLATE "C",
        m.slot COLLATE "C", m.supersedes, m.importance, m.importance_assessed_at, m.confidence,
        m.pinned, m.created_at, m.updated_at, m.observed_at, m.valid_from, m.valid_until,
        m.expires_at, m.status COLLATE "C", m.status_reason COLLATE "C", m.status_changed_at,
        m.superseded_by, m.deleted_at, m.metadata), 0)
$$
"""


def upgrade() -> None:
    op.execute(CONTENT_VERSION)


def downgrade() -> None:
    op.execute("DROP FUNCTION memory_gc_content_version(memories)")
