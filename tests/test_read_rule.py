"""The read rule (memory_gc_current / current_memories): validity, overrides, slots, known_at."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from gc_worker.read_rule import SUPERSESSION_REASONS, current_memories
from jobs.contradiction_rules import REASONS, VALIDITY_ENDED
from tests.store import NOW, add, days_ago, execute, run, status

WEEK_START = NOW - timedelta(days=1)
DURING_WEEK = WEEK_START + timedelta(days=2)
AFTER_WEEK = WEEK_START + timedelta(days=8)


def contents(engine, at, *, user="u1", scope=None, known_at=None) -> list[str]:
    return [m["content"] for m in current_memories(engine, user, scope, at, known_at)]


def seed_schedule(engine):
    """The issue's example: a long-standing rule and a one-week override that declares it."""
    original = add(
        engine, "u1", "No evening meetings", scope="scheduling", created_at=days_ago(100)
    )
    override = add(
        engine,
        "u1",
        "Evening meetings are fine this week",
        scope="scheduling",
        created_at=WEEK_START,
        valid_from=WEEK_START,
        valid_until=WEEK_START + timedelta(days=7),
        supersedes=[original],
    )
    return original, override


class TestSchedulingExample:
    def test_override_during_the_week_original_after(self, engine, settings):
        """In the week the override is current, after it the original; nothing is obsoleted."""
        original, override = seed_schedule(engine)
        report = run(engine, settings, jobs=["contradiction"], now=DURING_WEEK)
        assert report["totals"]["actions"] == 0
        assert status(engine, original) == status(engine, override) == "active"
        assert contents(engine, DURING_WEEK, scope="scheduling") == [
            "Evening meetings are fine this week"
        ]
        assert contents(engine, AFTER_WEEK, scope="scheduling") == ["No evening meetings"]

    def test_after_the_week_the_override_ends_and_history_stays(self, engine, settings):
        """A run after the week retires the override (validity_ended); the week still reads it."""
        original, override = seed_schedule(engine)
        report = run(engine, settings, jobs=["contradiction"], now=AFTER_WEEK)
        assert [(a["memory_id"], a["reason"]) for a in report["actions"]] == [
            (str(override), VALIDITY_ENDED)
        ]
        assert status(engine, original) == "active"
        assert contents(engine, AFTER_WEEK) == ["No evening meetings"]
        assert contents(engine, DURING_WEEK) == ["Evening meetings are fine this week"]

    def test_the_override_window_is_half_open(self, engine):
        """The override is current at its valid_from and no longer at its valid_until."""
        seed_schedule(engine)
        assert contents(engine, WEEK_START) == ["Evening meetings are fine this week"]
        end = WEEK_START + timedelta(days=7)
        assert contents(engine, end - timedelta(microseconds=1)) == [
            "Evening meetings are fine this week"
        ]
        assert contents(engine, end) == ["No evening meetings"]


class TestValidity:
    def test_valid_from_and_observed_at_start_the_window(self, engine):
        """A row is current from its valid_from, or from when it was observed."""
        add(engine, "u1", "explicit start", valid_from=NOW, created_at=days_ago(5))
        add(engine, "u1", "observed start", created_at=NOW)
        before = NOW - timedelta(microseconds=1)
        assert contents(engine, before) == []
        assert sorted(contents(engine, NOW)) == ["explicit start", "observed start"]

    def test_expired_rows_are_not_current(self, engine):
        """A TTL at `at` means expired; one microsecond later than `at` is still current."""
        add(engine, "u1", "expires now", created_at=days_ago(1), expires_at=NOW)
        later = NOW + timedelta(microseconds=1)
        add(engine, "u1", "expires later", created_at=days_ago(1), expires_at=later)
        assert contents(engine, NOW) == ["expires later"]

    def test_scope_filter_and_users_are_separate(self, engine):
        """Only the asked scope (None = all) and only the asked user."""
        add(engine, "u1", "work", scope="work", created_at=days_ago(1))
        add(engine, "u1", "home", scope="home", created_at=days_ago(1))
        add(engine, "u2", "other user", scope="work", created_at=days_ago(1))
        assert contents(engine, NOW, scope="work") == ["work"]
        assert sorted(contents(engine, NOW)) == ["home", "work"]

    def test_naive_datetimes_are_refused(self, engine):
        """`at` must carry a timezone."""
        with pytest.raises(ValueError, match="timezone"):
            current_memories(engine, "u1", None, NOW.replace(tzinfo=None))


