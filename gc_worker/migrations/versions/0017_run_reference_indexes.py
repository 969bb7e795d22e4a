"""Indexes on the columns that reference ``gc_runs``: ``gc_sweep_requests.run_id``,
``gc_review_items.run_id`` and ``gc_runs.plan_run_id``.

Revision ID: 0017

``memory-gc prune-history`` (gc_worker.history) deletes old runs one by one; PostgreSQL checks
every foreign key that references the deleted row, and without an index on the referencing
column that check reads the whole table. Sweep requests and review items are never pruned, so
each run deleted cost a scan of tables that only grow (2,000 runs against 200,000 sweep
requests: 78 s). ``history_run_left`` also looks a run up by ``plan_run_id``. The tables are the
worker's own and small next to ``memories``; the build holds them for its duration.
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# spelled out: adoption_guards.created_names() reads the names this creates from the text
CREATE = (
    "CREATE INDEX gc_sweep_requests_run_idx ON gc_sweep_requests (run_id)",
    "CREATE INDEX gc_review_items_run_idx ON gc_review_items (run_id)",
    "CREATE INDEX gc_runs_plan_run_idx ON gc_runs (plan_run_id)",
)
DROP = ("gc_sweep_requests_run_idx", "gc_review_items_run_idx", "gc_runs_plan_run_idx")


def upgrade() -> None:
    for statement in CREATE:
        op.execute(statement)


def downgrade() -> None:
    for name in DROP:
        op.execute(f"DROP INDEX {name}")
