"""user_cap: keep each user's active memories at or under ``max_memories``.

Options (``[user_cap]``):
    max_memories = 500     active rows allowed per user (pinned rows count but are never evicted)
    overflow = "evict"     or "summarize": fold the evicted rows into one summary first
    fallback_to_evict = false   with "summarize": evict anyway when the LLM can't summarise
    max_summary_depth = 1  a summary is not folded into a summary-of-summaries beyond this
    max_summary_rows = 20  rows one summary folds at most
    max_summaries_per_user = 10  chunks one user's rows are cut into in one run at most (a
                           rejected chunk's parts are each a summary too); when they cannot
                           bring the user to the cap the least valuable rows wait for the next
                           run (or with the fallback are evicted)

Eviction order: lowest importance first (as re-assessed earlier in the run), then least recently
used (last_accessed_at, else created_at), then oldest, then id. ``overflow = "evict"`` emits
``soft_delete`` with reason ``over_cap`` for the ``active - cap`` least valuable unpinned rows.

``overflow = "summarize"``: each summary is one more active row, so ``k`` summaries take the
``active - cap + k`` least valuable rows; the fewest chunks of at most ``max_summary_rows``
that bring the user to the cap are made, in disjoint runs of consecutive rows, the most
valuable chunk first (jobs.user_cap_split). Those that may be folded (summary depth <
``max_summary_depth``; an ordinary row has depth 0, a summary or merged record the worker made has
``metadata.summary_depth`` / ``merge_depth`` (the larger counts), one the application wrote with
memory_type ``summary`` counts as depth 1) are folded by the LLM, chunk by chunk, each into one
record — ``create_merged`` (memory_type ``summary``, source ``gc_merge``, importance the highest
among the folded rows (assessed if one of theirs was), ``last_accessed_at`` their latest use
(``last_accessed_at``, else ``created_at``), ``metadata.summary_depth`` one more than theirs,
embedding from the embeddings port, else the normalised centroid of the folded rows' non-zero
embeddings of ``embeddings.dim``, lineage to each)
and a ``soft_delete`` per folded row (reason ``over_cap_summarized``, superseded_by the summary),
one group per chunk. Taken rows that may not be folded are evicted plainly (``over_cap``,
``details.not_folded`` says why): at the depth limit (a summary is itself subject to the cap, it
is just not re-summarised past the depth), or a row the open-ended, slotless summary would
change the reading of (``fold_blocker``: bounded, not yet valid or expired, a slot's value, a
declarer or a declared row, a row of an open review). The summary expires with the earliest TTL
among the folded rows: no fact outlives its own.

Summarising needs at least two foldable rows among the taken ones and ``active - cap + 1``
evictable rows; otherwise (pinned rows leave too little room) eviction is plain, exactly as with
``overflow = "evict"``. A chunk whose summary is rejected (``llm_invalid``: malformed, or
dropping a folded row's facts) is asked again in parts (jobs.user_cap_fold: halves, depth first,
the more valuable first, at most ``2 * ceil(log2(rows))`` further calls); each part that passes
is its own summary. Rows no part could fold are *set aside*: listed as ``deferred`` (reason
``llm_invalid``), they count as the user's like pinned rows, hold back no eviction, and the
user's next foldable rows are cut into chunks in their place (another round, ``next_round``,
within the run's ``max_summaries_per_user`` chunks; rows read on past the first ranking); the
first round's plain evictions stand, a later round evicts nothing. One row the model cannot
fold no longer keeps its user over the cap. When the LLM is offline, unavailable, out of budget,
refuses a request for its content, or isolation is off for the batch (a model that never
answers validly) and a chunk is rejected, the user's questions end (the summaries already made
stay): with ``fallback_to_evict`` the least valuable rows not folded are evicted plainly down to
the cap (``details.fallback`` says why; set-aside rows too); without it the user stays over the
cap and the rows not folded are listed as ``deferred`` (reason ``llm_unavailable`` /
``llm_invalid`` / ``llm_budget``; details.memory_ids = their rows, details.over_cap_by = how far
over the cap the user stays, in every listing of the user; 0 when rows set aside were made up
for). Rows the run's chunks could not take are listed the same way, reason ``summary_rows``.
A taken row that may not be folded is evicted only when something was folded; while the user
stays over the cap for such a reason, only when ranked before the most valuable folded row, and
that eviction rests on that summary (``details.depends_on_group``: it drifts with it at apply).
A user whose rows changed between the ranking and the fold read gets no action but that
listing, reason ``rows_changed``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any
from uuid import UUID

import structlog

from gc_worker.actions import Action, soft_delete
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.queries import q
from jobs.importance import INVALID, UNAVAILABLE
from jobs.llm_support import deferred
from jobs.user_cap_fold import Answer, Folding, ModelState, fold_chunk, fold_chunks
from jobs.user_cap_fold import summary_embedding as summary_embedding  # (re-exported)
from jobs.user_cap_records import NAME, REASON, Overflow
from jobs.user_cap_records import summary_depth as summary_depth  # (re-exported)
from jobs.user_cap_split import WAITING, eviction_key, fold_blocker, split_overflow

log = structlog.get_logger("memory_gc")

ROWS_CHANGED = "rows_changed"  # a fold row deleted or moved since the ranking read it


def choose_evictions(
    rows: Iterable[Any], *, active: int, cap: int, importance: Mapping | None = None
) -> list[Any]:
    """The least valuable ``active - cap`` of one user's evictable rows (fewer if not enough)."""
    importance = importance or {}
    excess = max(active - cap, 0)
    return sorted(rows, key=lambda row: eviction_key(row, importance))[:excess]


