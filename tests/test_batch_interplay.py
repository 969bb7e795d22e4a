"""Jobs acting on the same user's rows across one batch and across consecutive runs: what one
job makes (a merged record, a summary) must not be retired by the next run for a reason none of
the rows it stands for had."""

from __future__ import annotations

from datetime import timedelta

from gc_worker.config import Settings
from tests.conftest import TEST_DIM
from tests.store import NOW, acted_on, add, days_ago, get, run, status
from tests.test_compaction import E0
from tests.test_importance import scored_by_content
from tests.test_user_cap_summarize import cap_settings, make_llm, summaries, summary_replies

__all__ = ["make_llm"]  # (a fixture)

DAY = timedelta(days=1)


class TestMergedRecordUse:
    def test_a_restated_fact_merged_with_an_old_one_is_not_pruned_as_unused(self, engine, settings):
        """Said 200 days ago and again 20 days ago, never read: the old copy is unused (90
        days), the restatement is not; merged, the record is used as recently as its latest
        member, so the next run does not prune it (it would prune neither fact's restatement)."""
        old = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(200), embedding=E0)
        new = add(engine, "u1", "has a dog named Rex", created_at=days_ago(20), embedding=E0)
        first = run(engine, settings)
        assert acted_on(first, "merge") == {str(old), str(new)}
        record = get(engine, new)["superseded_by"]
        second = run(engine, settings, now=NOW + DAY)
        assert str(record) not in acted_on(second) and status(engine, record) == "active"

    def test_a_merged_record_is_not_evicted_before_older_unused_rows(self, engine):
        """Over the cap the next run evicts the least recently used row: not the merged
        record of a fact restated yesterday, ranked as if last used when first said."""
        cap = Settings(embeddings={"dim": TEST_DIM}, user_cap={"max_memories": 2})
        add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(80), embedding=E0)
        new = add(engine, "u1", "has a dog named Rex", created_at=days_ago(1), embedding=E0)
        middle = add(engine, "u1", "Works at Acme.", created_at=days_ago(40))
        run(engine, cap)
        record = get(engine, new)["superseded_by"]
        add(engine, "u1", "Plays chess.", created_at=days_ago(2))
        second = run(engine, cap, now=NOW + DAY)
        assert acted_on(second, "soft_delete") == {str(middle)}
        assert status(engine, record) == "active"


class TestSummaryUse:
    def test_a_summary_is_not_pruned_before_its_recently_written_row(self, engine, make_llm):
        """Folded: a row last read 80 days ago and one written 3 days ago, never read. Past
        the summary's grace (14 days) the summary is used as recently as the newer row, not
        unused since the old read (usage_prune, unused_days = 90)."""
        settings = cap_settings(2)
        add(engine, "u1", "memory a", importance=1, created_at=days_ago(100),
            last_accessed_at=days_ago(80))  # fmt: skip
        add(engine, "u1", "memory b", importance=1, created_at=days_ago(3))
        add(engine, "u1", "memory c", importance=5, created_at=days_ago(10))
        llm, _ = make_llm(settings, *summary_replies())
        run(engine, settings, jobs=["user_cap"], llm=llm)
        [summary] = summaries(engine)
        later = run(engine, settings, jobs=["usage_prune"], now=NOW + timedelta(days=15))
        assert str(summary["id"]) not in acted_on(later)
        assert status(engine, summary["id"]) == "active"


class TestScoresOfCreatedRecords:
    LUNCH, LUNCH_AGAIN = "Had pasta for lunch today.", "had pasta for lunch today"

    def test_a_merged_record_takes_the_scores_the_model_gave_its_members(self, engine, make_llm):
        """Two never-assessed duplicates (default 3) the model scores 1: merged in the same run,
        the record is importance 1, as its members now are — not 3 and marked assessed, which
        no later run would ask about again (a lowered score only waits one run to decide)."""
        settings = cap_settings(100)
        a = add(engine, "u1", self.LUNCH, created_at=days_ago(30), embedding=E0)
        add(engine, "u1", self.LUNCH_AGAIN, created_at=days_ago(29), embedding=E0)
        llm, _ = make_llm(settings, scored_by_content({self.LUNCH: 1, self.LUNCH_AGAIN: 1}))
        run(engine, settings, jobs=["importance", "compaction"], llm=llm)
        record = get(engine, get(engine, a)["superseded_by"])
        assert get(engine, a)["importance"] == 1
        assert (record["importance"], record["importance_assessed_at"]) == (1, NOW)

    def test_a_summary_takes_the_scores_the_model_gave_the_folded_rows(self, engine, make_llm):
        """Over the cap, the two rows the model scored 1 (from 3) are folded: the summary is
        importance 1, not the 3 they held before the run."""
        settings = cap_settings(2)
        texts = ["memory a", "memory b", "memory c"]
        for i, text in enumerate(texts):
            add(engine, "u1", text, created_at=days_ago(30 - i))
        llm, _ = make_llm(
            settings,
            scored_by_content({"memory a": 1, "memory b": 1, "memory c": 5}),
            *summary_replies(),
        )
        run(engine, settings, jobs=["importance", "user_cap"], llm=llm)
        [summary] = summaries(engine)
        assert (summary["importance"], summary["importance_assessed_at"]) == (1, NOW)
