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
# The erasure's audit rows of tombstoned memories, aggregated once and joined by hash: a lookup
# per tombstone intersected the user's audit rows with the memory's (gc_actions_user_idx),
# quadratic in a forgotten user's rows (50,000 tombstones, 250,000 audit rows: 6 minutes, the
# tombstones locked meanwhile; 10 seconds this way).
BACKFILL = """
UPDATE gc_erasure_tombstones t
SET request_ids = n.ids
FROM (SELECT t2.id,
             ARRAY(SELECT DISTINCT u
                   FROM unnest(array_remove(ARRAY[t2.request_id], NULL)
                               || coalesce(f.ids, CAST('{}' AS uuid[]))) AS u
                   ORDER BY u) AS ids
      FROM gc_erasure_tombstones t2
      LEFT JOIN (SELECT a.memory_id, a.user_id, array_agg(CAST(x.value AS uuid)) AS ids
                 FROM gc_actions a
                 CROSS JOIN LATERAL jsonb_array_elements_text(
                     CASE WHEN jsonb_typeof(a.details -> 'request_ids') = 'array'
                          THEN a.details -> 'request_ids' ELSE '[]' END) AS x(value)
                 WHERE a.job = 'erasure' AND a.action = 'soft_delete'
                   AND a.outcome = 'applied'
                   AND a.memory_id IN (SELECT memory_id FROM gc_erasure_tombstones)
                   AND x.value ~ '^[0-9a-fA-F-]{36}$'
                 GROUP BY a.memory_id, a.user_id) AS f
        ON f.memory_id = t2.memory_id AND f.user_id = t2.user_id) AS n
WHERE t.id = n.id AND n.ids <> CAST('{}' AS uuid[])
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
