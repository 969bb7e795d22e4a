"""user_cap in summarize mode for a user far over the cap: a summary folds at most
``max_summary_rows`` rows, so the overflow is summarised in bounded chunks instead of one
request no model can answer (docs/importance-and-caps.md, "Far over the cap"). These tests
make one chunk a run (``max_summaries_per_user = 1``); several a run:
tests/test_user_cap_many_chunks.py. The LLM is faked at the HTTP boundary only."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx2

from gc_worker.config import Settings
from tests.store import NOW, add, days_ago, execute, run
from tests.test_llm_port import chat_reply, data_block, embeddings_reply, error_reply
from tests.test_user_cap_summarize import cap_settings, make_llm

__all__ = ["make_llm"]  # (a fixture)

LIMIT = 20  # memories the fake model can read in one request


def small_context_model(request: httpx2.Request) -> httpx2.Response:
    """Refuses (400, context too long) a summary of more than LIMIT memories; otherwise
    summarises by joining the texts (every fact kept)."""
    body = json.loads(request.content)
    if request.url.path.endswith("/embeddings"):
        return embeddings_reply([[0.5] * 4 + [0.0] * 4 for _ in body["input"]])
    items = data_block(body["messages"][1]["content"])
    if len(items) > LIMIT:
        return error_reply(400)
    return chat_reply({"summary": "; ".join(item["content"] for item in items)})


def seed_many(engine, count: int, user: str = "u1") -> None:
    letters = "abcdefghijklmnopqrstuvwxyz"
    for i in range(count):  # no numbers: the joined texts restate each row as it stands
        name = letters[i // 26] + letters[i % 26]
        add(engine, user, f"memory {name}", created_at=days_ago(200 - i))


def active(engine, user: str = "u1") -> int:
    sql = "SELECT count(*) FROM active_memories WHERE user_id = :u"
    return execute(engine, sql, u=user).scalar_one()


def chunked(cap: int, **options) -> Settings:
    return cap_settings(cap, max_summary_rows=LIMIT, **options)


class TestFarOverTheCap:
    def test_the_overflow_is_summarised_in_chunks_over_successive_runs(self, engine, make_llm):
        """40 over a cap of 10, without fallback: each run folds 20 rows into one summary (one
        request the model can read), 19 fewer rows a run, until the user is at the cap; no
        row is evicted unsummarised."""
        seed_many(engine, 50)
        settings = chunked(10, max_summary_depth=3, max_summaries_per_user=1)
        replies = [small_context_model] * 6
        llm, server = make_llm(settings, *replies)
        counts = []
        for night in range(3):
            run(engine, settings, jobs=["user_cap"], llm=llm, now=NOW + timedelta(days=night))
            counts.append(active(engine))
        assert counts == [31, 12, 10]
        assert len(server.requests) == 6  # a summary and its embedding per run
        plain = "SELECT count(*) FROM memories WHERE status_reason = 'over_cap'"
        assert execute(engine, plain).scalar_one() == 0

    def test_a_chunk_summary_is_not_evicted_while_less_valuable_rows_wait(self, engine, make_llm):
        """Each chunk is the most valuable of the rows to fold, so its summary ranks after
        the rows still waiting. The next run (at the default depth limit of 1) takes the
        waiting rows and one more: that one, the first summary, is not evicted plainly while
        less valuable rows stay."""
        seed_many(engine, 50)
        settings = chunked(10, max_summaries_per_user=1)
        llm, _ = make_llm(settings, *[small_context_model] * 4)
        for night in range(2):
            run(engine, settings, jobs=["user_cap"], llm=llm, now=NOW + timedelta(days=night))
        sql = (
            "SELECT count(*) FROM active_memories WHERE user_id = 'u1' AND memory_type = 'summary'"
        )
        assert (active(engine), execute(engine, sql).scalar_one()) == (12, 2)
        plain = "SELECT count(*) FROM memories WHERE status_reason = 'over_cap'"
        assert execute(engine, plain).scalar_one() == 0

    def test_with_fallback_the_rest_is_evicted_in_the_same_run(self, engine, make_llm):
        """With fallback_to_evict the user is at the cap after one run: the 20 most valuable
        rows of the overflow fold, the others are evicted plainly (not_folded =
        summary_rows)."""
        seed_many(engine, 50)
        settings = chunked(10, fallback_to_evict=True, max_summaries_per_user=1)
        llm, _ = make_llm(settings, *[small_context_model] * 2)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert active(engine) == 10
        plain = [a for a in report["actions"] if a["reason"] == "over_cap"]
        assert len(plain) == 21
        assert {a["details"]["not_folded"] for a in plain} == {"summary_rows"}

    def test_just_inside_the_limit_is_one_summary(self, engine, make_llm):
        """19 over the cap: 20 rows fold, exactly the limit, into one summary at the cap."""
        seed_many(engine, 29)
        settings = chunked(10)
        llm, server = make_llm(settings, *[small_context_model] * 2)
        run(engine, settings, jobs=["user_cap"], llm=llm)
        assert active(engine) == 10 and len(server.requests) == 2
