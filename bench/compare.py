"""End-state comparison of the contenders' databases.

A fingerprint is computed inside PostgreSQL, so comparing a million rows moves a few numbers:
the row count and an order-independent sum of 64-bit hashes of (id, status, status_reason,
decayed_confidence rounded to 4 places, deleted_at, status_changed_at, superseded_by), plus the
lineage row count. The per-(status, reason) counts and the audit counts per (job, reason) are
kept to show where two states differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

ROW_KEY = """concat_ws('|', id, status, status_reason, round(decayed_confidence::numeric, 4),
                 deleted_at, status_changed_at, superseded_by)"""

FINGERPRINT = f"""
SELECT count(*) AS rows, coalesce(sum(hashtextextended({ROW_KEY}, 0)::numeric), 0) AS digest,
       (SELECT count(*) FROM memory_lineage) AS lineage
FROM memories
"""

BY_STATUS = """
SELECT status, coalesce(status_reason, '') AS reason, count(*) AS n
FROM memories GROUP BY 1, 2 ORDER BY 1, 2
"""

AUDIT = """
SELECT job, reason, count(*) AS n FROM gc_actions
WHERE outcome = 'applied' AND run_id = ANY(CAST(:runs AS uuid[]))
GROUP BY 1, 2 ORDER BY 1, 2
"""


@dataclass(frozen=True)
class EndState:
    rows: int
    digest: str
    lineage: int
    by_status: tuple[tuple[str, str, int], ...]

    def matches(self, other: EndState) -> bool:
        return (self.rows, self.digest, self.lineage) == (other.rows, other.digest, other.lineage)


def end_state(engine: Engine) -> EndState:
    """The fingerprint of ``memories`` / ``memory_lineage`` as they are now."""
    with engine.connect() as conn:
        row = conn.execute(sa.text(FINGERPRINT)).one()
        by_status = tuple(tuple(r) for r in conn.execute(sa.text(BY_STATUS)))
    return EndState(rows=row.rows, digest=str(row.digest), lineage=row.lineage,
                    by_status=by_status)  # fmt: skip


def audit_counts(engine: Engine, runs: list[Any]) -> dict[tuple[str, str], int]:
    """Applied audit rows per (job, reason) of the given runs."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(AUDIT), {"runs": [str(r) for r in runs]})
        return {(r.job, r.reason): r.n for r in rows}


def differences(expected: EndState, actual: EndState) -> list[str]:
    """Human-readable differences between two end states (empty when they match)."""
    if expected.matches(actual):
        return []
    out = [f"rows {expected.rows} vs {actual.rows}, lineage {expected.lineage} vs {actual.lineage}"]
    mine, theirs = _as_dict(expected), _as_dict(actual)
    for key in sorted(mine.keys() | theirs.keys()):
        if mine.get(key, 0) != theirs.get(key, 0):
            out.append(f"{key[0]}/{key[1] or '-'}: {mine.get(key, 0)} vs {theirs.get(key, 0)}")
    if len(out) == 1:
        out.append("same counts per status and reason; scores or timestamps differ")
    return out


def _as_dict(state: EndState) -> dict[tuple[str, str], int]:
    return {(status, reason): n for status, reason, n in state.by_status}
