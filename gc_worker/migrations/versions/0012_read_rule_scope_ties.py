"""The read rule: a scoped read is a subset of the unscoped one; slot ties as the jobs break them;
no quadratic shadow check.

Revision ID: 0012

``memory_gc_current`` (migrations 0005, 0009) filtered by scope before it applied the shadow
and slot rules, so a read of one scope ignored what other scopes said about its rows: a
temporary override without a scope that declares a ``scheduling`` rule in ``supersedes`` hid it
from the unscoped read but not from the read of ``scheduling`` (for the override's whole window:
the jobs never obsolete what an override shadows), and a slot value replaced by a newer one in
another scope was still current in its own. The scope now filters what the rules leave.

Slot ties (same trust, start and ``observed_at``: rows written in one transaction, or an adopted
store whose ``observed_at`` was added with one default) were broken by the lowest id, while the
contradiction job keeps the newest by ``created_at`` and then the highest id
(``jobs.contradiction_rules.recency``): the value the application read flipped once the job
ran. The read rule now breaks ties the same way.

The shadow check compared every live row of the user with every other (a nested loop: 4.6 s
for a user with 8,000 rows); the declarations now meet the rows they name in one sort (a window
over rows and declarations by id), with no join the planner could make a nested loop of.

A "bounded" slot value (a temporary override, ranked before open-ended ones) is one whose own
``valid_until`` is set, not one whose window the worker closed at its replacement (from the
audit's prior state): a replaced value closed by the contradiction job outranked the real
override in reads of the past once the job ran. A slot's holder hidden by a temporary override
(declared in its ``supersedes``) keeps its slot while hidden: the value it replaced does not come
back in its place (the job obsoletes that one anyway); an open-ended declaration replaces for
good and takes the row out of its slot's ranking.

A record the worker derived (a merge, a summary) counts as known from the instant of the run
that wrote it (its ``create_merged`` audit row), not from its ``updated_at``: an application
edit of the record moved that, and a read as known between the merge and the edit lost the
fact (its members merged, the record not yet known).
"""

from alembic import op

from gc_worker.migration_modules import load

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _migration_0005():
    return load("0005_read_rule.py")


CURRENT_FUNCTION = """
CREATE OR REPLACE FUNCTION memory_gc_current(
    p_user_id text, p_scope text, p_at timestamptz, p_known_at timestamptz DEFAULT NULL
) RETURNS SETOF memories
LANGUAGE sql STABLE
AS $fn$
WITH seen AS (
    SELECT m AS mem, m.id, m.slot, m.scope, m.supersedes, m.observed_at, m.created_at,
           m.status_reason,
           coalesce(m.valid_from, m.observed_at) AS starts,
           memory_gc_trust(m.source, m.metadata) AS trust,
           CASE WHEN later.changed THEN 'active' ELSE m.status END AS status_then,
           CASE WHEN later.changed AND prior.found THEN prior.valid_until
                ELSE m.valid_until END AS ends,
           -- bounded by its own window (a temporary override), not by the one the worker
           -- closed at its replacement's start
           CASE WHEN prior.found THEN prior.valid_until IS NOT NULL
                ELSE m.valid_until IS NOT NULL END AS bounded
    FROM memories m
    CROSS JOIN LATERAL (
        SELECT coalesce(p_known_at IS NOT NULL AND m.status_changed_at > p_known_at, false)
               AS changed
    ) later
    LEFT JOIN LATERAL (
        SELECT true AS found, (a.prior ->> 'valid_until')::timestamptz AS valid_until
        FROM gc_actions a
        WHERE (later.changed
               OR (m.status = 'obsolete' AND m.status_reason IN ({closed_reasons})))
          AND a.memory_id = m.id AND a.outcome = 'applied'
          AND a.action IN ('obsolete', 'merge') AND a.prior IS NOT NULL
        ORDER BY a.id DESC
        LIMIT 1
    ) prior ON true
    WHERE m.user_id = p_user_id
      AND m.status <> 'deleted'
      AND (p_known_at IS NULL OR (
            m.observed_at <= p_known_at
            AND (NOT EXISTS (SELECT 1 FROM memory_lineage l WHERE l.derived_id = m.id)
                 OR coalesce((SELECT r.now FROM gc_actions a JOIN gc_runs r ON r.id = a.run_id
                              WHERE a.memory_id = m.id AND a.action = 'create_merged'
                                AND a.outcome IN ('applied', 'restored')
                              ORDER BY a.id LIMIT 1),
                             m.updated_at) <= p_known_at)))
),
live AS MATERIALIZED (
    SELECT * FROM seen
    WHERE (status_then = 'active'
           OR (status_then = 'obsolete' AND status_reason IN ({reasons})))
      AND starts <= p_at
      AND (ends IS NULL OR p_at < ends)
      AND ((mem).expires_at IS NULL OR p_at < (mem).expires_at)
),
marks AS (  -- each live row, and each declaration naming one (with the declarer's trust, and
            -- whether the declarer is a temporary override)
    SELECT l.id, true AS is_row, l.trust, NULL::integer AS by_trust,
           NULL::boolean AS by_bounded, l AS row
    FROM live l
    UNION ALL
    SELECT s.id, false, NULL, o.trust, o.bounded, NULL
    FROM live o CROSS JOIN LATERAL unnest(o.supersedes) AS s(id)
    WHERE cardinality(o.supersedes) > 0 AND s.id <> o.id
),
judged AS (  -- one sort, whatever the planner estimates (a join of live with itself became a
             -- nested loop, rescanning live per declaring row, when it thought live small)
    SELECT is_row, row, trust,
           max(by_trust) FILTER (WHERE NOT by_bounded) OVER (PARTITION BY id) AS replacer_trust,
           max(by_trust) FILTER (WHERE by_bounded) OVER (PARTITION BY id) AS override_trust
    FROM marks
),
ranked AS (  -- replaced for good by an open-ended declarer at least as trusted: out of its
             -- slot; shadowed by a temporary override: still its slot's holder, hidden while
             -- the override runs (the value it replaced does not come back)
    SELECT (row).*, coalesce(override_trust >= trust, false) AS overridden
    FROM judged
    WHERE is_row AND coalesce(replacer_trust < trust, true)
),
shown AS (
    SELECT l.*, row_number() OVER (
        PARTITION BY l.slot
        ORDER BY l.trust DESC, l.bounded DESC, l.starts DESC, l.observed_at DESC,
                 l.created_at DESC, l.id DESC
    ) AS slot_rank
    FROM ranked l
)
SELECT (mem).* FROM shown
WHERE NOT overridden AND (slot IS NULL OR slot_rank = 1)
  AND (p_scope IS NULL OR scope = p_scope)
ORDER BY (mem).importance DESC, starts DESC, id
$fn$
"""


# Obsolete reasons for which the worker closed the row's window at its replacement's start.
CLOSED_REASONS = "'superseded', 'slot_replaced', 'contradicted', 'review_superseded'"


def upgrade() -> None:
    reasons = _migration_0005().SUPERSESSION_REASONS
    op.execute(
        CURRENT_FUNCTION.replace("{reasons}", reasons).replace("{closed_reasons}", CLOSED_REASONS)
    )


def downgrade() -> None:
    text = _migration_0005().CURRENT_FUNCTION
    op.execute(text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
