"""The read rule for the request path: ``memory_gc_current`` and the trust order it uses.

Revision ID: 0005

- ``memory_gc_trust(source, metadata)``: explicit_user_statement 3 > model_inference 2 >
  external 1 (and any unknown source); a record the worker made (source ``gc_…``) counts as the
  best source among its members (``metadata.trust_source``), else as model_inference.
- ``memory_gc_current(user_id, scope, at, known_at)``: what is current at ``at`` (see
  gc_worker.read_rule for the rule in words).
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TRUST_FUNCTION = """
CREATE FUNCTION memory_gc_trust(source text, metadata jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN left(source, 3) = 'gc_' THEN CASE metadata ->> 'trust_source'
        WHEN 'explicit_user_statement' THEN 3
        WHEN 'model_inference' THEN 2
        WHEN 'external' THEN 1
        ELSE 2 END
    WHEN source = 'explicit_user_statement' THEN 3
    WHEN source = 'model_inference' THEN 2
    ELSE 1
END
"""

# Obsolete rows whose reason means "true until it was replaced": they stay current for the part
# of their (closed) validity window before the replacement.
SUPERSESSION_REASONS = "'superseded', 'slot_replaced', 'contradicted', 'validity_ended', " \
    "'review_superseded'"  # fmt: skip

CURRENT_FUNCTION = f"""
CREATE FUNCTION memory_gc_current(
    p_user_id text, p_scope text, p_at timestamptz, p_known_at timestamptz DEFAULT NULL
) RETURNS SETOF memories
LANGUAGE sql STABLE
AS $fn$
WITH seen AS (
    SELECT m AS mem, m.id, m.slot, m.supersedes, m.observed_at, m.status_reason,
           coalesce(m.valid_from, m.observed_at) AS starts,
           memory_gc_trust(m.source, m.metadata) AS trust,
           CASE WHEN later.changed THEN 'active' ELSE m.status END AS status_then,
           CASE WHEN later.changed AND prior.found THEN prior.valid_until
                ELSE m.valid_until END AS ends
    FROM memories m
    CROSS JOIN LATERAL (
        SELECT coalesce(p_known_at IS NOT NULL AND m.status_changed_at > p_known_at, false)
               AS changed
    ) later
    LEFT JOIN LATERAL (
        SELECT true AS found, (a.prior ->> 'valid_until')::timestamptz AS valid_until
        FROM gc_actions a
        WHERE later.changed AND a.memory_id = m.id AND a.outcome = 'applied'
          AND a.action IN ('obsolete', 'merge') AND a.prior IS NOT NULL
        ORDER BY a.id DESC
        LIMIT 1
    ) prior ON true
    WHERE m.user_id = p_user_id
      AND (p_scope IS NULL OR m.scope = p_scope)
      AND m.status <> 'deleted'
      AND (p_known_at IS NULL OR (
            m.observed_at <= p_known_at
            AND (m.updated_at <= p_known_at
                 OR NOT EXISTS (SELECT 1 FROM memory_lineage l WHERE l.derived_id = m.id))))
),
live AS (
    SELECT * FROM seen
    WHERE (status_then = 'active'
           OR (status_then = 'obsolete' AND status_reason IN ({SUPERSESSION_REASONS})))
      AND starts <= p_at
      AND (ends IS NULL OR p_at < ends)
      AND ((mem).expires_at IS NULL OR p_at < (mem).expires_at)
),
shown AS (
    SELECT l.*, row_number() OVER (
        PARTITION BY l.slot
        ORDER BY l.trust DESC, (l.ends IS NOT NULL) DESC, l.starts DESC, l.observed_at DESC, l.id
    ) AS slot_rank
    FROM live l
    WHERE NOT EXISTS (
        SELECT 1 FROM live o
        WHERE o.id <> l.id AND l.id = ANY(o.supersedes) AND o.trust >= l.trust
    )
)
SELECT (mem).* FROM shown
WHERE slot IS NULL OR slot_rank = 1
ORDER BY (mem).importance DESC, starts DESC, id
$fn$
"""


def upgrade() -> None:
    op.execute(TRUST_FUNCTION)
    op.execute(CURRENT_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS memory_gc_current(text, text, timestamptz, timestamptz)")
    op.execute("DROP FUNCTION IF EXISTS memory_gc_trust(text, jsonb)")
