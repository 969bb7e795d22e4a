"""How user_cap's summarize mode asks the model to fold one over-cap user's chunks (jobs.user_cap
plans with it; docs/importance-and-caps.md, "Chunk order" and "A row the model cannot fold").

``fold_chunk`` asks for one part's summary (a chunk, or a part of one). ``fold_chunks`` asks
for a user's chunks, most valuable first. A chunk whose summary is rejected as invalid (a
malformed answer, or one that drops a folded row's facts) is asked again in halves, depth
first and the more valuable half first, each half of 3 rows or more that is rejected halved
again (a half of one row cannot be summarised: it waits without a call), within
``further_calls`` (``2 * ceil(log2(rows))``) calls beyond the chunk's own; the parts that pass
are folded (each its own summary), the rows no part could fold wait (``llm_invalid``; jobs.user_cap
sets them aside and folds other rows in their place), and the later chunks are asked. Asked in
that order, what a spent budget or an outage leaves waiting (the part being asked, those still
to be asked and the later chunks) ranks before every summary made; only rows the model could
not fold may rank after summaries made after them.

An unavailable server, a request refused for its content (400/413/422) or a spent budget ends
the user's questions (the rest waits with that reason); unavailable and budget end the batch's
too (``ModelState.stop``), as do three refusals in a row (``Refusals``). A chunk whose
isolation got no valid answer at all (the chunk and more than one part rejected), or
``MAX_REJECTED`` chunks in a row rejected whole (the model, not a row, fails) turn isolation off
for the rest of the batch (log ``user_cap.isolation_off``): a rejected chunk then ends the
user's chunks, as before isolation existed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import structlog

from gc_worker.actions import Action
from gc_worker.batch import BatchContext
from gc_worker.llm import (
    LLMBudgetExhausted,
    LLMError,
    LLMInvalidAnswer,
    LLMUnavailable,
    centroid_embedding,
)
from jobs.importance import BUDGET, INVALID, UNAVAILABLE, further_calls
from jobs.llm_support import Refusals
from jobs.text_facts import unsupported_reason
from jobs.user_cap_records import NAME, summary_actions, summary_record

log = structlog.get_logger("memory_gc")

Part = tuple[Any, ...]  # rows of one summary, least valuable first


@dataclass(frozen=True)
class Answer:
    """One part's summary (its actions), or why there is none and whether the model is not to
    be asked again in this batch."""

    actions: list[Action]
    reason: str | None = None
    down: bool = False


# Chunks rejected whole (no part of them folded) in a row, with no valid answer between them,
# after which isolation and set-aside rounds are off for the rest of the batch: a model that
# never answers validly is not asked once per 2-row chunk of every round of every user.
MAX_REJECTED = 3


@dataclass
class ModelState:
    """What one batch's questions so far say about the model: why it is not to be asked again
    (``stop``), the run of requests refused for their content, whether a rejected chunk is
    still asked again in halves (``isolate``) and how many chunks in a row were rejected
    whole (``rejected``)."""

    stop: str | None = None
    refusals: Refusals = field(default_factory=Refusals)
    isolate: bool = True
    rejected: int = 0

    def after_chunk(self, calls: int, answered: int) -> bool:
        """Record one chunk's questions; whether isolation was just turned off (an isolation
        with no valid answer, or MAX_REJECTED chunks rejected whole in a row)."""
        self.rejected = 0 if answered else self.rejected + 1
        if self.isolate and not answered and (calls > 2 or self.rejected >= MAX_REJECTED):
            self.isolate = False
            return True
        return False


@dataclass
class Folding:
    """One user's chunks once asked: the summaries made (each part with its action group),
    the rows that wait per reason, and why the user's questions ended early (None: all were
    asked)."""

    actions: list[Action] = field(default_factory=list)
    made: list[tuple[Part, str]] = field(default_factory=list)
    waits: dict[str, list[Any]] = field(default_factory=dict)
    reason: str | None = None

    def fold(self, part: Part, actions: list[Action]) -> None:
        self.actions += actions
        self.made.append((part, actions[0].group))

    def wait(self, reason: str, rows: Sequence[Any]) -> None:
        if rows:
            self.waits.setdefault(reason, []).extend(rows)

    def end(self, reason: str, parts: Sequence[Part]) -> None:
        """The user's questions end: ``parts`` (the rest of them) wait with ``reason``."""
        self.reason = reason
        self.wait(reason, [row for part in parts for row in part])


def halves(part: Part) -> tuple[Part, Part]:
    """(less valuable half, more valuable half): the more valuable takes the odd row."""
    middle = len(part) // 2
    return part[:middle], part[middle:]


def fold_chunks(
    chunks: Sequence[Part], ask: Callable[[Part], Answer], model: ModelState, folding: Folding,
    user_id: str = "",
) -> None:  # fmt: skip
    """Ask for each chunk's summary, most valuable chunk first, isolating rejected ones, into
    ``folding`` (module docstring)."""
    for number, chunk in enumerate(chunks):
        if model.stop is not None:
            folding.end(model.stop, chunks[number:])
            return
        calls, answered = fold_one(chunk, ask, model, folding)
        if folding.reason is not None:
            folding.end(folding.reason, chunks[number + 1 :])
            return
        if model.after_chunk(calls, answered):  # the model fails, not a row
            log.warning("user_cap.isolation_off", user_id=user_id, rows=len(chunk), calls=calls)
            folding.end(INVALID, chunks[number + 1 :])
            return


def fold_one(
    chunk: Part, ask: Callable[[Part], Answer], model: ModelState, folding: Folding
) -> tuple[int, int]:
    """Ask for one chunk's summary and, while rejected, its parts' (depth first, the more
    valuable first); (calls made, valid answers)."""
    allowance = further_calls(len(chunk)) if model.isolate else 0
    pending = [chunk]  # the next to ask last: always the most valuable
    calls = answered = 0
    while pending:
        part = pending.pop()
        answer = ask(part)
        calls += 1
        if answer.actions:
            answered += 1
            folding.fold(part, answer.actions)
            continue
        model.stop = answer.reason if answer.down else model.stop
        if answer.reason != INVALID or not model.isolate:
            folding.end(answer.reason or INVALID, [part, *reversed(pending)])
            return calls, answered
        less, more = halves(part)
        cost = (len(less) >= 2) + (len(more) >= 2)
        if len(more) < 2 or cost > allowance:
            folding.wait(INVALID, part)
            continue
        allowance -= cost
        if len(less) >= 2:
            pending.append(less)
        else:
            folding.wait(INVALID, less)
        pending.append(more)
    return calls, answered


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
) -> Answer:  # fmt: skip
    """One part's summary, or why none was made and whether the model is not to be asked
    again in this batch: unavailable after its retries, budget spent — a request refused for
    its own content, 400/413/422, stops nothing until ``refusals`` says a run of them means
    the server is down; an invalid answer says nothing of the next part's."""
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
        return Answer([], reason, down)
    refusals.answered()
    embedding, source = summary_embedding(ctx, text, chunk, full)
    record = summary_record(
        chunk, full, text=text, embedding=embedding, embedding_source=source,
        importance=ctx.scored, now_iso=ctx.now.isoformat(),
    )  # fmt: skip
    return Answer(summary_actions(user_id, chunk, record))
