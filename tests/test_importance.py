"""The importance job: LLM scores in validated per-user batches, through the real engine and
database; the LLM is faked only at the HTTP boundary (MockTransport under the openai client)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import httpx2
import pytest
import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker import erasure
from gc_worker.config import Runtime, Settings
from gc_worker.llm import LLMPort
from gc_worker.llm_store import open_run_llm
from gc_worker.render import render_markdown
from gc_worker.report import build_report
from gc_worker.restore import restore_memory, restore_run
from gc_worker.verify_erasure import verify
from jobs.importance import scoring_batches
from tests.store import NOW, add, days_ago, execute, get, run, snapshot, status
from tests.test_llm_port import FakeServer, Reply, chat_reply, data_block, error_reply

GOAL, LUNCH, CAT = (
    "Goal: pass the C1 exam in June.",
    "Had pasta for lunch today.",
    "Remember this: my cat is called Tom.",
)
SCORES = {GOAL: 5, LUNCH: 1, CAT: 3}
BASE_URL = "http://llm.test/v1"
MakeLLM = Callable[..., tuple[LLMPort, FakeServer]]


def scored_by_content(scores: dict[str, int]) -> Callable[[httpx2.Request], httpx2.Response]:
    """A reply that scores each memory of the request by its content (as a model would)."""

    def reply(request: httpx2.Request) -> httpx2.Response:
        items = data_block(json.loads(request.content)["messages"][1]["content"])
        return chat_reply({"scores": [{"index": i["index"], "score": scores[i["content"]]}
                                      for i in items]})  # fmt: skip

    return reply


def sent_contents(server: FakeServer, number: int = 0) -> list[str]:
    return [item["content"] for item in data_block(server.body(number)["messages"][1]["content"])]


def with_options(**sections: dict[str, Any]) -> Settings:
    return Settings.model_validate({"embeddings": {"dim": 8}, **sections})


@pytest.fixture
def make_llm(engine, tmp_path: Path) -> Iterator[MakeLLM]:
    ports: list[LLMPort] = []

    def make(*replies: Reply, settings: Settings | None = None) -> tuple[LLMPort, FakeServer]:
        server = FakeServer(list(replies))
        runtime = Runtime(data_dir=tmp_path, openai_api_key="test", openai_base_url=BASE_URL)
        http_client = httpx2.Client(transport=httpx2.MockTransport(server))
        port = open_run_llm(settings or with_options(), runtime, engine, http_client=http_client)
        assert port is not None
        ports.append(port)
        return port, server

    yield make
    for port in ports:
        port.close()


def seed_three(engine) -> dict[str, Any]:
    return {text: add(engine, "u1", text, created_at=days_ago(3 - i)) for i, text in
            enumerate((GOAL, LUNCH, CAT))}  # fmt: skip


class TestScoring:
    def test_valid_batch_scores_every_row(self, engine, settings, make_llm) -> None:
        """One call scores the batch; importance and importance_assessed_at are written."""
        ids = seed_three(engine)
        llm, server = make_llm(scored_by_content(SCORES))
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert len(server.requests) == 1
        for text, memory_id in ids.items():
            row = get(engine, memory_id)
            assert (row["importance"], row["importance_assessed_at"]) == (SCORES[text], NOW)
        assert report["jobs"]["importance"]["by_action"] == {"set_importance": 3}
        assert report["jobs"]["importance"]["llm_calls"] == 1
        assert report["llm"]["calls"] == 1
        lunch = next(a for a in report["actions"] if a["memory_id"] == str(ids[LUNCH]))
        assert lunch["details"] == {"importance": 1, "previous": 3, "content": LUNCH}

    def test_assessed_and_pinned_rows_are_never_sent(self, engine, settings, make_llm) -> None:
        """Rows the application assessed, pinned rows and retired rows are not scored."""
        todo = add(engine, "u1", GOAL)
        assessed = add(engine, "u1", LUNCH, importance=2, importance_assessed_at=days_ago(9))
        pinned = add(engine, "u1", CAT, pinned=True)
        add(engine, "u1", "old news", status="deleted", deleted_at=days_ago(1))
        llm, server = make_llm(scored_by_content(SCORES))
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert sent_contents(server) == [GOAL]
        assert {a["memory_id"] for a in report["actions"]} == {str(todo)}
        assert get(engine, assessed)["importance_assessed_at"] == days_ago(9)
        assert get(engine, pinned)["importance_assessed_at"] is None

    def test_unchanged_score_still_marks_the_row_assessed(self, engine, settings, make_llm):
        """A score equal to the default is written too, so the row is not asked about again."""
        memory_id = add(engine, "u1", CAT)
        llm, _ = make_llm(scored_by_content(SCORES))
        run(engine, settings, jobs=["importance"], llm=llm)
        row = get(engine, memory_id)
        assert (row["importance"], row["importance_assessed_at"]) == (3, NOW)

    @pytest.mark.parametrize(("batch_size", "calls"), [(3, 1), (2, 2)])
    def test_batch_size_just_inside_and_outside(self, engine, make_llm, batch_size, calls):
        """Three rows fit one batch of 3; with batches of 2 they take two calls."""
        seed_three(engine)
        settings = with_options(importance={"batch_size": batch_size})
        replies = [scored_by_content(SCORES)] * calls
        llm, server = make_llm(*replies, settings=settings)
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert len(server.requests) == calls
        assert report["jobs"]["importance"]["by_action"] == {"set_importance": 3}

    def test_a_batch_never_mixes_users(self, engine, settings, make_llm) -> None:
        """Two users' rows go in two calls, each with only its user's memories."""
        add(engine, "u1", GOAL)
        add(engine, "u2", LUNCH)
        llm, server = make_llm(scored_by_content(SCORES), scored_by_content(SCORES))
        run(engine, settings, jobs=["importance"], llm=llm)
        assert sorted(map(sent_contents, [server, server], [0, 1])) == [[GOAL], [LUNCH]]

    def test_a_lowered_score_decides_from_the_next_run(self, engine, settings, make_llm) -> None:
        """A 200-day-old row the model scores 1 (from the default 3) is not retired in the run
        that scored it — one answer cannot retire rows at once — but by the next run's decay;
        a row scored 3 stays. A raised score protects at once: a row at 1 scored 5 survives."""
        trivial = add(engine, "u1", LUNCH, created_at=days_ago(200))
        useful = add(engine, "u1", CAT, created_at=days_ago(200))
        raised = add(engine, "u1", GOAL, created_at=days_ago(200), importance=1)
        llm, _ = make_llm(scored_by_content(SCORES))
        first = run(engine, settings, jobs=["importance", "decay"], llm=llm)
        assert [a["action"] for a in first["actions"]] == ["set_importance"] * 3
        assert get(engine, trivial)["importance"] == 1 and status(engine, trivial) == "active"
        run(engine, settings, jobs=["decay"], now=NOW + timedelta(days=1))
        assert (get(engine, trivial)["status"], get(engine, trivial)["status_reason"]) == (
            "deleted",
            "decayed",
        )
        assert status(engine, useful) == "active" and status(engine, raised) == "active"

    def test_restore_puts_the_default_back(self, engine, settings, make_llm) -> None:
        """Restoring the run resets importance and importance_assessed_at."""
        ids = seed_three(engine)
        before = snapshot(engine)
        llm, _ = make_llm(scored_by_content(SCORES))
        report = run(engine, settings, jobs=["importance"], llm=llm)
        result = restore_run(engine, UUID(report["run_id"]))
        assert sorted(map(str, result.restored)) == sorted(map(str, ids.values()))
        assert snapshot(engine) == before

    def test_a_restored_score_is_not_made_again(self, engine, settings, make_llm) -> None:
        """A restore of the model's scores is a person overruling the model: the next run
        asked again (or answered from the decision cache) and wrote the same scores, so the
        undo lasted one night. A restore records a dismissed review naming the rows it put
        back, and the job leaves them alone; a row no restore touched is still asked."""
        ids = seed_three(engine)
        lisbon = "Starts a new job in Lisbon in March."
        scored = scored_by_content({**SCORES, lisbon: 4})
        llm, server = make_llm(scored, scored)
        run(engine, settings, jobs=["importance"], llm=llm)
        for memory_id in (ids[GOAL], ids[LUNCH]):
            restore_memory(engine, memory_id)
        before = snapshot(engine)
        newer = add(engine, "u1", lisbon, created_at=days_ago(0))
        again = run(engine, settings, jobs=["importance"], llm=llm, now=NOW + timedelta(days=1))
        assert {a["memory_id"] for a in again["actions"]} == {str(newer)}
        assert len(server.requests) == 2 and sent_contents(server, 1) == [lisbon]
        after = {k: v for k, v in snapshot(engine).items() if k != newer}
        assert after == before
        with engine.connect() as conn:
            vetoes = conn.execute(sa.text(
                "SELECT kind, reason, status, resolution ->> 'decision' AS d, memory_ids"
                " FROM gc_review_items ORDER BY id"
            )).all()  # fmt: skip
        assert {(v.kind, v.reason, v.status, v.d) for v in vetoes} == {
            ("importance", "restored", "resolved", "dismiss")}  # fmt: skip
        assert [v.memory_ids for v in vetoes] == [[ids[GOAL]], [ids[LUNCH]]]

    def test_restoring_a_run_keeps_a_later_same_clock_score(self, engine, settings, make_llm):
        """The application reset a scored row and a second run with the same `--now` scored it
        again (the same score, the same instant). Restoring the first run left that score in
        place; the second run's restore puts the application's reset back."""
        goal = add(engine, "u1", GOAL)
        llm, _ = make_llm(scored_by_content(SCORES), scored_by_content(SCORES))
        first = run(engine, settings, jobs=["importance"], llm=llm)
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE memories SET importance = 2, importance_assessed_at"
                                 " = NULL WHERE id = :id"), {"id": goal})  # fmt: skip
        second = run(engine, settings, jobs=["importance"], llm=llm)
        assert get(engine, goal)["importance"] == 5
        kept = restore_run(engine, UUID(first["run_id"]))
        assert kept.restored == [] and get(engine, goal)["importance"] == 5
        restore_run(engine, UUID(second["run_id"]))
        assert (get(engine, goal)["importance"], get(engine, goal)["importance_assessed_at"]) == (
            2, None)  # fmt: skip

    def test_forgetting_one_restored_row_keeps_the_others_unscored(
        self, engine, settings, make_llm
    ) -> None:
        """Restored scores of two rows are one dismissal. Forgetting one row takes its id out
        (it would be a residue of the erasure); the other row is still never asked about."""

        ids = seed_three(engine)
        llm, server = make_llm(scored_by_content(SCORES))
        report = run(engine, settings, jobs=["importance"], llm=llm)
        restore_run(engine, UUID(report["run_id"]))
        erasure.forget(engine, settings, now=NOW, memory_id=ids[LUNCH], purge_now=True)
        with engine.connect() as conn:
            kept = conn.execute(sa.text("SELECT memory_ids FROM gc_review_items")).scalars().all()
        assert [sorted(k) for k in kept] == [sorted([ids[GOAL], ids[CAT]])]
        assert verify(engine, now=NOW, memory_id=ids[LUNCH]).residues == []
        again = run(engine, settings, jobs=["importance"], llm=llm, now=NOW + timedelta(days=1))
        assert again["actions"] == [] and len(server.requests) == 1


def test_restore_a_dismissal_of_one_row_goes_with_that_row(engine, settings, make_llm):
    """Just outside the trim: a restored score of a single row is an item naming that row
    alone; forgetting the row drops the item (an id left behind would be a residue)."""
    ids = seed_three(engine)
    llm, _ = make_llm(scored_by_content(SCORES))
    run(engine, settings, jobs=["importance"], llm=llm)
    restore_memory(engine, ids[GOAL])
    items = "SELECT memory_ids FROM gc_review_items"
    assert [list(r) for r in execute(engine, items).scalars()] == [[ids[GOAL]]]
    erasure.forget(engine, settings, now=NOW, memory_id=ids[GOAL], purge_now=True)
    assert execute(engine, items).scalars().all() == []
    assert verify(engine, now=NOW, memory_id=ids[GOAL]).residues == []


def test_restore_a_stale_plan_does_not_write_back_a_restored_score(engine, settings, make_llm):
    """A dry run plans the scores, another run applies them, and that run is restored. Found
    by a review: `apply` of the plan wrote the scores back (a restore puts the values back
    exactly, so nothing drifted them). A score dismissed after planning drifts now."""
    ids = seed_three(engine)
    llm, _ = make_llm(scored_by_content(SCORES), scored_by_content(SCORES))
    plan = run(engine, settings, jobs=["importance"], llm=llm, dry_run=True)
    applied = run(engine, settings, jobs=["importance"], llm=llm)
    restore_run(engine, UUID(applied["run_id"]))
    run_id = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    row = get(engine, ids[LUNCH])
    assert (row["importance"], row["importance_assessed_at"]) == (3, None)
    with engine.connect() as conn:
        report = build_report(conn, run_id)
    assert {d["memory_id"] for d in report["drifted"]} == {str(m) for m in ids.values()}


def test_restore_an_erased_row_keeps_its_score_and_the_others_their_dismissal(
    engine, settings, make_llm
):
    """One of three scored rows is forgotten (erased, not yet purged), then the run is
    restored. Found by a review: the erased row's score was reset too, and the dismissal,
    naming an erased row, was not recorded at all, so the other two were asked again."""
    ids = seed_three(engine)
    llm, server = make_llm(scored_by_content(SCORES), scored_by_content(SCORES))
    report = run(engine, settings, jobs=["importance"], llm=llm)
    erasure.forget(engine, settings, now=NOW, memory_id=ids[LUNCH])
    run(engine, settings, jobs=["erasure"], now=NOW)
    result = restore_run(engine, UUID(report["run_id"]))
    assert (ids[LUNCH], "set_importance", "erased") in result.why_not
    assert get(engine, ids[LUNCH])["importance"] == 1
    again = run(engine, settings, jobs=["importance"], llm=llm, now=NOW + timedelta(days=1))
    assert again["actions"] == [] and len(server.requests) == 1


def test_restore_leaves_a_scored_row_moved_to_another_user(engine, settings, make_llm):
    """Found by a review: a restore reset the score of a row the application had moved to
    another user (a change across users), and filed the dismissal under the old user."""
    ids = seed_three(engine)
    llm, _ = make_llm(scored_by_content(SCORES))
    report = run(engine, settings, jobs=["importance"], llm=llm)
    execute(engine, "UPDATE memories SET user_id = 'u2' WHERE id = :id", id=ids[CAT])
    result = restore_run(engine, UUID(report["run_id"]))
    assert result.why_not == [(ids[CAT], "set_importance", "moved_to_another_user")]
    assert get(engine, ids[CAT])["importance"] == SCORES[CAT]
    assert get(engine, ids[CAT])["importance_assessed_at"] == NOW


def scored_and_evicted(engine, make_llm: MakeLLM) -> tuple[UUID, dict[str, Any]]:
    """One run scores three rows (the model gives LUNCH 1) and evicts LUNCH over a cap of 2:
    one row, two changes of one run."""
    ids = seed_three(engine)
    settings = with_options(user_cap={"max_memories": 2})
    llm, _ = make_llm(scored_by_content(SCORES), settings=settings)
    report = run(engine, settings, jobs=["importance", "user_cap"], llm=llm)
    assert {a["action"] for a in report["actions"] if a["memory_id"] == str(ids[LUNCH])} == {
        "set_importance", "soft_delete"}  # fmt: skip
    return ids[LUNCH], report


def test_restore_a_kept_score_of_a_row_brought_back_is_changed_not_merge_kept(engine, make_llm):
    """The application re-scored the row: its eviction is undone, its score kept. The reason
    is decided per change (found by a review: the row's eviction being in place made the
    kept score read 'merge_kept', with no merge anywhere)."""
    lunch, report = scored_and_evicted(engine, make_llm)
    execute(engine, "UPDATE memories SET importance = 4 WHERE id = :id", id=lunch)
    result = restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
    assert status(engine, lunch) == "active"
    assert result.why_not == [(lunch, "set_importance", "changed_since")]


def test_restore_memory_of_an_evicted_row_keeps_its_score(engine, make_llm):
    """restore --memory undoes the worker's latest change to the memory (README, `restore`):
    found by a review, it undid every change of that run to the row, so bringing back a row
    the cap evicted also reset the model's score and filed a dismissal of it, and the row was
    never scored again though no one had overruled the model. The eviction alone is undone."""
    lunch, _ = scored_and_evicted(engine, make_llm)
    result = restore_memory(engine, lunch, now=NOW + timedelta(hours=1))
    assert result.restored == [lunch]
    row = get(engine, lunch)
    assert (row["status"], row["importance"], row["importance_assessed_at"]) == ("active", 1, NOW)
    assert execute(engine, "SELECT count(*) FROM gc_review_items").scalar_one() == 0


def test_restore_two_kept_changes_of_one_row_are_both_named(engine, make_llm):
    lunch, report = scored_and_evicted(engine, make_llm)
    execute(engine, "UPDATE memories SET importance = 4, status = 'active', deleted_at = NULL"
                    " WHERE id = :id", id=lunch)  # fmt: skip
    result = restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
    assert sorted(result.why_not) == [(lunch, "set_importance", "changed_since"),
                                      (lunch, "soft_delete", "changed_since")]  # fmt: skip


def scores(*pairs: tuple[int, int]) -> dict[str, Any]:
    return {"scores": [{"index": index, "score": score} for index, score in pairs]}


class TestRejectedAnswers:
    @pytest.mark.parametrize(
        ("reply", "error"),
        [
            (chat_reply(scores((0, 5), (1, 1))), "missing_index"),
            (chat_reply(scores((0, 5), (1, 1), (1, 2))), "duplicate_index"),
            (chat_reply(scores((0, 5), (1, 1), (3, 2))), "index_out_of_range"),
            (chat_reply(scores((0, 5), (1, 0), (2, 3))), "score_out_of_range"),
            (chat_reply(scores((0, 6), (1, 1), (2, 3))), "score_out_of_range"),
            (chat_reply('{"scores": [{"index": 0, "score": 5}'), "malformed_json"),
        ],
        ids=["missing", "duplicate", "out-of-range", "score-0", "score-6", "malformed-json"],
    )
    def test_bad_answer_changes_nothing_and_is_counted(
        self, engine, settings, make_llm, reply: httpx2.Response, error: str
    ) -> None:
        """No row takes a score from a rejected answer; the batch is asked again in halves
        (here rejected too, down to single rows), each failure counted as an error, every row
        listed as deferred with the rejection code."""
        from structlog.testing import capture_logs

        from gc_worker import logs as gc_logs

        gc_logs.configure("info")  # an earlier test (the demo) may have raised the level
        ids = seed_three(engine)
        before = snapshot(engine)
        again = chat_reply(scores((0, 9)))  # rejected for a half of 1 or 2 rows
        llm, server = make_llm(reply, again, again, again, again)
        with capture_logs() as logs:
            report = run(engine, settings, jobs=["importance"], llm=llm)
        assert snapshot(engine) == before
        assert len(server.requests) == 5  # the batch, its halves (2 + 1), the 2's halves
        assert report["jobs"]["importance"]["errors"] == 5
        rejected = [e["reason"] for e in logs if e["event"] == "llm.answer_rejected"]
        assert rejected[0] == error
        assert {(a["action"], a["reason"]) for a in report["actions"]} == {
            ("deferred", "llm_invalid")}  # fmt: skip
        listed = [i for a in report["actions"] for i in a["details"]["memory_ids"]]
        assert sorted(listed) == sorted(map(str, ids.values()))
        assert {a["details"]["error"] for a in report["actions"]} <= {
            "missing_index", "score_out_of_range"}  # fmt: skip

    def test_a_bad_batch_does_not_stop_the_next_one(self, engine, make_llm) -> None:
        """With batches of one, a rejected answer defers its batch and the next is scored."""
        goal, lunch = add(engine, "u1", GOAL, created_at=days_ago(2)), add(engine, "u1", LUNCH)
        settings = with_options(importance={"batch_size": 1})
        llm, _ = make_llm(chat_reply(scores((0, 9))), scored_by_content(SCORES), settings=settings)
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert get(engine, goal)["importance_assessed_at"] is None
        assert get(engine, lunch)["importance"] == 1
        assert report["jobs"]["importance"]["errors"] == 1

    @pytest.mark.parametrize("status", [503, 401])
    def test_unavailable_server_defers_the_rest_without_calling(
        self, engine, make_llm, status
    ) -> None:
        """A server that is down (or refuses the key) fails one call, counted as one error;
        the user's remaining batches are deferred uncalled."""
        seed_three(engine)
        settings = with_options(importance={"batch_size": 1}, llm={"max_retries": 0})
        llm, server = make_llm(error_reply(status), settings=settings)
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert len(server.requests) == 1
        assert report["jobs"]["importance"]["errors"] == 1
        [listing] = report["actions"]
        assert (listing["reason"], len(listing["details"]["memory_ids"])) == ("llm_unavailable", 3)
        assert listing["details"]["calls"] == 3

    def test_a_request_refused_for_its_content_stops_nothing(self, engine, make_llm) -> None:
        """400 (too long for the model, a content filter) refuses that request only: the
        next batches are still asked."""
        seed_three(engine)
        settings = with_options(importance={"batch_size": 1}, llm={"max_retries": 0})
        llm, server = make_llm(error_reply(400), error_reply(400), error_reply(400),
                               settings=settings)  # fmt: skip
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert len(server.requests) == 3
        assert report["jobs"]["importance"]["errors"] == 3

    def test_a_rejected_answer_breaks_a_run_of_refusals(self, engine, make_llm) -> None:
        """Refused, rejected, refused, refused: the server answered in between, so these are
        not three refusals in a row, and the next batch is still asked and scored."""
        ids = [add(engine, "u1", f"fact {i}", created_at=days_ago(9 - i)) for i in range(5)]
        settings = with_options(importance={"batch_size": 1}, llm={"max_retries": 0})
        llm, server = make_llm(
            error_reply(400), chat_reply(scores((0, 9))), error_reply(400), error_reply(400),
            chat_reply(scores((0, 2))), settings=settings,
        )  # fmt: skip
        run(engine, settings, jobs=["importance"], llm=llm)
        assert len(server.requests) == 5
        assert get(engine, ids[4])["importance"] == 2


