"""user_cap in summarize mode when the model cannot fold one row: a chunk whose summary is
rejected (malformed, or dropping a folded row's facts) is asked again in halves, the parts
that pass are folded, the rows no part could fold are set aside (llm_invalid) and the user's
other rows folded in their place (docs/importance-and-caps.md, "A row the model cannot
fold"). The LLM is faked at the HTTP boundary."""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import UUID

import httpx2
from structlog.testing import capture_logs

from gc_worker import engine as gc_engine
from tests.store import NOW, add, days_ago, execute, get, run, snapshot
from tests.test_llm_port import chat_reply, data_block, embeddings_reply, error_reply
from tests.test_user_cap_chunks import active
from tests.test_user_cap_many_chunks import deferred, plain, settings_for, summaries
from tests.test_user_cap_summarize import make_llm

__all__ = ["make_llm"]  # (a fixture)

BAD = "Owes Bob 500 EUR"  # a row whose facts the fake model always drops


def dropping_model(request: httpx2.Request) -> httpx2.Response:
    """Summarises by joining the texts, but leaves out BAD (its number and name): every
    summary of a part holding BAD is rejected by the checks."""
    body = json.loads(request.content)
    if request.url.path.endswith("/embeddings"):
        return embeddings_reply([[0.5] * 4 + [0.0] * 4 for _ in body["input"]])
    items = data_block(body["messages"][1]["content"])
    return chat_reply({"summary": "; ".join(i["content"] for i in items if i["content"] != BAD)})


def garbling_model(request: httpx2.Request) -> httpx2.Response:
    """Never a valid answer: text that is not JSON."""
    return chat_reply("Sure! Here is the summary: {not json")


def seed_with_bad_row(engine, count: int, bad_at: int | None, user: str = "u1") -> list[UUID]:
    """``count`` rows, the oldest least valuable; the one at ``bad_at`` is BAD."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        add(engine, user, BAD if i == bad_at else f"memory {letters[i // 26]}{letters[i % 26]}",
            created_at=days_ago(200 - i))
        for i in range(count)
    ]  # fmt: skip


def asked(server) -> list[int]:
    """The number of memories in each summary request, in order."""
    return [
        len(data_block(json.loads(r.content)["messages"][1]["content"]))
        for r in server.requests
        if not r.url.path.endswith("/embeddings")
    ]


class TestARowTheModelCannotFold:
    def test_the_user_reaches_the_cap_and_stays_there(self, engine, make_llm):
        """40 over a cap of 10, BAD in the most valuable chunk (15 rows): that chunk is asked
        in halves, depth first, the more valuable first (15, 8, 4, 2 of them rejected: 4
        rejections; 4, 2 and 7 folded); the other two chunks are folded; the two rows no part
        could fold are set aside and one more chunk of the user's rows is folded in their
        place: the user is at the cap in one run, nothing evicted unsummarised, and the next
        runs ask nothing."""
        rows = seed_with_bad_row(engine, 50, bad_at=35)
        settings = settings_for(10)
        llm, server = make_llm(settings, *[dropping_model] * 40)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert asked(server) == [15, 8, 4, 4, 2, 2, 7, 14, 14, 5]
        assert active(engine) == 10 and plain(engine) == 0
        [aside] = deferred(report)
        assert (aside["reason"], aside["details"]["over_cap_by"]) == ("llm_invalid", 0)
        assert sorted(aside["details"]["memory_ids"]) == sorted(str(r) for r in rows[35:37])
        assert get(engine, rows[35])["status"] == "active"
        assert report["jobs"]["user_cap"]["errors"] == 4
        assert report["jobs"]["user_cap"]["by_action"]["create_merged"] == 6
        requests = len(server.requests)
        for night in (1, 2):
            run(engine, settings, jobs=["user_cap"], llm=llm, now=NOW + timedelta(days=night))
        assert active(engine) == 10 and len(server.requests) == requests

    def test_two_chunks_a_night_reach_the_cap_over_two_nights(self, engine, make_llm):
        """max_summaries_per_user = 2, BAD in the most valuable chunk: the first night folds
        the good parts and chunk (rows wait: llm_invalid, summary_rows), the second reaches
        the cap around the rows set aside; nothing evicted unsummarised, nothing asked after."""
        rows = seed_with_bad_row(engine, 50, bad_at=35)
        settings = settings_for(10, max_summaries_per_user=2, max_summary_depth=3)
        llm, server = make_llm(settings, *[dropping_model] * 60)
        counts = []
        for night in range(4):
            run(engine, settings, jobs=["user_cap"], llm=llm, now=NOW + timedelta(days=night))
            counts.append((active(engine), len(server.requests)))
        assert [n for n, _ in counts] == [17, 10, 10, 10]
        assert counts[1][1] == counts[3][1]
        assert plain(engine) == 0 and get(engine, rows[35])["status"] == "active"

    def test_a_dry_run_with_parts_applies_exactly_without_a_call(self, engine, make_llm):
        """The parts' summaries are planned like chunks: apply creates them, asks nothing."""
        seed_with_bad_row(engine, 50, bad_at=35)
        settings = settings_for(10)
        llm, server = make_llm(settings, *[dropping_model] * 40)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        requests = len(server.requests)
        gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert len(server.requests) == requests and active(engine) == 10
        planned = {a["memory_id"] for a in plan["actions"] if a["action"] == "create_merged"}
        assert {str(s["id"]) for s in summaries(engine)} == planned


