"""``Outage``: after the model did not answer a call (all its retries spent), no call is made
for ``llm.outage_pause_seconds``; each question meanwhile fails at once as unavailable, so its
candidate group is deferred to a later run, as it would have been after the wait.

Without it a model that is down cost every batch of the run one full failed call per job
(the timeout × the attempts, plus the backoff: about two minutes at the defaults) before
the batch deferred the rest of its questions: at 500 users a batch, 10,000 users took some
three hours of waiting, a million users days. With it the run asks again once per pause, and
goes on deferring in between. A request refused for its content (400, 413, 422: the server is
up) or a budget row another session held does not start a pause: the next question may well
be answered. A pause of 0 turns this off. One ``Outage`` per endpoint of a port (decisions,
embeddings: a server may answer one and not the other), shared by its threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from gc_worker.llm.errors import LLMUnavailable, SpendLocked

log = structlog.get_logger("gc_worker.llm")


class Outage:
    """Whether the model may be asked now, after the last call it did not answer."""

    def __init__(self, pause_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pause_seconds = pause_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._until: float | None = None

    def check(self, kind: str) -> None:
        """Raise LLMUnavailable (no attempt made) while a pause runs."""
        with self._lock:
            until = self._until
        if until is None:
            return
        left = until - self._clock()
        if left > 0:
            raise LLMUnavailable(
                kind, attempts=0, status_code=None,
                cause=f"the model did not answer a call a moment ago; no call for {left:.0f} s "
                "more (llm.outage_pause_seconds)",
            )  # fmt: skip

    def failed(self, exc: LLMUnavailable) -> None:
        """A call the model did not answer: pause, unless the server only refused it."""
        if self.pause_seconds <= 0 or exc.refused or isinstance(exc, SpendLocked):
            return
        with self._lock:
            self._until = self._clock() + self.pause_seconds
        log.warning("llm.outage_pause", kind=exc.kind, pause_seconds=self.pause_seconds)

    def answered(self) -> None:
        """The model answered: no pause."""
        with self._lock:
            self._until = None
