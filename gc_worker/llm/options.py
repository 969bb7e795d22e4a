"""Connection and limit options of the LLM port, passed in by the caller (no file is read here).

- ``LLMOptions``: frozen; ``api_key`` and ``base_url`` both absent means offline mode.
  Defaults: model ``gpt-4.1-mini``, embedding model ``text-embedding-3-small``, timeout 30 s,
  500 calls (each request sent, a retry too) and unlimited tokens per run, 3 retries, backoff
  base 0.5 s capped at 30 s, no call for 300 s after one the model did not answer
  (``llm.outage``), no ``max_completion_tokens`` sent (some compatible servers refuse it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_BASE_URL = "https://api.openai.com/v1"


@dataclass(frozen=True, kw_only=True)
class LLMOptions:
    """What the port needs to reach one OpenAI-compatible server and how much it may spend."""

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    model: str = "gpt-4.1-mini"
    embedding_model: str = "text-embedding-3-small"
    embedding_dim: int | None = None
    timeout_seconds: float = 30.0
    max_calls_per_run: int | None = 500
    max_tokens_per_run: int | None = None
    max_retries: int = 3
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    temperature: float | None = None
    max_completion_tokens: int | None = None  # None: not sent
    outage_pause_seconds: float = 300.0  # after a call not answered: none for this long

    def __post_init__(self) -> None:
        _require(self.timeout_seconds > 0, "timeout_seconds must be > 0")
        _require(self.max_retries >= 0, "max_retries must be >= 0")
        _require(self.backoff_base_seconds >= 0, "backoff_base_seconds must be >= 0")
        _require(self.backoff_max_seconds >= 0, "backoff_max_seconds must be >= 0")
        _require(self.outage_pause_seconds >= 0, "outage_pause_seconds must be >= 0")
        _require(_none_or_at_least(self.max_calls_per_run, 0), "max_calls_per_run must be >= 0")
        _require(_none_or_at_least(self.max_tokens_per_run, 0), "max_tokens_per_run must be >= 0")
        _require(_none_or_at_least(self.embedding_dim, 1), "embedding_dim must be >= 1")
        _require(
            _none_or_at_least(self.max_completion_tokens, 1), "max_completion_tokens must be >= 1"
        )

    @property
    def offline(self) -> bool:
        """True when neither an API key nor a base URL is configured."""
        return not self.api_key and not self.base_url


def _none_or_at_least(value: int | None, minimum: int) -> bool:
    return value is None or value >= minimum


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
