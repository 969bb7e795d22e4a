"""importance: score never-assessed memories 1..5 with the LLM, in validated batches.

Options (``[importance]``):
    batch_size = 20    memories per LLM call (one user per call, never two)

Candidates: active, unpinned rows with ``importance_assessed_at`` null — rows the application
(or an earlier run) assessed are never re-scored, nor rows whose score a restore undid (a
dismissed ``importance`` review names them: a person overruled the model). Per user, oldest
first, in batches of ``batch_size``; each batch is one ``score_importance`` call, validated
whole by the LLM port (a missing, duplicated or out-of-range index, or a score outside 1..5,
rejects the whole answer).

Emits ``set_importance`` (details: ``importance`` = new score, ``previous`` = old one; the
executor writes ``importance`` and ``importance_assessed_at``; restore puts both back), also when
the score is unchanged, so the row counts as assessed.

A batch whose answer is rejected, or whose request is refused for its content (400/413/422), is
asked again in halves, level by level, each failing half halved again down to single rows, at
most ``2 * ceil(log2(size))`` further calls (``Isolation``): one bad row costs its batch of 20 at
most 11 calls, and every other row is scored. A part that still has no usable answer changes
nothing and is listed as ``deferred`` (details.memory_ids = the part; consecutive deferred
parts of one user for the same reason are listed once, details.calls = how many) with reason:

- ``llm_unavailable`` — offline (no LLM configured) or the server did not answer (an error);
- ``llm_invalid`` — the answer was rejected (an error; details.error = the rejection code);
- ``llm_budget`` — the run's LLM budget is spent.

After an unavailable server or a spent budget, the job's remaining batches (and parts) of this
user batch are deferred without calling again; so after three refusals in a row, where both
halves of a refused part refused count as one (a gateway refusing everything). After an
isolation in which no question was answered validly (every half failed: a model that answers
in another schema, or never in strict JSON), the run's later batches (every user batch, every
worker thread: ``LLMBudget.stop_isolating``, forgotten at the next run) are asked once each and
a failed one is deferred whole, as before isolation existed (log ``importance.isolation_off``,
once per run): such a model would otherwise cost 11 calls per batch and spend the run's call
budget before the later jobs are asked anything.

Runs before decay, usage_prune and user_cap, which use the
new scores in the same run where they are higher than before (a lowered score decides from the
next run: gc_worker.batch.BatchContext.record). Batches are cut in a stable order (user,
created_at, id), so a dry run followed by another dry run asks the same questions and the
second is answered from the decision cache; ``apply RUN_ID`` replays the stored plan and asks
nothing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any

import structlog

from gc_worker.actions import Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.llm import LLMBudgetExhausted, LLMInvalidAnswer, LLMUnavailable
from jobs.llm_support import Refusals, candidate_rows, deferred

NAME = "importance"
REASON = "importance_assessed"
UNAVAILABLE, INVALID, BUDGET = "llm_unavailable", "llm_invalid", "llm_budget"

log = structlog.get_logger("memory_gc")


@dataclass(frozen=True)
class ScoringBatch:
    """One LLM call's worth of one user's candidate rows."""

    user_id: str
    rows: tuple[Any, ...]

    @property
    def members(self) -> list[tuple[Any, str]]:
        return [(row.id, row.content) for row in self.rows]


def scoring_batches(rows: Iterable[Any], size: int) -> Iterator[ScoringBatch]:
    """Rows (ordered by user) cut into per-user batches of at most ``size``, lazily."""
    for user_id, user_rows in groupby(rows, key=lambda row: row.user_id):
        listed = list(user_rows)
        for start in range(0, len(listed), size):
            yield ScoringBatch(user_id, tuple(listed[start : start + size]))


def score_actions(batch: ScoringBatch, scores: Mapping[str, int]) -> list[Action]:
    """One ``set_importance`` per row of a batch whose validated scores are ``scores``."""
    return [
        Action(
            job=NAME,
            action=Kind.SET_IMPORTANCE,
            user_id=batch.user_id,
            reason=REASON,
            memory_id=row.id,
            row_version=row.row_version,
            details={"importance": int(scores[str(row.id)]), "previous": int(row.importance)},
            preview=row.preview,
        )
        for row in batch.rows
    ]


def defer_batch(batch: ScoringBatch, reason: str, **details: Any) -> Action:
    return deferred(NAME, batch.user_id, [row.id for row in batch.rows], reason, **details)


@dataclass(frozen=True)
class Failure:
    """Why one question got no usable answer: ``reason`` (a deferral reason), the rejection
    code of an invalid answer, the refusal of a request refused for its content."""

    reason: str
    error: str | None = None
    refusal: LLMUnavailable | None = None

    @property
    def about_content(self) -> bool:
        """The answer failed for what was asked (a half may well be answered), not because
        the server is down or the budget spent."""
        return self.error is not None or self.refusal is not None

    def defer(self, batch: ScoringBatch) -> Action:
        return defer_batch(batch, self.reason, **({"error": self.error} if self.error else {}))


def ask(ctx: BatchContext, batch: ScoringBatch) -> dict[str, int] | Failure:
    """The batch's validated scores, or why there are none (failed calls count in errors)."""
    ctx.stop_if_asked()
    try:
        return ctx.llm.score_importance(batch.user_id, batch.members)
    except LLMInvalidAnswer as exc:
        ctx.job_stats(NAME).errors += 1
        return Failure(INVALID, error=exc.reason)
    except LLMBudgetExhausted:
        return Failure(BUDGET)
    except LLMUnavailable as exc:
        ctx.job_stats(NAME).errors += 1
        return Failure(UNAVAILABLE, refusal=exc if exc.refused else None)


