"""contradiction: the older of two conflicting memories becomes obsolete, or a person decides.

Options (``[contradiction]``):
    enabled = true      run the job at all
    similarity = 0.75   cosine similarity at which two memories are a candidate pair for the LLM
    max_pairs_per_memory = 3   only each memory's most similar pairs go to the LLM

Per user, over active rows (jobs.contradiction_rules has the rules in full):

1. ``valid_until <= now`` (unpinned) → ``obsolete``, reason ``validity_ended``.
2. Deterministic pairs: a declared ``supersedes`` (the declarer wins) and rows sharing a
   ``slot`` (per user, whatever their scope: the newest of the most trusted wins). The loser →
   ``obsolete`` (reason ``superseded`` / ``slot_replaced``) with ``superseded_by`` and its
   ``valid_until`` closed at the winner's start — unless the winner is a temporary override
   (has ``valid_until``: it shadows, never obsoletes), has not taken effect yet, is less
   trusted than the loser, or the loser is pinned: then a ``review`` (kind contradiction,
   memory_ids [older, newer]) and no change. Two rows written together (same start,
   ``observed_at`` and ``created_at``: neither is newer) → ``review`` (reason ``no_newer``),
   unless declared. Declarations on a cycle (A supersedes B, B supersedes A) → ``review``
   (reason ``declared_cycle``). A declarer obsoleted by another declaration in the same run
   still closes what it declared (a chain v3 → v2 → v1 is decided whole, whatever the ids).
3. Other pairs at or above ``similarity`` (not exact duplicates — compaction's —, not a
   newer temporary override, not of two scopes: two topic areas, e.g. two projects'
   deadlines) go
   to the LLM, one call per pair (cached on the exact inputs): ``contradicts`` → as in 2
   (reason ``contradicted``) if the texts differ in a fact (``differing_facts``), else a
   ``review`` (reason ``llm_unverified``); ``duplicate`` / ``compatible`` → nothing;
   ``unsure`` → ``review`` (reason ``llm_unsure``). Offline, over budget or with the
   LLM down → ``deferred`` (reason ``llm_unavailable`` / ``llm_budget``). A rejected answer
   changes nothing and counts in ``errors``.

A pair with an open review, or one a person dismissed, is left alone (no new review, no call).
Every action on a pair carries the group ``contradiction:<older>:<newer>``. Embedded rows whose
vector is unusable (wrong size, zero, non-finite) are counted in ``skipped``; pairs that would be
asked but are left out by ``max_pairs_per_memory`` in ``not_asked`` (they are not listed as
deferred: a cluster of near-copies would otherwise list n(n−1)/2 pairs). The quota counts only
pairs that would be asked: the ones never asked (above) do not use it up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from gc_worker.actions import Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.queries import q
from jobs.contradiction_rules import (
    DECLARED_CYCLE,
    NAME,
    SUMMARY_NEWER,
    Pair,
    decide,
    declared_cycles,
    declared_pairs,
    ended,
    ordered,
    review,
    scope_of,
    slot_pairs,
    validity_ended,
)
from jobs.llm_support import (
    Deferral,
    ModelGate,
    deferred,
    first_preview,
    rows_by_user,
    with_embeddings,
)
from jobs.similarity import normalise_text, pairs_above
from jobs.text_facts import differing_facts

__all__ = ["NAME", "plan", "plan_contradiction"]

Judge = Callable[[Any, Any], Any]  # (older, newer) -> verdict | Deferral | None


class _Plan:
    """The running state of one user's plan: actions so far and what they settled."""

    def __init__(self, blocked: set[frozenset]) -> None:
        self.actions: list[Action] = []
        self.handled: set[frozenset] = set(blocked)
        self.lost: set[Any] = set()

    def open(self, pair: Pair) -> bool:
        """Not settled yet, and neither row obsoleted in this run — but a declarer that was
        keeps closing its own target: no later run sees its declaration again (it is no longer
        active), and with no cycles (``declared_cycles``) no row is closed for its own loser."""
        gone = {pair.loser.id} if pair.basis == "declared" else {pair.older.id, pair.newer.id}
        return pair.key not in self.handled and not (gone & self.lost)

    def add(self, pair: Pair, action: Action | None) -> None:
        self.handled.add(pair.key)
        if action is None:
            return
        self.actions.append(action)
        if action.action is Kind.OBSOLETE:
            self.lost.add(action.memory_id)


