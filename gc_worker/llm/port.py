"""``LLMPort``: the decisions and embeddings the jobs ask for, cached, budgeted and validated.

- ``merge_group``, ``judge_contradiction``, ``score_importance``, ``summarize``: look the
  decision up in the ``DecisionCache`` (a hit makes no HTTP call and counts ``cache_hits``),
  otherwise ask the model, check the answer against the candidates it was given, cache it.
  A rejected answer counts ``invalid_answers``, logs ``llm.answer_rejected`` and raises
  ``LLMInvalidAnswer``; nothing is cached for it.
- ``embed``: embeddings of texts, same retries and budget.
- After a call the model did not answer, no call for ``outage_pause_seconds`` (``llm.outage``);
  the embeddings endpoint pauses apart from the decisions.
- ``begin_run()``: a fresh ``LLMBudget`` for the next run; ``usage()``: its counters.
- ``build_llm`` / ``open_llm``: the port over a real ``openai.OpenAI`` client (``max_retries=0``,
  the port retries; each whole request bounded by ``timeout_seconds``, ``llm.deadline``), or
  ``None`` in offline mode (no API key and no base URL).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx2
import openai
import structlog
from pydantic import BaseModel, ValidationError

from gc_worker.llm import decisions
from gc_worker.llm.budget import LLMBudget, SharedSpend
from gc_worker.llm.cache import DecisionCache, InMemoryDecisionCache, decision_key
from gc_worker.llm.client import ModelClient
from gc_worker.llm.deadline import with_deadline
from gc_worker.llm.decisions import ContradictionVerdict, DecisionRequest, Member, MergeDecision
from gc_worker.llm.errors import LLMInvalidAnswer, LLMUnavailable
from gc_worker.llm.options import DEFAULT_BASE_URL, LLMOptions
from gc_worker.llm.outage import Outage
from gc_worker.llm.prompts import chat_messages

log = structlog.get_logger("gc_worker.llm")

NO_KEY_PLACEHOLDER = "not-needed"
_MISS = object()


class LLMPort:
    """The model behind the LLM-needing jobs, for one OpenAI-compatible server."""

    def __init__(
        self,
        options: LLMOptions,
        client: openai.OpenAI,
        *,
        cache: DecisionCache | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self._model = ModelClient(client, options, sleep, on_attempt=self._request_done)
        # one pause per endpoint: a server whose embeddings fail (its embeddings model missing)
        # still answers the decisions, and a merged record then takes its members' centroid
        self._outage = Outage(options.outage_pause_seconds, clock)
        self._embed_outage = Outage(options.outage_pause_seconds, clock)
        self._cache: DecisionCache = cache if cache is not None else InMemoryDecisionCache()
        self._budget = self._new_budget()
        # called after every request to the model, answered or not, and after each retried
        # attempt and its backoff wait: a sign of life for a caller whose unit of work may take
        # minutes of model calls (the daemon's /healthz)
        self.on_request_done: Callable[[], None] | None = None

    @property
    def budget(self) -> LLMBudget:
        return self._budget

    def begin_run(
        self, *, spent_calls: int = 0, spent_tokens: int = 0, shared: SharedSpend | None = None
    ) -> LLMBudget:
        """Start a run's budget and counters; a run taken up again (stopped, resumed) has only
        what its earlier workers left of its limits (``spent_*``: what they used). ``shared``:
        what every process working the run spends (its calls are refused here too)."""
        self._budget = self._new_budget(spent_calls, spent_tokens)
        self._budget.shared = shared
        return self._budget

    def usage(self, *, this_thread: bool = False) -> dict[str, int]:
        """The current run's counters (the report's ``llm`` section plus extras); with
        ``this_thread``, only what the calling thread's requests used (a batch's share when
        several threads work the run)."""
        return self._budget.as_report(this_thread=this_thread)

    def close(self) -> None:
        self._model.close()

    def __enter__(self) -> LLMPort:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def merge_group(
        self, user_id: str, members: Sequence[Member], *, vet: Vet | None = None
    ) -> MergeDecision:
        """One merged statement for a group of near-duplicates, or why they are not. ``vet``:
        the caller's own check of the decision (a reason to reject it, or None), run with the
        port's checks — a rejected answer is neither used nor cached."""
        return self._decide(user_id, _vetted(decisions.merge_request(members), vet))

    def judge_contradiction(
        self, user_id: str, older: Member, newer: Member
    ) -> ContradictionVerdict:
        """contradicts / duplicate / compatible / unsure for an (older, newer) pair."""
        return self._decide(user_id, decisions.contradiction_request(older, newer))

    def score_importance(self, user_id: str, items: Sequence[Member]) -> dict[str, int]:
        """Importance 1..5 per memory id, all of the batch or nothing."""
        if not items:
            return {}
        return self._decide(user_id, decisions.importance_request(items))

    def summarize(self, user_id: str, members: Sequence[Member], *, vet: Vet | None = None) -> str:
        """One summary statement that keeps the members' facts (``vet`` as in merge_group)."""
        return self._decide(user_id, _vetted(decisions.summary_request(members), vet))

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embedding vectors of ``texts``, in order."""
        if not texts:
            return []
        self._embed_outage.check("embed")
        try:
            vectors = self._model.embed(texts, self._budget)
        except LLMUnavailable as exc:
            self._embed_outage.failed(exc)
            raise
        except LLMInvalidAnswer as exc:
            self._embed_outage.answered()
            self._reject("embed", None, len(texts), exc)
            raise
        finally:
            self._request_done()
        self._embed_outage.answered()
        return vectors

    def _decide(self, user_id: str, request: DecisionRequest[Any, Any]) -> Any:
        key = decision_key(
            request.kind, self.options.model, request.prompt_version, user_id, request.cache_inputs
        )
        cached = self._from_cache(key, request)
        if cached is not _MISS:
            return cached
        messages = chat_messages(request.system, request.instruction, request.payload)
        self._outage.check(request.kind)
        try:
            answer = self._model.complete(
                request.kind, messages, request.answer_model, self._budget
            )
            self._outage.answered()
            result = request.check(answer)
        except LLMUnavailable as exc:
            self._outage.failed(exc)
            raise
        except LLMInvalidAnswer as exc:
            self._outage.answered()  # (an answer the server sent, rejected by the checks)
            self._reject(request.kind, user_id, len(request.memory_ids), exc)
            raise
        finally:
            self._request_done()
        self._cache.put(
            key, request.kind, user_id, list(request.memory_ids), answer.model_dump(mode="json")
        )
        return result

    def _from_cache(self, key: str, request: DecisionRequest[Any, Any]) -> Any:
        value = self._cache.get(key)
        if value is None:
            return _MISS
        try:
            result = request.check(_revalidate(request.answer_model, value))
        except (ValidationError, LLMInvalidAnswer):
            log.warning("llm.cache_entry_ignored", kind=request.kind, key=key[:12])
            return _MISS
        self._budget.count("cache_hits")
        log.debug("llm.cache_hit", kind=request.kind, memories=len(request.memory_ids))
        return result

    def _request_done(self) -> None:
        if self.on_request_done is not None:
            self.on_request_done()

    def _reject(self, kind: str, user_id: str | None, size: int, exc: LLMInvalidAnswer) -> None:
        self._budget.count("invalid_answers")
        log.warning(
            "llm.answer_rejected",
            kind=kind,
            user_id=user_id,
            reason=exc.reason,
            memories=size,
            detail=exc.detail,
        )

    def _new_budget(self, spent_calls: int = 0, spent_tokens: int = 0) -> LLMBudget:
        calls, tokens = self.options.max_calls_per_run, self.options.max_tokens_per_run
        return LLMBudget(
            None if calls is None else max(0, calls - spent_calls),
            None if tokens is None else max(0, tokens - spent_tokens),
        )


def _revalidate(model: type[BaseModel], value: dict) -> BaseModel:
    return model.model_validate(value)


def open_llm(
    options: LLMOptions,
    *,
    http_client: httpx2.Client | None = None,
    cache: DecisionCache | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMPort | None:
    """The port for ``options``, or ``None`` in offline mode."""
    if options.offline:
        return None
    # the whole request is bounded, not only each read (gc_worker.llm.deadline)
    http = with_deadline(http_client or openai.DefaultHttpxClient(), options.timeout_seconds)
    client = openai.OpenAI(
        api_key=options.api_key or NO_KEY_PLACEHOLDER,
        base_url=options.base_url or DEFAULT_BASE_URL,
        timeout=options.timeout_seconds,
        max_retries=0,
        http_client=http,
    )
    return LLMPort(options, client, cache=cache, sleep=sleep)


def build_llm(
    api_key: str | None,
    base_url: str | None,
    *,
    model: str = "gpt-4.1-mini",
    embedding_model: str = "text-embedding-3-small",
    embedding_dim: int | None = None,
    timeout_seconds: float = 30.0,
    max_calls_per_run: int | None = 500,
    max_tokens_per_run: int | None = None,
    max_retries: int = 3,
    backoff_base_seconds: float = 0.5,
    http_client: httpx2.Client | None = None,
    cache: DecisionCache | None = None,
) -> LLMPort | None:
    """The port from plain values (``OPENAI_API_KEY`` / ``OPENAI_BASE_URL`` and config)."""
    options = LLMOptions(
        api_key=api_key,
        base_url=base_url,
        model=model,
        embedding_model=embedding_model,
        embedding_dim=embedding_dim,
        timeout_seconds=timeout_seconds,
        max_calls_per_run=max_calls_per_run,
        max_tokens_per_run=max_tokens_per_run,
        max_retries=max_retries,
        backoff_base_seconds=backoff_base_seconds,
    )
    return open_llm(options, http_client=http_client, cache=cache)


Vet = Callable[[Any], "str | None"]


def _vetted(request: decisions.DecisionRequest[Any, Any], vet: Vet | None) -> Any:
    """``request`` whose check also runs ``vet`` on the checked result."""
    if vet is None:
        return request
    check = request.check

    def vetted(answer: Any) -> Any:
        result = check(answer)
        problem = vet(result)
        if problem is not None:
            raise LLMInvalidAnswer("unsupported", problem)
        return result

    return dataclasses.replace(request, check=vetted)
