"""The contradiction job's rules as pure functions of candidate rows (no database, no LLM).

Rows are any objects with ``id, user_id, row_version, preview, content, slot, supersedes,
pinned, trust, valid_from, valid_until, observed_at, created_at`` (``trust`` is
``memory_gc_trust(source, metadata)``: explicit_user_statement 3 > model_inference 2 >
external 1; a gc_merge record counts as its best member).

Newer = later ``valid_from``, else later ``observed_at`` (ties: observed_at, created_at). Rows
that tie on all three (written together, e.g. in one request) have no newer: ``recency`` still
orders them by id (the read rule ranks a slot the same way), but no pair of them is decided.

- ``validity_ended``: unpinned rows whose ``valid_until <= now`` → obsolete (validity_ended).
- ``declared_pairs``: a row's ``supersedes`` names another row of the same user → the declarer
  is the winner (reason ``superseded``), the earliest-starting declarer first. Declarations on
  a cycle (A supersedes B … supersedes A: ``declared_cycles``) contradict each other: a
  review (``declared_cycle``, no proposed winner).
- ``slot_pairs``: among a slot's open-ended rows (no ``valid_until``) the slot's holder is the
  newest of the most trusted that has taken effect (a row starting after ``now`` waits); every
  older row loses to it (reason ``slot_replaced``) and every newer, less trusted row would win
  by recency but may not (→ review).
- ``decide(pair, now)``: the winner obsoletes the loser only if the winner is not a temporary
  override (has ``valid_until``: it shadows, never obsoletes), has taken effect (its start is
  not after ``now``), the loser is not pinned (→ review) and the winner is at least as trusted
  (→ review otherwise). The loser's ``valid_until`` is closed at the winner's start. A slot or
  similar pair with no newer row is a review (``no_newer``); a declared pair is decided as declared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gc_worker.actions import Action, Kind

NAME = "contradiction"
VALIDITY_ENDED = "validity_ended"
REVIEW_KIND = "contradiction"

# basis of a pair → the reason its loser is obsoleted with
REASONS = {"declared": "superseded", "slot": "slot_replaced", "similar": "contradicted"}
NO_NEWER = "no_newer"
DECLARED_CYCLE = "declared_cycle"
# a pair whose newer row is a summary user_cap folded: its time is its writing's, not its facts'
SUMMARY_NEWER = "summary_newer"
NO_WINNER = (NO_NEWER, DECLARED_CYCLE, SUMMARY_NEWER)  # review reasons that propose no winner


@dataclass(frozen=True)
class Pair:
    """Two rows of one user in conflict; ``winner`` is the one that would replace the other."""

    older: Any
    newer: Any
    winner: Any
    basis: str  # declared | slot | similar
    similarity: float | None = None

    @property
    def loser(self) -> Any:
        return self.older if self.winner is self.newer else self.newer

    @property
    def key(self) -> frozenset:
        return frozenset((self.older.id, self.newer.id))


def starts(row: Any) -> datetime:
    """When the row's fact holds from: valid_from, else when it was observed."""
    return row.valid_from or row.observed_at


def timing(row: Any) -> tuple:
    """What makes one row newer than another: its start, then observed_at, then created_at."""
    return (starts(row), row.observed_at, row.created_at)


def recency(row: Any) -> tuple:
    """``timing``, then the id: a total order for ranking, but the id is no evidence of which
    fact is newer (``no_newer``)."""
    return (*timing(row), str(row.id))


def ordered(a: Any, b: Any) -> tuple[Any, Any]:
    """(older, newer)."""
    return (a, b) if recency(a) <= recency(b) else (b, a)


def validity_ended(rows: Iterable[Any], *, now: datetime) -> list[Any]:
    """Unpinned rows whose validity window has closed at ``now``."""
    return [r for r in rows if r.valid_until is not None and r.valid_until <= now and not r.pinned]


def declared_pairs(rows: Sequence[Any]) -> list[Pair]:
    """Pairs in which one row declares it supersedes another row of the same user, the
    earliest-starting declarer first (of two declaring one target, it closes the target)."""
    by_id = {row.id: row for row in rows}
    pairs = []
    for row in sorted(rows, key=recency):
        for target_id in sorted(set(row.supersedes or ()), key=str):
            target = by_id.get(target_id)
            if target is not None and target is not row and target.user_id == row.user_id:
                pairs.append(Pair(*ordered(row, target), winner=row, basis="declared"))
    return pairs


