"""user_cap with overflow = "summarize": the evicted rows are folded into one summary record,
through the real engine and database; the LLM is faked only at the HTTP boundary."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import httpx2
import pytest

import jobs.user_cap as user_cap
from gc_worker import engine as gc_engine
from gc_worker import erasure
from gc_worker.batch import BatchContext
from gc_worker.config import Runtime, Settings
from gc_worker.db import transaction
from gc_worker.llm import LLMPort
from gc_worker.llm_store import open_run_llm
from gc_worker.report import build_report
from gc_worker.restore import restore_memory, restore_run
from jobs.user_cap import split_overflow, summary_depth
from tests.store import NOW, add, days_ago, execute, get, run, snapshot
from tests.test_llm_port import FakeServer, Reply, chat_reply, data_block, embeddings_reply

BASE_URL = "http://llm.test/v1"
SUMMARY = "Memories a, b and c."  # in the folded rows' words (seed): the check reads them
VECTOR = [0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
MakeLLM = Callable[..., tuple[LLMPort, FakeServer]]


def cap_settings(cap: int, **options: Any) -> Settings:
    user_cap = {"max_memories": cap, "overflow": "summarize", **options}
    return Settings.model_validate(
        {"embeddings": {"dim": 8}, "llm": {"max_retries": 0}, "user_cap": user_cap}
    )


def summary_replies(text: str = SUMMARY) -> list[Reply]:
    return [chat_reply({"summary": text}), embeddings_reply([VECTOR])]


@pytest.fixture
def make_llm(engine, tmp_path: Path) -> Iterator[MakeLLM]:
    ports: list[LLMPort] = []

    def make(settings: Settings, *replies: Reply) -> tuple[LLMPort, FakeServer]:
        server = FakeServer(list(replies))
        runtime = Runtime(data_dir=tmp_path, openai_api_key="test", openai_base_url=BASE_URL)
        http_client = httpx2.Client(transport=httpx2.MockTransport(server))
        port = open_run_llm(settings, runtime, engine, http_client=http_client)
        assert port is not None
        ports.append(port)
        return port, server

    yield make
    for port in ports:
        port.close()


def seed(engine, *importances: int, user: str = "u1", **columns: Any) -> list[UUID]:
    """One row per importance, the first one oldest (so it is evicted first among equals);
    texts without numbers or names whose only content word is "memory", so SUMMARY may stand
    for any of them."""
    return [
        add(engine, user, f"memory {'abcdefghij'[i]}", importance=imp, created_at=days_ago(50 - i),
            **columns)
        for i, imp in enumerate(importances)
    ]  # fmt: skip


def active_count(engine, user: str = "u1") -> int:
    sql = "SELECT count(*) FROM active_memories WHERE user_id = :u"
    return execute(engine, sql, u=user).scalar_one()


def summaries(engine, user: str = "u1") -> list[dict[str, Any]]:
    sql = "SELECT id FROM memories WHERE user_id = :u AND memory_type = 'summary' ORDER BY id"
    return [get(engine, row.id) for row in execute(engine, sql, u=user)]


def lineage(engine, derived: UUID) -> set[UUID]:
    sql = "SELECT source_id FROM memory_lineage WHERE derived_id = :d"
    return set(execute(engine, sql, d=derived).scalars())


def vector(row: dict[str, Any]) -> list[float] | None:
    value = row["embedding"]
    return None if value is None else [float(x) for x in json.loads(str(value))]


def by_kind(report: dict[str, Any]) -> dict[str, int]:
    return report["jobs"]["user_cap"]["by_action"]


class TestSummarisedOverflow:
    def test_overflow_is_folded_into_one_summary_with_lineage(self, engine, make_llm) -> None:
        """Two over a cap of 3: the three least valuable rows become one summary, with lineage
        (their scores assessed: so is the summary's; tests/test_user_cap_edges.py)."""
        low, mid1, mid2, high1, high2 = seed(engine, 1, 2, 2, 4, 5, importance_assessed_at=NOW)
        settings = cap_settings(3)
        llm, server = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert summary["content"] == SUMMARY
        assert (summary["memory_type"], summary["source"], summary["status"]) == (
            "summary",
            "gc_merge",
            "active",
        )
        assert (summary["importance"], summary["importance_assessed_at"]) == (2, NOW)
        assert summary["metadata"] == {
            "summary_depth": 1,
            "summarized_count": 3,
            "embedding_source": "embeddings_model",
            "trust_source": "explicit_user_statement",  # the least trusted folded row's
        }
        assert vector(summary) == VECTOR
        assert lineage(engine, summary["id"]) == {low, mid1, mid2}
        for folded in (low, mid1, mid2):
            row = get(engine, folded)
            assert (row["status"], row["status_reason"]) == ("deleted", "over_cap_summarized")
            assert row["superseded_by"] == summary["id"]
        assert active_count(engine) == 3
        assert {get(engine, m)["status"] for m in (high1, high2)} == {"active"}
        sent = [m["content"] for m in data_block(server.body(0)["messages"][1]["content"])]
        assert sorted(sent) == ["memory a", "memory b", "memory c"]
        assert by_kind(report) == {"create_merged": 1, "soft_delete": 3}
        assert report["jobs"]["user_cap"]["llm_calls"] == 2

    def test_at_the_cap_nothing_happens(self, engine, make_llm) -> None:
        """Exactly max_memories active rows: no call, no action."""
        seed(engine, 1, 2, 3)
        settings = cap_settings(3)
        llm, server = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert server.requests == []
        assert report["actions"] == []

    def test_one_over_the_cap_folds_two_rows(self, engine, make_llm) -> None:
        """One over: two rows fold into one summary, which leaves the user exactly at the cap."""
        low, mid, _, _ = seed(engine, 1, 2, 3, 4)
        settings = cap_settings(3)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert lineage(engine, summary["id"]) == {low, mid}
        assert active_count(engine) == 3

    def test_pinned_rows_are_never_folded(self, engine, make_llm) -> None:
        """Pinned rows count towards the cap but are never folded, however unimportant."""
        pinned = seed(engine, 1, 1, pinned=True)
        low, mid, high = seed(engine, 2, 3, 5, user="u1")
        settings = cap_settings(4)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert lineage(engine, summary["id"]) == {low, mid}
        assert {get(engine, m)["status"] for m in (*pinned, high)} == {"active"}
        assert active_count(engine) == 4

    def test_each_over_cap_user_gets_own_summary(self, engine, make_llm) -> None:
        """Two over-cap users: two summaries, each only of its user's rows."""
        first = seed(engine, 1, 2, 3, user="a")
        second = seed(engine, 1, 2, 3, user="b")
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies("Memories a, b."),
                          *summary_replies("Memories a and b."))  # fmt: skip
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [sa], [sb] = summaries(engine, "a"), summaries(engine, "b")
        assert (lineage(engine, sa["id"]), lineage(engine, sb["id"])) == (
            set(first[:2]),
            set(second[:2]),
        )


