"""Decision cache: a decision already taken on exactly the same inputs is not asked again.

- ``decision_key(kind, model, prompt_version, user_id, inputs)``: sha256 of a canonical JSON of
  everything the answer depends on (the ids and contents given to the model, in prompt order).
- ``DecisionCache``: the protocol a store implements (``get`` / ``put``); a PostgreSQL-backed one
  lives with the database code.
- ``InMemoryDecisionCache``: a dict, for tests and single-process runs.

Only validated answers are cached; a cached value is validated again when it is read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def decision_key(kind: str, model: str, prompt_version: str, user_id: str, inputs: Any) -> str:
    """The cache key of one decision: sha256 hex of its canonical inputs."""
    payload = {
        "kind": kind,
        "model": model,
        "prompt_version": prompt_version,
        "user_id": user_id,
        "inputs": inputs,
    }
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


class DecisionCache(Protocol):
    """Where validated LLM decisions are kept between runs."""

    def get(self, key: str) -> dict | None: ...

    def put(
        self, key: str, kind: str, user_id: str, memory_ids: list[str], value: dict
    ) -> None: ...


@dataclass(frozen=True)
class CachedDecision:
    kind: str
    user_id: str
    memory_ids: tuple[str, ...]
    value: dict


class InMemoryDecisionCache:
    """A process-local decision cache."""

    def __init__(self) -> None:
        self.entries: dict[str, CachedDecision] = {}

    def get(self, key: str) -> dict | None:
        entry = self.entries.get(key)
        return json.loads(json.dumps(entry.value)) if entry else None

    def put(self, key: str, kind: str, user_id: str, memory_ids: list[str], value: dict) -> None:
        copied = json.loads(json.dumps(value))
        self.entries[key] = CachedDecision(kind, user_id, tuple(memory_ids), copied)
