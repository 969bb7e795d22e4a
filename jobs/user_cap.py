"""user_cap: keep each user's active memories at or under ``max_memories``.

Options (``[user_cap]``):
    max_memories = 500     active rows allowed per user (pinned rows count but are never evicted)
    overflow = "evict"     or "summarize": fold the evicted rows into one summary first
    fallback_to_evict = false   with "summarize": evict anyway when the LLM can't summarise
    max_summary_depth = 1  a summary is not folded into a summary-of-summaries beyond this
    max_summary_rows = 20  rows one summary folds at most
    max_summaries_per_user = 10  summaries (chunks) one user gets in one run at most; when they
                           cannot bring the user to the cap the least valuable rows wait for
                           the next run (or with the fallback are evicted)

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
``overflow = "evict"``. When the LLM is offline, unavailable, out of budget or its answer is
invalid for a chunk, the user's later chunks are not asked (the chunks already made stay): with
``fallback_to_evict`` the least valuable rows not folded are evicted plainly down to the cap
(``details.fallback`` says why); without it the user stays over the cap and the chunks not made
are listed as ``deferred`` (reason ``llm_unavailable`` / ``llm_invalid`` / ``llm_budget``;
details.memory_ids = their rows, details.over_cap_by = how far over the cap the user stays).
Rows the run's ``max_summaries_per_user`` chunks could not take are listed the same way, reason
``summary_rows``. While the user stays over the cap, a taken row that may not be folded is
evicted only when ranked before the most valuable folded row, and that eviction rests on the
most valuable summary (``details.depends_on_group``: it drifts with that summary at apply). A
user whose rows changed between the ranking and the fold read gets no action but that listing,
reason ``rows_changed``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any
from uuid import UUID

import structlog

from gc_worker.actions import Action, Kind, soft_delete
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.llm import (
    LLMBudgetExhausted,
    LLMError,
    LLMInvalidAnswer,
    LLMUnavailable,
    centroid_embedding,
)
from gc_worker.queries import q
from jobs.importance import BUDGET, INVALID, UNAVAILABLE
from jobs.llm_support import Refusals, deferred
from jobs.text_facts import unsupported_reason
from jobs.user_cap_records import (
    NAME,
    REASON,
    Overflow,
    summary_actions,
    summary_record,
)
from jobs.user_cap_records import summary_depth as summary_depth  # (re-exported)
from jobs.user_cap_split import WAITING, eviction_key, split_overflow
from jobs.user_cap_split import fold_blocker as fold_blocker  # (re-exported)

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


def failure_reason(ctx: BatchContext, exc: Exception) -> str:
    """The deferral reason for a failed summary, counting the errors."""
    if isinstance(exc, LLMBudgetExhausted):
        return BUDGET
    if isinstance(exc, LLMInvalidAnswer | LLMUnavailable):
        ctx.job_stats(NAME).errors += 1
    return INVALID if isinstance(exc, LLMInvalidAnswer) else UNAVAILABLE


def summary_embedding(
    ctx: BatchContext, text: str, fold: Sequence[Any], full: Mapping[UUID, Any]
) -> tuple[list[float] | None, str]:
    """(embedding, where it came from): the embeddings port, else the members' centroid (the
    port failed, or ``[embeddings] model = ""`` configures none)."""
    if ctx.llm.options.embedding_model:
        try:
            return ctx.llm.embed([text])[0], "embeddings_model"
        except LLMError as exc:
            log.warning("user_cap.summary_embedding_failed", error=str(exc))
    # an adopted store's unconstrained ``vector`` column may hold another model's vectors
    dim = ctx.settings.embeddings.dim
    stored = [json.loads(full[row.id].embedding) for row in fold if full[row.id].embedding]
    vectors = [v for v in stored if len(v) == dim and any(v)]
    if not vectors:
        return None, "none"
    return centroid_embedding(vectors), "centroid"


def fold_chunk(
    ctx: BatchContext, user_id: str, chunk: Sequence[Any], full: Mapping[UUID, Any],
    refusals: Refusals,
) -> tuple[list[Action], str | None, bool]:  # fmt: skip
    """One chunk's summary: (its actions, why none was made, whether the model is not to be
    asked again in this batch: unavailable after its retries, budget spent — a request refused
    for its own content, 400/413/422, stops nothing until ``refusals`` says a run of them means
    the server is down; an invalid answer says nothing of the next user's)."""
    members = [(row.id, full[row.id].content) for row in chunk]
    ctx.stop_if_asked()
    try:
        # the summary is all that stays once the folded rows are purged: it must carry their facts
        folded = [content for _, content in members]
        text = ctx.llm.summarize(
            user_id, members, vet=lambda s: unsupported_reason(s, folded, "summary")
        )
    except LLMError as exc:
        reason = failure_reason(ctx, exc)
        if isinstance(exc, LLMUnavailable):
            down = refusals.down_after(exc)
        else:
            down = reason != INVALID
            if not down:
                refusals.answered()
        return [], reason, down
    refusals.answered()
    embedding, source = summary_embedding(ctx, text, chunk, full)
    record = summary_record(
        chunk, full, text=text, embedding=embedding, embedding_source=source,
        importance=ctx.scored, now_iso=ctx.now.isoformat(),
    )  # fmt: skip
    return summary_actions(user_id, chunk, record), None, False