class TestStatus:
    def test_deleted_and_merged_rows_are_never_current(self, engine):
        """Soft-deleted and merged rows stay off the read path; active rows show."""
        add(engine, "u1", "deleted", created_at=days_ago(3), status="deleted")
        add(engine, "u1", "merged", created_at=days_ago(3), status="merged")
        add(engine, "u1", "active", created_at=days_ago(3))
        assert contents(engine, NOW) == ["active"]

    def test_replaced_rows_stay_true_for_their_past(self, engine, settings):
        """A slot's replaced value is current before the replacement started, not after."""
        add(engine, "u1", "Lives in Berlin", slot="home", created_at=days_ago(300))
        add(engine, "u1", "Lives in Paris", slot="home", created_at=days_ago(10))
        run(engine, settings, jobs=["contradiction"])
        assert contents(engine, NOW) == ["Lives in Paris"]
        assert contents(engine, days_ago(11)) == ["Lives in Berlin"]

    def test_rejected_rows_are_never_current(self, engine):
        """An obsolete row with a reason that is not a supersession never shows."""
        add(engine, "u1", "wrong", created_at=days_ago(3), status="obsolete",
            status_reason="review_rejected")  # fmt: skip
        assert contents(engine, days_ago(1)) == []

    def test_every_supersession_reason_of_the_jobs_is_listed(self):
        """The reasons the jobs obsolete with are the ones the read rule treats as history."""
        assert {*REASONS.values(), VALIDITY_ENDED, "review_superseded"} == set(SUPERSESSION_REASONS)


class TestSlots:
    def test_one_current_value_per_slot(self, engine):
        """With two open-ended values of a slot, the newer is the one current."""
        add(engine, "u1", "English level is B1", slot="english", created_at=days_ago(90))
        add(engine, "u1", "English level is B2", slot="english", created_at=days_ago(5))
        assert contents(engine, NOW) == ["English level is B2"]

    def test_a_slot_holds_one_value_per_user_across_scopes(self, engine):
        """At most one current memory per (user_id, slot) (the contract; migration 0009 undid
        0008's per-scope ranking): an unscoped read shows the newest value of the slot,
        whatever scope it was noted in; a scoped read shows what of that is in its scope — the
        value replaced in another scope is not current in its own (migration 0012: a review
        found the scoped read showing it)."""
        add(engine, "u1", "English level is B1", slot="english", scope="onboarding")
        lessons = add(engine, "u1", "English level is B2", slot="english", scope="lessons",
                      observed_at=NOW + timedelta(seconds=1))  # fmt: skip
        at = NOW + timedelta(minutes=1)
        assert [r["id"] for r in current_memories(engine, "u1", None, at)] == [lessons]
        assert [r["id"] for r in current_memories(engine, "u1", "onboarding", at)] == []
        assert [r["id"] for r in current_memories(engine, "u1", "lessons", at)] == [lessons]

    def test_a_bounded_override_shadows_inside_its_window(self, engine):
        """A slot value with valid_until wins while valid, the open-ended one after."""
        add(engine, "u1", "Works from the office", slot="workplace", created_at=days_ago(90))
        add(engine, "u1", "Works from home this week", slot="workplace",
            created_at=days_ago(2), valid_until=NOW + timedelta(days=3))  # fmt: skip
        assert contents(engine, NOW) == ["Works from home this week"]
        assert contents(engine, NOW + timedelta(days=4)) == ["Works from the office"]

    def test_a_less_trusted_value_does_not_win_the_slot(self, engine):
        """A newer model inference does not displace what the user said."""
        add(engine, "u1", "Diet: vegetarian", slot="diet", created_at=days_ago(90))
        add(engine, "u1", "Diet: vegan", slot="diet", created_at=days_ago(1),
            source="model_inference")  # fmt: skip
        assert contents(engine, NOW) == ["Diet: vegetarian"]

    def test_a_less_trusted_override_does_not_shadow(self, engine):
        """A declared override from a less trusted source leaves the original current."""
        original = add(engine, "u1", "No calls on Sunday", created_at=days_ago(90))
        add(engine, "u1", "Calls on Sunday are fine", created_at=days_ago(1),
            source="external", supersedes=[original])  # fmt: skip
        assert sorted(contents(engine, NOW)) == ["Calls on Sunday are fine", "No calls on Sunday"]


