"""compaction: candidate groups, the merged record, and what happens offline (real database)."""

from __future__ import annotations

import math
from datetime import timedelta
from types import SimpleNamespace
from uuid import UUID, uuid4

import pytest

from gc_worker import engine as gc_engine
from gc_worker import render, restore
from gc_worker.config import CompactionSettings, EmbeddingSettings, Settings
from gc_worker.report import build_report
from jobs.compaction import exact_duplicates, find_groups
from jobs.compaction_records import merge_depth, merged_record
from tests.conftest import TEST_DIM
from tests.store import NOW, acted_on, add, days_ago, execute, get, run, snapshot, status
from tests.test_erasure_helpers import count


def unit(angle: float, axis: int = 1) -> list[float]:
    """A unit vector at `angle` radians from e0 towards e_axis (cosine to e0 = cos(angle))."""
    vector = [0.0] * TEST_DIM
    vector[0], vector[axis] = math.cos(angle), math.sin(angle)
    return vector


def at_similarity(similarity: float, axis: int = 1) -> list[float]:
    return unit(math.acos(similarity), axis)


E0 = unit(0.0)
NEAR_MISSES = [
    ("English level is B1", "English level is B2"),
    ("Books flights from New York to Florida", "Books flights from Florida to New York"),
    ("Prefers morning meetings", "Does not prefer morning meetings"),
]


def row(content: str, embedding, **fields):
    values = {
        "id": uuid4(), "user_id": "u1", "row_version": 1, "preview": content, "content": content,
        "embedding": embedding, "memory_type": "semantic", "source": "explicit_user_statement",
        "scope": None, "slot": None, "importance": 3, "importance_assessed_at": None,
        "confidence": 1.0, "created_at": NOW, "last_accessed_at": None, "access_count": 0,
        "observed_at": NOW, "valid_from": None, "expires_at": None, "metadata": {}, "trust": 3,
    }  # fmt: skip
    return SimpleNamespace(**(values | fields))


def groups_of(rows, similarity=0.85, max_group_size=8, max_merge_depth=1):
    return find_groups(
        rows,
        similarity=similarity,
        max_group_size=max_group_size,
        max_merge_depth=max_merge_depth,
        dim=TEST_DIM,
    )


class TestFindGroups:
    def test_threshold_just_inside_and_just_outside(self):
        """A pair at 0.8501 is a group, a pair at 0.8499 is not."""
        inside = [row("a", E0), row("b", at_similarity(0.8501))]
        outside = [row("a", E0), row("b", at_similarity(0.8499))]
        assert len(groups_of(inside)[0]) == 1
        assert groups_of(outside)[0] == []

    def test_unusable_embeddings_are_skipped_and_counted(self):
        """Zero, wrong-size and non-finite vectors never join a group and count as skipped."""
        rows = [
            row("a", E0),
            row("b", E0),
            row("zero", [0.0] * TEST_DIM),
            row("short", [1.0, 0.0]),
            row("nan", [math.nan] + [0.0] * (TEST_DIM - 1)),
            row("not embedded", None),
        ]
        groups, skipped = groups_of(rows)
        assert [sorted(m.content for m in g) for g in groups] == [["a", "b"]]
        assert skipped == 3

    def test_groups_never_span_two_slots(self):
        """Identical vectors in different slots stay apart."""
        rows = [row("a", E0, slot="x"), row("b", E0, slot="y"), row("c", E0, slot="x")]
        groups, _ = groups_of(rows)
        assert [sorted(m.content for m in g) for g in groups] == [["a", "c"]]

    def test_group_size_is_capped(self):
        """Ten identical vectors with a cap of 4 make groups of at most 4."""
        groups, _ = groups_of([row(str(i), E0) for i in range(10)], max_group_size=4)
        assert max(len(g) for g in groups) == 4

    def test_merged_records_are_not_merged_beyond_the_depth(self):
        """A depth-1 merge is left alone at max depth 1 and merged again at max depth 2."""
        rows = [row("a", E0), row("b", E0, source="gc_merge", metadata={"merge_depth": 1})]
        assert groups_of(rows, max_merge_depth=1)[0] == []
        assert len(groups_of(rows, max_merge_depth=2)[0]) == 1

    def test_merge_depth_of_summaries_and_plain_rows(self):
        """Plain rows are depth 0; summaries and merges without a depth count as 1."""
        assert merge_depth(row("a", E0)) == 0
        assert merge_depth(row("s", E0, memory_type="summary")) == 1
        assert merge_depth(row("s", E0, source="gc_merge", metadata={"summary_depth": 2})) == 2
        # a depth rewritten as 2.0 by the application's tooling is still 2 (JSON has one number
        # type); 1.5 is no depth, so the record counts as 1
        assert merge_depth(row("s", E0, source="gc_merge", metadata={"merge_depth": 2.0})) == 2
        assert merge_depth(row("s", E0, source="gc_merge", metadata={"merge_depth": 1.5})) == 1