def further_calls(size: int) -> int:
    """Calls one batch of ``size`` rows may cost after its own to isolate what failed: two per
    halving, enough to narrow one bad row down to itself."""
    return 2 * math.ceil(math.log2(size)) if size > 1 else 0


def halves(batch: ScoringBatch) -> tuple[ScoringBatch, ScoringBatch]:
    middle = (len(batch.rows) + 1) // 2
    return replace(batch, rows=batch.rows[:middle]), replace(batch, rows=batch.rows[middle:])


class Isolation:
    """One batch's questions: the batch, then, while it or a part of it fails for its content,
    the two halves of that part, level by level (both halves of a part are asked before any
    is split again), within ``further_calls``. A part that still fails waits, with its reason;
    a spent budget or a server that is down ends the isolation (module docstring)."""

    def __init__(
        self, ctx: BatchContext, batch: ScoringBatch, refusals: Refusals, *, isolate: bool = True
    ) -> None:
        self.ctx, self.batch, self.refusals = ctx, batch, refusals
        self.allowance = further_calls(len(batch.rows)) if isolate else 0
        self.pairs: deque[tuple[ScoringBatch, ScoringBatch]] = deque()
        self.actions: list[Action] = []
        self.calls = 0
        self.answered = False  # some question of it was answered validly

    @property
    def found_nothing(self) -> bool:
        """It asked about halves and not one question was answered: the model, not a row,
        fails (it answers in another schema, or not in strict JSON)."""
        return self.calls > 1 and not self.answered

    def run(self) -> str | None:
        """Ask about the batch; the reason the model is not to be asked again, if so."""
        batch = self.batch
        failure = self.answer(batch)
        if failure is not None:
            if failure.refusal is not None and self.refusals.down_after(failure.refusal):
                return self.stop([batch], UNAVAILABLE)
            if not failure.about_content:
                return self.stop([batch], failure.reason)
            self.settle(batch, failure)
        while self.pairs:
            pair = self.pairs.popleft()
            failed: list[tuple[ScoringBatch, Failure]] = []
            for number, part in enumerate(pair):
                failure = self.answer(part)
                if failure is not None and not failure.about_content:
                    self.actions += [f.defer(p) for p, f in failed]
                    return self.stop(list(pair[number:]), failure.reason)
                if failure is not None:
                    failed.append((part, failure))
            refusals = [f.refusal for _, f in failed if f.refusal is not None]
            # both halves refused: the refusal is not about one row (a gateway refusing all)
            if len(refusals) == 2 and self.refusals.down_after(refusals[0]):
                return self.stop([part for part, _ in failed], UNAVAILABLE)
            for part, failure in failed:
                self.settle(part, failure)
        return None

    def answer(self, batch: ScoringBatch) -> Failure | None:
        """Ask; record the scores, or return why there are none."""
        answer = ask(self.ctx, batch)
        self.calls += 1
        if isinstance(answer, Failure):
            if answer.error is not None:  # the server answered: no run of refusals goes on
                self.refusals.answered()
            return answer
        self.refusals.answered()
        self.answered = True
        self.actions += score_actions(batch, answer)
        return None

    def settle(self, part: ScoringBatch, failure: Failure) -> None:
        """Ask about a failed part's halves, or let it wait when it is one row (or the
        allowance is spent)."""
        if len(part.rows) > 1 and self.allowance >= 2:
            self.allowance -= 2
            self.pairs.append(halves(part))
        else:
            self.actions.append(failure.defer(part))

    def stop(self, unasked: list[ScoringBatch], reason: str) -> str:
        """Defer ``unasked`` and every part still to be asked."""
        parts = unasked + [part for pair in self.pairs for part in pair]
        self.pairs.clear()
        self.actions += [defer_batch(part, reason) for part in parts]
        return reason