class TestSummaryEmbedding:
    def test_failed_embedding_falls_back_to_the_centroid(self, engine, make_llm) -> None:
        """When the embeddings call fails, the summary gets the normalised members' centroid."""
        e1, e2 = [1.0] + [0.0] * 7, [0.0, 1.0] + [0.0] * 6
        add(engine, "u1", "memory a", importance=1, embedding=e1, created_at=days_ago(3))
        add(engine, "u1", "memory b", importance=1, embedding=e2, created_at=days_ago(2))
        add(engine, "u1", "memory c", importance=5)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, chat_reply({"summary": SUMMARY}), httpx2.Response(400))
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        half = 1 / math.sqrt(2)
        assert vector(summary) == pytest.approx([half, half, 0, 0, 0, 0, 0, 0], abs=1e-6)
        assert summary["metadata"]["embedding_source"] == "centroid"

    def test_no_embedding_anywhere_leaves_it_null(self, engine, make_llm) -> None:
        """Unembedded members and a failed embeddings call: embedding null, flagged 'none'."""
        seed(engine, 1, 1, 5)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, chat_reply({"summary": SUMMARY}), httpx2.Response(400))
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert summary["embedding"] is None
        assert summary["metadata"]["embedding_source"] == "none"


class TestRestoreAndReplay:
    def test_restore_brings_folded_rows_back_and_retires_the_summary(
        self, engine, make_llm
    ) -> None:
        """Restoring the run re-activates every folded row and takes the summary off reads."""
        rows = seed(engine, 1, 2, 2, 4, 5)
        before = snapshot(engine)
        settings = cap_settings(3)
        llm, _ = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        restore_run(engine, UUID(report["run_id"]))
        after = snapshot(engine)
        assert {m: after[m] for m in rows} == {m: before[m] for m in rows}
        retired = get(engine, summary["id"])
        assert (retired["status"], retired["status_reason"]) == ("deleted", "restored")
        sql = "SELECT count(*) FROM active_memories WHERE id = :id"
        assert execute(engine, sql, id=summary["id"]).scalar_one() == 0
        assert active_count(engine) == 5

    def test_restore_of_the_summary_undoes_the_whole_fold(self, engine, make_llm) -> None:
        """Restoring the summary memory re-activates every row it folded."""
        low, mid, _ = seed(engine, 1, 2, 5)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        restore_memory(engine, summary["id"])
        assert {get(engine, m)["status"] for m in (low, mid)} == {"active"}
        assert get(engine, summary["id"])["status"] == "deleted"

    def test_restore_of_the_summary_keeps_the_folded_rows_scores(self, engine, make_llm):
        """The same run scored the rows (importance) and folded three of them: restoring the
        summary undoes the fold, not the scores — found by a review, it reset them and filed a
        dismissal, so those rows were never scored again though no one overruled the model."""
        low, mid1, mid2, _, _ = seed(engine, 1, 2, 2, 4, 5)
        settings = cap_settings(3)
        two = chat_reply({"scores": [{"index": i, "score": 2} for i in range(5)]})
        llm, _ = make_llm(settings, two, *summary_replies())
        run(engine, settings, jobs=["importance", "user_cap"], llm=llm)
        [summary] = summaries(engine)
        restore_memory(engine, summary["id"], now=NOW + timedelta(hours=1))
        assert get(engine, summary["id"])["status"] == "deleted"
        for folded in (low, mid1, mid2):
            row = get(engine, folded)
            assert (row["status"], row["importance"], row["importance_assessed_at"]) == (
                "active", 2, NOW)  # fmt: skip
        assert execute(engine, "SELECT count(*) FROM gc_review_items").scalar_one() == 0

    def test_a_summary_the_user_edited_keeps_its_folded_rows_folded(self, engine, make_llm) -> None:
        """The application edited the summary after the run: restore leaves it on the read path
        (it is the user's text now) and the rows it folded stay deleted, not back beside it;
        the evictions outside the fold are still undone."""
        seed(engine, 1, 2, 2, 4, 5)
        settings = cap_settings(3)
        llm, _ = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        deletes = [a for a in report["actions"] if a["action"] == "soft_delete"]
        folded = {UUID(a["memory_id"]) for a in deletes if a["reason"] == "over_cap_summarized"}
        evicted = {UUID(a["memory_id"]) for a in deletes if a["reason"] == "over_cap"}
        assert folded
        execute(engine, "UPDATE memories SET content = 'Edited by the user', updated_at = :t"
                        " WHERE id = :id", t=NOW + timedelta(days=1), id=summary["id"])  # fmt: skip
        result = restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(days=2))
        assert get(engine, summary["id"])["status"] == "active"
        assert {get(engine, m)["status"] for m in folded} == {"deleted"}
        assert set(result.not_restorable) == {summary["id"], *folded}
        assert {get(engine, m)["status"] for m in evicted} <= {"active"}

    def test_a_drifted_folded_row_cancels_the_whole_fold(self, engine, make_llm) -> None:
        """A folded row changed between plan and apply: no summary, no row retired."""
        low, mid, _ = seed(engine, 1, 2, 5)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies())
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        execute(engine, "UPDATE memories SET access_count = 1 WHERE id = :id", id=mid)
        applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        assert summaries(engine) == []
        assert {get(engine, m)["status"] for m in (low, mid)} == {"active"}
        with engine.connect() as conn:
            report = build_report(conn, applied)
        assert report["actions"] == []
        assert len(report["drifted"]) == 3

    def test_apply_of_a_dry_run_makes_no_call(self, engine, make_llm) -> None:
        """The dry run summarises; applying its plan creates that summary without any call."""
        seed(engine, 1, 2, 5)
        settings = cap_settings(2)
        llm, server = make_llm(settings, *summary_replies())
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        assert summaries(engine) == []
        gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert len(server.requests) == 2
        planned = next(a for a in plan["actions"] if a["action"] == "create_merged")
        [summary] = summaries(engine)
        assert str(summary["id"]) == planned["memory_id"]
        assert vector(summary) == VECTOR


