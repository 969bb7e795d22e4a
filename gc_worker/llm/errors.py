"""Errors the LLM port raises; every failure of a model call is one of these three.

- ``LLMInvalidAnswer``: the model answered, but the answer is malformed or fails the checks
  against the candidate set it was given (``reason`` is a machine code such as ``unknown_id``).
- ``LLMUnavailable``: no answer after the retries (or a request the API refused outright).
- ``LLMBudgetExhausted``: the run's call or token budget is spent; the work is deferred.

Callers treat all three the same way: nothing changes, the candidate group is deferred.
"""

from __future__ import annotations

from gc_worker.errors import MemoryGCError


class LLMError(MemoryGCError):
    """The LLM could not provide a decision."""


class LLMInvalidAnswer(LLMError):
    """The LLM answer was rejected."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"LLM answer rejected: {reason}" + (f" ({detail})" if detail else ""))


# Statuses that refuse one request for what it asks (too long for the model's context, a
# content filter, unprocessable): the server is up, and the next request may well be answered.
# Any other failure (401/403 bad key, 404 no such model, 5xx, timeouts) would recur for every
# request.
REFUSED_FOR_CONTENT = frozenset({400, 413, 422})


class LLMUnavailable(LLMError):
    """The LLM did not answer."""

    def __init__(self, kind: str, *, attempts: int, status_code: int | None, cause: str) -> None:
        self.kind = kind
        self.attempts = attempts
        self.status_code = status_code
        super().__init__(
            f"LLM {kind} call failed after {attempts} attempt(s)"
            f" (status {status_code if status_code is not None else 'none'}): {cause}"
        )

    @property
    def refused(self) -> bool:
        """This request was refused for its content; the server itself is not down."""
        return self.status_code in REFUSED_FOR_CONTENT


class LLMBudgetExhausted(LLMError):
    """The run's LLM budget is spent; the remaining work is deferred to the next run."""

    def __init__(self, limit: str, used: int, maximum: int) -> None:
        self.limit = limit
        self.used = used
        self.maximum = maximum
        super().__init__(f"LLM {limit} budget exhausted: {used} used of {maximum}")


class SpendLocked(LLMUnavailable):
    """Another session held the run's shared model budget row past the worker's wait: the call
    is not made (nothing was spent on it); its group is deferred like any unanswered one."""

    def __init__(self, run_id: object, waited_ms: int) -> None:
        self.kind, self.attempts, self.status_code = "budget", 0, None
        LLMError.__init__(
            self,
            f"the run's model budget (gc_run_llm_spend, run {run_id}) stayed locked by another "
            f"session for {waited_ms} ms, so no model call was made; the work waits for a later "
            "run. End the transaction holding that row (pg_locks / pg_stat_activity)",
        )
