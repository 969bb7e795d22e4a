"""What the two LLM-backed jobs (contradiction, compaction) share.

- ``ModelGate``: one job's access to the LLM port during one batch. A decision comes back as
  the port's result, as a ``Deferral`` (offline → ``llm_unavailable``; budget spent →
  ``llm_budget``; no answer after the retries → ``llm_unavailable``, counted in the job's
  ``errors``, and every later question of the batch is deferred without a call), or as
  ``None`` (the answer was rejected by the port's checks: counted in ``errors``, logged as
  ``<job>.answer_rejected``, nothing changes).
- ``deferred(...)``: the ``deferred`` action listing a candidate group's member ids.
- ``rows_by_user(ctx, query, **binds)``: a candidate query cut into one list per user, so one
  user's rows at a time are in memory (``candidate_rows``: the rows, streamed or per user).
- ``embedding_of(row, dim)``: the row's embedding as a vector, or why it cannot be used.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import structlog

from gc_worker.actions import Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.llm import LLMBudgetExhausted, LLMInvalidAnswer, LLMUnavailable
from gc_worker.queries import q
from gc_worker.vector_loader import ARRAYS

log = structlog.get_logger("memory_gc")

LLM_UNAVAILABLE = "llm_unavailable"
LLM_BUDGET = "llm_budget"
STREAM_ROWS = 500  # rows fetched per round trip while streaming candidates

T = TypeVar("T")


# Requests refused for their content (400/413/422) in a row, with no answer between them,
# after which the server counts as down for the rest of the batch: a gateway that answers 400
# to everything (a misconfiguration: a response format the model does not support) is not
# asked once per question.
MAX_REFUSALS = 3


@dataclass
class Refusals:
    """One batch's run of requests refused for their content."""

    streak: int = 0

    def down_after(self, exc: LLMUnavailable) -> bool:
        """Whether this failure means the server is down (not just this request refused)."""
        if not exc.refused:
            return True
        self.streak += 1
        return self.streak >= MAX_REFUSALS

    def answered(self) -> None:
        self.streak = 0


@dataclass(frozen=True)
class Deferral:
    """The LLM could not be asked; the candidate group waits for a later run."""

    reason: str


class ModelGate:
    """One job's questions to the LLM within one batch."""

    def __init__(self, ctx: BatchContext, job: str) -> None:
        self.ctx = ctx
        self.llm = ctx.llm
        self.job = job
        self.stats = ctx.job_stats(job)
        self.down = False
        self.refusals = Refusals()

    @property
    def offline(self) -> bool:
        return self.llm is None

    def ask(self, question: Callable[[Any], T], *, user_id: str, size: int) -> T | Deferral | None:
        """``question(llm)``'s answer, a Deferral, or None for a rejected answer."""
        if self.llm is None or self.down:
            return Deferral(LLM_UNAVAILABLE)
        self.ctx.stop_if_asked()
        try:
            answer = question(self.llm)
        except LLMBudgetExhausted:
            return Deferral(LLM_BUDGET)
        except LLMUnavailable as exc:
            self.stats.errors += 1
            self.down = self.refusals.down_after(exc)  # refused for its content: ask the next
            log.error(f"{self.job}.llm_unavailable", user_id=user_id, error=str(exc))
            return Deferral(LLM_UNAVAILABLE)
        except LLMInvalidAnswer as exc:
            self.stats.errors += 1
            log.warning(
                f"{self.job}.answer_rejected", user_id=user_id, reason=exc.reason, memories=size
            )
            self.refusals.answered()
            return None
        self.refusals.answered()
        return answer


def deferred(
    job: str, user_id: str, ids: Sequence[Any], reason: str, *, preview: str | None = None,
    **details: Any,
) -> Action:  # fmt: skip
    """A candidate group left for a later run (nothing changes): its member ids, and a preview
    of one member's text when the caller has one."""
    return Action(
        job=job,
        action=Kind.DEFERRED,
        user_id=user_id,
        reason=reason,
        details={"memory_ids": [str(i) for i in ids], **details},
        preview=preview,
    )


def first_preview(members: Sequence[Any]) -> str | None:
    return getattr(members[0], "preview", None) if members else None


def rows_by_user(ctx: BatchContext, query: str, **binds: Any) -> Iterator[tuple[str, list[Any]]]:
    """(user_id, rows) per user of the batch, from a query ordered by user_id."""
    rows = candidate_rows(ctx, query, **binds)
    for user_id, user_rows in itertools.groupby(rows, key=lambda row: row.user_id):
        yield user_id, list(user_rows)


def candidate_rows(ctx: BatchContext, query: str, **binds: Any) -> Iterator[Any]:
    """A candidates query's rows, ordered by user, one user's rows at a time in memory: inside
    the batch transaction streamed from the server; planned before it (the model is asked in
    between, with no transaction open) one short read per user, so no cursor stays open."""
    params = ctx.params(**binds)
    statement = q(query).execution_options(**ARRAYS)  # an embedding as one numpy array
    if not ctx.in_transaction:
        for user in ctx.users:
            ctx.stop_if_asked()
            yield from ctx.conn.execute(statement, params | {"users": [user]}).all()
        return
    result = ctx.conn.execute(statement.execution_options(yield_per=STREAM_ROWS), params)
    try:
        yield from result
    finally:
        result.close()


def embedding_of(row: Any, dim: int) -> np.ndarray | None:
    """The row's embedding, or None if it is missing, of the wrong size, non-finite or zero."""
    values = row.embedding
    if values is None or len(values) != dim:
        return None
    vector = np.asarray(values, dtype=np.float64)
    if not np.isfinite(vector).all() or not np.any(vector):
        return None
    return vector


def with_embeddings(rows: Iterable[Any], dim: int) -> tuple[list[Any], np.ndarray, int]:
    """Rows with a usable embedding, their vectors, and how many embedded rows were unusable."""
    kept, vectors, skipped = [], [], 0
    for row in rows:
        vector = embedding_of(row, dim)
        if vector is None:
            skipped += row.embedding is not None
            continue
        kept.append(row)
        vectors.append(vector)
    matrix = np.vstack(vectors) if vectors else np.zeros((0, dim))
    return kept, matrix, skipped