def plan_overflow(
    ctx: BatchContext, overflow: Overflow, full: Mapping[UUID, Any], stop: str | None,
    refusals: Refusals,
) -> tuple[list[Action], str | None]:  # fmt: skip
    """One over-cap user's actions in summarize mode, its chunks folded most valuable first
    until one cannot be (the rest wait: ``leftovers``); and why the model is not to be asked
    again in this batch, if so. ``stop``: such a reason from an earlier user — no retry storm
    against a server that is down."""
    if not overflow.chunks:
        return evictions(overflow.evict), stop
    actions: list[Action] = []
    made: list[tuple[Any, ...]] = []
    reason = stop or (UNAVAILABLE if ctx.llm is None else None)
    for chunk in overflow.chunks:
        if reason is not None:
            break
        planned, reason, down = fold_chunk(ctx, overflow.user_id, chunk, full, refusals)
        stop = reason if down else stop
        made += [chunk] if planned else []
        actions += planned
    groups = [a.group for a in actions if a.action is Kind.CREATE_MERGED]
    return actions + leftovers(ctx, overflow, made, reason, groups), stop


def leftovers(
    ctx: BatchContext, overflow: Overflow, made: Sequence[Sequence[Any]], reason: str | None,
    groups: Sequence[str] = (),
) -> list[Action]:  # fmt: skip
    """After the chunks (``made``: those folded, a prefix; ``groups``: their action groups):
    the plain evictions, and what waits, listed as ``deferred`` with how far over the cap the
    user stays — the chunks not made
    (``reason``: why) and the rows no chunk could take (summary_rows). With the fallback, a
    chunk not made means the least valuable rows not folded are evicted down to the cap."""
    folded = {row.id for chunk in made for row in chunk}
    shrunk = sum(len(chunk) - 1 for chunk in made)
    kept_out = list(zip(overflow.evict, overflow.not_folded, strict=True))
    if reason is not None:
        log.info("user_cap.summary_skipped", user_id=overflow.user_id, reason=reason,
                 summaries=len(made))  # fmt: skip
        if ctx.settings.user_cap.fallback_to_evict:
            rest = [row for row in overflow.ranked if row.id not in folded]
            return evictions(rest[: overflow.excess - shrunk], fallback=reason)
        # the user stays over the cap: a row ranked after the most valuable folded one is not
        # evicted while less valuable rows wait (none is when nothing was folded)
        rank = {row.id: i for i, row in enumerate(overflow.ranked)}
        top = rank[made[0][-1].id] if made else -1
        kept_out = [(row, why) for row, why in kept_out if rank[row.id] < top]
    over = overflow.excess - shrunk - len(kept_out)
    # the user stays over the cap: those evictions rest on the most valuable chunk's fold (a
    # drift of it at apply leaves them waiting too)
    rests = {"depends_on_group": groups[0]} if over and groups else {}
    actions = [soft_delete(NAME, row, REASON, not_folded=why, **rests) for row, why in kept_out]
    if reason is not None:
        unmade = [row.id for chunk in reversed(overflow.chunks[len(made) :]) for row in chunk]
        actions.append(deferred(NAME, overflow.user_id, unmade, reason, over_cap_by=over))
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
    policy = ctx.settings.user_cap
    grouped = by_user(rows)
    overflows = [
        split_overflow(
            user_id, grouped[user_id], active=counts[user_id], cap=policy.max_memories,
            max_depth=policy.max_summary_depth, importance=ctx.importance,
            max_rows=policy.max_summary_rows, max_chunks=policy.max_summaries_per_user,
            fallback=policy.fallback_to_evict,
        )
        for user_id in sorted(counts)
    ]  # fmt: skip
    fold_ids = [row.id for overflow in overflows for row in overflow.fold]
    full = {row.id: row for row in ctx.conn.execute(q("user_cap_fold_rows"), {"ids": fold_ids})}
    actions: list[Action] = []
    stop: str | None = None
    refusals = Refusals()
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
        planned, stop = plan_overflow(ctx, overflow, full, stop, refusals)
        actions += planned
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
    params = ctx.params() | {
        "users": users,
        "take": [counts[u] - cap + further for u in users],
        "reassessed_importance": list(ctx.importance.values()),  # aligned with :reassessed
        "with_metadata": summarize,
        "held": list(ctx.held),  # rows of a conflict left open earlier in this batch
    }
    rows = ctx.conn.execute(q("user_cap_candidates"), params).all()
    if summarize:
        return plan_summaries(ctx, rows, counts)
    return plan_user_cap(
        rows, counts, cap=ctx.settings.user_cap.max_memories, importance=ctx.importance
    )


def asks_model(settings: Settings) -> bool:
    """gc_worker.engine: only summarize mode calls the model while planning."""
    return settings.user_cap.overflow == "summarize"