class TestNoNewCalls:
    def test_apply_of_a_dry_run_makes_no_call(self, engine, settings, make_llm) -> None:
        """The dry run asks once; applying its plan replays it and asks nothing."""
        ids = seed_three(engine)
        llm, server = make_llm(scored_by_content(SCORES))
        plan = run(engine, settings, jobs=["importance"], dry_run=True, llm=llm)
        assert get(engine, ids[GOAL])["importance_assessed_at"] is None
        applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert len(server.requests) == 1
        assert get(engine, ids[GOAL])["importance"] == 5
        with engine.connect() as conn:
            assert build_report(conn, applied)["llm"]["calls"] == 0

    def test_second_dry_run_is_answered_from_the_cache(self, engine, settings, make_llm) -> None:
        """The same batch again is a cache hit: no HTTP request, same plan."""
        seed_three(engine)
        llm, server = make_llm(scored_by_content(SCORES))
        first = run(engine, settings, jobs=["importance"], dry_run=True, llm=llm)
        second = run(engine, settings, jobs=["importance"], dry_run=True, llm=llm)
        assert len(server.requests) == 1
        assert (second["llm"]["calls"], second["llm"]["cache_hits"]) == (0, 1)
        assert [a["details"] for a in second["actions"]] == [a["details"] for a in first["actions"]]


