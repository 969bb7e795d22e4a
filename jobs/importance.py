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
the score is unchanged, so the row counts as assessed. A batch that gets no usable answer changes
nothing and is listed as ``deferred`` (details.memory_ids = the batch; consecutive deferred
batches of one user for the same reason are listed once, details.calls = how many) with reason:

- ``llm_unavailable`` — offline (no LLM configured) or the server did not answer (an error);
- ``llm_invalid`` — the answer was rejected (an error; details.error = the rejection code);
- ``llm_budget`` — the run's LLM budget is spent.

After an unavailable server or a spent budget, the job's remaining batches of this user batch
are deferred without calling again. Runs before decay, usage_prune and user_cap, which use the
new scores in the same run where they are higher than before (a lowered score decides from the
next run: gc_worker.batch.BatchContext.record). Batches are cut in a stable order (user,
created_at, id), so a dry run followed by another dry run asks the same questions and the
second is answered from the decision cache; ``apply RUN_ID`` replays the stored plan and asks
nothing.
"""

from __future__ import annotations

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


def ask(
    ctx: BatchContext, batch: ScoringBatch, refusals: Refusals
) -> tuple[dict[str, int] | Action, bool]:
    """The batch's validated scores, or the ``deferred`` action saying why there are none; and
    whether the server now counts as down for the rest of the batch."""
    ctx.stop_if_asked()
    try:
        scores = ctx.llm.score_importance(batch.user_id, batch.members)
    except LLMInvalidAnswer as exc:
        ctx.job_stats(NAME).errors += 1
        refusals.answered()
        return defer_batch(batch, INVALID, error=exc.reason), False
    except LLMBudgetExhausted:
        return defer_batch(batch, BUDGET), True
    except LLMUnavailable as exc:
        ctx.job_stats(NAME).errors += 1
        return defer_batch(batch, UNAVAILABLE), refusals.down_after(exc)
    refusals.answered()
    return scores, False


def plan_scoring(ctx: BatchContext, batches: Iterable[ScoringBatch]) -> list[Action]:
    """Scores per batch; after an unavailable server or a spent budget, defer without asking."""
    actions: list[Action] = []
    stop_reason = UNAVAILABLE if ctx.llm is None else None
    refusals = Refusals()
    for batch in batches:
        if stop_reason is not None:
            actions.append(defer_batch(batch, stop_reason))
            continue
        answer, down = ask(ctx, batch, refusals)
        if isinstance(answer, Action):
            actions.append(answer)
            stop_reason = answer.reason if down else None
        else:
            actions += score_actions(batch, answer)
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
