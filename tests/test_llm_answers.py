"""Odd answers of an OpenAI-compatible server, under the real openai client (MockTransport):
each is a rejected answer or a used one, never an exception that fails the batch; an answer
that states a field twice is rejected, not read by its last value."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from gc_worker.llm import LLMInvalidAnswer
from tests.test_llm_guards import Model, batch_stands_with_the_centroid
from tests.test_llm_port import MakePort, chat_reply, make_port

__all__ = ["make_port"]  # the fixture, imported for this module's tests

GROUP = [
    ("a0000000-0000-0000-0000-000000000001", "Prefers morning meetings."),
    ("b0000000-0000-0000-0000-000000000002", "Likes meetings in the morning."),
]
VECTOR = [1.0, 0.0, 0.0, 0.0]


def embeddings_body(usage: Any) -> httpx2.Response:
    data = [{"object": "embedding", "index": 0, "embedding": VECTOR}]
    return httpx2.Response(200, json={"object": "list", "data": data, "model": "m", "usage": usage})


class TestEmbeddingsBodies:
    @pytest.mark.parametrize(
        "reply",
        [
            httpx2.Response(200, text="<html>proxy error</html>"),
            httpx2.Response(
                200, content=b"{not json", headers={"content-type": "application/json"}
            ),
            httpx2.Response(200, json=[1, 2]),
        ],
        ids=["html", "broken_json", "a_list"],
    )
    def test_a_body_that_is_no_embeddings_answer_is_rejected(
        self, make_port: MakePort, reply: httpx2.Response
    ) -> None:
        """A 200 whose body is not an embeddings answer (a proxy's page, broken JSON) is an
        invalid answer — the caller falls back to the centroid — not an AttributeError or a
        JSONDecodeError failing the batch."""
        port, _ = make_port(reply, embedding_dim=4)
        with pytest.raises(LLMInvalidAnswer) as caught:
            port.embed(["a text"])
        assert caught.value.reason == "malformed_response"
        assert port.usage()["invalid_answers"] == 1 and port.usage()["calls"] == 1

    @pytest.mark.parametrize(
        "usage", [{}, {"prompt_tokens": None}, {"prompt_tokens": "many"}, "n/a"]
    )
    def test_unusable_usage_counts_no_tokens_and_the_vectors_are_used(
        self, make_port: MakePort, usage: Any
    ) -> None:
        """A server that reports no usable token count (an empty or null ``usage``) still
        answered: its vectors are used, and the call is counted with no tokens."""
        port, _ = make_port(embeddings_body(usage), embedding_dim=4)
        assert port.embed(["a text"]) == [VECTOR]
        assert port.usage()["input_tokens"] == 0 and port.usage()["calls"] == 1

    def test_a_fractional_token_count_is_counted_whole(self, make_port: MakePort) -> None:
        """Token counts are whole numbers in the budget and the report, as for chat calls."""
        port, _ = make_port(embeddings_body({"prompt_tokens": 7.5}), embedding_dim=4)
        port.embed(["a text"])
        assert port.usage()["input_tokens"] == 7


class TestChatBodies:
    @pytest.mark.parametrize("refusal", [5, True, {"reason": "policy"}, ["no"]])
    def test_a_refusal_that_is_no_text_is_still_a_refusal(
        self, make_port: MakePort, refusal: Any
    ) -> None:
        """A gateway that sends ``refusal`` as a number, flag, object or list refused all the
        same: an invalid answer, not a TypeError failing the batch."""
        message = {"role": "assistant", "content": None, "refusal": refusal}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [choice]}  # fmt: skip
        port, _ = make_port(httpx2.Response(200, json=body))
        with pytest.warns(UserWarning), pytest.raises(LLMInvalidAnswer) as caught:
            port.merge_group("u1", GROUP)  # (pydantic warns of the field's unexpected type)
        assert caught.value.reason == "refused"

    @pytest.mark.parametrize(
        "content",
        [
            '{"is_duplicate_set": false, "member_ids": [], "merged_text": null, "reason": "no",'
            ' "is_duplicate_set": true}',
            f'{{"is_duplicate_set": true, "member_ids": ["{GROUP[0][0]}", "{GROUP[1][0]}"],'
            ' "merged_text": "Prefers morning meetings.", "merged_text": "Prefers evening'
            ' meetings.", "reason": null}',
        ],
        ids=["two-decisions", "two-texts"],
    )
    def test_an_answer_that_states_a_field_twice_is_rejected(
        self, make_port: MakePort, content: str
    ) -> None:
        """A JSON object naming a key twice says two things ("not a duplicate set", then "a
        duplicate set"); the parser kept the last one and the job acted on it. Found by an
        adversarial review of the answer checks."""
        port, _ = make_port(chat_reply(content))
        with pytest.raises(LLMInvalidAnswer) as caught:
            port.merge_group("u1", GROUP)
        assert caught.value.reason == "duplicate_key"

    def test_an_answer_with_an_extra_field_is_used_without_it(self, make_port: MakePort) -> None:
        """A field the schema does not have is ignored (it is never read), not a rejection."""
        answer = {"is_duplicate_set": False, "member_ids": [], "merged_text": None,
                  "reason": "differ", "delete_ids": [GROUP[0][0]]}  # fmt: skip
        port, _ = make_port(chat_reply(answer))
        assert not port.merge_group("u1", GROUP).is_duplicate_set


class ProxyPageForEmbeddings(Model):
    """Answers chat calls; the embeddings route is behind a proxy that answers 200 with a page."""

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/embeddings"):
            self.requests.append(request)
            return httpx2.Response(200, text="<html>Service temporarily unavailable</html>")
        return super().__call__(request)


class TestAJobSurvivesAnEmbeddingsPage:
    def test_compaction_merges_with_the_centroid_and_the_batch_stands(
        self, engine, settings, make_llm
    ):
        """The merged record gets its members' centroid (docs/llm-jobs.md: the embeddings call
        failed), and another user's TTL expiry in the same batch is applied — before, the
        page's AttributeError failed the whole batch."""
        batch_stands_with_the_centroid(engine, settings, make_llm, ProxyPageForEmbeddings,
                                       "an embeddings page")  # fmt: skip
