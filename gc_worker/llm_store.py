"""The LLM decision cache in PostgreSQL (``gc_llm_cache``), a run's model spend shared by the
processes working it (``gc_run_llm_spend``), and opening the port for a run.

Cache writes commit on their own connection, at once: a decision paid for is kept even when
the batch that asked for it rolls back, so a retried batch makes no new call. So does the spend:
a call is counted before it is made, whatever becomes of its batch.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Engine

from gc_worker.config import Runtime, Settings
from gc_worker.llm import LLMOptions, LLMPort, open_llm
from gc_worker.queries import q


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


class RunSpend:
    """``SharedSpend`` over ``gc_run_llm_spend``: one run's model calls and tokens, whoever made
    them. A call is taken in one statement (``calls < limit``), so processes asking at once get
    at most the limit between them; the token limit is checked when a call is taken, so calls in
    flight at that moment (one per worker) can pass it."""

    def __init__(
        self, engine: Engine, run_id: UUID, max_calls: int | None, max_tokens: int | None
    ) -> None:
        self._engine, self._run_id = engine, run_id
        self._limits = {"max_calls": max_calls, "max_tokens": max_tokens}

    def open(self, calls: int, tokens: int) -> tuple[int, int]:
        """Join the run's spend, which is at least ``calls`` and ``tokens`` (what its batches
        recorded); what the run has spent, by every process."""
        spent = {"calls": min(calls, BIGINT_MAX), "tokens": min(tokens, BIGINT_MAX)}
        with self._engine.begin() as conn:  # (records of a run older than USAGE_CEILING)
            row = conn.execute(q("run_llm_spend_open"), {"run_id": self._run_id, **spent}).one()
        return row.calls, row.tokens

    def take_call(self) -> tuple[str, int, int] | None:
        with self._engine.begin() as conn:
            taken = conn.execute(
                q("run_llm_take_call"), {"run_id": self._run_id, **self._limits}
            ).first()
            if taken is not None:
                return None
            spent = conn.execute(q("run_llm_spent"), {"run_id": self._run_id}).one()
        calls, tokens = self._limits["max_calls"], self._limits["max_tokens"]
        if calls is not None and spent.calls >= calls:
            return "calls", spent.calls, calls
        return "tokens", spent.tokens, tokens if tokens is not None else spent.tokens

    def add_tokens(self, tokens: int) -> None:
        if tokens:
            with self._engine.begin() as conn:
                conn.execute(q("run_llm_add_tokens"), {"run_id": self._run_id, "tokens": tokens})


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
        **connection,
    )
