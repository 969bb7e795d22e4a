"""Jobs acting on the same user's rows across one batch and across consecutive runs: what one
job makes (a merged record, a summary) must not be retired by the next run for a reason none of
the rows it stands for had."""

from __future__ import annotations

from datetime import timedelta

from gc_worker.config import Settings
from tests.conftest import TEST_DIM
from tests.store import NOW, acted_on, add, days_ago, get, run, status
from tests.test_compaction import E0
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