class TestExactDuplicates:
    def test_normalised_text_decides(self):
        """Case, spacing and surrounding punctuation do not matter; a different word does."""
        assert exact_duplicates([row("Has a dog.", E0), row("  has a DOG", E0)])
        assert not exact_duplicates([row("Has a dog", E0), row("Has a cat", E0)])

    @pytest.mark.parametrize(("a", "b"), NEAR_MISSES)
    def test_near_misses_are_not_exact(self, a, b):
        """The issue's near-miss pairs are never exact duplicates."""
        assert not exact_duplicates([row(a, E0), row(b, E0)])


class TestMergedRecord:
    def test_fields_follow_the_members(self):
        """Highest importance, earliest times, latest access, summed counts, open TTL wins."""
        a = row("a", E0, importance=2, created_at=days_ago(9), observed_at=days_ago(8),
                last_accessed_at=days_ago(3), access_count=2, expires_at=None, trust=2)  # fmt: skip
        b = row("b", E0, importance=4, created_at=days_ago(5), observed_at=days_ago(5),
                last_accessed_at=days_ago(1), access_count=5, expires_at=NOW, trust=3,
                valid_from=days_ago(5))  # fmt: skip
        record = merged_record([a, b], content="ab", embedding=E0, embedding_source="model")
        assert record["importance"] == 4
        assert record["created_at"] == days_ago(9).isoformat()
        assert record["observed_at"] == days_ago(8).isoformat()
        assert record["last_accessed_at"] == days_ago(1).isoformat()
        assert record["access_count"] == 7
        assert record["expires_at"] is None
        assert record["valid_from"] is None
        assert record["source"] == "gc_merge"
        assert record["metadata"] == {
            "merge_depth": 1, "merged_count": 2, "embedding_source": "model",
            "trust_source": "explicit_user_statement",
        }  # fmt: skip

    def test_a_text_the_model_wrote_is_trusted_as_its_least_trusted_member(self):
        """An external claim merged with a user statement must not come out as a user
        statement (it could then obsolete other user statements): a model-written merge takes
        the weakest member's source; an exact duplicate keeps the best (it is a member's text)."""
        external, stated = row("a", E0, trust=1), row("b", E0, trust=3)
        written = merged_record([external, stated], content="ab", embedding=E0,
                                embedding_source="model", model_written=True)  # fmt: skip
        copied = merged_record([external, stated], content="a", embedding=E0,
                               embedding_source="copied")  # fmt: skip
        assert written["metadata"]["trust_source"] == "external"
        assert copied["metadata"]["trust_source"] == "explicit_user_statement"

    def test_ttl_is_the_latest_when_every_member_has_one(self):
        """All members expiring → the merged record expires with the last of them."""
        a = row("a", E0, expires_at=NOW + timedelta(days=1))
        b = row("b", E0, expires_at=NOW + timedelta(days=9))
        record = merged_record([a, b], content="ab", embedding=E0, embedding_source="model")
        assert record["expires_at"] == (NOW + timedelta(days=9)).isoformat()

    def test_reassessed_importance_counts(self):
        """An importance re-assessed earlier in the batch is the one used."""
        a, b = row("a", E0, importance=2), row("b", E0, importance=2)
        record = merged_record(
            [a, b], content="ab", embedding=E0, embedding_source="model", importance={a.id: 5}
        )
        assert record["importance"] == 5