class TestIsolationIsBounded:
    def test_a_model_that_never_answers_validly_costs_one_isolation(self, engine, make_llm):
        """Every answer malformed: the first user's chunk of 20 costs 1 + 2 * ceil(log2 20) =
        11 requests (no half answered), then isolation is off for the batch: the second user's
        chunk is asked once; both wait whole (llm_invalid), nothing changes."""
        seed_with_bad_row(engine, 29, bad_at=None, user="u1")
        seed_with_bad_row(engine, 29, bad_at=None, user="u2")
        settings = settings_for(10)
        llm, server = make_llm(settings, *[garbling_model] * 40)
        with capture_logs() as logs:
            report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert asked(server) == [20, 10, 5, 3, 2, 2, 5, 3, 2, 2, 10, 20]
        waits = {(a["user_id"], a["reason"], len(a["details"]["memory_ids"]))
                 for a in deferred(report)}  # fmt: skip
        assert waits == {("u1", "llm_invalid", 20), ("u2", "llm_invalid", 20)}
        assert active(engine) == 29 and active(engine, "u2") == 29
        [off] = [e for e in logs if e["event"] == "user_cap.isolation_off"]
        assert (off["user_id"], off["calls"]) == ("u1", 11)

    def test_rejected_two_row_chunks_in_a_row_turn_isolation_off(self, engine, make_llm):
        """Chunks too small to halve, each rejected: after three in a row (no valid answer
        between) no rows are set aside for another round; four users one over the cap cost
        four requests, not one per round of each."""
        for user in ("u1", "u2", "u3", "u4"):
            seed_with_bad_row(engine, 11, bad_at=None, user=user)
        settings = settings_for(10)
        llm, server = make_llm(settings, *[garbling_model] * 40)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert asked(server) == [2] * (3 + 3)  # u1: three rounds; u2 .. u4: one chunk each
        assert {a["reason"] for a in deferred(report)} == {"llm_invalid"}
        assert sum(active(engine, u) for u in ("u1", "u2", "u3", "u4")) == 44

    def test_a_model_that_never_answers_validly_evicts_nothing(self, engine, make_llm):
        """Two-row chunks, every answer malformed: the rows set aside and those asked in their
        place are all rejected, nothing is folded, so the slot's value among the taken rows is
        not evicted either: the store is as an offline run leaves it."""
        add(engine, "u1", "memory aa", importance=1, created_at=days_ago(90))
        add(engine, "u1", "memory ab", importance=1, created_at=days_ago(89), slot="profile.x")
        add(engine, "u1", "memory ac", importance=1, created_at=days_ago(88))
        for name in ("ad", "ae"):
            add(engine, "u1", f"memory {name}", importance=5, created_at=days_ago(80))
        before = snapshot(engine)
        settings = settings_for(3)
        llm, server = make_llm(settings, *[garbling_model] * 10)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert asked(server) == [2, 2]
        assert snapshot(engine) == before
        assert {a["reason"] for a in deferred(report)} == {"llm_invalid"}


