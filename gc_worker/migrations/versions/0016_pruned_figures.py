"""A pruned run's report figures: ``gc_runs.pruned_figures``.

Revision ID: 0016

``memory-gc prune-history`` removes an old run's batch rows and most of its audit rows, which
its report's totals, job counters and LLM usage are computed from. Before the first of them go,
the prune keeps those figures here (with ``pruned_at``), once; the report shows them and says
how many of the run's actions are still listed. NULL: never pruned. Adding a nullable column
without a default rewrites nothing.
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE gc_runs ADD COLUMN pruned_figures jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE gc_runs DROP COLUMN pruned_figures")