def report_of(engine, run_id):
    with engine.connect() as conn:
        return build_report(conn, run_id)


def action_key(action):
    return (action["job"], action["action"], action["memory_id"], action["reason"])


def lineage(engine, derived: UUID) -> set[UUID]:
    rows = execute(engine, "SELECT source_id FROM memory_lineage WHERE derived_id = :d", d=derived)
    return {r.source_id for r in rows}


class TestOffline:
    def test_exact_duplicates_merge_without_an_llm(self, engine, settings):
        """Exact duplicates merge into one record with lineage; members become merged."""
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(9), embedding=E0,
                importance=2, access_count=1)  # fmt: skip
        b = add(engine, "u1", "has a dog named Rex", created_at=days_ago(4), embedding=E0,
                importance=4, access_count=2)  # fmt: skip
        report = run(engine, settings, jobs=["compaction"])
        created = [x for x in report["actions"] if x["action"] == "create_merged"]
        assert len(created) == 1 and created[0]["reason"] == "exact_duplicates"
        new_id = UUID(created[0]["memory_id"])
        merged = get(engine, new_id)
        assert merged["content"] == "Has a dog named Rex."
        assert merged["importance"] == 4 and merged["access_count"] == 3
        assert merged["metadata"]["embedding_source"] == "copied"
        assert lineage(engine, new_id) == {a, b}
        for member in (a, b):
            assert get(engine, member)["status"] == "merged"
            assert get(engine, member)["superseded_by"] == new_id

    def test_the_same_event_on_two_days_is_two_events(self, engine, settings):
        """'Went to the dentist' (episodic) observed 60 days ago and 5 days ago are two visits:
        not merged; the same text observed the same day is one memory said twice: merged."""
        add(engine, "u1", "Went to the dentist", memory_type="episodic", embedding=E0,
            observed_at=days_ago(60), created_at=days_ago(60))  # fmt: skip
        add(engine, "u1", "Went to the dentist", memory_type="episodic", embedding=E0,
            observed_at=days_ago(5), created_at=days_ago(5))  # fmt: skip
        assert run(engine, settings, jobs=["compaction"])["actions"] == []
        add(engine, "u1", "Went to the dentist", memory_type="episodic", embedding=E0,
            observed_at=days_ago(5), created_at=days_ago(4))  # fmt: skip
        merged = run(engine, settings, jobs=["compaction"])
        assert merged["totals"]["by_action"] == {"create_merged": 1, "merge": 2}

    @pytest.mark.parametrize(
        ("second", "merges"),
        [(59, True), (60, False)],  # 08:00:00 with 08:00:59 (same minute) / 08:01:00 (the next)
    )
    def test_an_event_is_one_minute_of_observed_at(self, engine, settings, second, merges):
        """Episodic duplicates merge within one UTC minute of observed_at, not across two."""
        at = days_ago(5).replace(hour=8, minute=0, second=0, microsecond=0)
        for offset in (0, second):
            add(engine, "u1", "Took insulin", memory_type="episodic", embedding=E0,
                observed_at=at + timedelta(seconds=offset), created_at=at)  # fmt: skip
        actions = run(engine, settings, jobs=["compaction"])["totals"]["by_action"]
        assert actions == ({"create_merged": 1, "merge": 2} if merges else {})

    def test_rows_of_two_trust_levels_do_not_merge(self, engine, settings):
        """An external claim and the user's own statement of the same text stay apart: a merge
        would either raise the claim or lower the statement."""
        add(engine, "u1", "Works at Acme", source="external", embedding=E0)
        add(engine, "u1", "Works at Acme", embedding=E0)
        assert run(engine, settings, jobs=["compaction"])["actions"] == []

    def test_duplicates_of_two_scopes_do_not_merge(self, engine, settings):
        """'Deadline is Friday' in project alpha and in project beta are two facts, read apart
        (memory_gc_current by scope): they are not merged into one record of no scope."""
        add(engine, "u1", "Deadline is Friday", scope="alpha", embedding=E0)
        add(engine, "u1", "Deadline is Friday", scope="beta", embedding=E0)
        before = snapshot(engine)
        assert run(engine, settings, jobs=["compaction"])["actions"] == []
        assert snapshot(engine) == before

    @pytest.mark.parametrize(("a", "b"), NEAR_MISSES)
    def test_near_miss_pairs_never_merge_offline(self, engine, settings, a, b):
        """Near-miss pairs with near-identical embeddings are deferred, never merged."""
        first = add(engine, "u1", a, created_at=days_ago(3), embedding=E0)
        second = add(engine, "u1", b, created_at=days_ago(2), embedding=at_similarity(0.99))
        before = snapshot(engine)
        report = run(engine, settings, jobs=["compaction"])
        assert snapshot(engine) == before
        [deferred] = report["actions"]
        assert deferred["action"] == "deferred" and deferred["reason"] == "near_miss"
        assert set(deferred["details"]["memory_ids"]) == {str(first), str(second)}
        assert deferred["details"]["near_misses"][0]["reasons"]

    def test_deferred_groups_render_for_people(self, engine, settings):
        """The Markdown and HTML reports list a deferred group with its member ids."""
        first = add(engine, "u1", NEAR_MISSES[0][0], embedding=E0)
        add(engine, "u1", NEAR_MISSES[0][1], embedding=E0)
        report = run(engine, settings, jobs=["compaction"])
        for fmt in ("md", "html"):
            assert str(first)[:8] in render.render(report, fmt)

    def test_purging_a_member_scrubs_the_deferred_group_preview(self, engine, settings):
        """A deferred group's audit row (no memory_id of its own) previews a member's text;
        when the members are purged, that preview goes with them."""
        first = add(engine, "u1", "secret: owes Bob 500", created_at=days_ago(3), embedding=E0)
        second = add(engine, "u1", "secret: owes Bob 50", created_at=days_ago(2),
                     embedding=at_similarity(0.99))  # fmt: skip
        [deferred] = run(engine, settings, jobs=["compaction"])["actions"]
        assert deferred["memory_id"] is None and "secret" in deferred["details"]["content"]
        execute(engine, "UPDATE memories SET status = 'deleted', status_reason = 'ttl_expired',"
                " deleted_at = :at, status_changed_at = :at WHERE id IN (:a, :b)",
                at=days_ago(400), a=first, b=second)  # fmt: skip
        purged = run(engine, settings, jobs=["hard_delete"])
        assert {a["memory_id"] for a in purged["actions"]} == {str(first), str(second)}
        assert (
            count(engine, "SELECT count(*) FROM gc_actions WHERE content_preview LIKE '%secret%'")
            == 0
        )

    def test_paraphrases_are_deferred_as_one_group(self, engine, settings):
        """A group needing the LLM is one deferred action listing every member."""
        ids = {add(engine, "u1", text, embedding=at_similarity(s, axis))
               for text, s, axis in [("Likes tea", 1.0, 1), ("Enjoys tea", 0.95, 1),
                                     ("Tea lover", 0.95, 2)]}  # fmt: skip
        report = run(engine, settings, jobs=["compaction"])
        assert [a["action"] for a in report["actions"]] == ["deferred"]
        assert {UUID(m) for m in report["actions"][0]["details"]["memory_ids"]} == ids

    def test_pinned_rows_are_untouched(self, engine, settings):
        """A pinned exact duplicate is neither merged nor grouped."""
        pinned = add(engine, "u1", "Has a dog", embedding=E0, pinned=True)
        add(engine, "u1", "Has a dog", embedding=E0)
        report = run(engine, settings, jobs=["compaction"])
        assert report["totals"]["actions"] == 0
        assert status(engine, pinned) == "active"

    def test_no_action_spans_two_users(self, engine, settings):
        """The same text for two users gives one merge per user, each inside its user."""
        for user in ("u1", "u2"):
            for _ in range(2):
                add(engine, user, "Has a dog", embedding=E0)
        report = run(engine, settings, jobs=["compaction"])
        groups: dict[str, set[str]] = {}
        for action in report["actions"]:
            groups.setdefault(action["details"]["group"], set()).add(action["user_id"])
        assert len(groups) == 2 and all(len(users) == 1 for users in groups.values())

    def test_rows_with_validity_supersedes_or_open_reviews_are_left_out(self, engine, settings):
        """Bounded rows, overrides, their targets and rows under review are not compacted."""
        target = add(engine, "u1", "Has a dog", embedding=E0)
        add(engine, "u1", "Has a dog", embedding=E0, supersedes=[target])
        add(engine, "u1", "Has a dog", embedding=E0, valid_until=NOW + timedelta(days=1))
        reviewed = add(engine, "u1", "Has a dog", embedding=E0)
        lonely = add(engine, "u1", "Has a dog", embedding=E0)
        execute(engine, "INSERT INTO gc_review_items (user_id, kind, memory_ids, reason) "
                "VALUES ('u1', 'contradiction', ARRAY[CAST(:a AS uuid), :b], 'x')",
                a=reviewed, b=lonely)  # fmt: skip
        report = run(engine, settings, jobs=["compaction"])
        assert report["totals"]["actions"] == 0

    def test_threshold_in_the_database(self, engine, settings):
        """Stored as float32, a pair at 0.8501 is still a group and one at 0.8499 is not."""
        add(engine, "u1", "a", embedding=E0)
        add(engine, "u1", "b", embedding=at_similarity(0.8501))
        add(engine, "u2", "a", embedding=E0)
        add(engine, "u2", "b", embedding=at_similarity(0.8499))
        report = run(engine, settings, jobs=["compaction"])
        assert {a["user_id"] for a in report["actions"]} == {"u1"}

    def test_unusable_embeddings_are_counted_in_the_report(self, engine, settings):
        """A zero vector is skipped and reported under jobs.compaction.skipped."""
        add(engine, "u1", "zero", embedding=[0.0] * TEST_DIM)
        report = run(engine, settings, jobs=["compaction"])
        assert report["jobs"]["compaction"]["skipped"] == 1

    def test_merged_record_is_not_merged_again(self, engine, settings):
        """After a merge, a new duplicate of the merged text is left alone at depth 1."""
        for _ in range(2):
            add(engine, "u1", "Has a dog", embedding=E0, created_at=days_ago(5))
        run(engine, settings, jobs=["compaction"])
        add(engine, "u1", "Has a dog", embedding=E0)
        again = run(engine, settings, jobs=["compaction"])
        assert again["totals"]["actions"] == 0
        deeper = Settings(
            embeddings=EmbeddingSettings(dim=TEST_DIM),
            compaction=CompactionSettings(max_merge_depth=2),
        )
        assert run(engine, deeper, jobs=["compaction"])["totals"]["by_action"]["merge"] == 2

    def test_dry_run_then_apply_equals(self, engine, settings):
        """Applying a dry run's plan performs exactly the planned actions, same new id."""
        for _ in range(3):
            add(engine, "u1", "Has a dog", embedding=E0)
        add(engine, "u1", "English level is B1", embedding=unit(1.0))
        add(engine, "u1", "English level is B2", embedding=unit(1.0))
        before = snapshot(engine)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        assert snapshot(engine) == before
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert sorted(map(action_key, applied["actions"])) == sorted(
            map(action_key, plan["actions"])
        )
        assert len(plan["actions"]) == 5  # create_merged + 3 merges + the deferred near-miss

    def test_a_merge_can_be_restored(self, engine, settings):
        """Restoring the merged record brings the members back and retires the record."""
        ids = [add(engine, "u1", "Has a dog", embedding=E0) for _ in range(2)]
        report = run(engine, settings, jobs=["compaction"])
        new_id = UUID(report["actions"][0]["memory_id"])
        restore.restore_memory(engine, new_id)
        assert [status(engine, m) for m in ids] == ["active", "active"]
        assert status(engine, new_id) == "deleted"

    def test_a_merge_whose_members_were_purged_is_kept_by_a_restore(self, engine, settings):
        """Once history retention purged the members, the merged record is the only copy of
        what they said: restoring the merge run leaves it on the read path (it used to retire
        it, and the user lost the fact)."""
        ids = [add(engine, "u1", "Has a dog", embedding=E0) for _ in range(2)]
        report = run(engine, settings, jobs=["compaction"])
        new_id = UUID(report["actions"][0]["memory_id"])
        later = run(engine, settings, jobs=["hard_delete"], now=NOW + timedelta(days=366))
        assert acted_on(later, "hard_delete") == {str(m) for m in ids}
        result = restore.restore_run(engine, UUID(report["run_id"]))
        assert result.restored == [] and status(engine, new_id) == "active"
        assert set(result.not_restorable) == {*ids, new_id}


