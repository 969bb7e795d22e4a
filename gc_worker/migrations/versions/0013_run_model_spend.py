"""One model budget per run, whatever number of processes work it; resolved reviews by user.

Revision ID: 0013

``llm.max_calls_per_run`` / ``max_tokens_per_run`` were counted by each process: one joining a
run started from what the run's batches had recorded by then, so replicas joining the nightly
run together (each at zero) could together spend the budget once each. ``gc_run_llm_spend``
holds what every process and thread working a run has spent on the model: a call is taken
from it (``UPDATE … WHERE calls < limit``) before it is made, and its tokens added after.

``gc_review_items_user_kind_idx``: every batch of compaction and contradiction reads its users'
dismissed reviews (a `restore` of a model's merge or verdict records one); the only index by
user covered open items, so resolved ones were a scan of the whole table per batch.
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE gc_run_llm_spend (
            run_id uuid PRIMARY KEY REFERENCES gc_runs (id) ON DELETE CASCADE,
            calls bigint NOT NULL DEFAULT 0 CHECK (calls >= 0),
            tokens bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0)
        )
        """
    )
    op.execute("CREATE INDEX gc_review_items_user_kind_idx ON gc_review_items (user_id, kind)")


def downgrade() -> None:
    op.execute("DROP INDEX gc_review_items_user_kind_idx")
    op.execute("DROP TABLE gc_run_llm_spend")
