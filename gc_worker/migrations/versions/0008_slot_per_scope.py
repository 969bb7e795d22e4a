"""The read rule keeps one value per slot *per scope*.

Revision ID: 0008

``memory_gc_current`` ranked the rows of a slot across scopes, so an unscoped read
(``scope = NULL``) showed one project's ``deadline`` and hid the other's — while the jobs keep one
holder per slot and scope (compaction and contradiction never pair rows of two scopes). The
function is the one of migration 0005 with ``PARTITION BY (l.mem).scope, l.slot``.
"""

from alembic import op

from gc_worker.migration_modules import load

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SIGNATURE = "memory_gc_current(text, text, timestamptz, timestamptz)"


def _read_rule_0005():
    return load("0005_read_rule.py").CURRENT_FUNCTION


def _function(partition: str) -> str:
    text = _read_rule_0005().replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    assert "PARTITION BY l.slot\n" in text  # the 0005 body this migration was written against
    return text.replace("PARTITION BY l.slot\n", f"PARTITION BY {partition}\n", 1)


def upgrade() -> None:
    op.execute(_function("(l.mem).scope, l.slot"))


def downgrade() -> None:
    op.execute(_function("l.slot"))