class TestWithoutSummary:
    @pytest.mark.parametrize(
        ("reply", "reason"),
        [(chat_reply({"summary": "  "}), "llm_invalid"), (httpx2.Response(500), "llm_unavailable")],
    )
    def test_failure_leaves_the_user_over_the_cap_and_reports_it(
        self, engine, make_llm, reply: httpx2.Response, reason: str
    ) -> None:
        """Without fallback_to_evict nothing changes; the would-be-folded rows are deferred."""
        rows = seed(engine, 1, 2, 5)
        before = snapshot(engine)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, reply)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert snapshot(engine) == before
        [action] = report["actions"]
        assert (action["action"], action["reason"]) == ("deferred", reason)
        assert sorted(action["details"]["memory_ids"]) == sorted(str(m) for m in rows[:2])
        assert action["details"]["over_cap_by"] == 1
        assert report["jobs"]["user_cap"]["errors"] == 1

    def test_a_summary_that_loses_a_stated_fact_is_rejected(self, engine, make_llm) -> None:
        """Once the folded rows are purged the summary is all that stays: one that drops a
        number, a name or a negation they state ("User has preferences." for "Owes Bob 500
        EUR" and "Does not eat pork") is rejected like a malformed answer; nothing changes."""
        add(engine, "u1", "Owes Bob 500 EUR", importance=1, created_at=days_ago(40))
        add(engine, "u1", "Does not eat pork", importance=2, created_at=days_ago(30))
        add(engine, "u1", "memory kept", importance=5, created_at=days_ago(20))
        before = snapshot(engine)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, chat_reply({"summary": "User has preferences."}))
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert snapshot(engine) == before
        assert [(a["action"], a["reason"]) for a in report["actions"]] == [
            ("deferred", "llm_invalid")
        ]
        assert report["jobs"]["user_cap"]["errors"] == 1
        assert report["llm"]["invalid_answers"] == 1

    def test_failure_with_fallback_evicts_plainly(self, engine, make_llm) -> None:
        """With fallback_to_evict, an invalid summary means plain eviction, reason over_cap."""
        low, _, _ = seed(engine, 1, 2, 5)
        settings = cap_settings(2, fallback_to_evict=True)
        llm, _ = make_llm(settings, chat_reply({"summary": ""}))
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        [action] = report["actions"]
        assert (action["memory_id"], action["reason"]) == (str(low), "over_cap")
        assert action["details"]["fallback"] == "llm_invalid"
        assert summaries(engine) == []
        assert active_count(engine) == 2

    @pytest.mark.parametrize(("fallback", "expected"), [(False, "deferred"), (True, "soft_delete")])
    def test_offline(self, engine, fallback: bool, expected: str) -> None:
        """Offline: deferred (llm_unavailable) unless fallback_to_evict, then plain eviction."""
        seed(engine, 1, 2, 5)
        report = run(engine, cap_settings(2, fallback_to_evict=fallback), jobs=["user_cap"])
        assert [a["action"] for a in report["actions"]] == [expected]
        assert report["actions"][0]["reason"] == ("over_cap" if fallback else "llm_unavailable")
        assert report["jobs"]["user_cap"]["errors"] == 0

    def test_room_for_the_summary_just_inside(self, engine, make_llm) -> None:
        """One pinned row, cap 2, two evictable rows: both fold, summary + pinned = cap."""
        seed(engine, 5, pinned=True)
        low, mid = seed(engine, 1, 2)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert lineage(engine, summary["id"]) == {low, mid}
        assert active_count(engine) == 2

    def test_room_for_the_summary_just_outside(self, engine, make_llm) -> None:
        """Two pinned rows, cap 2, one evictable row: no room to fold, it is evicted plainly."""
        seed(engine, 5, 5, pinned=True)
        [low] = seed(engine, 1)
        settings = cap_settings(2)
        llm, server = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert server.requests == []
        assert [(a["memory_id"], a["reason"]) for a in report["actions"]] == [
            (str(low), "over_cap")
        ]


