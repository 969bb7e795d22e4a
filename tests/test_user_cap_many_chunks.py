"""user_cap in summarize mode makes several summaries (chunks) for one user in one run, up to
``max_summaries_per_user``: a user far over the cap reaches it in a few runs instead of one
chunk a night; what waits (the chunk limit, the budget, an outage) is listed as ``deferred``
(docs/importance-and-caps.md, "Far over the cap"). The LLM is faked at the HTTP boundary."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from gc_worker import engine as gc_engine
from gc_worker.config import Settings
from gc_worker.report import build_report
from gc_worker.restore import restore_memory, restore_run
from tests.store import execute, get, run, snapshot
from tests.test_llm_port import error_reply
from tests.test_user_cap_chunks import LIMIT, active, seed_many, small_context_model
from tests.test_user_cap_summarize import make_llm

__all__ = ["make_llm"]  # (a fixture)


def settings_for(cap: int, *, max_calls: int = 500, **options: Any) -> Settings:
    user_cap = {"max_memories": cap, "overflow": "summarize", "max_summary_rows": LIMIT, **options}
    llm = {"max_retries": 0, "max_calls_per_run": max_calls}
    return Settings.model_validate({"embeddings": {"dim": 8}, "llm": llm, "user_cap": user_cap})


def summaries(engine, user: str = "u1") -> list[dict[str, Any]]:
    sql = (
        "SELECT id FROM memories WHERE user_id = :u AND memory_type = 'summary'"
        " AND status = 'active' ORDER BY id"
    )
    return [get(engine, row.id) for row in execute(engine, sql, u=user)]


def lineage(engine, derived: UUID) -> set[UUID]:
    sql = "SELECT source_id FROM memory_lineage WHERE derived_id = :d"
    return set(execute(engine, sql, d=derived).scalars())


def deferred(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in report["actions"] if a["action"] == "deferred"]


def plain(engine) -> int:
    sql = "SELECT count(*) FROM memories WHERE status_reason = 'over_cap'"
    return execute(engine, sql).scalar_one()


class TestSeveralChunksInOneRun:
    def test_a_user_far_over_the_cap_reaches_it_in_one_run(self, engine, make_llm):
        """40 over a cap of 10: three chunks of at most 20 rows (43 rows, 15 + 14 + 14), each
        its own summary with lineage to disjoint rows, bring the user to the cap in one run;
        one summary and one embedding request per chunk, nothing evicted unsummarised."""
        seed_many(engine, 50)
        settings = settings_for(10)
        llm, server = make_llm(settings, *[small_context_model] * 6)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert active(engine) == 10
        made = summaries(engine)
        folded = [lineage(engine, s["id"]) for s in made]
        assert sorted(len(rows) for rows in folded) == [14, 14, 15]
        assert len(set().union(*folded)) == 43
        assert len(server.requests) == 6
        assert plain(engine) == 0 and deferred(report) == []
        assert report["jobs"]["user_cap"]["by_action"] == {"create_merged": 3, "soft_delete": 43}

    def test_the_chunk_limit_leaves_the_least_valuable_rows_waiting_and_says_so(
        self, engine, make_llm
    ):
        """max_summaries_per_user = 2: two chunks of 20 (the most valuable of the 42 taken, so
        both summaries rank after what waits); the two least valuable rows wait, listed as one
        deferred group (reason summary_rows, over_cap_by = 2 still over)."""
        seed_many(engine, 50)
        settings = settings_for(10, max_summaries_per_user=2)
        llm, server = make_llm(settings, *[small_context_model] * 4)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert active(engine) == 12 and len(server.requests) == 4
        [waiting] = deferred(report)
        oldest = execute(
            engine, "SELECT id FROM memories ORDER BY created_at LIMIT 2"
        ).scalars()  # seed_many: the oldest are the least valuable
        assert (waiting["reason"], waiting["user_id"]) == ("summary_rows", "u1")
        assert sorted(waiting["details"]["memory_ids"]) == sorted(str(m) for m in oldest)
        assert waiting["details"]["over_cap_by"] == 2
        assert {get(engine, UUID(m))["status"] for m in waiting["details"]["memory_ids"]} == {
            "active"
        }

    def test_restore_undoes_each_chunk_and_the_run_all_of_them(self, engine, make_llm):
        """restore --memory SUMMARY re-activates that chunk's rows only; restore --run the
        rest."""
        seed_many(engine, 50)
        before = snapshot(engine)
        settings = settings_for(10)
        llm, _ = make_llm(settings, *[small_context_model] * 6)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        first, *others = summaries(engine)
        restore_memory(engine, first["id"])
        assert {get(engine, m)["status"] for m in lineage(engine, first["id"])} == {"active"}
        for other in others:
            assert {get(engine, m)["status"] for m in lineage(engine, other["id"])} == {"deleted"}
        restore_run(engine, UUID(report["run_id"]))
        after = snapshot(engine)
        assert {m: after[m]["status"] for m in before} == {m: "active" for m in before}
        assert summaries(engine) == []

    def test_the_dry_run_plan_applies_exactly_without_a_call(self, engine, make_llm):
        """The dry run makes three chunks (six requests); its apply creates those summaries,
        the planned ids, without a request, and lists no deferred group."""
        seed_many(engine, 50)
        settings = settings_for(10)
        llm, server = make_llm(settings, *[small_context_model] * 6)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert len(server.requests) == 6
        planned = {a["memory_id"] for a in plan["actions"] if a["action"] == "create_merged"}
        assert {str(s["id"]) for s in summaries(engine)} == planned and len(planned) == 3
        assert active(engine) == 10
        with engine.connect() as conn:
            report = build_report(conn, applied)
        assert report["drifted"] == []

    def test_apply_and_restore_leave_the_waiting_listing_alone(self, engine, make_llm):
        """A plan with a summary_rows listing: apply changes nothing of the waiting rows (the
        listing changes no row, drifts nothing) and restore of the apply undoes both
        chunks."""
        seed_many(engine, 50)
        before = snapshot(engine)
        settings = settings_for(10, max_summaries_per_user=2)
        llm, server = make_llm(settings, *[small_context_model] * 4)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        [listing] = deferred(plan)
        applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert len(server.requests) == 4 and active(engine) == 12
        for memory_id in listing["details"]["memory_ids"]:
            assert get(engine, UUID(memory_id))["status"] == "active"
        with engine.connect() as conn:
            report = build_report(conn, applied)
        assert report["drifted"] == []
        assert report["jobs"]["user_cap"]["by_action"]["create_merged"] == 2
        restore_run(engine, applied)
        after = snapshot(engine)
        assert {m: after[m]["status"] for m in before} == {m: "active" for m in before}

    def test_a_drifted_row_cancels_its_chunk_only(self, engine, make_llm):
        """A row of one chunk read by the application between plan and apply: that chunk's
        summary and folds drift, the other chunks are applied."""
        seed_many(engine, 50)
        settings = settings_for(10)
        llm, _ = make_llm(settings, *[small_context_model] * 6)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        create = next(a for a in plan["actions"] if a["action"] == "create_merged")
        touched = create["details"]["sources"][0]
        execute(engine, "UPDATE memories SET access_count = 1 WHERE id = :id", id=touched)
        gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        made = {str(s["id"]) for s in summaries(engine)}
        assert create["memory_id"] not in made and len(made) == 2
        assert get(engine, UUID(touched))["status"] == "active"
        assert active(engine) == 10 + len(create["details"]["sources"]) - 1


class TestStoppedBetweenChunks:
    def test_a_spent_budget_stops_the_chunks_the_rest_wait(self, engine, make_llm):
        """A budget of four calls: two chunks (the most valuable) are made, the third is not
        asked; its rows are listed deferred (llm_budget), the user still over the cap."""
        seed_many(engine, 50)
        settings = settings_for(10, max_calls=4)
        llm, server = make_llm(settings, *[small_context_model] * 6)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert len(server.requests) == 4 and len(summaries(engine)) == 2
        assert active(engine) == 50 - 29 + 2
        [waiting] = deferred(report)
        assert waiting["reason"] == "llm_budget"
        assert len(waiting["details"]["memory_ids"]) == 14
        assert waiting["details"]["over_cap_by"] == 13
        assert plain(engine) == 0

    def test_an_outage_stops_the_chunks_and_the_next_user(self, engine, make_llm):
        """The second chunk's request fails (500): the first chunk stays made, the others
        wait (llm_unavailable); the next over-cap user is not asked."""
        seed_many(engine, 50)
        seed_many(engine, 12, user="u2")
        settings = settings_for(10)
        replies = [small_context_model, small_context_model, error_reply(500)]
        llm, server = make_llm(settings, *replies)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert len(server.requests) == 3 and len(summaries(engine)) == 1
        waits = {(a["user_id"], a["reason"]) for a in deferred(report)}
        assert waits == {("u1", "llm_unavailable"), ("u2", "llm_unavailable")}
        assert active(engine, "u2") == 12 and active(engine) == 50 - 15 + 1

    def test_with_fallback_a_failed_chunk_is_evicted_plainly_to_the_cap(self, engine, make_llm):
        """fallback_to_evict: the first chunk made, the second refused — the least valuable
        of the rows not folded are evicted plainly (details.fallback) down to the cap."""
        seed_many(engine, 50)
        settings = settings_for(10, fallback_to_evict=True)
        replies = [small_context_model, small_context_model, error_reply(500)]
        llm, _ = make_llm(settings, *replies)
        report = run(engine, settings, jobs=["user_cap"], llm=llm)
        assert active(engine) == 10 and len(summaries(engine)) == 1
        evicted = [a for a in report["actions"] if a["reason"] == "over_cap"]
        assert len(evicted) == 40 - 14
        assert {a["details"].get("fallback") for a in evicted} == {"llm_unavailable"}
        assert deferred(report) == []