class TestStoppedWhileIsolating:
    def test_a_spent_budget_mid_isolation_stops_cleanly(self, engine, make_llm):
        """A budget of four requests: the chunk (rejected), its more valuable half (rejected),
        that half's more valuable half (folded) and its embedding; the rest of the chunk and
        the later chunks wait (llm_budget), all ranked before the summary made; the next
        over-cap user is not asked."""
        rows = seed_with_bad_row(engine, 50, bad_at=35)
        seed_with_bad_row(engine, 12, bad_at=None, user="u2")
        settings = settings_for(10, max_calls=4)
        llm, server = make_llm(settings, *[dropping_model] * 40)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert asked(server) == [15, 8, 4] and len(server.requests) == 4
        [made] = summaries(engine)
        folded = {UUID(s) for a in report["actions"] if a["action"] == "create_merged"
                  for s in a["details"]["sources"]}  # fmt: skip
        assert folded == set(rows[39:43])
        waits = {a["user_id"]: a for a in deferred(report)}
        assert {a["reason"] for a in waits.values()} == {"llm_budget"}
        assert sorted(waits["u1"]["details"]["memory_ids"]) == sorted(str(r) for r in rows[:39])
        assert waits["u1"]["details"]["over_cap_by"] == 40 - 3
        assert active(engine) == 50 - 4 + 1 and active(engine, "u2") == 12
        assert plain(engine) == 0 and made["status"] == "active"

    def test_an_unavailable_server_mid_isolation_stops_everything(self, engine, make_llm):
        """The chunk is rejected, its first half's request fails (500): nothing is folded, the
        user's rows wait (llm_unavailable) and the next over-cap user is not asked."""
        seed_with_bad_row(engine, 50, bad_at=35)
        seed_with_bad_row(engine, 12, bad_at=None, user="u2")
        settings = settings_for(10)
        llm, server = make_llm(settings, dropping_model, error_reply(500))
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert len(server.requests) == 2 and summaries(engine) == []
        waits = {(a["user_id"], a["reason"]) for a in deferred(report)}
        assert waits == {("u1", "llm_unavailable"), ("u2", "llm_unavailable")}
        [u1] = [a for a in deferred(report) if a["user_id"] == "u1"]
        assert len(u1["details"]["memory_ids"]) == 43 and u1["details"]["over_cap_by"] == 40

    def test_a_refused_part_ends_the_user_not_the_batch(self, engine, make_llm):
        """A part refused for its content (400) ends that user's questions like a refused
        chunk (llm_unavailable); the next user is asked and folded."""
        seed_with_bad_row(engine, 50, bad_at=35)
        seed_with_bad_row(engine, 12, bad_at=None, user="u2")
        settings = settings_for(10)
        llm, server = make_llm(settings, dropping_model, error_reply(400), *[dropping_model] * 2)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert len(server.requests) == 4
        assert {(a["user_id"], a["reason"]) for a in deferred(report)} == {
            ("u1", "llm_unavailable")
        }
        assert active(engine, "u2") == 10
        sql = "SELECT count(*) FROM memories WHERE user_id = 'u1' AND status = 'active'"
        assert execute(engine, sql).scalar_one() == 50
