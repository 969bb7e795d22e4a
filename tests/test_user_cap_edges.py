"""user_cap in summarize mode at its edges: what the summary claims about its rows' scores,
rows gone between the reads of one plan, and embeddings the summary cannot average."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from uuid import UUID, uuid4

import jobs.user_cap as user_cap
from gc_worker.batch import BatchContext
from gc_worker.queries import q
from gc_worker.restore import restore_run
from tests.store import NOW, execute, get, run
from tests.test_importance import scored_by_content
from tests.test_user_cap_summarize import (
    SUMMARY,
    cap_settings,
    make_llm,
    seed,
    summaries,
    summary_replies,
)

__all__ = ["make_llm"]  # (a fixture)


class TestSummaryAssessment:
    def test_a_summary_of_rows_never_assessed_is_not_marked_assessed(self, engine, make_llm):
        """Rows holding the default importance no one assessed fold into a summary whose score
        is that default: it stays unassessed, so the importance job scores it, instead of a
        default marked assessed that no run would ever ask about (DESIGN.md: null = never
        assessed)."""
        seed(engine, 3, 3, 5)
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert (summary["importance"], summary["importance_assessed_at"]) == (3, None)

    def test_the_next_run_scores_it_and_the_fold_still_restores(self, engine, make_llm):
        """The next run's importance job scores the unassessed summary; that score (the
        worker's own) does not keep ``restore --run`` of the fold from undoing it."""
        rows = seed(engine, 3, 3, 5)
        settings = cap_settings(2)
        llm, _ = make_llm(
            settings, *summary_replies(), scored_by_content({SUMMARY: 2, "memory c": 5})
        )
        fold = run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        run(engine, settings, jobs=["importance"], llm=llm, now=NOW + timedelta(days=1))
        assert get(engine, summary["id"])["importance"] == 2
        restore_run(engine, UUID(fold["run_id"]), now=NOW + timedelta(days=2))
        assert [get(engine, m)["status"] for m in rows] == ["active"] * 3
        assert get(engine, summary["id"])["status"] == "deleted"

    def test_a_summary_of_an_assessed_row_is_assessed(self, engine, make_llm):
        """Just inside: one folded row was assessed (by the application), so the summary is."""
        low, _, _ = seed(engine, 1, 3, 5)
        execute(engine, "UPDATE memories SET importance_assessed_at = :t WHERE id = :id",
                t=NOW, id=low)  # fmt: skip
        settings = cap_settings(2)
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert (summary["importance"], summary["importance_assessed_at"]) == (3, NOW)


class TestRowsGoneWhilePlanning:
    def test_a_row_deleted_between_the_ranking_and_the_fold_read_skips_the_user(
        self, engine, make_llm
    ):
        """Planned before its transaction every read is its own: a row the application deletes
        between the candidates and the fold rows' read made the batch fail (KeyError); the
        user is left for the next run, no model asked — and listed as deferred (rows_changed,
        the rows still theirs), not only logged: the report showed nothing of a user left
        over the cap."""
        low, mid, _ = seed(engine, 1, 2, 5)
        settings = cap_settings(2)
        llm, server = make_llm(settings, *summary_replies())
        with engine.connect() as conn:
            ctx = BatchContext(conn=conn, users=["u1"], settings=settings, now=NOW,
                               dry_run=True, llm=llm, in_transaction=False)  # fmt: skip
            counts, _ = user_cap.over_cap_counts(ctx)
            params = ctx.params() | {
                "users": ["u1"], "take": [counts["u1"] - 2 + 1], "reassessed_importance": [],
                "with_metadata": True, "held": [],
            }  # fmt: skip
            rows = conn.execute(q("user_cap_candidates"), params).all()
            execute(engine, "DELETE FROM memories WHERE id = :id", id=mid)
            [listing] = user_cap.plan_summaries(ctx, rows, counts)
        assert (listing.action.value, listing.reason) == ("deferred", "rows_changed")
        assert listing.details == {"memory_ids": [str(low)], "over_cap_by": 1}
        assert server.requests == []
        assert get(engine, low)["status"] == "active"


class TestCentroid:
    def embedding_of(self, *vectors: list[float] | None) -> tuple[list[float] | None, str]:
        """summary_embedding with no embeddings model, over folded rows with ``vectors``."""
        rows = [SimpleNamespace(id=uuid4(), embedding=None if v is None else str(v))
                for v in vectors]  # fmt: skip
        ctx = SimpleNamespace(
            llm=SimpleNamespace(options=SimpleNamespace(embedding_model="")),
            settings=cap_settings(2),  # embeddings.dim = 8
        )
        return user_cap.summary_embedding(ctx, "text", rows, {r.id: r for r in rows})

    def test_only_vectors_of_the_store_dimension_are_averaged(self) -> None:
        """An adopted store's unconstrained ``vector`` column can hold another model's
        vectors: averaging vectors of two sizes raised (every batch with such a fold failed),
        and vectors of a foreign size alone gave the summary one. Zero vectors carry no
        direction. Rows of the configured size count; none → no embedding."""
        unit = [1.0] + [0.0] * 7
        assert self.embedding_of(unit, [0.0, 1.0, 0.0], [0.0] * 8) == (unit, "centroid")
        assert self.embedding_of([0.0, 1.0, 0.0], [0.0] * 8, None) == (None, "none")
