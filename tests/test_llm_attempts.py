"""Every HTTP request to the model is a call of the run's budget, retries included, and an
answer's length is bounded (``llm.max_completion_tokens``); the model faked at the HTTP
boundary (MockTransport under the real openai client)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import httpx2
import pytest
from structlog.testing import capture_logs

from gc_worker.config import LLMSettings, Settings, load_settings
from gc_worker.errors import ConfigError
from gc_worker.llm import LLMBudgetExhausted, LLMInvalidAnswer, LLMOptions, open_llm
from gc_worker.llm_store import llm_options
from tests.conftest import TEST_DIM
from tests.fake_model import FakeModel, fake_port
from tests.store import NOW, execute, run
from tests.test_llm_jobs_http import FakeOpenAI, fixed, merge_all, seed_tea
from tests.test_llm_port import (
    BASE_URL,
    GROUP,
    FakeServer,
    MakePort,
    chat_reply,
    embeddings_reply,
    error_reply,
    make_port,
    merge_answer,
)

__all__ = ["make_port"]  # the fixture, imported for this module's tests


def billed_error(status: int, prompt_tokens: int, completion_tokens: int) -> httpx2.Response:
    """An error a gateway sends with the usage the model was billed for before it failed."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return httpx2.Response(status, json={"error": {"message": "upstream"}, "usage": usage})


class TestAttemptsAreCalls:
    def test_each_attempt_is_a_call(self, make_port: MakePort) -> None:
        """A server answering 500 twice and then 200 costs three calls of the budget."""
        port, server = make_port(error_reply(500), error_reply(500), chat_reply(merge_answer()))
        assert port.merge_group("u1", GROUP).is_duplicate_set
        assert len(server.requests) == 3
        assert (port.usage()["calls"], port.usage()["retries"]) == (3, 2)

    def test_budget_spent_mid_retry_stops_and_defers(self, make_port: MakePort) -> None:
        """With two calls left, a server failing twice is asked twice: the retry that would
        be the third request is not sent, and the decision is deferred by budget, not guessed."""
        port, server = make_port(
            error_reply(500), error_reply(500), chat_reply(merge_answer()), max_calls_per_run=2
        )
        with capture_logs() as logs, pytest.raises(LLMBudgetExhausted) as caught:
            port.merge_group("u1", GROUP)
        assert caught.value.limit == "calls"
        assert len(server.requests) == 2
        usage = port.usage()
        assert (usage["calls"], usage["deferred_by_budget"], usage["errors"]) == (2, 1, 0)
        assert "llm.retry_stopped" in [log["event"] for log in logs]

    def test_budget_just_enough_for_the_retries(self, make_port: MakePort) -> None:
        """With exactly three calls left, 500, 500, 200 is answered."""
        port, server = make_port(
            error_reply(500), error_reply(500), chat_reply(merge_answer()), max_calls_per_run=3
        )
        assert port.merge_group("u1", GROUP).is_duplicate_set
        assert len(server.requests) == 3

    def test_tokens_billed_for_a_failed_attempt_are_counted(self, make_port: MakePort) -> None:
        """Usage a server reports with an error counts against the token budget too."""
        port, _ = make_port(
            billed_error(502, 40, 5), chat_reply(merge_answer()), max_tokens_per_run=10_000
        )
        port.merge_group("u1", GROUP)
        assert (port.usage()["input_tokens"], port.usage()["output_tokens"]) == (140, 25)
        assert port.budget.tokens == 165

    def test_tokens_billed_for_a_failed_attempt_can_stop_the_retry(
        self, make_port: MakePort
    ) -> None:
        """A failed attempt billed past the token budget is not retried: deferred by budget."""
        port, server = make_port(
            billed_error(502, 90, 10), chat_reply(merge_answer()), max_tokens_per_run=100
        )
        with pytest.raises(LLMBudgetExhausted) as caught:
            port.merge_group("u1", GROUP)
        assert caught.value.limit == "tokens"
        assert len(server.requests) == 1

    def test_embedding_retries_are_calls(self, make_port: MakePort) -> None:
        """An embeddings request retried once is two calls, both embedding calls."""
        port, _ = make_port(error_reply(503), embeddings_reply([[0.1, 0.2]]))
        assert port.embed(["x"]) == [[0.1, 0.2]]
        assert (port.usage()["calls"], port.usage()["embedding_calls"]) == (2, 2)


class TestAttemptsAreSignsOfLife:
    def test_each_attempt_and_each_backoff_is_a_sign_of_life(self) -> None:
        """A server answering 500 twice, then 200: ``on_request_done`` (the daemon's /healthz
        progress) is called after each attempt and when each backoff wait ends, not only once
        the question is answered, so a worker retrying a slow server is not taken for stuck."""
        events: list[str] = []
        server = FakeServer([error_reply(500), error_reply(500), chat_reply(merge_answer())])

        def handler(request: httpx2.Request) -> httpx2.Response:
            events.append("request")
            return server(request)

        options = LLMOptions(api_key="k", base_url=BASE_URL, max_retries=2)
        http_client = httpx2.Client(transport=httpx2.MockTransport(handler))
        port = open_llm(options, http_client=http_client, sleep=lambda _: events.append("wait"))
        assert port is not None
        port.on_request_done = lambda: events.append("alive")
        with port:
            assert port.merge_group("u1", GROUP).is_duplicate_set
        retried = ["request", "alive", "wait", "alive"]
        assert events == [*retried, *retried, "request", "alive"]

    def test_a_sweep_retrying_the_model_keeps_the_daemon_alive(self, engine) -> None:
        """In a daemon's sweep against a server failing every other request, each request
        (a retry too) finds a newer sign of life than the one before it."""
        from gc_worker import sweeps
        from gc_worker.daemon import Daemon

        seen: list[float] = []
        model = Flaky(lambda: seen.append(daemon.last_progress))
        settings = Settings(embeddings={"dim": TEST_DIM})
        seed_tea(engine)
        daemon = Daemon(engine, settings, clock=lambda: NOW,
                        llm_factory=lambda: fake_port(engine, settings, model))  # fmt: skip
        try:
            sweeps.request_sweep(engine, "u1")
            assert daemon.sweep_next()
        finally:
            daemon.close()
        assert len(seen) >= 4 and all(b > a for a, b in itertools.pairwise(seen))