def by_user(rows: Iterable[Any]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        grouped[row.user_id].append(row)
    return grouped


def plan_user_cap(
    rows: Iterable[Any],
    active_counts: Mapping[str, int],
    *,
    cap: int,
    importance: Mapping | None = None,
) -> list[Action]:
    """Evict per user down to the cap; ``active_counts`` includes pinned rows."""
    grouped = by_user(rows)
    actions = []
    for user_id in sorted(active_counts):
        chosen = choose_evictions(
            grouped[user_id], active=active_counts[user_id], cap=cap, importance=importance
        )
        actions += [soft_delete(NAME, r, REASON, active=active_counts[user_id]) for r in chosen]
    return actions


def evictions(rows: Iterable[Any], **details: Any) -> list[Action]:
    return [soft_delete(NAME, row, REASON, **details) for row in rows]


def plan_overflow(
    ctx: BatchContext, overflow: Overflow, full: dict[UUID, Any], model: ModelState
) -> list[Action]:
    """One over-cap user's actions in summarize mode: its chunks folded most valuable first
    (jobs.user_cap_fold: a rejected chunk in parts), round after round while rows the model
    could not fold are set aside (``next_round``), then what is evicted plainly and what waits
    (``leftovers``). ``model``: what the batch's earlier questions said of the model — no
    retry storm against a server that is down. ``full``: the fold rows' complete rows."""
    if not overflow.chunks:
        return evictions(overflow.evict)

    def ask(part: tuple[Any, ...]) -> Answer:
        return fold_chunk(ctx, overflow.user_id, part, full, model.refusals)

    folding, chunks = Folding(), overflow.chunks
    chunks_left = ctx.settings.user_cap.max_summaries_per_user
    waiting = overflow.waiting
    while chunks:
        aside = len(folding.waits.get(INVALID, ()))
        fold_chunks(chunks, ask, model, folding, overflow.user_id)
        chunks_left -= len(chunks)
        if len(folding.waits.get(INVALID, ())) == aside or folding.reason or waiting:
            break  # nothing set aside, or the questions ended, or no chunk is left
        if chunks_left <= 0 or ctx.settings.user_cap.fallback_to_evict:
            break
        chunks, waiting = next_round(ctx, overflow, folding, full, chunks_left)
    return folding.actions + leftovers(ctx, replace(overflow, waiting=waiting), folding)


def next_round(
    ctx: BatchContext, overflow: Overflow, folding: Folding, full: dict[UUID, Any],
    chunks_left: int,
) -> tuple[tuple[tuple[Any, ...], ...], tuple[Any, ...]]:  # fmt: skip
    """After rows were set aside (no part of them could be folded: they count as the user's,
    like pinned rows): (chunks of the user's foldable rows not yet taken, to fold in their
    place, at most ``chunks_left``; rows those chunks could not take). The first round's
    plain evictions stand; no other row is evicted. No chunk when none brings the user closer
    to the cap, or a row to fold changed since the ranking."""
    depth = ctx.settings.user_cap.max_summary_depth
    out = {row.id for part, _ in folding.made for row in part} | {r.id for r in overflow.evict}
    out |= {row.id for rows in folding.waits.values() for row in rows}
    shrunk = sum(len(part) - 1 for part, _ in folding.made)
    excess = overflow.excess - shrunk - len(overflow.evict)
    # the first read took just what the first round could use: read on, as far as this one can
    ranked = candidates(ctx, [overflow.user_id], [len(out) + excess + chunks_left])
    rows = [r for r in ranked if r.id not in out and fold_blocker(r, depth) is None]
    cap = ctx.settings.user_cap.max_memories
    split = split_user(ctx, overflow.user_id, rows, cap + excess, chunks_left)
    if not split.chunks:
        return (), ()
    new = [row.id for row in split.fold if row.id not in full]
    if new:
        full.update((r.id, r) for r in ctx.conn.execute(q("user_cap_fold_rows"), {"ids": new}))
    if any(getattr(full.get(row.id), "user_id", None) != row.user_id for row in split.fold):
        return (), ()
    return split.chunks, split.waiting


def split_user(
    ctx: BatchContext, user_id: str, rows: Iterable[Any], active: int, max_chunks: int
) -> Overflow:
    """split_overflow with the run's policy."""
    policy = ctx.settings.user_cap
    return split_overflow(
        user_id, rows, active=active, cap=policy.max_memories,
        max_depth=policy.max_summary_depth, importance=ctx.importance,
        max_rows=policy.max_summary_rows, max_chunks=max_chunks,
        fallback=policy.fallback_to_evict,
    )  # fmt: skip


def leftovers(ctx: BatchContext, overflow: Overflow, folding: Folding) -> list[Action]:
    """After the chunks were asked (``folding``; ``overflow``: the first round's ranking,
    excess and evictions, the last round's waiting rows): the plain evictions, and what waits,
    listed as ``deferred`` with how far over the cap the user stays — per reason the rows no
    summary was made of, and the rows no chunk could take (summary_rows). With the fallback,
    rows no summary was made of mean the least valuable rows not folded are evicted down to
    the cap."""
    folded = {row.id for part, _ in folding.made for row in part}
    shrunk = sum(len(part) - 1 for part, _ in folding.made)  # each summary is one more row
    kept_out = list(zip(overflow.evict, overflow.not_folded, strict=True))
    why = folding.reason or next(iter(folding.waits), None)
    if why is not None:
        log.info("user_cap.summary_skipped", user_id=overflow.user_id, reason=why,
                 summaries=len(folding.made))  # fmt: skip
        if ctx.settings.user_cap.fallback_to_evict:
            rest = [row for row in overflow.ranked if row.id not in folded]
            return evictions(rest[: overflow.excess - shrunk], fallback=why)
    # a row a later round read ranks after every row of the first read (next_round)
    ranks = {row.id: i for i, row in enumerate(overflow.ranked)}
    rank = defaultdict(lambda: len(ranks), ranks)
    top, top_group = max(((rank[p[-1].id], g) for p, g in folding.made), default=(-1, None))
    held_back = folding.reason is not None or bool(overflow.waiting)
    if held_back or not folding.made:
        # the user stays over the cap: a row ranked after the most valuable folded one is not
        # evicted while less valuable rows wait, and none is when nothing was folded (a model
        # that answers nothing validly changes nothing); rows set aside (no part of them could
        # be folded) count as pinned ones, they hold back nothing else
        kept_out = [(row, w) for row, w in kept_out if rank[row.id] < top]
    over = overflow.excess - shrunk - len(kept_out)
    # and those evictions rest on that summary: its drift at apply leaves them waiting too
    rests = {"depends_on_group": top_group} if held_back and over and top_group else {}
    actions = [soft_delete(NAME, row, REASON, not_folded=w, **rests) for row, w in kept_out]
    for reason, rows in folding.waits.items():
        ids = [row.id for row in sorted(rows, key=lambda row: rank[row.id])]
        actions.append(deferred(NAME, overflow.user_id, ids, reason, over_cap_by=over))
    if overflow.waiting:
        waiting = [row.id for row in overflow.waiting]
        actions.append(deferred(NAME, overflow.user_id, waiting, WAITING, over_cap_by=over))
    return actions


WORK = "work_user_cap"  # gc_worker.triage: which users have work (sql/triage.sql)


def work_params(settings: Settings, now: datetime) -> dict[str, Any]:
    return {"max_memories": settings.user_cap.max_memories}


def over_cap_counts(ctx: BatchContext) -> tuple[dict[str, int], dict[str, int]]:
    """Active rows per over-cap user, counting records created earlier in this batch; and
    every active row of those users in the store now (the premise of their evictions)."""
    cap = ctx.settings.user_cap.max_memories
    floor = cap - max(ctx.created.values(), default=0)
    rows = ctx.conn.execute(q("user_cap_counts"), ctx.params(floor=floor)).all()
    counts = {row.user_id: row.active + ctx.created[row.user_id] for row in rows}
    present = {row.user_id: row.present for row in rows}
    return {user: n for user, n in counts.items() if n > cap}, present


def with_premise(actions: list[Action], present: Mapping[str, int]) -> list[Action]:
    """Each action that changes the store carries the user's active rows when it was chosen
    (``details.user_active``): applied later to a user with fewer (the application deleted
    some since), the evictions would take the user below the cap, so they drift instead."""
    return [
        replace(a, details={**a.details, "user_active": present[a.user_id]})
        if a.changes_store
        else a
        for a in actions
    ]


def plan_summaries(
    ctx: BatchContext, rows: Iterable[Any], counts: Mapping[str, int]
) -> list[Action]:
    """Summarize-mode actions for every over-cap user of the batch."""
    grouped = by_user(rows)
    chunks = ctx.settings.user_cap.max_summaries_per_user
    overflows = [
        split_user(ctx, user_id, grouped[user_id], counts[user_id], chunks)
        for user_id in sorted(counts)
    ]
    fold_ids = [row.id for overflow in overflows for row in overflow.fold]
    full = {row.id: row for row in ctx.conn.execute(q("user_cap_fold_rows"), {"ids": fold_ids})}
    actions: list[Action] = []
    model = ModelState(stop=UNAVAILABLE if ctx.llm is None else None)
    for overflow in overflows:
        still = [
            r.id for r in overflow.fold if getattr(full.get(r.id), "user_id", None) == r.user_id
        ]
        if len(still) < len(overflow.fold):
            # planned before its transaction each read is its own: a row deleted (or moved to
            # another user) since the ranking read it changed the premise; the next run decides
            log.info("user_cap.summary_skipped", user_id=overflow.user_id, reason=ROWS_CHANGED)
            actions.append(
                deferred(NAME, overflow.user_id, still, ROWS_CHANGED, over_cap_by=overflow.excess)
            )
            continue
        actions += plan_overflow(ctx, overflow, full, model)
    return actions


def plan(ctx: BatchContext) -> list[Action]:
    counts, present = over_cap_counts(ctx)
    if not counts:
        return []
    return with_premise(_plan_over_cap(ctx, counts), present)


def _plan_over_cap(ctx: BatchContext, counts: dict[str, int]) -> list[Action]:
    summarize = ctx.settings.user_cap.overflow == "summarize"
    cap = ctx.settings.user_cap.max_memories
    # k summaries take excess + k rows (jobs.user_cap_split)
    further = ctx.settings.user_cap.max_summaries_per_user if summarize else 1
    users = sorted(counts)
    rows = candidates(ctx, users, [counts[u] - cap + further for u in users])
    if summarize:
        return plan_summaries(ctx, rows, counts)
    return plan_user_cap(
        rows, counts, cap=ctx.settings.user_cap.max_memories, importance=ctx.importance
    )


def candidates(ctx: BatchContext, users: list[str], take: list[int]) -> list[Any]:
    """Per user (aligned with ``take``) the first so many evictable rows in eviction order."""
    params = ctx.params() | {
        "users": users,
        "take": take,
        "reassessed_importance": list(ctx.importance.values()),  # aligned with :reassessed
        "with_metadata": ctx.settings.user_cap.overflow == "summarize",
        "held": list(ctx.held),  # rows of a conflict left open earlier in this batch
    }
    return ctx.conn.execute(q("user_cap_candidates"), params).all()


def asks_model(settings: Settings) -> bool:
    """gc_worker.engine: only summarize mode calls the model while planning."""
    return settings.user_cap.overflow == "summarize"