class TestMutualDeclarations:
    """Two rows that each declare the other in `supersedes` (an application's mistake): the
    contradiction job leaves the pair to a person (a `declared_cycle` review) and changes
    nothing, but the read rule hid both rows, each shadowing the other: the fact was gone from
    the request path until the person came."""

    def test_rows_of_equal_trust_declaring_each_other_shadow_neither(self, engine):
        paris = add(engine, "u1", "Lives in Paris", created_at=days_ago(3))
        berlin = add(engine, "u1", "Lives in Berlin", created_at=days_ago(1), supersedes=[paris])
        execute(engine, "UPDATE memories SET supersedes = ARRAY[CAST(:b AS uuid)] WHERE id = :p",
                b=berlin, p=paris)  # fmt: skip
        assert sorted(contents(engine, NOW)) == ["Lives in Berlin", "Lives in Paris"]

    def test_in_one_slot_the_slot_ranks_them(self, engine):
        paris = add(engine, "u1", "City: Paris", slot="city", created_at=days_ago(3))
        add(engine, "u1", "City: Berlin", slot="city", created_at=days_ago(1), supersedes=[paris])
        execute(engine, "UPDATE memories SET supersedes = ARRAY(SELECT id FROM memories"
                " WHERE content = 'City: Berlin') WHERE id = :p", p=paris)  # fmt: skip
        assert contents(engine, NOW) == ["City: Berlin"]

    def test_a_more_trusted_declarer_still_replaces(self, engine):
        """Only declarations that would both take effect cancel: a less trusted row's
        declaration never shadows, so the more trusted one's stands."""
        said = add(engine, "u1", "No calls on Sunday", created_at=days_ago(90))
        guess = add(engine, "u1", "Calls on Sunday are fine", created_at=days_ago(1),
                    source="model_inference", supersedes=[said])  # fmt: skip
        execute(engine, "UPDATE memories SET supersedes = ARRAY[CAST(:g AS uuid)] WHERE id = :s",
                g=guess, s=said)  # fmt: skip
        assert contents(engine, NOW) == ["No calls on Sunday"]

    def test_a_declaration_back_from_a_row_no_longer_current_does_not_cancel(self, engine):
        old = add(engine, "u1", "Lives in Paris", created_at=days_ago(30))
        new = add(engine, "u1", "Lives in Berlin", created_at=days_ago(1), supersedes=[old])
        execute(engine, "UPDATE memories SET supersedes = ARRAY[CAST(:n AS uuid)],"
                " expires_at = :t WHERE id = :o", n=new, o=old, t=days_ago(2))  # fmt: skip
        assert contents(engine, NOW) == ["Lives in Berlin"]

    def test_migration_0018_round_trip(self, empty_database_url):
        from tests.conftest import check_round_trip

        count = (
            "SELECT count(*) FROM pg_proc WHERE proname = 'memory_gc_current'"
            " AND strpos(prosrc, 'bool_or(o.id < s.id)') > 0"
        )
        check_round_trip(empty_database_url, "0018", "0017", count, 1)


class TestKnownAt:
    def test_records_observed_later_are_unknown(self, engine):
        """With known_at, a record observed after it is not considered; at known_at it is."""
        add(engine, "u1", "old fact", created_at=days_ago(10))
        add(engine, "u1", "new fact", created_at=days_ago(2))
        assert contents(engine, NOW, known_at=days_ago(3)) == ["old fact"]
        assert sorted(contents(engine, NOW, known_at=days_ago(2))) == ["new fact", "old fact"]

    def test_status_changes_after_known_at_are_ignored(self, engine, settings):
        """Before the replacement was known, the replaced value read as current and open-ended."""
        add(engine, "u1", "Lives in Berlin", slot="home", created_at=days_ago(300))
        add(engine, "u1", "Lives in Paris", slot="home", created_at=days_ago(10))
        run(engine, settings, jobs=["contradiction"])
        assert contents(engine, NOW, known_at=days_ago(20)) == ["Lives in Berlin"]
        assert contents(engine, NOW, known_at=NOW) == ["Lives in Paris"]

    def test_a_merge_after_known_at_shows_the_members(self, engine, settings):
        """Rows merged after known_at read as they were; the merged record is not yet known."""
        vector = [1.0] + [0.0] * 7
        for _ in range(2):
            add(engine, "u1", "Has a dog", created_at=days_ago(30), embedding=vector)
        run(engine, settings, jobs=["compaction"])
        assert contents(engine, NOW) == ["Has a dog"]
        assert contents(engine, NOW, known_at=days_ago(1)) == ["Has a dog", "Has a dog"]


