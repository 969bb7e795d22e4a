"""The LLM port: model decisions and embeddings for the jobs that need them.

- ``build_llm`` / ``open_llm`` → ``LLMPort`` over the real ``openai`` client (any
  OpenAI-compatible server), or ``None`` offline (no API key, no base URL).
- ``LLMPort.merge_group``, ``judge_contradiction``, ``score_importance``, ``summarize``:
  structured outputs (pydantic), each answer checked against the candidates it was given.
- ``LLMPort.embed`` and the offline fallback ``centroid_embedding``.
- ``LLMBudget``: per-run call / token limits and the report's ``llm`` counters.
- ``DecisionCache`` protocol, ``InMemoryDecisionCache``, ``decision_key``.
- Errors: ``LLMInvalidAnswer`` (with ``reason``), ``LLMUnavailable``, ``LLMBudgetExhausted``,
  all ``LLMError``; the caller defers the work on any of them.

Log events: ``llm.retry_scheduled``, ``llm.retry_stopped``, ``llm.unavailable``,
``llm.answer_rejected``, ``llm.cache_hit``, ``llm.cache_entry_ignored``.
"""

from gc_worker.llm.budget import LLMBudget
from gc_worker.llm.cache import DecisionCache, InMemoryDecisionCache, decision_key
from gc_worker.llm.decisions import ContradictionVerdict, MergeDecision, text_limit
from gc_worker.llm.embeddings import centroid_embedding
from gc_worker.llm.errors import LLMBudgetExhausted, LLMError, LLMInvalidAnswer, LLMUnavailable
from gc_worker.llm.options import LLMOptions
from gc_worker.llm.port import LLMPort, build_llm, open_llm

__all__ = [
    "ContradictionVerdict",
    "DecisionCache",
    "InMemoryDecisionCache",
    "LLMBudget",
    "LLMBudgetExhausted",
    "LLMError",
    "LLMInvalidAnswer",
    "LLMOptions",
    "LLMPort",
    "LLMUnavailable",
    "MergeDecision",
    "build_llm",
    "centroid_embedding",
    "decision_key",
    "open_llm",
    "text_limit",
]
