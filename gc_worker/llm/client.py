"""The HTTP side of the port: one structured chat call or one embeddings call, with retries.

- ``ModelClient.complete(kind, messages, answer_model, budget)``: sends
  ``chat.completions.parse`` with the pydantic answer model as the strict JSON schema (and
  ``max_completion_tokens`` when configured), adds ``usage`` to the budget (also for answers
  that are then rejected) and returns the parsed answer. Malformed JSON, a schema mismatch, a
  key stated twice (``duplicate_key``), a refusal, a truncated (``finish_reason`` "length") or
  filtered answer → ``LLMInvalidAnswer`` with a reason code.
- ``ModelClient.embed(texts, budget)``: ``embeddings.create`` with ``encoding_format="float"``;
  the vectors come back in input order, checked for count and (if configured) dimension. A
  body that is no embeddings answer (a proxy's page, broken JSON) → ``LLMInvalidAnswer``.
- Retries: the openai client is built with ``max_retries=0``; this loop retries 408, 429, 5xx,
  timeouts and connection errors up to ``max_retries`` times with exponential backoff, jitter and
  ``Retry-After``; anything else (400, 401, 403, 404, …) fails at once. Either way the failure is
  ``LLMUnavailable``. Logs ``llm.retry_scheduled`` and ``llm.unavailable``.
- Every request sent is one call of the budget, a retry too: each attempt reserves its call
  first (a retry's before the backoff wait), and the usage a failed attempt's body reports is
  counted. A retry the budget refuses is not sent: ``LLMBudgetExhausted`` (the decision is
  deferred), logged as ``llm.retry_stopped``.
- ``on_attempt``: called after each failed attempt that is retried and again when its backoff
  wait ends (the port's ``on_request_done`` once the request is done): a sign of life per
  attempt, so a caller retrying a slow server for many minutes is not taken for stuck.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import openai
import pydantic
import structlog

from gc_worker.llm.budget import LLMBudget
from gc_worker.llm.errors import LLMBudgetExhausted, LLMInvalidAnswer, LLMUnavailable
from gc_worker.llm.options import LLMOptions

log = structlog.get_logger("gc_worker.llm")

AnswerT = TypeVar("AnswerT", bound=pydantic.BaseModel)
T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 429})
JITTER_FRACTION = 0.25
FLOAT4_MAX = 3.4e38  # pgvector stores float4


def is_retryable(exc: openai.APIError) -> bool:
    """Rate limits, server errors, timeouts and connection errors are worth another attempt."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return isinstance(exc, openai.APIConnectionError)


