"""The read rule: two rows that declare each other shadow neither.

Revision ID: 0018

An application that wrote both directions of a replacement ("Lives in Paris" declaring "Lives
in Berlin" in ``supersedes``, and Berlin declaring Paris) made ``memory_gc_current`` hide both:
each shadowed the other, so the fact was gone from the request path. The contradiction job
changes nothing for such a pair and leaves it to a person (a ``declared_cycle`` review); the
read rule now agrees: a declaration whose target declares its declarer back, with the same
trust (both would take effect), is set aside, and the two rows are read as if neither declared
(in one slot, the slot's ranking keeps one). A less trusted row's declaration never took
effect, so a more trusted one's stands. Longer cycles (A → B → C → A) are not looked for: the
read path would need the declarations' closure; they still hide their rows until the review is
resolved (docs/llm-jobs.md).

The pairs are found in the one sort the declarations already go through (a window over the
pair, whichever way it is declared), with no join: the shadow check stays linear.
"""

from alembic import op

from gc_worker.migration_modules import load

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# 0012's declarations, each naming a row with its declarer's trust, become the ones no pair
# sets aside: a window over each pair, whichever way it is declared, marks the mutual ones.
_DECLARATIONS = """\
    SELECT s.id, false, NULL, o.trust, o.bounded, NULL
    FROM live o CROSS JOIN LATERAL unnest(o.supersedes) AS s(id)
    WHERE cardinality(o.supersedes) > 0 AND s.id <> o.id
"""
_UNSET_ASIDE = """\
    SELECT id, false, NULL, by_trust, by_bounded, NULL
    FROM declared WHERE NOT mutual
"""
_MARKS = "marks AS (  -- each live row"
_DECLARED = """\
declared AS (  -- each declaration naming a row, and whether the row declares its
                -- declarer back with the same trust (then both are set aside)
    SELECT s.id, o.trust AS by_trust, o.bounded AS by_bounded,
           bool_or(o.id < s.id) OVER pair AND bool_or(o.id > s.id) OVER pair AS mutual
    FROM live o CROSS JOIN LATERAL unnest(o.supersedes) AS s(id)
    WHERE cardinality(o.supersedes) > 0 AND s.id <> o.id
    WINDOW pair AS (PARTITION BY least(s.id, o.id), greatest(s.id, o.id), o.trust)
),
"""


def _migration_0012():
    return load("0012_read_rule_scope_ties.py")


def upgrade() -> None:
    previous = _migration_0012()
    text = previous.CURRENT_FUNCTION
    assert _DECLARATIONS in text and _MARKS in text, "0012's read rule is not the one 0018 amends"
    text = text.replace(_DECLARATIONS, _UNSET_ASIDE).replace(_MARKS, _DECLARED + _MARKS)
    reasons = load("0005_read_rule.py").SUPERSESSION_REASONS
    op.execute(
        text.replace("{reasons}", reasons).replace("{closed_reasons}", previous.CLOSED_REASONS)
    )


def downgrade() -> None:
    _migration_0012().upgrade()
