"""The merged record compaction creates, and the actions that create it (pure functions).

``merged_record(members, ...)`` — the memories columns of one merged record:

    content             the LLM's merged statement, or (exact duplicates) the earliest member's text
    source              gc_merge; ``metadata.trust_source`` = the most trusted member's source
                        for exact duplicates, the least trusted one's for a text the model wrote
    importance          the highest (as importance scored them earlier in the batch, a lowered
                        score too: the record, marked assessed, is never scored again)
    created_at, observed_at, valid_from   the earliest (valid_from null if any member's is)
    last_accessed_at    the latest use (a member's last_accessed_at, else its created_at: as
                        usage_prune and user_cap read use), so the record, dated by its earliest
                        member, is not unused while a member restated since is not;
                        access_count the sum (both re-read from the locked members at apply:
                        sql/execute.sql merged_access)
    expires_at          null if any member has none, else the latest
    memory_type, scope, slot   shared by all members, else semantic / null / null
    embedding           the embeddings model's, or the text's own (exact duplicates: copied from
                        the member whose text is kept), or the normalised centroid of the members;
                        ``metadata.embedding_source`` says which (model, copied, centroid)
    metadata            merge_depth (one more than the deepest member), merged_count,
                        embedding_source, trust_source

``merge_actions`` returns one ``create_merged`` (new uuid4; details.record, details.sources) and a
``merge`` per member (details.superseded_by / into = the new id), all in one group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import numpy as np

from gc_worker.actions import Action, Kind
from gc_worker.llm import centroid_embedding

NAME = "compaction"
MERGED_SOURCE = "gc_merge"
TRUST_SOURCES = {3: "explicit_user_statement", 2: "model_inference", 1: "external"}
DEPTH_KEYS = ("merge_depth", "summary_depth")


def merge_depth(row: Any) -> int:
    """0 for a record the application wrote; how many merges deep a worker-made record is.
    (metadata is any JSON in an adopted store: an array or a string has no depth.)"""
    metadata = row.metadata if isinstance(row.metadata, dict) else {}
    for key in DEPTH_KEYS:
        value = depth_value(metadata.get(key))
        if value is not None:
            return value
    return 1 if row.source == MERGED_SOURCE or row.memory_type == "summary" else 0


def depth_value(value: Any) -> int | None:
    """A depth read from JSON metadata: a whole number >= 0 — also written as ``2.0`` (JSON has
    one number type; an application's tooling may rewrite the worker's ``2`` so) — else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None  # (NaN and the infinities are not whole numbers either)
    return int(value) if value >= 0 else None


def mergeable(row: Any, max_merge_depth: int) -> bool:
    """Application rows always; merged records only while under ``max_merge_depth``."""
    depth = merge_depth(row)
    return depth == 0 or depth < max_merge_depth


def cohesive(
    members: Sequence[Any], footprints: Mapping[Any, np.ndarray], similarity: float
) -> list[Any]:
    """The group without the members unlike a row another member stands for: each member's
    footprint (its own unit vector, and for a merged record those of the rows it stands for)
    must reach ``similarity`` with every other kept member's. Merged records are taken first
    (what is there stays; a new row joins it or stays out), then earliest first; the group's
    order is kept."""
    order = sorted(members, key=lambda m: (-merge_depth(m), m.created_at, str(m.id)))
    kept: list[Any] = []
    for member in order:
        mine = footprints[member.id]
        if all(float((mine @ footprints[k].T).min()) >= similarity - 1e-9 for k in kept):
            kept.append(member.id)
    return [m for m in members if m.id in kept]


def earliest(members: Sequence[Any]) -> Any:
    return min(members, key=lambda m: (m.created_at, str(m.id)))


def _shared(values: Sequence[Any], default: Any) -> Any:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else default


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _latest_or_none(values: Sequence[datetime | None]) -> datetime | None:
    """None if any value is None (open-ended wins), else the latest."""
    return None if any(v is None for v in values) else max(values)  # type: ignore[type-var]


def merged_record(
    members: Sequence[Any],
    *,
    content: str,
    embedding: Sequence[float],
    embedding_source: str,
    importance: Mapping[UUID, int] | None = None,
    assessed_at: datetime | None = None,
    model_written: bool = False,
) -> dict[str, Any]:
    """The memories columns of the record that replaces ``members`` (see module docstring)."""
    importance = importance or {}
    assessed = [m.importance_assessed_at for m in members if m.importance_assessed_at]
    if assessed_at is not None and any(m.id in importance for m in members):
        assessed.append(assessed_at)  # scored earlier in this batch: the record is assessed too
    starts = [m.valid_from for m in members]
    return {
        "content": content,
        "embedding": [float(x) for x in embedding],
        "memory_type": _shared([m.memory_type for m in members], "semantic"),
        "source": MERGED_SOURCE,
        "scope": _shared([m.scope for m in members], None),
        "slot": _shared([m.slot for m in members], None),
        "importance": max(importance.get(m.id, m.importance) for m in members),
        "importance_assessed_at": _iso(max(assessed)) if assessed else None,
        "confidence": max(float(m.confidence) for m in members),
        "created_at": _iso(min(m.created_at for m in members)),
        "observed_at": _iso(min(m.observed_at for m in members)),
        "valid_from": None if None in starts else _iso(min(starts)),
        "last_accessed_at": _iso(max(m.last_accessed_at or m.created_at for m in members)),
        # held to an integer column's range (merged_access re-reads it at apply, unclamped
        # where the column is bigint)
        "access_count": min(sum(int(m.access_count) for m in members), 2**31 - 1),
        "expires_at": _iso(_latest_or_none([m.expires_at for m in members])),
        "metadata": {
            "merge_depth": max(merge_depth(m) for m in members) + 1,
            "merged_count": len(members),
            "embedding_source": embedding_source,
            # a text the model wrote can carry any member's claim: it is trusted as the least
            # trusted member; an exact duplicate keeps a member's own text and its best source
            "trust_source": TRUST_SOURCES.get(
                (min if model_written else max)(m.trust for m in members), "external"
            ),
        },
    }


def centroid_of(vectors: Sequence[Sequence[float]]) -> list[float]:
    return centroid_embedding([list(map(float, v)) for v in vectors])


def merge_actions(
    user_id: str, members: Sequence[Any], record: Mapping[str, Any], *, reason: str, **details: Any
) -> list[Action]:
    """create_merged for the new record, then a merge per member, all in one group."""
    new_id = uuid4()
    group = f"{NAME}:{new_id}"
    create = Action(
        job=NAME,
        action=Kind.CREATE_MERGED,
        user_id=user_id,
        reason=reason,
        memory_id=new_id,
        details={"record": dict(record), "sources": [str(m.id) for m in members], **details},
        preview=str(record["content"])[:200],
        group=group,
    )
    merges = [
        Action(
            job=NAME,
            action=Kind.MERGE,
            user_id=user_id,
            reason=reason,
            memory_id=m.id,
            row_version=m.row_version,
            details={"superseded_by": str(new_id), "into": str(new_id)},
            preview=m.preview,
            group=group,
        )
        for m in members
    ]
    return [create, *merges]