class TestDeferred:
    def test_offline_lists_each_user_once_as_deferred(self, engine) -> None:
        """Without an LLM nothing is guessed: a user's batches are listed once with their count."""
        ids = seed_three(engine)
        before = snapshot(engine)
        settings = with_options(importance={"batch_size": 2})
        report = run(engine, settings, jobs=["importance"])
        assert snapshot(engine) == before
        [listing] = report["actions"]
        assert listing["reason"] == "llm_unavailable" and listing["details"]["calls"] == 2
        assert listing["details"]["memory_ids"] == [str(ids[k]) for k in (GOAL, LUNCH, CAT)]
        assert report["jobs"]["importance"]["errors"] == 0
        markdown = render_markdown(report)
        assert "| importance | u1 | llm_unavailable |" in markdown

    def test_the_log_counts_deferred_batches_not_listings(self, engine) -> None:
        """importance.batches_deferred says how many batches wait (docs/importance-and-caps.md):
        found by a review, it counted the listings, one per user however many batches."""
        from structlog.testing import capture_logs

        from gc_worker import logs as gc_logs

        gc_logs.configure("info")  # an earlier test (the demo) may have raised the level
        seed_three(engine)
        add(engine, "u2", GOAL)
        settings = with_options(importance={"batch_size": 2})
        with capture_logs() as logs:
            report = run(engine, settings, jobs=["importance"])
        assert len(report["actions"]) == 2  # one listing per user: u1's two batches, u2's one
        [line] = [e for e in logs if e["event"] == "importance.batches_deferred"]
        assert line["batches"] == 3

    def test_spent_budget_defers_the_rest(self, engine, make_llm) -> None:
        """With one call allowed, the first batch is scored and the second deferred (llm_budget)."""
        ids = seed_three(engine)
        settings = with_options(importance={"batch_size": 2}, llm={"max_calls_per_run": 1})
        llm, server = make_llm(scored_by_content(SCORES), settings=settings)
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert len(server.requests) == 1
        assert get(engine, ids[GOAL])["importance"] == 5
        [deferred] = [a for a in report["actions"] if a["action"] == "deferred"]
        assert (deferred["reason"], deferred["details"]["memory_ids"]) == (
            "llm_budget",
            [str(ids[CAT])],
        )
        assert report["jobs"]["importance"]["errors"] == 0

    @pytest.mark.parametrize("limit", ["max_calls_per_run", "max_tokens_per_run"])
    def test_a_zero_budget_sends_nothing(self, engine, make_llm, limit) -> None:
        """[llm] max_calls_per_run = 0 and max_tokens_per_run = 0 both mean: no request at all
        (everything deferred as llm_budget), not "unlimited"."""
        seed_three(engine)
        settings = with_options(llm={limit: 0})
        llm, server = make_llm(scored_by_content(SCORES), settings=settings)
        report = run(engine, settings, jobs=["importance"], llm=llm)
        assert server.requests == []
        assert {a["reason"] for a in report["actions"]} == {"llm_budget"}


class TestScoringBatches:
    def row(self, user_id: str) -> SimpleNamespace:
        return SimpleNamespace(id=uuid4(), user_id=user_id)

    def test_cut_per_user_and_size(self) -> None:
        """Rows ordered by user are cut into per-user batches of at most the batch size."""
        rows = [self.row("a"), self.row("a"), self.row("a"), self.row("b")]
        batches = list(scoring_batches(rows, 2))
        assert [(b.user_id, len(b.rows)) for b in batches] == [("a", 2), ("a", 1), ("b", 1)]