def _seed_user(engine, user: str, n: int) -> None:
    """n memories of one user; every other one declares the next one in `supersedes`."""
    execute(engine, """
        INSERT INTO memories (id, user_id, content, created_at, updated_at, observed_at)
        SELECT md5(:u || g)::uuid, :u, 'memory ' || g, :now - g * interval '1 minute',
               :now - g * interval '1 minute', :now - g * interval '1 minute'
        FROM generate_series(1, :n) g""", u=user, now=NOW, n=n)  # fmt: skip
    execute(engine, """
        UPDATE memories SET supersedes = ARRAY[md5(:u || (g + 1))::uuid]
        FROM generate_series(1, :n, 2) g WHERE id = md5(:u || g)::uuid""", u=user, n=n)  # fmt: skip


@pytest.mark.parametrize("case", ["known_at", "fresh_import"])
def test_no_plan_rescans_the_users_live_rows_per_row(engine, case):
    """Whatever the planner estimates — a read with known_at (its filters make the estimate
    1-3 rows), or a user imported since the last ANALYZE — no node of the read runs once per
    row: the first version of migration 0012 joined the live rows with themselves, and a
    small estimate made that a nested loop rescanning them per declaring row (loops=4000 for
    8,000 rows; a review found it). Shown by the plan's loop counters, not by a timing."""
    if case == "known_at":
        _seed_user(engine, "u1", 4000)
        execute(engine, "ANALYZE memories")
        known_at = NOW
    else:
        _seed_user(engine, "other", 1000)
        execute(engine, "ANALYZE memories")
        _seed_user(engine, "u1", 4000)
        known_at = None
    with engine.connect() as conn:
        plan = conn.execute(
            sa.text("EXPLAIN (ANALYZE, FORMAT JSON)"
                    " SELECT id FROM memory_gc_current('u1', NULL, :at, :k)"),
            {"at": NOW, "k": known_at},
        ).scalar_one()  # fmt: skip

    def rescans(node: dict) -> list[str]:  # a scan of the live rows run more than once
        looped = node["Node Type"] == "CTE Scan" and node.get("Actual Loops", 1) > 1
        own = [node.get("CTE Name", "?")] if looped else []
        return own + [n for child in node.get("Plans", ()) for n in rescans(child)]

    assert plan[0]["Plan"]["Actual Rows"] == 2000  # every declared row is shadowed
    assert rescans(plan[0]["Plan"]) == []


class TestKnownAtAfterAnEdit:
    def test_an_edited_merged_record_keeps_its_fact_in_reads_as_known_before_the_edit(
        self, engine, settings
    ):
        """Two duplicates merged; later the application corrects the merged record's text
        (updated_at = the edit). A read as known between the merge and the edit returned
        nothing: the members merged by then, the record counted from its updated_at (a review
        found it). It counts from the run that wrote it."""
        vector = [1.0] + [0.0] * 7
        for _ in range(2):
            add(engine, "u1", "Has a dog", created_at=days_ago(30), embedding=vector)
        run(engine, settings, jobs=["compaction"], now=days_ago(10))
        (merged,) = [r["id"] for r in current_memories(engine, "u1", None, NOW)]
        execute(engine, "UPDATE memories SET content = 'Has a dog named Rex', updated_at = :t"
                " WHERE id = :id", t=days_ago(2), id=merged)  # fmt: skip
        assert contents(engine, NOW, known_at=days_ago(5)) == ["Has a dog named Rex"]
        assert contents(engine, NOW, known_at=days_ago(20)) == ["Has a dog", "Has a dog"]