class TestSummaryDepth:
    def old_summary(self, engine, **metadata: Any) -> UUID:
        return add(engine, "u1", "an older summary", importance=1, memory_type="summary",
                   metadata=json.dumps(metadata), created_at=days_ago(60))  # fmt: skip

    def test_summary_at_max_depth_is_evicted_not_refolded(self, engine, make_llm) -> None:
        """A depth-1 summary (max depth 1) among the taken rows is evicted plainly (over_cap)."""
        old = self.old_summary(engine, summary_depth=1)
        low, mid, _, _ = seed(engine, 2, 2, 5, 5)
        settings = cap_settings(3)
        llm, _ = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert (get(engine, old)["status"], get(engine, old)["status_reason"]) == (
            "deleted",
            "over_cap",
        )
        [kept_out] = [a for a in report["actions"] if a["reason"] == "over_cap"]
        assert kept_out["details"]["not_folded"] == "summary_depth"
        [summary] = [s for s in summaries(engine) if s["status"] == "active"]
        assert lineage(engine, summary["id"]) == {low, mid}
        assert active_count(engine) == 3

    def test_summary_below_max_depth_is_refolded_one_level_deeper(self, engine, make_llm):
        """With max depth 2, a depth-1 summary is folded again and the new one has depth 2."""
        old = self.old_summary(engine, summary_depth=1)
        low, mid, _, _ = seed(engine, 2, 2, 5, 5)
        settings = cap_settings(3, max_summary_depth=2)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = [s for s in summaries(engine) if s["status"] == "active"]
        assert lineage(engine, summary["id"]) == {old, low, mid}
        assert summary["metadata"]["summary_depth"] == 2
        assert active_count(engine) == 3


