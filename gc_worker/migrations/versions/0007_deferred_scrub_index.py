"""Find the audit rows of deferred groups by their members, to scrub their content preview.

Revision ID: 0007

A ``deferred`` action (a group waiting for an LLM) has no ``memory_id`` of its own: its members
are ``details.memory_ids`` and its ``content_preview`` is the first member's text. When a member
is purged (``hard_delete``) that preview must go too; this partial GIN index lets the purge find
those rows by member id without reading the audit of every user in the batch.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX gc_actions_group_members_idx ON gc_actions"
        " USING gin ((details -> 'memory_ids'))"
        " WHERE memory_id IS NULL AND content_preview IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX gc_actions_group_members_idx")
