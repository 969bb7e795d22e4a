"""A run over every user refreshes decay scores in one pass over the table, after its batches.

Revision ID: 0011

Refreshing ``decayed_confidence`` batch by batch reads and rewrites each batch's rows where they
lie; a user's rows are spread over the whole table, so every batch of a run over all users
touches most of its pages, and a page is read, dirtied and written once per batch (20 times at
a million rows and 10,000 users; 200 times at ten times that). A run over every user with more
than one batch now refreshes scores after its batches in one pass in physical order instead
(gc_worker.score_pass): each page once, sequentially.

- ``gc_runs.score_pass``: NULL, the run has no pass (its batches refresh); ``due``, it has one
  not finished yet; ``done``; ``stopped`` (a stop or an error ended it early: the scores it did
  not reach are left to the next run);
- ``gc_runs.scores_refreshed``: how many scores the pass rewrote; the run's report counts them
  as decay's ``refreshed``.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE gc_runs ADD COLUMN score_pass text"
        " CHECK (score_pass IN ('due', 'done', 'stopped'))"
    )
    op.execute("ALTER TABLE gc_runs ADD COLUMN scores_refreshed bigint")


def downgrade() -> None:
    op.execute("ALTER TABLE gc_runs DROP COLUMN scores_refreshed")
    op.execute("ALTER TABLE gc_runs DROP COLUMN score_pass")
