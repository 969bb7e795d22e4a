"""The records user_cap's summarize mode writes (jobs.user_cap plans when): the summary of the
rows folded for one over-cap user (``summary_record``: its columns) and its actions
(``summary_actions``: create_merged, then a soft delete per folded row, as one group).
``summary_depth``: how many summarisations or merges deep a row is. ``Overflow``: one over-cap
user's split of rows to fold (in chunks), to evict and to leave waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID, uuid4

from gc_worker.actions import Action, Kind, soft_delete
from jobs.compaction_records import MERGED_SOURCE, TRUST_SOURCES, depth_value

NAME = "user_cap"
REASON = "over_cap"
SUMMARIZED = "over_cap_summarized"
SUMMARY_TYPE = "summary"
SUMMARY_SOURCE = "gc_merge"


def summary_depth(row: Any) -> int:
    """How many summarisations or merges deep a row is (0 for an ordinary memory): a merged
    record already stands for several rows, and folding it would summarise a merge."""
    metadata = row.metadata if isinstance(row.metadata, dict) else {}
    values = [depth_value(metadata.get(key)) for key in ("summary_depth", "merge_depth")]
    depths = [v for v in values if v is not None]
    if depths:
        return max(depths)
    return 1 if row.memory_type == SUMMARY_TYPE or row.source == MERGED_SOURCE else 0


@dataclass(frozen=True)
class Overflow:
    """One over-cap user's plan (jobs.user_cap_split): chunks of rows to fold, each into its
    own summary (the most valuable chunk first), rows to evict plainly (with why each is not
    folded), rows left waiting for a later run."""

    user_id: str
    excess: int
    chunks: tuple[tuple[Any, ...], ...]  # each least valuable first
    evict: tuple[Any, ...]
    ranked: tuple[Any, ...]  # the rows it looked at, least valuable first
    not_folded: tuple[str, ...] = ()  # aligned with evict, when there is a fold
    waiting: tuple[Any, ...] = ()  # foldable rows the run's chunks could not take

    @property
    def fold(self) -> tuple[Any, ...]:
        """Every row of the chunks, least valuable first."""
        return tuple(row for chunk in reversed(self.chunks) for row in chunk)

    @property
    def plain(self) -> tuple[Any, ...]:
        """What plain eviction takes (no summary, or the fallback)."""
        return self.ranked[: self.excess]


def summary_record(
    fold: Sequence[Any],
    full: Mapping[UUID, Any],
    *,
    text: str,
    embedding: list[float] | None,
    embedding_source: str,
    importance: Mapping,
    now_iso: str,
) -> dict[str, Any]:
    """The memories columns of the summary of ``fold`` (``full`` = their complete rows)."""
    members = [full[row.id] for row in fold]
    scopes = {m.scope for m in members}
    expiries = [m.expires_at for m in members if m.expires_at is not None]
    # a default no one assessed stays unassessed, for the importance job to score
    assessed = any(m.importance_assessed_at is not None or m.id in importance for m in members)
    return {
        "content": text,
        "embedding": embedding,
        "memory_type": SUMMARY_TYPE,
        "source": SUMMARY_SOURCE,
        "scope": scopes.pop() if len(scopes) == 1 else None,
        "importance": max(importance.get(row.id, row.importance) for row in fold),
        "importance_assessed_at": now_iso if assessed else None,
        "confidence": max(m.confidence for m in members),
        # used as recently as its most recently used row (read, else written: usage_prune's
        # rule), not since an old read of another while a row written since was never read
        "last_accessed_at": max(row.last_accessed_at or row.created_at for row in fold).isoformat(),
        # no folded fact outlives its TTL (the rows would otherwise be evicted now)
        "expires_at": min(expiries).isoformat() if expiries else None,
        "metadata": {
            "summary_depth": max(summary_depth(row) for row in fold) + 1,
            "summarized_count": len(fold),
            "embedding_source": embedding_source,
            # a model wrote it from every folded row: as trusted as the least trusted of them
            "trust_source": TRUST_SOURCES.get(min(m.trust for m in members), "external"),
        },
    }


def summary_actions(user_id: str, fold: Sequence[Any], record: Mapping[str, Any]) -> list[Action]:
    """create_merged for the summary of ``fold``, then a soft delete per folded row, as one
    group."""
    summary_id = uuid4()
    group = f"summary:{summary_id}"
    create = Action(
        job=NAME,
        action=Kind.CREATE_MERGED,
        user_id=user_id,
        reason=SUMMARIZED,
        memory_id=summary_id,
        details={
            "record": dict(record),
            "sources": [str(row.id) for row in fold],
            "summary_depth": record["metadata"]["summary_depth"],
        },
        preview=record["content"][:200],
        group=group,
    )
    folded = [
        replace(soft_delete(NAME, row, SUMMARIZED, superseded_by=str(summary_id)), group=group)
        for row in fold
    ]
    return [create, *folded]