def plan_contradiction(
    rows: Sequence[Any],
    *,
    now: datetime,
    similarity: float,
    dim: int,
    judge: Judge,
    blocked: set[frozenset] | None = None,
    max_pairs_per_memory: int | None = None,
) -> tuple[list[Action], int, int]:
    """One user's actions, the number of rows skipped for an unusable embedding, and the
    number of pairs that would be asked but for ``max_pairs_per_memory``."""
    state = _Plan(blocked or set())
    finished = validity_ended(rows, now=now)
    state.actions += [ended(row) for row in finished]
    live = [r for r in rows if r.valid_until is None or r.valid_until > now]
    declared = declared_pairs(live)
    cycles = declared_cycles(declared)
    for pair in [*declared, *slot_pairs(live, now=now)]:
        if state.open(pair):
            on_cycle = pair.basis == "declared" and pair.key in cycles
            state.add(pair, review(pair, DECLARED_CYCLE) if on_cycle else decide(pair, now=now))
    kept, vectors, skipped = with_embeddings([r for r in live if r.id not in state.lost], dim)
    by_id = {row.id: row for row in kept}
    scored = pairs_above([r.id for r in kept], vectors, similarity=similarity)
    similar = [_similar(by_id[a], by_id[b], score) for a, b, score in scored]
    # pairs never asked about go before the quota: near-copies in other scopes (or reviewed,
    # or exact duplicates) would otherwise fill a memory's quota, night after night
    askable = [(p.older.id, p.newer.id, p) for p in similar if state.open(p) and _worth_asking(p)]
    asked = nearest_pairs(askable, max_pairs_per_memory)
    for _, _, pair in asked:
        if state.open(pair):  # a verdict earlier in this loop may have obsoleted one of its rows
            state.add(pair, _judged(pair, judge(pair.older, pair.newer), now=now))
    return state.actions, skipped, len(askable) - len(asked)


def _similar(a: Any, b: Any, score: float) -> Pair:
    older, newer = ordered(a, b)
    return Pair(older, newer, winner=newer, basis="similar", similarity=score)


def nearest_pairs(pairs: Sequence[tuple], limit: int | None) -> list[tuple]:
    """The most similar pairs (``pairs``: ``(a, b, …)`` tuples, most similar first) such that
    no memory is in more than ``limit`` of them: a cluster of n near-copies costs at most
    n·limit/2 LLM calls, not n(n−1)/2."""
    if limit is None:
        return list(pairs)
    used: dict[Any, int] = defaultdict(int)
    kept = []
    for item in pairs:
        a, b = item[:2]
        if used[a] < limit and used[b] < limit:
            used[a] += 1
            used[b] += 1
            kept.append(item)
    return kept


def _worth_asking(pair: Pair) -> bool:
    """Whether the LLM's verdict could change anything for a similarity-only pair."""
    older, newer = pair.older, pair.newer
    if scope_of(older) != scope_of(newer):
        return False  # two topic areas (two projects' deadlines): not one fact
    if newer.valid_until is not None:
        return False  # a temporary override shadows, it never obsoletes
    if older.slot is not None and older.slot == newer.slot and older.valid_until is None:
        return False  # the slot rule owns it
    return normalise_text(older.content) != normalise_text(newer.content)  # compaction's


def _judged(pair: Pair, verdict: Any, *, now: datetime) -> Action | None:
    if verdict is None:
        return None
    if isinstance(verdict, Deferral):
        members = [pair.older, pair.newer]
        score = round(pair.similarity or 0.0, 4)
        # whether a verdict could obsolete one (else at most a review): compaction holds the
        # rows of such a pair only (gc_worker.batch.BatchContext.record)
        differ = bool(differing_facts(pair.older.content, pair.newer.content))
        return deferred(NAME, pair.older.user_id, [m.id for m in members], verdict.reason,
                        preview=first_preview(members), similarity=score,
                        facts_differ=differ)  # fmt: skip
    if verdict.verdict == "contradicts":
        if not differing_facts(pair.older.content, pair.newer.content):
            # nothing in the texts differs that could make them conflict (a number, date,
            # name, negation, direction, antonym): the verdict is not acted on unchecked
            return review(pair, "llm_unverified")
        if getattr(pair.newer, "summary", False):
            # a summary is as new as its writing, not as the facts it folds (old, low-value
            # rows over the cap): "newer" would retire a recent row for a stale fact
            return review(pair, SUMMARY_NEWER)
        return decide(pair, now=now)
    if verdict.verdict == "unsure":
        return review(pair, "llm_unsure")
    return None  # duplicate (compaction's) or compatible


def blocked_pairs(ctx: BatchContext) -> dict[str, set[frozenset]]:
    """Per user, the memory sets of open or dismissed contradiction reviews."""
    blocked: dict[str, set[frozenset]] = defaultdict(set)
    for row in ctx.conn.execute(q("contradiction_blocked_pairs"), ctx.params()):
        blocked[row.user_id].add(frozenset(row.memory_ids))
    return blocked


def plan(ctx: BatchContext) -> list[Action]:
    gate = ModelGate(ctx, NAME)
    blocked = blocked_pairs(ctx)
    settings = ctx.settings
    actions: list[Action] = []
    for user_id, rows in rows_by_user(ctx, "contradiction_candidates"):

        def judge(older: Any, newer: Any, user_id: str = user_id) -> Any:
            return gate.ask(
                lambda llm: llm.judge_contradiction(
                    user_id, (older.id, older.content), (newer.id, newer.content)
                ),
                user_id=user_id,
                size=2,
            )

        user_actions, skipped, not_asked = plan_contradiction(
            rows,
            now=ctx.now,
            similarity=settings.contradiction.similarity,
            dim=settings.embeddings.dim,
            judge=judge,
            blocked=blocked.get(user_id),
            max_pairs_per_memory=settings.contradiction.max_pairs_per_memory,
        )
        actions += user_actions
        ctx.job_stats(NAME).skipped += skipped
        ctx.job_stats(NAME).not_asked += not_asked
    return actions


def asks_model(settings: Settings) -> bool:
    """gc_worker.engine: planning may call the model, so it is done before the batch
    transaction."""
    return True