def test_a_row_whose_metadata_is_not_an_object_is_merged(engine, settings):
    """metadata is `jsonb NOT NULL` in the contract, which a JSON array or string satisfies
    (an adopted store may hold `["pets"]`): compaction's depth check called .get on it and
    failed the batch, every night, for every user of it (a review found it)."""
    keep = add(engine, "u1", "Has a dog", created_at=days_ago(30), embedding=E0,
               metadata='["pets"]')  # fmt: skip
    twin = add(engine, "u1", "Has a dog", created_at=days_ago(20), embedding=E0,
               metadata='"tagged"')  # fmt: skip
    report = run(engine, settings, jobs=["compaction"])
    assert report["totals"]["by_action"].get("create_merged") == 1
    assert status(engine, keep) == status(engine, twin) == "merged"


class TestAPartitionTooLargeToGroupAtOnce:
    """The similarity matrices of one partition grow with its rows squared (5,000 rows: 1.2 GB;
    20,000 would need 15 GB): a user with that many near-copies killed the worker at every
    night's batch, and user_cap after compaction never ran for them. Only the newest
    MAX_CLUSTER_ROWS of a partition are grouped in one run; the rest wait, counted in skipped."""

    def test_only_the_newest_rows_are_grouped_and_the_rest_counted(self, monkeypatch):
        import jobs.compaction as compaction

        monkeypatch.setattr(compaction, "MAX_CLUSTER_ROWS", 4)
        rows = [row(f"Likes tea, take {i}", at_similarity(0.99 - i * 1e-4),
                    created_at=days_ago(10 - i)) for i in range(6)]  # fmt: skip
        groups, skipped = groups_of(rows)
        grouped = {member.id for group in groups for member in group}
        assert grouped and grouped <= {r.id for r in rows[2:]}  # the four newest
        assert skipped == 2

    def test_a_partition_at_the_limit_is_grouped_whole(self, monkeypatch):
        import jobs.compaction as compaction

        monkeypatch.setattr(compaction, "MAX_CLUSTER_ROWS", 6)
        rows = [row(f"Likes tea, take {i}", at_similarity(0.99 - i * 1e-4),
                    created_at=days_ago(10 - i)) for i in range(6)]  # fmt: skip
        groups, skipped = groups_of(rows)
        assert skipped == 0 and {m.id for g in groups for m in g} == {r.id for r in rows}
