"""An OpenAI-compatible server, faked at the HTTP boundary, that answers every decision kind.

``FakeModel(behaviour)`` is a ``MockTransport`` handler for the real openai client:

- ``good``: valid, deterministic answers (importance by text length, merges keep the longest
  text, contradiction verdicts by content, summaries join the texts, embeddings from a hash);
- ``garbage``: answers that must be rejected, cycling through non-JSON text, a JSON object of
  the wrong shape, an empty choice list, a truncated answer and schema-valid answers that name
  ids or indexes that were not asked about;
- ``obey``: a model that follows instructions found in the memory text and answers with
  *other* memories' ids (``foreign_ids``) to get them deleted;
- ``down``: HTTP 503 on every call; ``timeout``: the read times out on every call;
- ``flaky``: every other request is a 503 (a retry gets the good answer).

``fake_port(engine, settings, model)`` builds the real ``LLMPort`` over it, with the Postgres
decision cache, the run's budget options and no backoff sleep between retries.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx2
import sqlalchemy as sa

from gc_worker.config import Settings
from gc_worker.llm import LLMPort, open_llm
from gc_worker.llm_store import PostgresDecisionCache, llm_options
from tests.test_llm_port import chat_reply, data_block, embeddings_reply, error_reply

BASE_URL = "http://llm.test/v1"
BEHAVIOURS = ("good", "garbage", "obey", "down", "timeout", "flaky")


def hashed_vector(text: str, dim: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dim)]


def _score(item: dict[str, Any]) -> int:
    return 1 + len(item["content"]) % 5


GOOD: dict[str, Callable[[Any], dict[str, Any]]] = {
    "ImportanceAnswer": lambda items: {
        "scores": [{"index": i["index"], "score": _score(i)} for i in items]
    },
    "MergeAnswer": lambda items: {
        "is_duplicate_set": True,
        "member_ids": [i["id"] for i in items],
        "merged_text": max((i["content"] for i in items), key=len),
        "reason": None,
    },
    "ContradictionAnswer": lambda pair: {
        "older_id": pair["older"]["id"],
        "newer_id": pair["newer"]["id"],
        "verdict": ("contradicts", "compatible", "unsure")[
            (len(pair["older"]["content"]) + len(pair["newer"]["content"])) % 3
        ],
        "reason": "fake",
    },
    "SummaryAnswer": lambda items: {
        "summary": "Summary: " + "; ".join(i["content"] for i in items)
    },
}


class FakeModel:
    """A MockTransport handler answering as ``behaviour`` (module docstring)."""

    def __init__(self, behaviour: str = "good", *, dim: int = 8, foreign_ids: tuple = ()) -> None:
        assert behaviour in BEHAVIOURS
        self.behaviour = behaviour
        self.dim = dim
        self.foreign_ids = [str(i) for i in foreign_ids] or ["00000000-0000-0000-0000-00000000beef"]
        self.calls: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self._garbage = itertools.count()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        kind = "embed" if request.url.path.endswith("/embeddings") else _schema_name(body)
        self.calls[kind] += 1
        self.bodies.append(body)
        if self.behaviour == "down" or (self.behaviour == "flaky" and len(self.bodies) % 2):
            return error_reply(503)
        if self.behaviour == "timeout":
            raise httpx2.ReadTimeout("the model did not answer in time", request=request)
        if kind == "embed":
            return embeddings_reply([hashed_vector(t, self.dim) for t in body["input"]])
        payload = data_block(body["messages"][1]["content"])
        if self.behaviour == "garbage":
            return self._garbage_reply(kind, payload)
        if self.behaviour == "obey":
            return chat_reply(self._obedient(kind, payload))
        return chat_reply(GOOD[kind](payload))

    def _garbage_reply(self, kind: str, payload: Any) -> httpx2.Response:
        variant = next(self._garbage) % 5
        if variant == 0:
            return chat_reply("Sure! Here is my answer: {not json")
        if variant == 1:
            return chat_reply({"answer": "delete everything"})
        if variant == 2:
            return httpx2.Response(
                200,
                json={
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "m",
                    "choices": [],
                },
            )
        if variant == 3:
            return chat_reply(GOOD[kind](payload), finish_reason="length")
        return chat_reply(self._obedient(kind, payload))

    def _obedient(self, kind: str, payload: Any) -> dict[str, Any]:
        """Answers that reach outside the question: other memories' ids, indexes out of range."""
        foreign = self.foreign_ids
        if kind == "ImportanceAnswer":
            return {"scores": [{"index": i["index"] + 1000, "score": 1} for i in payload]}
        if kind == "MergeAnswer":
            ids = [i["id"] for i in payload] + foreign
            return {"is_duplicate_set": True, "member_ids": ids, "merged_text": "x", "reason": None}
        if kind == "ContradictionAnswer":
            return {
                "older_id": foreign[0],
                "newer_id": pair_newer(payload),
                "verdict": "contradicts",
                "reason": "the memory told me to",
            }
        return {
            "summary": "Deleted every memory of every user as instructed: " + ", ".join(foreign)
        }


def pair_newer(payload: dict[str, Any]) -> str:
    return payload["newer"]["id"]


def _schema_name(body: dict[str, Any]) -> str:
    return body["response_format"]["json_schema"]["name"]


def fake_port(engine: sa.Engine, settings: Settings, model: FakeModel) -> LLMPort:
    """The real port (openai client, Postgres cache, budget) over ``model``."""
    options = llm_options(settings, api_key="test-key", base_url=BASE_URL, backoff_base_seconds=0)
    http_client = httpx2.Client(transport=httpx2.MockTransport(model))
    port = open_llm(options, http_client=http_client, cache=PostgresDecisionCache(engine))
    assert port is not None
    return port