class TestWhatTheReadPathShows:
    """Found by a review: a summary is an open-ended record with no slot, validity or
    declaration, so a folded row whose text the read path (gc_worker.read_rule) does not show
    as is — its validity ended or not begun, hidden by a declaration, a slot's value, one that
    declares what it replaces, or one a review holds — came back (or stayed) current for good
    inside the summary: "in Tokyo until March" folded in June reads "in Tokyo". Such a row is
    evicted plainly, as with overflow = "evict"; the others fold."""

    @staticmethod
    def hidden_by_override(engine, target: UUID) -> None:
        add(engine, "u1", "memory override", importance=5, supersedes=[target],
            valid_until=NOW + timedelta(days=3), created_at=days_ago(1))  # fmt: skip

    @staticmethod
    def under_review(engine, target: UUID) -> None:
        execute(engine, "INSERT INTO gc_review_items (user_id, kind, memory_ids, reason)"
                        " VALUES ('u1', 'contradiction', ARRAY[CAST(:m AS uuid)], 'unsure')",
                m=target)  # fmt: skip

    @pytest.mark.parametrize(
        ("columns", "then", "cap", "why"),
        [
            ({"valid_until": days_ago(5)}, None, 3, "bounded"),  # ended: hidden from reads
            ({"valid_from": NOW + timedelta(days=5)}, None, 3, "not_yet_valid"),
            ({"slot": "profile.city"}, None, 3, "slot"),  # a later value could not replace it
            ({"supersedes": [UUID(int=7)]}, None, 3, "declares_supersedes"),
            ({}, "hidden_by_override", 4, "superseded_by_declaration"),
            ({}, "under_review", 3, "in_review"),  # a conflict a person has yet to judge
            ({"expires_at": days_ago(1)}, None, 3, "expired"),  # TTL passed, not yet retired
        ],
        ids=["ended", "not-begun", "slot", "declares", "shadowed", "in-review", "expired"],
    )
    def test_a_row_the_summary_cannot_carry_is_evicted_not_folded(
        self, engine, make_llm, columns: dict[str, Any], then: str | None, cap: int, why: str
    ) -> None:
        low, mid1, mid2, _, _ = seed(engine, 1, 2, 2, 4, 5)
        execute(engine, "UPDATE memories SET " + ", ".join(f"{k} = :{k}" for k in columns)
                + " WHERE id = :id", id=low, **columns) if columns else None  # fmt: skip
        if then is not None:
            getattr(self, then)(engine, low)
        settings = cap_settings(cap)
        llm, _ = make_llm(settings, *summary_replies())
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert lineage(engine, summary["id"]) == {mid1, mid2}
        evicted = get(engine, low)
        assert (evicted["status"], evicted["status_reason"]) == ("deleted", "over_cap")
        assert active_count(engine) == cap
        assert by_kind(report) == {"create_merged": 1, "soft_delete": 3}
        [kept_out] = [a for a in report["actions"] if a["reason"] == "over_cap"]
        assert kept_out["details"]["not_folded"] == why

    @pytest.mark.parametrize(
        ("ttls", "expected"),
        [
            ((None, None, None), None),
            ((10, None, None), 10),  # found by a review: it never expired
            ((10, 30, None), 10),
            ((30, 10, 20), 10),  # found by a review: it expired at day 30
        ],
    )
    def test_a_folded_fact_never_outlives_its_ttl(self, engine, make_llm, ttls, expected):
        """Found by a review: the summary expired at the latest TTL of the folded rows, or
        never when one of them had none, so a fact the application said to forget at T (a
        session note, a one-off code) stayed on the read path past T inside the summary. It
        now expires at the earliest: the folded rows would otherwise have been evicted now."""
        rows = seed(engine, 1, 2, 2, 4, 5)
        for memory_id, days in zip(rows, ttls, strict=False):
            if days is not None:
                execute(engine, "UPDATE memories SET expires_at = :t WHERE id = :id",
                        t=NOW + timedelta(days=days), id=memory_id)  # fmt: skip
        settings = cap_settings(3)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert lineage(engine, summary["id"]) == set(rows[:3])
        want = None if expected is None else NOW + timedelta(days=expected)
        assert summary["expires_at"] == want

    @pytest.mark.parametrize("held", [False, True])
    def test_a_conflict_left_open_earlier_in_the_batch_is_not_folded(self, engine, held):
        """A pair the contradiction job left open in this batch (BatchContext.held) is not
        folded either; just outside, the same row is."""
        low, mid1, mid2, _, _ = seed(engine, 1, 2, 2, 4, 5)
        with engine.connect() as conn:
            ctx = BatchContext(conn=conn, users=["u1"], settings=cap_settings(3), now=NOW,
                               dry_run=True, held={low} if held else set())  # fmt: skip
            [listing] = user_cap.plan(ctx)  # offline: the rows it would fold, deferred
        expected = [mid1, mid2] if held else [low, mid1, mid2]
        assert sorted(listing.details["memory_ids"]) == sorted(map(str, expected))