class TestTrustOrder:
    @pytest.mark.parametrize(
        ("source", "metadata", "rank"),
        [
            ("explicit_user_statement", "{}", 3),
            ("model_inference", "{}", 2),
            ("external", "{}", 1),
            ("something_else", "{}", 1),
            ("gc_merge", '{"trust_source": "explicit_user_statement"}', 3),
            ("gc_merge", '{"trust_source": "external"}', 1),
            ("gc_merge", "{}", 2),
        ],
    )
    def test_memory_gc_trust(self, engine, source, metadata, rank):
        """explicit > inference > external; a merge counts as its best member, else inference."""
        with engine.connect() as conn:
            got = conn.execute(
                sa.text("SELECT memory_gc_trust(:s, CAST(:m AS jsonb))"),
                {"s": source, "m": metadata},
            ).scalar()
        assert got == rank

    def test_sql_function_is_callable_from_the_request_path(self, engine):
        """The SQL function answers a plain SELECT with whole memories rows."""
        add(engine, "u1", "plain", created_at=days_ago(1))
        rows = execute(
            engine, "SELECT content, status FROM memory_gc_current('u1', NULL, :at, NULL)", at=NOW
        ).all()
        assert [tuple(r) for r in rows] == [("plain", "active")]


class TestScopesTiesAndScale:
    """Cases a review reproduced (each failed before migration 0012)."""

    def test_a_scoped_read_honours_an_override_declared_from_another_scope(self, engine, settings):
        """A temporary override without a scope that declares a 'scheduling' rule in
        `supersedes` hides it from the scoped read too, for the override's whole window (no
        run obsoletes what an override shadows): a scoped read is a subset of the unscoped."""
        original = add(engine, "u1", "No evening meetings", scope="scheduling",
                       created_at=days_ago(100))  # fmt: skip
        override = add(engine, "u1", "Evening meetings are fine this week",
                       created_at=days_ago(1), valid_from=days_ago(1),
                       valid_until=NOW + timedelta(days=6), supersedes=[original])  # fmt: skip
        run(engine, settings, jobs=["contradiction"])
        assert status(engine, original) == "active"
        assert [r["id"] for r in current_memories(engine, "u1", None, NOW)] == [override]
        assert current_memories(engine, "u1", "scheduling", NOW) == []
        later = NOW + timedelta(days=7)  # the window closed: the rule is back, in its scope
        assert [r["id"] for r in current_memories(engine, "u1", "scheduling", later)] == [original]

    def test_the_read_rule_and_the_contradiction_job_agree_on_a_tied_slot(self, engine, settings):
        """Two values of one slot written in one transaction (same start, observed_at and
        created_at): the read shows the one the contradiction job keeps, so what the
        application reads does not flip when the job runs."""
        from uuid import UUID

        low = UUID("00000000-0000-4000-8000-000000000001")
        high = UUID("ffffffff-ffff-4fff-bfff-ffffffffffff")
        t = days_ago(3)
        add(engine, "u1", "Timezone is CET", id=low, slot="tz", created_at=t)
        add(engine, "u1", "Timezone is PST", id=high, slot="tz", created_at=t)
        before = [r["id"] for r in current_memories(engine, "u1", None, NOW)]
        run(engine, settings, jobs=["contradiction"])
        after = [r["id"] for r in current_memories(engine, "u1", None, NOW)]
        assert before == after == [high]

    def test_a_later_created_row_wins_a_tie_of_start_and_observed_at(self, engine):
        """An adopted store whose observed_at was added with one default: the slot's newest
        row by created_at is shown (the contradiction job's order), not the lowest id."""
        from uuid import UUID

        stamp = days_ago(1)
        add(engine, "u1", "Lives in Paris", id=UUID("ffffffff-ffff-4fff-bfff-fffffffffff9"),
            slot="home", created_at=days_ago(30), observed_at=stamp)  # fmt: skip
        add(engine, "u1", "Lives in Berlin", id=UUID("00000000-0000-4000-8000-000000000009"),
            slot="home", created_at=days_ago(700), observed_at=stamp)  # fmt: skip
        assert contents(engine, NOW) == ["Lives in Paris"]

    def test_the_shadow_check_is_not_a_nested_loop_over_the_users_rows(self, engine):
        """A user with 3,000 live rows, none declaring `supersedes`: the shadow check was a
        nested-loop anti join of the user's rows with themselves (9 million comparisons;
        4.6 s at 8,000 rows). Shown by the plan's row counters, not by a timing."""
        execute(engine, """
            INSERT INTO memories (user_id, content, created_at, updated_at, observed_at)
            SELECT 'big', 'memory ' || g, now() - interval '30 days', now() - interval '30 days',
                   now() - interval '30 days' + g * interval '1 second'
            FROM generate_series(1, 3000) g""")  # fmt: skip
        execute(engine, "ANALYZE memories")
        with engine.connect() as conn:
            plan = conn.execute(sa.text(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM memory_gc_current('big', NULL,"
                " now(), NULL)"
            )).scalar_one()  # fmt: skip

        def removed(node: dict) -> int:  # rows every join compared and threw away
            own = int(node.get("Rows Removed by Join Filter", 0))
            return own + sum(removed(child) for child in node.get("Plans", ()))

        assert plan[0]["Plan"]["Actual Rows"] == 3000
        assert removed(plan[0]["Plan"]) < 30_000  # linear; the nested loop threw 9,000,000


class TestTheReadDoesNotFlipWhenTheJobRuns:
    """What the read returns for one question must not change when the contradiction job runs
    and nothing new was learnt (cases a differential review found; each failed before)."""

    def test_a_past_read_does_not_flip_when_the_job_closes_replaced_slot_values(
        self, engine, settings
    ):
        """Slot `workplace`, all from the user: an open value (30 days old), a bounded override
        (from 20 days ago, still running for 10 days), a newer open value (10 days old) and the
        newest open value (5 days old, the holder). Asked about 7 days ago, the read shows the
        override (a bounded override beats open-ended values). The contradiction job then
        obsoletes the two older open values (slot_replaced), closing their valid_until at the
        holder's start — and from then on the same question is answered with the 10-day-old value:
        the worker-written valid_until makes a replaced value rank as a "bounded override"."""
        add(engine, "u1", "Works from the office", slot="workplace", created_at=days_ago(30))
        override = add(engine, "u1", "Works from the beach until further notice", slot="workplace",
                       created_at=days_ago(20), valid_from=days_ago(20),
                       valid_until=days_ago(-10))  # fmt: skip
        replaced = add(engine, "u1", "Works from home", slot="workplace", created_at=days_ago(10))
        add(engine, "u1", "Works from the cafe", slot="workplace", created_at=days_ago(5))
        asked = days_ago(7)
        before = [r["content"] for r in current_memories(engine, "u1", None, asked)]
        assert before == ["Works from the beach until further notice"]
        run(engine, settings, jobs=["contradiction"])
        assert status(engine, replaced) == "obsolete"  # slot_replaced, valid_until = 5 days ago
        assert status(engine, override) == "active"  # still in its window: the job leaves it
        after = [r["content"] for r in current_memories(engine, "u1", None, asked)]
        assert after == before

    def test_shadowing_a_slots_holder_does_not_bring_back_the_value_it_replaced(
        self, engine, settings
    ):
        """Slot `city`: "Lives in Paris" (300 days old), then "Lives in Berlin" (10 days old); a
        temporary override without a slot, "Staying in Rome this month", declares Berlin in
        `supersedes`. The read shadows Berlin and then ranks the slot among what is left — so it
        shows Paris, the value Berlin replaced. Once the contradiction job runs it obsoletes Paris
        (slot_replaced, closed at Berlin's start) and the same read at the same instant no longer
        shows it: the read flips when the job runs."""
        paris = add(engine, "u1", "Lives in Paris", slot="city", created_at=days_ago(300))
        berlin = add(engine, "u1", "Lives in Berlin", slot="city", created_at=days_ago(10))
        add(engine, "u1", "Staying in Rome this month", created_at=days_ago(2),
            valid_from=days_ago(2), valid_until=days_ago(-28), supersedes=[berlin])  # fmt: skip
        at = days_ago(0)
        before = sorted(r["content"] for r in current_memories(engine, "u1", None, at))
        run(engine, settings, jobs=["contradiction"])
        assert status(engine, paris) == "obsolete"  # slot_replaced, closed at Berlin's start
        assert status(engine, berlin) == "active"  # an override shadows, it does not supersede
        after = sorted(r["content"] for r in current_memories(engine, "u1", None, at))
        assert after == ["Staying in Rome this month"]
        assert before == after
