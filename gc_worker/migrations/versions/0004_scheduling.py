"""Scheduling: one run per nightly slot, and the on-demand sweep queue.

- ``gc_runs.slot`` (nullable, unique): ``nightly:<fire time, ISO 8601 UTC>``; the replica whose
  insert takes the slot starts the run, every other replica finds it and joins it.
- ``gc_sweep_requests``: a row per on-demand single-user sweep. An application may insert one
  itself (``INSERT INTO gc_sweep_requests (user_id, dry_run) VALUES ('u1', false)``); a trigger
  sends ``NOTIFY memory_gc_sweep`` so a daemon picks it up within a second or so, and daemons
  also poll every ``schedule.poll_seconds``.

Revision ID: 0004
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)


STATEMENTS = [
    "ALTER TABLE gc_runs ADD COLUMN slot text",
    "CREATE UNIQUE INDEX gc_runs_slot_key ON gc_runs (slot)",
    # runs a daemon may have to join (resume) or apply (plan_then_apply)
    "CREATE INDEX gc_runs_running_idx ON gc_runs (trigger) WHERE status = 'running'",
    "CREATE INDEX gc_runs_unapplied_plans_idx ON gc_runs (finished_at)"
    " WHERE slot IS NOT NULL AND mode = 'dry_run' AND status = 'completed'"
    " AND applied_by IS NULL",
    """
    CREATE TABLE gc_sweep_requests (
        id bigserial PRIMARY KEY,
        user_id text NOT NULL,
        dry_run boolean NOT NULL DEFAULT false,
        requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        requested_by text,
        claimed_at timestamptz,
        claimed_by text,
        attempts integer NOT NULL DEFAULT 0,
        run_id uuid REFERENCES gc_runs (id) ON DELETE SET NULL,
        status text NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'running', 'done', 'failed')),
        finished_at timestamptz,
        error text
    )
    """,
    "CREATE INDEX gc_sweep_requests_open_idx ON gc_sweep_requests (requested_at, id)"
    " WHERE status IN ('pending', 'running')",
    "CREATE INDEX gc_sweep_requests_user_idx ON gc_sweep_requests (user_id)",
    """
    CREATE FUNCTION memory_gc_sweep_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('memory_gc_sweep', NEW.id::text);
        RETURN NULL;
    END
    $$
    """,
    "CREATE TRIGGER gc_sweep_requests_inserted AFTER INSERT ON gc_sweep_requests"
    " FOR EACH ROW EXECUTE FUNCTION memory_gc_sweep_notify()",
    # a request handed back by a stopping daemon wakes the others too
    "CREATE TRIGGER gc_sweep_requests_released AFTER UPDATE OF status ON gc_sweep_requests"
    " FOR EACH ROW WHEN (NEW.status = 'pending' AND OLD.status <> 'pending')"
    " EXECUTE FUNCTION memory_gc_sweep_notify()",
]

DOWNGRADE = [
    "DROP TABLE gc_sweep_requests",
    "DROP FUNCTION memory_gc_sweep_notify()",
    "DROP INDEX gc_runs_unapplied_plans_idx",
    "DROP INDEX gc_runs_running_idx",
    "ALTER TABLE gc_runs DROP COLUMN slot",
]
