"""A model that is down for the whole run. Each batch used to pay one full failed call per job
(the timeout × the attempts, plus the backoff) before deferring the rest of its questions: at the
defaults some two minutes a batch, hours for a store of 10,000 users, days for a million. Now,
after a call the model did not answer, no call is made for `llm.outage_pause_seconds`: the
questions meanwhile are deferred at once (nothing is guessed), and the model is asked again
once the pause is over."""

from __future__ import annotations

from uuid import uuid4

import httpx2
import pytest

from gc_worker.llm import LLMUnavailable
from gc_worker.llm.decisions import Member
from gc_worker.llm.outage import Outage
from tests.store import add, days_ago, run
from tests.test_compaction import E0, at_similarity
from tests.test_llm_jobs_http import FakeOpenAI, fixed, merge_all

MEMBERS: list[Member] = [
    (str(uuid4()), "Likes green tea"),
    (str(uuid4()), "Enjoys drinking green tea"),
]


def down(status: int) -> FakeOpenAI:
    reply = httpx2.Response(status, json={"error": {"message": "down"}})
    return FakeOpenAI(merge=fixed(reply))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def paused_port(make_llm, server: FakeOpenAI, clock: Clock, pause: float = 300.0):
    port = make_llm(server, max_retries=0, outage_pause_seconds=pause)
    port._outage = Outage(pause, clock)  # the port's own, on a clock the test turns
    return port


class TestThePause:
    def test_no_call_while_the_pause_runs_then_one_again(self, make_llm):
        clock, server = Clock(), down(503)
        port = paused_port(make_llm, server, clock)
        with pytest.raises(LLMUnavailable):
            port.merge_group("u1", MEMBERS)
        with pytest.raises(LLMUnavailable, match=r"llm\.outage_pause_seconds"):
            port.merge_group("u1", MEMBERS)  # at once, no request
        assert len(server.requests) == 1
        clock.now += 299  # just inside the pause
        with pytest.raises(LLMUnavailable, match=r"llm\.outage_pause_seconds"):
            port.merge_group("u1", MEMBERS)
        assert len(server.requests) == 1
        clock.now += 2  # just past it
        server.handlers["MergeAnswer"] = merge_all  # it is back
        assert port.merge_group("u1", MEMBERS).is_duplicate_set
        assert port.merge_group("u2", MEMBERS).is_duplicate_set
        assert len(server.requests) == 3

    def test_a_request_refused_for_its_content_does_not_pause(self, make_llm):
        """A 400 says the server is up: the next question is asked."""
        clock, server = Clock(), down(400)
        port = paused_port(make_llm, server, clock)
        for _ in range(2):
            with pytest.raises(LLMUnavailable):
                port.merge_group("u1", MEMBERS)
        assert len(server.requests) == 2

    def test_a_pause_of_zero_asks_every_time(self, make_llm):
        clock, server = Clock(), down(503)
        port = paused_port(make_llm, server, clock, pause=0)
        for _ in range(3):
            with pytest.raises(LLMUnavailable):
                port.merge_group("u1", MEMBERS)
        assert len(server.requests) == 3


def seed_pairs(engine, users: int) -> None:
    for i in range(users):
        add(engine, f"u{i}", "Likes green tea", created_at=days_ago(9), embedding=E0)
        add(engine, f"u{i}", "Enjoys drinking green tea", created_at=days_ago(2),
            embedding=at_similarity(0.95))  # fmt: skip


@pytest.mark.parametrize(("pause", "asked"), [(300.0, 1), (0.0, 6)])
def test_a_run_against_a_model_that_is_down_asks_once(engine, settings, make_llm, pause, asked):
    """Six users, a batch each, the model down: one request for the whole run (it was one per
    batch); every group is deferred as unavailable, nothing changes."""
    seed_pairs(engine, 6)
    settings = settings.model_copy(
        update={"run": settings.run.model_copy(update={"batch_users": 1, "workers": 1})}
    )
    server = down(503)
    llm = make_llm(server, max_retries=0, outage_pause_seconds=pause)
    report = run(engine, settings, jobs=["compaction"], llm=llm)
    assert len(server.requests) == asked
    deferred = [a for a in report["actions"] if a["action"] == "deferred"]
    assert len(deferred) == 6 and {a["reason"] for a in deferred} == {"llm_unavailable"}
    assert report["totals"]["by_action"].get("merge", 0) == 0


def test_embeddings_that_fail_pause_no_decision(engine, settings, make_llm):
    """A server that answers chat but not embeddings (its embeddings model missing: 404): each
    merged record takes its members' centroid, as before the pause. The embeddings call's
    failure paused every later merge question too, so after the first batch's merge the other
    users' groups were deferred for the whole pause."""
    seed_pairs(engine, 3)
    settings = settings.model_copy(
        update={"run": settings.run.model_copy(update={"batch_users": 1, "workers": 1})}
    )
    missing = httpx2.Response(404, json={"error": {"message": "no such model"}})
    server = FakeOpenAI(embed=lambda body, request: missing)
    report = run(engine, settings, jobs=["compaction"], llm=make_llm(server, max_retries=0))
    assert report["totals"]["by_action"].get("create_merged", 0) == 3
    assert server.count("/chat/completions") == 3
    assert server.count("/embeddings") == 1  # paused after it: the centroid meanwhile