class Flaky(FakeModel):
    """Every other request a 503; ``during()`` runs first on each."""

    def __init__(self, during: Callable[[], None]) -> None:
        super().__init__("flaky", dim=TEST_DIM)
        self.during = during

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.during()
        return super().__call__(request)


class TestSharedBudgetCountsAttempts:
    def test_retries_take_calls_from_the_run_spend(self, engine, make_llm) -> None:
        """The run's shared spend (what every replica draws on) counts each attempt: with
        llm.max_calls_per_run = 1 a failing server is asked once, and the group is deferred
        as llm_budget."""
        seed_tea(engine)
        settings = Settings(embeddings={"dim": TEST_DIM}, llm=LLMSettings(max_calls_per_run=1))
        server = FakeOpenAI(merge=fixed(error_reply(500)))
        report = run(engine, settings, jobs=["compaction"], llm=make_llm(server, max_retries=3))
        assert len(server.requests) == 1
        assert [(a["action"], a["reason"]) for a in report["actions"]] == [
            ("deferred", "llm_budget")
        ]
        spent = execute(engine, "SELECT calls FROM gc_run_llm_spend").scalar()
        assert spent == report["llm"]["calls"] == 1

    def test_report_calls_are_requests_sent(self, engine, settings, make_llm) -> None:
        """A retried merge is reported as the requests sent, in the run and in the job."""
        seed_tea(engine)
        replies = iter([error_reply(503)])
        server = FakeOpenAI(merge=lambda p, r: next(replies, None) or merge_all(p, r))
        report = run(engine, settings, jobs=["compaction"], llm=make_llm(server))
        assert len(server.requests) == 3  # 503, merge, embeddings
        assert report["llm"]["calls"] == report["jobs"]["compaction"]["llm_calls"] == 3
        assert execute(engine, "SELECT calls FROM gc_run_llm_spend").scalar() == 3


class TestMaxCompletionTokens:
    def test_not_sent_by_default(self, make_port: MakePort) -> None:
        """Unset, the parameter is not sent (some compatible servers refuse it)."""
        port, server = make_port(chat_reply(merge_answer()))
        port.merge_group("u1", GROUP)
        assert "max_completion_tokens" not in server.body()
        assert Settings().llm.max_completion_tokens is None

    def test_sent_when_set(self, make_port: MakePort) -> None:
        """Set in the settings, every chat request carries it."""
        settings = load_settings(env={"MEMORY_GC_LLM__MAX_COMPLETION_TOKENS": "256"})
        options = llm_options(settings)
        assert options.max_completion_tokens == 256
        port, server = make_port(chat_reply(merge_answer()), max_completion_tokens=256)
        port.merge_group("u1", GROUP)
        assert server.body()["max_completion_tokens"] == 256

    @pytest.mark.parametrize("value", ["0", "-5", "true"])
    def test_not_positive_is_a_config_error(self, value: str) -> None:
        """0, a negative number or a switch is refused, naming the key (exit 2)."""
        env = {"MEMORY_GC_LLM__MAX_COMPLETION_TOKENS": value}
        with pytest.raises(ConfigError, match=r"llm\.max_completion_tokens"):
            load_settings(env=env)
        with pytest.raises(ValueError, match="max_completion_tokens"):
            LLMOptions(max_completion_tokens=0)

    @pytest.mark.parametrize("limit", [None, 32], ids=["unset", "set"])
    def test_an_answer_cut_off_is_not_trusted(self, make_port: MakePort, limit) -> None:
        """finish_reason "length" is an invalid answer even when the text cut off happens to be
        a complete, schema-valid decision: deferred, never parsed as a partial one."""
        port, _ = make_port(
            chat_reply(merge_answer(), finish_reason="length"), max_completion_tokens=limit
        )
        with pytest.raises(LLMInvalidAnswer) as caught:
            port.merge_group("u1", GROUP)
        assert caught.value.reason == "truncated"
        assert port.usage()["invalid_answers"] == 1 and port.usage()["output_tokens"] == 20

    def test_a_cut_off_answer_defers_in_a_run(self, engine, settings, make_llm) -> None:
        """In a run, a merge answer cut off by the length limit changes nothing."""
        seed_tea(engine)
        server = FakeOpenAI(
            merge=lambda p, r: chat_reply(
                {"is_duplicate_set": True, "member_ids": [m["id"] for m in p],
                 "merged_text": "Likes green tea", "reason": None}, finish_reason="length")
        )  # fmt: skip
        report = run(engine, settings, jobs=["compaction"], llm=make_llm(server))
        assert report["totals"]["actions"] == 0
        assert report["llm"]["invalid_answers"] == 1