def plan_scoring(ctx: BatchContext, batches: Iterable[ScoringBatch]) -> list[Action]:
    """Scores per batch; after an unavailable server or a spent budget, defer without asking;
    after an isolation that answered nothing, ask each batch once (module docstring)."""
    actions: list[Action] = []
    stop_reason = UNAVAILABLE if ctx.llm is None else None
    refusals = Refusals()
    for batch in batches:
        if stop_reason is not None:
            actions.append(defer_batch(batch, stop_reason))
            continue
        # the run's, read per batch: another thread may have turned it off meanwhile
        isolate = ctx.llm.budget.isolating
        isolation = Isolation(ctx, batch, refusals, isolate=isolate)
        stop_reason = isolation.run()
        actions += isolation.actions
        found_nothing = isolate and stop_reason is None and isolation.found_nothing
        if found_nothing and ctx.llm.budget.stop_isolating():
            log.warning(
                "importance.isolation_off", user_id=batch.user_id, rows=len(batch.rows),
                calls=isolation.calls,
            )  # fmt: skip
    return merge_deferred(actions)


def merge_deferred(actions: Iterable[Action]) -> list[Action]:
    """One ``deferred`` listing per user and reason instead of one per batch (``calls`` says how
    many LLM calls the group needs), so an offline store of a million unassessed rows adds one
    audit row per user a night, not one per 20 rows."""
    merged: list[Action] = []
    for action in actions:
        last = merged[-1] if merged else None
        if (
            last is not None
            and action.action is Kind.DEFERRED is last.action
            and (action.user_id, action.reason) == (last.user_id, last.reason)
            and action.reason != INVALID
        ):
            details = dict(last.details)
            details["memory_ids"] = [*last.details["memory_ids"], *action.details["memory_ids"]]
            details["calls"] = last.details.get("calls", 1) + 1
            merged[-1] = replace(last, details=details)
        else:
            merged.append(action)
    return merged


def plan(ctx: BatchContext) -> list[Action]:
    rows = candidate_rows(ctx, "importance_candidates")
    actions = plan_scoring(ctx, scoring_batches(rows, ctx.settings.importance.batch_size))
    # batches, not listings: merge_deferred lists a user's run of them once (details.calls)
    deferred_count = sum(a.details.get("calls", 1) for a in actions if a.action is Kind.DEFERRED)
    if deferred_count:
        log.info("importance.batches_deferred", batches=deferred_count)
    return actions


def asks_model(settings: Settings) -> bool:
    """gc_worker.engine: planning may call the model, so it is done before the batch
    transaction."""
    return True
