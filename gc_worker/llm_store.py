"""The LLM decision cache in PostgreSQL (``gc_llm_cache``), a run's model spend shared by the
processes working it (``gc_run_llm_spend``), and opening the port for a run.

Cache writes commit on their own connection, at once: a decision paid for is kept even when
the batch that asked for it rolls back, so a retried batch makes no new call. So does the spend:
a call is counted before it is made, whatever becomes of its batch. Its statements wait for
the run's row a bounded time (``SPEND_LOCK_TIMEOUT_MS``), as every wait of the worker is bounded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection, Engine

from gc_worker.config import Runtime, Settings
from gc_worker.db import LOCK_NOT_AVAILABLE
from gc_worker.errors import WriteConflict
from gc_worker.llm import LLMOptions, LLMPort, open_llm
from gc_worker.llm.errors import SpendLocked
from gc_worker.queries import q

log = structlog.get_logger("memory_gc")


class PostgresDecisionCache:
    """``DecisionCache`` over ``gc_llm_cache``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def get(self, key: str) -> dict | None:
        with self._engine.connect() as conn:
            return conn.execute(q("llm_cache_get"), {"key": key}).scalar()

    def put(self, key: str, kind: str, user_id: str, memory_ids: list[str], value: dict) -> None:
        params = {
            "key": key,
            "kind": kind,
            "user_id": user_id,
            "memory_ids": [str(m) for m in memory_ids],
            "value": json.dumps(value),
        }
        with self._engine.begin() as conn:
            conn.execute(q("llm_cache_put"), params)


BIGINT_MAX = 2**63 - 1
# How long (ms) a spend statement waits for the run's row. Each process holds it for one short
# statement; only an application's transaction (or a stuck session) holds it longer, and the
# worker would otherwise wait for it without bound, every thread behind the budget's lock.
SPEND_LOCK_TIMEOUT_MS = 10_000


class RunSpend:
    """``SharedSpend`` over ``gc_run_llm_spend``: one run's model calls and tokens, whoever made
    them. A call is taken in one statement (``calls < limit``), so processes asking at once get
    at most the limit between them; the token limit is checked when a call is taken, so calls in
    flight at that moment (one per worker) can pass it.

    Each statement waits at most ``SPEND_LOCK_TIMEOUT_MS`` for the row. Past it: a call is not
    taken (``SpendLocked``, an ``LLMUnavailable``: the group is deferred, nothing was spent);
    tokens already paid for are owed and added with the next statement that gets the row (this
    process's budget counted them at once); a process joining the run fails (``WriteConflict``:
    the run is resumed later)."""

    def __init__(
        self, engine: Engine, run_id: UUID, max_calls: int | None, max_tokens: int | None
    ) -> None:
        self._engine, self._run_id = engine, run_id
        self._limits = {"max_calls": max_calls, "max_tokens": max_tokens}
        self._owed = 0  # tokens paid for while the row was held (callers hold LLMBudget's lock)

    @contextlib.contextmanager
    def _row(self) -> Iterator[Connection]:
        """A transaction on the run's row, its lock waits bounded; SpendLocked past them."""
        waited = SPEND_LOCK_TIMEOUT_MS
        try:
            with self._engine.begin() as conn:
                conn.execute(q("local_lock_timeout"), {"ms": waited})
                yield conn
        except sa.exc.OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise SpendLocked(self._run_id, waited) from None
            raise

    def open(self, calls: int, tokens: int) -> tuple[int, int]:
        """Join the run's spend, which is at least ``calls`` and ``tokens`` (what its batches
        recorded); what the run has spent, by every process."""
        spent = {"calls": min(calls, BIGINT_MAX), "tokens": min(tokens, BIGINT_MAX)}
        try:
            with self._row() as conn:  # (records of a run older than USAGE_CEILING)
                params = {"run_id": self._run_id, **spent}
                row = conn.execute(q("run_llm_spend_open"), params).one()
        except SpendLocked as exc:
            raise WriteConflict(
                f"{exc}; this process did not join the run, which is safe to retry (a later "
                "tick, or `memory-gc run`, resumes it)"
            ) from None
        return row.calls, row.tokens

    def take_call(self) -> tuple[str, int, int] | None:
        with self._row() as conn:
            self._pay_owed(conn)
            taken = conn.execute(
                q("run_llm_take_call"), {"run_id": self._run_id, **self._limits}
            ).first()
            spent = conn.execute(q("run_llm_spent"), {"run_id": self._run_id}).one()
        self._owed = 0  # committed
        if taken is not None:
            return None
        calls, tokens = self._limits["max_calls"], self._limits["max_tokens"]
        if calls is not None and spent.calls >= calls:
            return "calls", spent.calls, calls
        return "tokens", spent.tokens, tokens if tokens is not None else spent.tokens

    def add_tokens(self, tokens: int) -> None:
        """Add a call's tokens; while another session holds the row, owe them (the call was
        paid for: its answer must not be lost for want of the ledger)."""
        self._owed = min(self._owed + tokens, BIGINT_MAX)
        if not self._owed:
            return
        try:
            with self._row() as conn:
                self._pay_owed(conn)
            self._owed = 0
        except SpendLocked as exc:
            log.warning("llm.spend_owed", tokens=self._owed, error=str(exc))

    def _pay_owed(self, conn: Connection) -> None:
        if self._owed:
            params = {"run_id": self._run_id, "tokens": self._owed}
            conn.execute(q("run_llm_add_tokens"), params)


def open_run_llm(
    settings: Settings, runtime: Runtime, engine: Engine, *, http_client: Any = None
) -> LLMPort | None:
    """The LLM port for a run, or None in offline mode (no OPENAI_API_KEY / OPENAI_BASE_URL)."""
    options = llm_options(
        settings, api_key=runtime.openai_api_key, base_url=runtime.openai_base_url
    )
    return open_llm(options, http_client=http_client, cache=PostgresDecisionCache(engine))


def llm_options(settings: Settings, **connection: Any) -> LLMOptions:
    """The port's options from the settings; ``connection``: api_key, base_url, and anything a
    caller sets beyond the settings (tests: no backoff sleep)."""
    return LLMOptions(
        model=settings.llm.model,
        embedding_model=settings.embeddings.model,
        embedding_dim=settings.embeddings.dim,
        timeout_seconds=settings.llm.timeout_seconds,
        max_calls_per_run=settings.llm.max_calls_per_run,
        max_tokens_per_run=settings.llm.max_tokens_per_run,
        max_retries=settings.llm.max_retries,
        outage_pause_seconds=settings.llm.outage_pause_seconds,
        max_completion_tokens=settings.llm.max_completion_tokens,
        **connection,
    )
