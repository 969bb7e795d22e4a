"""Every erasure request a tombstone belongs to: ``gc_erasure_tombstones.request_ids``.

Revision ID: 0019

A tombstone recorded one request (``request_id``, the first of the erasing action's). When two
forget requests erase one row — A and B merged into M, forget A and forget B, in one run or A
first — M's tombstone named only one of them, so ``verify-erasure --memory`` of the other never
hashed for M's text (a copy of it elsewhere went unseen). ``request_ids`` holds every request
that erased the row: all of the erasing action's, and each later request whose reach covers the
row (a request completing links the tombstones of every row it reached, erased by it or
before). ``request_id`` stays as it was (the first).

Existing tombstones get their ``request_id`` and the ``request_ids`` of the erasure's audit rows
that erased their memory. A request that completed before this version, over a row another
request had erased first, is not linked (its run recorded nothing about that row).
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

ADD = "ALTER TABLE gc_erasure_tombstones ADD COLUMN request_ids uuid[] NOT NULL DEFAULT '{}'"
BACKFILL = """
UPDATE gc_erasure_tombstones t
SET request_ids = ARRAY(
    SELECT DISTINCT r.id
    FROM (SELECT t.request_id AS id
          UNION
          SELECT CAST(x.value AS uuid)
          FROM gc_actions a  -- gc_actions_memory_idx
          CROSS JOIN LATERAL jsonb_array_elements_text(
              CASE WHEN jsonb_typeof(a.details -> 'request_ids') = 'array'
                   THEN a.details -> 'request_ids' ELSE '[]' END) AS x(value)
          WHERE a.memory_id = t.memory_id AND a.user_id = t.user_id AND a.job = 'erasure'
            AND a.action = 'soft_delete' AND a.outcome = 'applied'
            AND x.value ~ '^[0-9a-fA-F-]{36}$') AS r
    WHERE r.id IS NOT NULL
    ORDER BY r.id)
"""
# spelled out: adoption_guards.created_names() reads the names this creates from the text
INDEX = (
    "CREATE INDEX gc_erasure_tombstones_requests_idx ON gc_erasure_tombstones"
    " USING gin (request_ids)"
)


def upgrade() -> None:
    op.execute(ADD)
    op.execute(BACKFILL)
    op.execute(INDEX)


def downgrade() -> None:
    op.execute("DROP INDEX gc_erasure_tombstones_requests_idx")
    op.execute("ALTER TABLE gc_erasure_tombstones DROP COLUMN request_ids")
