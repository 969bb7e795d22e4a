"""Per-batch work lists for the run-start scan, and a float8 decay function.

Revision ID: 0006

- ``gc_run_batches.work``: for each job that can tell from a one-pass scan at run start which
  users it has work for, those users of the batch (``{"decay": ["u1", …], …}``); NULL when no
  scan was made (every job reads every user of the batch). See gc_worker.triage.
- ``memory_gc_decayed`` computes the age with ``date_part`` (float8) instead of ``extract``
  (numeric since PostgreSQL 14): the same value (the result is a ``real``), about twice as
  fast over a million rows.
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

DECAYED = """
CREATE OR REPLACE FUNCTION memory_gc_decayed(
    confidence real, importance smallint, anchor timestamptz, at timestamptz,
    half_life_days float8, multipliers float8[]
) RETURNS real
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (
    CASE
        WHEN confidence < 1e-6
          OR greatest({age}, 0) / 86400.0 / (half_life_days * multipliers[importance]) >= 64
        THEN 0
        ELSE confidence * power(
            0.5::float8,
            greatest({age}, 0) / 86400.0 / (half_life_days * multipliers[importance]))
    END
)::real
"""


def upgrade() -> None:
    op.execute("ALTER TABLE gc_run_batches ADD COLUMN work jsonb")
    op.execute(DECAYED.format(age="date_part('epoch', at - anchor)"))


def downgrade() -> None:
    op.execute(DECAYED.format(age="extract(epoch FROM (at - anchor))"))
    op.execute("ALTER TABLE gc_run_batches DROP COLUMN work")
