"""Per-run LLM budget and counters.

- ``LLMBudget``: a call limit and a token limit (``None`` = unlimited). ``reserve_call`` raises
  ``LLMBudgetExhausted`` *before* a call that would exceed the call budget, or once the tokens
  used reach the token budget, and counts the refused decision in ``deferred_by_budget``.
- Counters (``as_report``): ``calls``, ``input_tokens``, ``output_tokens``, ``cache_hits`` (the
  report's ``llm`` section) plus ``invalid_answers``, ``errors``, ``retries``,
  ``embedding_calls`` and ``deferred_by_budget``.

A fresh budget per run; the counters are guarded by a lock so jobs may share it across threads.
It also keeps what the run learned about the model that spares calls in every later batch and
thread, and is forgotten with it at the next run: ``stop_isolating`` (jobs.importance: a model
that answered no question of an isolation validly is not isolated again).
Its limits are what was left of the run's when this process joined it; ``shared`` (the run's
``RunSpend``, gc_worker.llm_store) is what every process working the run spends, and a call
it refuses is refused here too: replicas joining a run together share one budget.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol

from gc_worker.llm.errors import LLMBudgetExhausted

REPORT_KEYS = ("calls", "input_tokens", "output_tokens", "cache_hits")
# the most tokens one call is taken to have used: a server (or proxy) reporting more (2**63,
# past the run's shared bigint spend) is not believed beyond it
USAGE_CEILING = 10**9
EXTRA_KEYS = ("invalid_answers", "errors", "retries", "embedding_calls", "deferred_by_budget")


class SharedSpend(Protocol):
    """What every process working one run spends of its model budget."""

    def take_call(self) -> tuple[str, int, int] | None:
        """Count one call; or, when a limit is reached, (limit, used, maximum) and count none."""
        ...

    def add_tokens(self, tokens: int) -> None: ...


@dataclass
class LLMBudget:
    """Limits of one run and what the run has used so far; also what each thread used (a run
    worked by several threads accounts each batch with its own thread's counters)."""

    max_calls: int | None = None
    max_tokens: int | None = None
    calls: int = 0
    embedding_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_hits: int = 0
    invalid_answers: int = 0
    errors: int = 0
    retries: int = 0
    deferred_by_budget: int = 0
    shared: SharedSpend | None = field(default=None, repr=False, compare=False)
    # the shared spend's refusal, kept: its counts only grow, so it refuses for the rest of the
    # run, and asking again would cost a transaction for each question left
    _shared_refusal: tuple[str, int, int] | None = field(default=None, repr=False, compare=False)
    _isolating: bool = field(default=True, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _by_thread: dict[int, dict[str, int]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def _add(self, counter: str, n: int = 1) -> None:  # under self._lock
        setattr(self, counter, getattr(self, counter) + n)
        mine = self._by_thread.setdefault(threading.get_ident(), {})
        mine[counter] = mine.get(counter, 0) + n

    def reserve_call(self, *, embedding: bool = False) -> None:
        """Count one call, or raise ``LLMBudgetExhausted`` if the run may not make it."""
        with self._lock:
            refused = self._refusal() or self._shared_refusal
            if refused is None and self.shared is not None:
                refused = self._shared_refusal = self.shared.take_call()
            if refused is not None:
                self._add("deferred_by_budget")
                raise LLMBudgetExhausted(*refused)
            self._add("calls")
            self._add("embedding_calls", int(embedding))

    def _refusal(self) -> tuple[str, int, int] | None:  # under self._lock
        if self.max_calls is not None and self.calls >= self.max_calls:
            return "calls", self.calls, self.max_calls
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return "tokens", self.tokens, self.max_tokens
        return None

    @property
    def isolating(self) -> bool:
        """Whether a failed importance batch may still be asked again in halves this run."""
        return self._isolating

    def stop_isolating(self) -> bool:
        """Ask no batch again in halves for the rest of the run; True for the call that
        decided it (one log line per run, whichever thread saw it first)."""
        with self._lock:
            first, self._isolating = self._isolating, False
        return first

    def record_usage(self, input_tokens: int, output_tokens: int) -> None:
        input_tokens = min(max(0, input_tokens), USAGE_CEILING)
        output_tokens = min(max(0, output_tokens), USAGE_CEILING)
        with self._lock:
            self._add("input_tokens", input_tokens)
            self._add("output_tokens", output_tokens)
            if self.shared is not None:
                self.shared.add_tokens(input_tokens + output_tokens)

    def count(self, counter: str) -> None:
        """Add one to ``cache_hits``, ``invalid_answers``, ``errors`` or ``retries``."""
        if counter not in ("cache_hits", "invalid_answers", "errors", "retries"):
            raise ValueError(f"unknown LLM counter {counter!r}")
        with self._lock:
            self._add(counter)

    def as_report(self, *, this_thread: bool = False) -> dict[str, int]:
        """The report's ``llm`` section followed by the extra counters: the run's, or what the
        calling thread used of it (``this_thread``)."""
        with self._lock:
            if this_thread:
                mine = self._by_thread.get(threading.get_ident(), {})
                return {key: mine.get(key, 0) for key in (*REPORT_KEYS, *EXTRA_KEYS)}
            return {key: getattr(self, key) for key in (*REPORT_KEYS, *EXTRA_KEYS)}