def declared_cycles(pairs: Sequence[Pair]) -> set[frozenset]:
    """Keys of the declared pairs on a cycle of declarations (A supersedes B … supersedes A):
    they contradict each other, and deciding them in any order would guess a winner."""
    edges: dict[Any, set[Any]] = defaultdict(set)
    for pair in pairs:
        edges[pair.winner.id].add(pair.loser.id)

    def reaches(start: Any, goal: Any) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, ()))
        return False

    return {pair.key for pair in pairs if reaches(pair.loser.id, pair.winner.id)}


def scope_of(row: Any) -> str | None:
    """The row's scope (topic area): similar rows of two scopes are not put to the model as a
    contradiction ("Deadline is Friday" in two projects). A slot is not split by scope."""
    return getattr(row, "scope", None)


def slot_pairs(rows: Sequence[Any], *, now: datetime | None = None) -> list[Pair]:
    """Pairs between each open-ended row of a slot and the slot's holder: at most one current
    memory per (user_id, slot), whatever the rows' scopes (the contract; migration 0009). The
    holder is one that has taken effect at ``now`` if any: a value starting next week would
    keep every current one open until then, and close them at its own start."""
    slots: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in rows:
        if row.slot is not None and row.valid_until is None:
            slots[(row.user_id, row.slot)].append(row)
    pairs = []
    for key in sorted(slots):
        members = slots[key]
        started = [r for r in members if now is None or starts(r) <= now]
        holder = max(started or members, key=lambda r: (r.trust, recency(r)))
        for row in sorted(members, key=recency):
            if row is not holder:
                older, newer = ordered(row, holder)
                pairs.append(Pair(older, newer, winner=newer, basis="slot"))
    return pairs


def close_at(loser: Any, winner: Any) -> datetime | None:
    """The loser's new valid_until (the winner's start), or None to keep an earlier one."""
    end = starts(winner)
    if loser.valid_until is not None and loser.valid_until <= end:
        return None
    return end


def decide(pair: Pair, *, now: datetime) -> Action | None:
    """What a conflict leads to: obsolete the loser, queue a review, or nothing (yet)."""
    winner, loser = pair.winner, pair.loser
    if winner.valid_until is not None or starts(winner) > now:
        return None
    if pair.basis != "declared" and timing(winner) == timing(loser):
        # written together: only the ids would say which is "newer", and obsoleting one would
        # close it at its own start (an empty window, gone from reads of the past too)
        return review(pair, NO_NEWER)
    if loser.pinned:
        return review(pair, "pinned")
    if winner.trust < loser.trust:
        return review(pair, "lower_trust")
    return obsolete(pair)


def obsolete(pair: Pair) -> Action:
    winner, loser = pair.winner, pair.loser
    end = close_at(loser, winner)
    details = {
        "superseded_by": str(winner.id),
        "close_valid_until": end.isoformat() if end is not None else None,
        "basis": pair.basis,
        "memory_ids": [str(pair.older.id), str(pair.newer.id)],
        # decided against the winner as it was: applied only while it still is (execute.py)
        "depends_on": {str(winner.id): winner.row_version},
    }
    if pair.similarity is not None:
        details["similarity"] = round(pair.similarity, 4)
    return Action(
        job=NAME,
        action=Kind.OBSOLETE,
        user_id=loser.user_id,
        reason=REASONS[pair.basis],
        memory_id=loser.id,
        row_version=loser.row_version,
        details=details,
        preview=loser.preview,
        group=group_of(pair),
    )


def review(pair: Pair, reason: str) -> Action:
    """A review item for the pair; nothing changes until a person resolves it."""
    details: dict[str, Any] = {
        "kind": REVIEW_KIND,
        "memory_ids": [str(pair.older.id), str(pair.newer.id)],
        "basis": pair.basis,
    }
    if reason not in NO_WINNER:  # with no newer row the "winner" is only the higher id
        details["proposed_winner"] = str(pair.winner.id)
    if pair.similarity is not None:
        details["similarity"] = round(pair.similarity, 4)
    return Action(
        job=NAME,
        action=Kind.REVIEW,
        user_id=pair.older.user_id,
        reason=reason,
        memory_id=pair.loser.id,
        details=details,
        preview=pair.loser.preview,
        group=group_of(pair),
    )


def ended(row: Any) -> Action:
    return Action(
        job=NAME,
        action=Kind.OBSOLETE,
        user_id=row.user_id,
        reason=VALIDITY_ENDED,
        memory_id=row.id,
        row_version=row.row_version,
        details={"valid_until": row.valid_until.isoformat()},
        preview=row.preview,
    )


def group_of(pair: Pair) -> str:
    return f"{NAME}:{pair.older.id}:{pair.newer.id}"
