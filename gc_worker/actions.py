"""What a job decides: frozen actions, the unit of plan, audit and restore.

A job's ``plan_*`` function turns candidate rows into actions; the executor (gc_worker.execute)
carries them out. Actions sharing a ``group`` stand or fall together: if any member row drifted
between plan and apply, none of the group is applied; an action whose
``details.depends_on_group`` names a group is not applied when that group is not (one way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from uuid import UUID


class Kind(StrEnum):
    SOFT_DELETE = "soft_delete"
    OBSOLETE = "obsolete"
    MERGE = "merge"
    CREATE_MERGED = "create_merged"
    SET_IMPORTANCE = "set_importance"
    HARD_DELETE = "hard_delete"
    REVIEW = "review"
    DEFERRED = "deferred"
    RESTORE = "restore"


# The status each status-changing action leaves its row in.
TARGET_STATUS = {Kind.SOFT_DELETE: "deleted", Kind.OBSOLETE: "obsolete", Kind.MERGE: "merged"}

# Actions after which the row is out of play for the rest of the run's jobs.
RETIRING = frozenset({Kind.SOFT_DELETE, Kind.OBSOLETE, Kind.MERGE, Kind.HARD_DELETE})

# Actions `restore` can undo while the row still exists.
RESTORABLE = frozenset(
    {Kind.SOFT_DELETE, Kind.OBSOLETE, Kind.MERGE, Kind.CREATE_MERGED, Kind.SET_IMPORTANCE}
)

# Actions whose ``row_version`` — and ``details.depends_on`` versions — are content versions
# (``memory_gc_content_version``, migration 0010: every contract column but the access bookkeeping
# and the worker's score) instead of ``xmin``. A merge, a contradiction and a model's importance
# score rest on what the rows say, not on when they were last read; an erasure was asked for
# whatever the application does with the memory meanwhile. A read between plan and apply does
# not drift them. The jobs' row queries (sql/llm_jobs.sql, sql/importance.sql, sql/erasure.sql)
# select that version. usage_prune, decay and user_cap keep ``xmin`` because a read changes
# what they decide; ttl_expiry and hard_delete keep it too (the rows they act on are expired or
# retired, off the read path).
CONTENT_VERSIONED = frozenset(
    {
        ("contradiction", Kind.OBSOLETE),
        ("compaction", Kind.MERGE),
        ("importance", Kind.SET_IMPORTANCE),
        ("erasure", Kind.SOFT_DELETE),
        ("erasure", Kind.RESTORE),
        ("erasure", Kind.HARD_DELETE),
    }
)

# Reasons that mark an erasure (they override `pinned` and use the erasure retention).
ERASURE_REASONS = ("erasure", "erasure_tombstone")


@dataclass(frozen=True, slots=True)
class Action:
    job: str
    action: Kind
    user_id: str
    reason: str
    memory_id: UUID | None = None
    # the row's version when planned (xmin, or its content version: CONTENT_VERSIONED);
    # None = no row to check
    row_version: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    preview: str | None = None  # first characters of the content, for people reading the plan
    group: str | None = None

    @property
    def retires(self) -> bool:
        return self.action in RETIRING

    @property
    def content_versioned(self) -> bool:
        return (self.job, self.action) in CONTENT_VERSIONED

    @property
    def changes_store(self) -> bool:
        return self.action not in (Kind.REVIEW, Kind.DEFERRED)


def soft_delete(job: str, row: Any, reason: str, **details: Any) -> Action:
    """A soft delete of a candidate row (any object with id, user_id, row_version, preview)."""
    return Action(
        job=job,
        action=Kind.SOFT_DELETE,
        user_id=row.user_id,
        reason=reason,
        memory_id=row.id,
        row_version=row.row_version,
        details=details,
        preview=getattr(row, "preview", None),
    )