class TestSplitOverflow:
    def row(self, importance: int, *, memory_type: str = "semantic", source: str = "app",
            **meta: Any):  # fmt: skip
        return SimpleNamespace(
            id=uuid4(), importance=importance, created_at=NOW, last_accessed_at=None,
            memory_type=memory_type, source=source, metadata=meta,
        )  # fmt: skip

    def test_takes_one_more_than_the_excess(self) -> None:
        """Excess 2 folds the 3 least valuable rows."""
        rows = [self.row(i) for i in (5, 1, 2, 3, 4)]
        overflow = split_overflow("u", rows, active=5, cap=3, max_depth=1)
        assert [r.importance for r in overflow.fold] == [1, 2, 3]
        assert [r.importance for r in overflow.plain] == [1, 2]

    def test_max_depth_zero_turns_folding_off(self) -> None:
        """With max_summary_depth 0 nothing may be folded: plain eviction."""
        rows = [self.row(i) for i in (1, 2, 3)]
        overflow = split_overflow("u", rows, active=3, cap=2, max_depth=0)
        assert overflow.fold == ()
        assert [r.importance for r in overflow.evict] == [1]

    @pytest.mark.parametrize(
        ("memory_type", "meta", "depth"),
        [
            ("semantic", {}, 0),
            ("summary", {}, 1),
            ("summary", {"summary_depth": 3}, 3),
            ("semantic", {"summary_depth": "deep"}, 0),
            ("semantic", {"merge_depth": 1}, 1),  # a merged record
            ("summary", {"summary_depth": 1, "merge_depth": 2}, 2),
            # JSON has one number type: tooling that rewrites metadata may turn 2 into 2.0
            ("summary", {"summary_depth": 2.0}, 2),
            ("semantic", {"merge_depth": 3.0}, 3),
            ("semantic", {"summary_depth": 1.5}, 0),
            ("semantic", {"summary_depth": -1}, 0),
            ("semantic", {"summary_depth": float("nan")}, 0),
            ("semantic", {"summary_depth": True}, 0),
        ],
    )
    def test_summary_depth(self, memory_type: str, meta: dict[str, Any], depth: int) -> None:
        """Depth is the larger of metadata.summary_depth and merge_depth; an application summary
        without them is 1, and so is a worker merge (source gc_merge)."""
        assert summary_depth(self.row(1, memory_type=memory_type, **meta)) == depth
        assert summary_depth(self.row(1, source="gc_merge")) == 1


class TestErasure:
    def test_erasing_a_folded_row_removes_the_summary(self, engine, make_llm) -> None:
        """forget(folded row) erases the summary made from it; the other folded rows return."""
        low, mid, _ = seed(engine, 1, 2, 5)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        with transaction(engine) as conn:
            erasure.file_request(conn, memory_id=low)
        run(engine, settings, jobs=["erasure"])
        assert get(engine, low)["status_reason"] == "erasure"
        assert get(engine, summary["id"])["status_reason"] == "erasure"
        sql = "SELECT count(*) FROM active_memories WHERE id = :id"
        assert execute(engine, sql, id=summary["id"]).scalar_one() == 0
        returned = get(engine, mid)
        assert (returned["status"], returned["superseded_by"]) == ("active", None)
