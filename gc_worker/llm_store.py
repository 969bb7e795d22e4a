"""The LLM decision cache in PostgreSQL (``gc_llm_cache``), and opening the port for a run.

Cache writes commit on their own connection, at once: a decision paid for is kept even when
the batch that asked for it rolls back, so a retried batch makes no new call.
"""

from __future__ import annotations

import json
from typing import Any

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
