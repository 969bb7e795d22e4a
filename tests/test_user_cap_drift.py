"""user_cap in summarize mode between plan and apply: a plain eviction of a row that may not be
folded, allowed only because a more valuable row was folded while the user stays over the cap,
drifts with that summary (docs/importance-and-caps.md, "What it writes"). The LLM is faked at
the HTTP boundary."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from gc_worker import engine as gc_engine
from tests.store import add, days_ago, execute, get, run
from tests.test_llm_port import error_reply
from tests.test_user_cap_chunks import small_context_model
from tests.test_user_cap_many_chunks import settings_for
from tests.test_user_cap_summarize import make_llm

__all__ = ["make_llm"]  # (a fixture)


def seed_ranked(engine, kinds: str) -> list[UUID]:
    """One row per letter of ``kinds``, least valuable first: ``f`` foldable, ``s`` a slot's
    value (evicted plainly, never folded), ``k`` kept (importance 5)."""
    ids = []
    for i, kind in enumerate(kinds):
        columns: dict[str, Any] = {"importance": 5 if kind == "k" else 1}
        if kind == "s":
            columns["slot"] = f"profile.{'abcdefghijklmnop'[i]}"
        name = "abcdefghijklmnop"[i]
        ids.append(
            add(engine, "u1", f"memory {name}{name}", created_at=days_ago(90 - i), **columns)
        )
    return ids


def touch(engine, memory_id: UUID) -> None:
    """The application reads the row (its xmin changes: a user_cap action on it drifts)."""
    execute(engine, "UPDATE memories SET access_count = access_count + 1 WHERE id = :id",
            id=memory_id)  # fmt: skip


def kinds_of(plan: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(a["action"], a["reason"], a["memory_id"]) for a in plan["actions"]]


class TestEvictionsRestOnTheFold:
    def test_waiting_rows_the_drifted_fold_cancels_the_blocked_eviction(self, engine, make_llm):
        """One chunk a run (two rows at most) and rows left waiting: the slot row ranked below
        the folded chunk is evicted only because that chunk folds; the chunk drifting at apply
        keeps it active too (no row is evicted while less valuable rows wait and nothing is
        folded)."""
        rows = seed_ranked(engine, "fffsffkk")
        settings = settings_for(2, max_summary_rows=2, max_summaries_per_user=1)
        llm, _ = make_llm(settings, *[small_context_model] * 2)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        slot_row = rows[3]
        assert ("soft_delete", "over_cap", str(slot_row)) in kinds_of(plan)
        create = next(a for a in plan["actions"] if a["action"] == "create_merged")
        touch(engine, UUID(create["details"]["sources"][0]))
        gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert get(engine, slot_row)["status"] == "active"

    def test_a_failed_later_chunk_the_drifted_top_chunk_cancels_the_evictions(
        self, engine, make_llm
    ):
        """Two chunks; the second's request fails (500), so the user stays over the cap and the
        slot row ranked below the first chunk is evicted on the strength of that chunk alone:
        the first chunk drifting at apply keeps the slot row active."""
        rows = seed_ranked(engine, "ffffsffkk")
        settings = settings_for(2, max_summary_rows=4, max_summaries_per_user=2)
        replies = [small_context_model, small_context_model, error_reply(500)]
        llm, _ = make_llm(settings, *replies)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        slot_row = rows[4]
        assert ("soft_delete", "over_cap", str(slot_row)) in kinds_of(plan)
        assert {a["reason"] for a in plan["actions"] if a["action"] == "deferred"} == {
            "llm_unavailable"
        }
        create = next(a for a in plan["actions"] if a["action"] == "create_merged")
        touch(engine, UUID(create["details"]["sources"][0]))
        gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        assert get(engine, slot_row)["status"] == "active"

    def test_the_slot_row_drifting_leaves_the_fold_alone(self, engine, make_llm):
        """The link is one way: the evicted row itself drifting cancels its eviction only, the
        summary it rested on is made."""
        rows = seed_ranked(engine, "fffsffkk")
        settings = settings_for(2, max_summary_rows=2, max_summaries_per_user=1)
        llm, _ = make_llm(settings, *[small_context_model] * 2)
        plan = run(engine, settings, jobs=["user_cap"], dry_run=True, llm=llm)
        touch(engine, rows[3])
        gc_engine.apply_plan(engine, UUID(plan["run_id"]), llm=llm)
        create = next(a for a in plan["actions"] if a["action"] == "create_merged")
        assert get(engine, UUID(create["memory_id"]))["status"] == "active"
        assert get(engine, rows[3])["status"] == "active"
