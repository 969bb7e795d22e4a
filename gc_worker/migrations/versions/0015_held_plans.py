"""Nightly plans held for a person: ``gc_runs.held``.

Revision ID: 0015

In ``plan_then_apply`` mode the daemon applies a nightly plan once its review delay is over.
A plan that would retire more than ``schedule.hold_above_share`` of the store's active memories
(and at least ``schedule.hold_min_rows``) is not applied by the daemon: ``held`` says why, and
the plan waits for ``memory-gc apply`` or ``memory-gc reject`` (or goes stale after
``run.max_plan_age_hours``, as any plan). NULL: not held. Adding a nullable column without a
default rewrites nothing.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE gc_runs ADD COLUMN held text")


def downgrade() -> None:
    op.execute("ALTER TABLE gc_runs DROP COLUMN held")
