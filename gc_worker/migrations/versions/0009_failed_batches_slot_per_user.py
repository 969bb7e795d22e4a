"""Failed batches; a slot holds one value per user again; find merged plan rows by source.

Revision ID: 0009

- ``gc_run_batches.state = 'failed'`` with ``error``: a batch whose job raised is rolled back,
  marked failed and the run goes on with the next batch (one bad row used to stop every user
  after it, every night). ``lost_claims``: claims of the batch that were never released — the
  worker died inside it (killed, out of memory); after ``claims.MAX_LOST_CLAIMS`` the batch is
  failed instead of crashing every worker that resumes the run.
- ``memory_gc_current`` ranks a slot across scopes again (migration 0005's function): the
  contract is "at most one current memory per (user_id, slot)"; 0008 had made it per scope.
- ``gc_actions_created_sources_idx``: the ``create_merged`` rows of plans and audits by their
  sources, so a purge can scrub a merged text made from purged rows (a plan never applied keeps
  it under a record id that never existed).
"""

from alembic import op

from gc_worker.migration_modules import load

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _migration_0008():
    return load("0008_slot_per_scope.py")


def upgrade() -> None:
    op.execute(
        "ALTER TABLE gc_run_batches ADD COLUMN error text,"
        " ADD COLUMN lost_claims integer NOT NULL DEFAULT 0,"
        " DROP CONSTRAINT gc_run_batches_state_check,"
        " ADD CONSTRAINT gc_run_batches_state_check"
        " CHECK (state IN ('pending', 'done', 'failed'))"
    )
    _migration_0008().downgrade()  # the read rule of 0005: PARTITION BY l.slot
    op.execute(
        "CREATE INDEX gc_actions_created_sources_idx ON gc_actions"
        " USING gin ((details -> 'sources')) WHERE action = 'create_merged'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX gc_actions_created_sources_idx")
    _migration_0008().upgrade()
    op.execute("UPDATE gc_run_batches SET state = 'pending' WHERE state = 'failed'")
    op.execute(
        "ALTER TABLE gc_run_batches DROP CONSTRAINT gc_run_batches_state_check,"
        " ADD CONSTRAINT gc_run_batches_state_check CHECK (state IN ('pending', 'done')),"
        " DROP COLUMN lost_claims, DROP COLUMN error"
    )