def backoff_delay(
    attempt: int,
    options: LLMOptions,
    *,
    retry_after: float | None = None,
    jitter: float | None = None,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    base = options.backoff_base_seconds * 2 ** (attempt - 1)
    spread = random.random() if jitter is None else jitter
    delay = base * (1 + JITTER_FRACTION * spread)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(delay, options.backoff_max_seconds)


def retry_after_seconds(exc: openai.APIError) -> float | None:
    """The server's ``Retry-After`` (in seconds) when it sent a numeric one."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    try:
        return float(exc.response.headers.get("retry-after", ""))
    except ValueError:
        return None


class ModelClient:
    """One OpenAI-compatible server, called with the port's own retry loop."""

    def __init__(
        self,
        client: openai.OpenAI,
        options: LLMOptions,
        sleep: Callable[[float], None] = time.sleep,
        on_attempt: Callable[[], None] = lambda: None,
    ) -> None:
        self._client = client
        self._options = options
        self._sleep = sleep
        self._on_attempt = on_attempt

    def close(self) -> None:
        self._client.close()

    def complete(
        self,
        kind: str,
        messages: list[dict[str, str]],
        answer_model: type[AnswerT],
        budget: LLMBudget,
    ) -> AnswerT:
        """One structured-output chat call; the parsed, schema-valid answer."""
        raw = self._with_retries(kind, budget, lambda: self._send_chat(messages, answer_model))
        budget.record_usage(*_usage(raw.http_response))
        return _parsed_answer(raw)

    def embed(self, texts: Sequence[str], budget: LLMBudget) -> list[list[float]]:
        """Embeddings of ``texts``, in the same order."""
        raw = self._with_retries(
            "embed", budget, lambda: self._send_embeddings(texts), embedding=True
        )
        budget.record_usage(*_usage(raw.http_response))
        return _checked_vectors(_parsed_body(raw), len(texts), self._options.embedding_dim)

    def _send_chat(
        self, messages: list[dict[str, str]], answer_model: type[pydantic.BaseModel]
    ) -> Any:
        extra: dict[str, Any] = {}
        if self._options.temperature is not None:
            extra["temperature"] = self._options.temperature
        if self._options.max_completion_tokens is not None:
            extra["max_completion_tokens"] = self._options.max_completion_tokens
        return self._client.chat.completions.with_raw_response.parse(
            model=self._options.model,
            messages=messages,  # type: ignore[arg-type]
            response_format=answer_model,
            **extra,
        )

    def _send_embeddings(self, texts: Sequence[str]) -> Any:
        return self._client.embeddings.with_raw_response.create(
            model=self._options.embedding_model, input=list(texts), encoding_format="float"
        )

    def _with_retries(
        self, kind: str, budget: LLMBudget, request: Callable[[], T], *, embedding: bool = False
    ) -> T:
        attempts = self._options.max_retries + 1
        budget.reserve_call(embedding=embedding)
        for attempt in range(1, attempts + 1):
            try:
                return request()
            except openai.APIError as exc:
                if isinstance(exc, openai.APIStatusError):  # a failed attempt may be billed
                    budget.record_usage(*_usage(exc.response))
                if attempt == attempts or not is_retryable(exc):
                    raise self._unavailable(kind, attempt, exc, budget) from exc
                self._on_attempt()
                self._reserve_retry(kind, attempt, exc, budget, embedding)
                self._wait_before_retry(kind, attempt, exc, budget)
                self._on_attempt()
        raise AssertionError("unreachable: the loop returns or raises")

    def _reserve_retry(
        self, kind: str, attempt: int, exc: openai.APIError, budget: LLMBudget, embedding: bool
    ) -> None:
        """The next attempt's call, taken before waiting for it: a retry is a request sent."""
        try:
            budget.reserve_call(embedding=embedding)
        except LLMBudgetExhausted as spent:
            log.warning(
                "llm.retry_stopped",
                kind=kind,
                attempts=attempt,
                status_code=_status_code(exc),
                error=type(exc).__name__,
                limit=spent.limit,
            )
            raise

    def _wait_before_retry(
        self, kind: str, attempt: int, exc: openai.APIError, budget: LLMBudget
    ) -> None:
        delay = backoff_delay(attempt, self._options, retry_after=retry_after_seconds(exc))
        budget.count("retries")
        log.warning(
            "llm.retry_scheduled",
            kind=kind,
            attempt=attempt,
            status_code=_status_code(exc),
            delay_seconds=round(delay, 3),
            error=type(exc).__name__,
        )
        self._sleep(delay)

    def _unavailable(
        self, kind: str, attempt: int, exc: openai.APIError, budget: LLMBudget
    ) -> LLMUnavailable:
        budget.count("errors")
        status = _status_code(exc)
        log.error(
            "llm.unavailable",
            kind=kind,
            attempts=attempt,
            status_code=status,
            retryable=is_retryable(exc),
            error=type(exc).__name__,
        )
        return LLMUnavailable(kind, attempts=attempt, status_code=status, cause=type(exc).__name__)


def _status_code(exc: openai.APIError) -> int | None:
    return exc.status_code if isinstance(exc, openai.APIStatusError) else None


def _usage(response: Any) -> tuple[int, int]:
    """Prompt and completion tokens from an HTTP response's body (a chat or an embeddings
    answer, or an error a gateway billed), readable even when parsing fails; 0 for a count the
    server did not give as a number."""
    try:
        usage = response.json().get("usage") or {}
        return _token_count(usage.get("prompt_tokens")), _token_count(
            usage.get("completion_tokens")
        )
    except (ValueError, TypeError, AttributeError):
        return 0, 0


def _token_count(value: Any) -> int:
    try:
        return int(value or 0)
    except (ValueError, TypeError, OverflowError):  # OverflowError: Infinity
        return 0


def _parsed_body(raw: Any) -> Any:
    """The parsed body of an embeddings call; a body that is no answer (a proxy's page, broken
    JSON) is an invalid answer, not an exception failing the batch."""
    try:
        return raw.parse()
    except Exception as exc:
        raise LLMInvalidAnswer("malformed_response", type(exc).__name__) from exc


def _parsed_answer(raw: Any) -> Any:
    try:
        completion = raw.parse()
    except pydantic.ValidationError as exc:
        raise _schema_error(exc) from exc
    except openai.LengthFinishReasonError as exc:
        raise LLMInvalidAnswer("truncated") from exc
    except openai.ContentFilterFinishReasonError as exc:
        raise LLMInvalidAnswer("content_filtered") from exc
    except Exception as exc:  # any other parse failure is still an answer we cannot use
        raise LLMInvalidAnswer("malformed_response", type(exc).__name__) from exc
    return _message_answer(completion)


def _message_answer(completion: Any) -> Any:
    if not completion.choices:
        raise LLMInvalidAnswer("empty_answer", "no choices")
    message = completion.choices[0].message
    refusal = message.refusal
    if refusal:  # its text is not kept: a refusal often restates what it was shown
        # (a gateway may send a number or an object: a refusal all the same)
        size = f"{len(refusal)} characters" if isinstance(refusal, str) else type(refusal).__name__
        raise LLMInvalidAnswer("refused", size)
    if message.parsed is None:
        raise LLMInvalidAnswer("empty_answer", "no content")
    twice = _key_twice(message.content)
    if twice is not None:
        # the parser keeps a key's last value: {"is_duplicate_set": false, …, "is_duplicate_set":
        # true} would be read as a merge the answer also declined
        raise LLMInvalidAnswer("duplicate_key", f"{twice!r} stated twice")
    if _has_nul(message.parsed.model_dump()):
        # PostgreSQL stores no text or jsonb with one: the cache or the merged record would
        # fail the batch's write instead
        raise LLMInvalidAnswer("malformed_response", "a NUL character in a text")
    return message.parsed


def _key_twice(content: Any) -> str | None:
    """A key some object of the JSON ``content`` states twice, or None."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        found.extend(key for key in keys if keys.count(key) > 1)
        return dict(items)

    try:
        json.loads(content, object_pairs_hook=pairs)
    except (TypeError, ValueError):
        return None  # (parsed already: a content the model client read otherwise)
    return found[0] if found else None


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def _schema_error(exc: pydantic.ValidationError) -> LLMInvalidAnswer:
    errors = exc.errors()
    reason = (
        "malformed_json"
        if any(e["type"] == "json_invalid" for e in errors)
        else ("schema_mismatch")
    )
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    where = ".".join(str(part) for part in first["loc"])
    return LLMInvalidAnswer(reason, f"{where}: {first['msg']}" if where else first["msg"])


def _checked_vectors(response: Any, expected: int, dim: int | None) -> list[list[float]]:
    try:
        data = sorted(response.data, key=lambda item: item.index)
        vectors = [[float(value) for value in item.embedding] for item in data]
    except (AttributeError, TypeError, ValueError) as exc:
        raise LLMInvalidAnswer("malformed_response", type(exc).__name__) from exc
    if len(data) != expected or [item.index for item in data] != list(range(expected)):
        raise LLMInvalidAnswer("embedding_count_mismatch", f"{len(data)} for {expected} texts")
    if dim is not None and any(len(vector) != dim for vector in vectors):
        raise LLMInvalidAnswer("embedding_dim_mismatch", f"expected {dim}")
    # JSON NaN / Infinity parse as floats; jsonb and pgvector (float4) refuse them, and a zero
    # vector has no direction: any of these would fail the batch's statement, not the answer
    if any(not all(math.isfinite(v) and abs(v) < FLOAT4_MAX for v in vec) for vec in vectors):
        raise LLMInvalidAnswer("embedding_not_finite", "NaN, infinite or beyond float4")
    if any(not any(vec) for vec in vectors):
        raise LLMInvalidAnswer("embedding_zero", "a vector of zeros")
    return vectors
