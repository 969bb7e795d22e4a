"""contradiction: deterministic rules, trust, overrides, validity, and offline deferral."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from uuid import UUID, uuid4

import pytest

from gc_worker import engine as gc_engine
from gc_worker.actions import Kind
from gc_worker.report import build_report
from jobs.contradiction import plan_contradiction
from jobs.contradiction_rules import (
    Pair,
    close_at,
    decide,
    declared_pairs,
    ordered,
    slot_pairs,
)
from tests.conftest import TEST_DIM
from tests.store import NOW, add, days_ago, execute, get, run, snapshot, status
from tests.test_compaction import E0, NEAR_MISSES, at_similarity, unit
from tests.test_llm_guards import Model, contradicts

# two ids in both orders: with rows that tie in time, only the id could say which is "newer"
ID_ORDERS = [(UUID(int=1), UUID(int=2)), (UUID(int=2), UUID(int=1))]


def row(content="x", **fields):
    values = {
        "id": uuid4(), "user_id": "u1", "row_version": 1, "preview": content, "content": content,
        "embedding": None, "slot": None, "supersedes": [], "pinned": False, "trust": 3,
        "valid_from": None, "valid_until": None, "observed_at": NOW, "created_at": NOW,
    }  # fmt: skip
    return SimpleNamespace(**(values | fields))


def reviews(engine) -> list[tuple[str, list[UUID]]]:
    rows = execute(engine, "SELECT reason, memory_ids FROM gc_review_items ORDER BY id")
    return [(r.reason, list(r.memory_ids)) for r in rows]


def changes(report) -> list[tuple[str, str, str]]:
    return [(a["action"], a["memory_id"], a["reason"]) for a in report["actions"]]


class TestRules:
    def test_declarer_wins_even_when_older(self):
        """A declared supersedes makes the declarer the winner."""
        target = row("new", observed_at=days_ago(1))
        declarer = row("old", observed_at=days_ago(5), supersedes=[target.id])
        [pair] = declared_pairs([target, declarer])
        assert pair.winner is declarer and pair.loser is target

    def test_declarations_across_users_are_ignored(self):
        """A supersedes naming another user's memory is not a pair."""
        target = row(user_id="u2")
        assert declared_pairs([target, row(supersedes=[target.id])]) == []

    def test_a_slot_holds_one_value_per_user_across_scopes(self):
        """The contract: at most one current memory per (user_id, slot). "Level B1" noted in
        onboarding and "Level B2" in lessons are one slot: the older loses (scopes are topic
        areas, not separate slots; per-project values need per-project slot keys)."""
        b1 = row("English level is B1", slot="english", scope="onboarding", observed_at=days_ago(5))
        b2 = row("English level is B2", slot="english", scope="lessons", observed_at=days_ago(1))
        assert [(p.winner, p.loser) for p in slot_pairs([b1, b2])] == [(b2, b1)]
        other_user = row("English level is C1", slot="english", user_id="u2")
        assert [(p.winner, p.loser) for p in slot_pairs([b1, b2, other_user])] == [(b2, b1)]

    def test_slot_holder_is_newest_of_the_most_trusted(self):
        """Older rows lose to the holder; a newer, less trusted row is a review."""
        old = row("old", slot="s", observed_at=days_ago(9))
        holder = row("holder", slot="s", observed_at=days_ago(5))
        newer_inference = row("inferred", slot="s", observed_at=days_ago(1), trust=2)
        bounded = row("bounded", slot="s", valid_until=NOW + timedelta(days=1))
        pairs = slot_pairs([old, holder, newer_inference, bounded])
        assert [(p.winner.content, p.loser.content) for p in pairs] == [
            ("holder", "old"),
            ("inferred", "holder"),
        ]
        assert decide(pairs[0], now=NOW).action is Kind.OBSOLETE
        assert decide(pairs[1], now=NOW).action is Kind.REVIEW

    def test_temporary_override_and_future_winner_do_nothing(self):
        """A winner with valid_until, or not yet in effect, changes nothing."""
        older = row("older", observed_at=days_ago(9))
        override = row("o", observed_at=days_ago(1), valid_until=NOW + timedelta(days=1))
        future = row("f", observed_at=days_ago(1), valid_from=NOW + timedelta(seconds=1))
        at_now = row("n", observed_at=days_ago(1), valid_from=NOW)
        assert decide(Pair(older, override, override, "declared"), now=NOW) is None
        assert decide(Pair(older, future, future, "declared"), now=NOW) is None
        assert decide(Pair(older, at_now, at_now, "declared"), now=NOW).action is Kind.OBSOLETE

    def test_pinned_loser_is_a_review(self):
        """A pinned loser is never obsoleted; a person is asked instead."""
        older, newer = row(pinned=True, observed_at=days_ago(2)), row()
        action = decide(Pair(older, newer, newer, "slot"), now=NOW)
        assert (action.action, action.reason) == (Kind.REVIEW, "pinned")

    @pytest.mark.parametrize(
        ("winner_trust", "loser_trust", "kind"),
        [(3, 3, Kind.OBSOLETE), (2, 3, Kind.REVIEW), (3, 1, Kind.OBSOLETE), (1, 2, Kind.REVIEW)],
    )
    def test_trust_order(self, winner_trust, loser_trust, kind):
        """The winner must be at least as trusted as the loser."""
        older, newer = row(trust=loser_trust, observed_at=days_ago(2)), row(trust=winner_trust)
        assert decide(Pair(older, newer, newer, "slot"), now=NOW).action is kind

    def test_close_at_keeps_an_earlier_end(self):
        """The loser's valid_until closes at the winner's start unless it already ends sooner."""
        winner = row(valid_from=days_ago(1))
        assert close_at(row(), winner) == days_ago(1)
        assert close_at(row(valid_until=days_ago(2)), winner) is None
        assert close_at(row(valid_until=NOW), winner) == days_ago(1)


class TestATieHasNoNewerFact:
    """Rows that tie on start, observed_at and created_at (written in one request) have no
    newer fact: no slot or similar pair of them is decided, whatever their ids."""

    @pytest.mark.parametrize("basis", ["slot", "similar"])
    @pytest.mark.parametrize("ids", ID_ORDERS)
    def test_a_tied_pair_is_a_review_and_a_microsecond_later_is_newer(self, basis, ids):
        """A full tie is a no_newer review proposing no winner, in both id orders; a
        created_at one microsecond later makes that row newer, and it wins."""
        paris = row("Lives in Paris", id=ids[0])
        berlin = row("Lives in Berlin", id=ids[1])
        older, newer = ordered(paris, berlin)
        action = decide(Pair(older, newer, newer, basis), now=NOW)
        assert (action.action, action.reason) == (Kind.REVIEW, "no_newer")
        assert "proposed_winner" not in action.details
        later = row("Lives in Berlin", id=ids[1], created_at=NOW + timedelta(microseconds=1))
        action = decide(Pair(paris, later, later, basis), now=NOW)
        assert (action.action, action.memory_id) == (Kind.OBSOLETE, paris.id)

    def test_a_declared_pair_is_decided_as_declared(self):
        """A supersedes is explicit: the declarer wins a tie in time."""
        target = row("Lives in Paris", id=UUID(int=2))
        declarer = row("Lives in Berlin", id=UUID(int=1), supersedes=[target.id])
        [pair] = declared_pairs([target, declarer])
        action = decide(pair, now=NOW)
        assert (action.action, action.memory_id) == (Kind.OBSOLETE, target.id)

    @pytest.mark.parametrize("ids", ID_ORDERS)
    def test_a_tied_slot_is_a_review_whatever_the_trust(self, ids):
        """Two values of a slot written together, one a model inference: a no_newer review in
        both id orders (it was an obsolete or a lower_trust review, by id)."""
        said = row("Diet: vegetarian", slot="diet", id=ids[0])
        inferred = row("Diet: vegan", slot="diet", id=ids[1], trust=2)
        [pair] = slot_pairs([said, inferred])
        assert decide(pair, now=NOW).reason == "no_newer"

    @pytest.mark.parametrize("ids", ID_ORDERS)
    def test_the_model_saying_contradicts_queues_a_review(self, engine, settings, make_llm, ids):
        """Two similar facts written together that the model says contradict: both stay
        active and one no_newer review is queued, whichever id is higher (the id-"older" one
        was obsoleted with valid_until at its own start, gone from reads of the past too)."""
        when = days_ago(3)
        paris = add(engine, "u1", "Lives in Paris", id=ids[0], created_at=when, embedding=E0)
        berlin = add(engine, "u1", "Lives in Berlin", id=ids[1], created_at=when,
                     embedding=at_similarity(0.9))  # fmt: skip
        before = snapshot(engine)
        report = run(engine, settings, jobs=["contradiction"], llm=make_llm(Model(contradicts)))
        assert [(a["action"], a["reason"]) for a in report["actions"]] == [("review", "no_newer")]
        assert snapshot(engine) == before
        assert reviews(engine) == [("no_newer", sorted([paris, berlin], key=str))]

    def test_a_tied_slot_is_queued_once_and_nothing_changes(self, engine, settings):
        """Two values of one slot written together: one review, nothing changes, and the next
        run queues no second one."""
        add(engine, "u1", "Timezone: CET", slot="tz", created_at=days_ago(2))
        add(engine, "u1", "Timezone: EST", slot="tz", created_at=days_ago(2))
        before = snapshot(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert [(a["action"], a["reason"]) for a in report["actions"]] == [("review", "no_newer")]
        assert snapshot(engine) == before
        assert run(engine, settings, jobs=["contradiction"])["totals"]["actions"] == 0


class TestValidityEnded:
    def test_just_inside_and_just_outside(self, engine, settings):
        """valid_until == now is ended; one second later is not; pinned rows are kept."""
        ended = add(engine, "u1", "ended", created_at=days_ago(9), valid_until=NOW)
        running = add(engine, "u1", "running", created_at=days_ago(9),
                      valid_until=NOW + timedelta(seconds=1))  # fmt: skip
        pinned = add(engine, "u1", "pinned", created_at=days_ago(9), valid_until=NOW,
                     pinned=True)  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("obsolete", str(ended), "validity_ended")]
        assert status(engine, running) == status(engine, pinned) == "active"


class TestDeterministic:
    def test_same_slot_newer_wins_and_closes_the_window(self, engine, settings):
        """The newer slot value obsoletes the older and closes its validity at the newer's start."""
        old = add(engine, "u1", "English level is B1", slot="english", created_at=days_ago(90))
        new = add(engine, "u1", "English level is B2", slot="english", created_at=days_ago(5),
                  valid_from=days_ago(6))  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("obsolete", str(old), "slot_replaced")]
        stored = get(engine, old)
        assert stored["superseded_by"] == new and stored["valid_until"] == days_ago(6)
        assert stored["status"] == "obsolete" and status(engine, new) == "active"

    def test_lower_trust_newer_queues_one_review(self, engine, settings):
        """A newer model inference does not obsolete a user statement; one review, not two."""
        said = add(engine, "u1", "Diet: vegetarian", slot="diet", created_at=days_ago(90))
        inferred = add(engine, "u1", "Diet: vegan", slot="diet", created_at=days_ago(1),
                       source="model_inference")  # fmt: skip
        before = snapshot(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("review", str(said), "lower_trust")]
        assert snapshot(engine) == before
        assert reviews(engine) == [("lower_trust", [said, inferred])]
        again = run(engine, settings, jobs=["contradiction"])
        assert again["totals"]["actions"] == 0 and len(reviews(engine)) == 1

    def test_declared_supersedes(self, engine, settings):
        """A permanent declared replacement obsoletes its target."""
        target = add(engine, "u1", "Works at Acme", created_at=days_ago(40))
        declarer = add(engine, "u1", "Works at Globex now", created_at=days_ago(2),
                       supersedes=[target])  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("obsolete", str(target), "superseded")]
        assert get(engine, target)["superseded_by"] == declarer

    def test_merged_record_counts_as_its_best_member(self, engine, settings):
        """A gc_merge record whose best member was a user statement beats an inference."""
        merged = add(
            engine,
            "u1",
            "Lives in Lyon",
            slot="home",
            created_at=days_ago(5),
            source="gc_merge",
            metadata='{"trust_source": "explicit_user_statement"}',
        )
        inferred = add(engine, "u1", "Lives in Nice", slot="home", created_at=days_ago(30),
                       source="model_inference")  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("obsolete", str(inferred), "slot_replaced")]
        assert status(engine, merged) == "active"

    def test_pinned_loser_is_queued_for_review(self, engine, settings):
        """The older, pinned slot value stays; a review is queued."""
        pinned = add(engine, "u1", "Timezone: CET", slot="tz", created_at=days_ago(50),
                     pinned=True)  # fmt: skip
        add(engine, "u1", "Timezone: EST", slot="tz", created_at=days_ago(1))
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("review", str(pinned), "pinned")]
        assert status(engine, pinned) == "active"

    def test_dry_run_then_apply_equals(self, engine, settings):
        """Applying the dry run's plan does exactly what it listed."""
        add(engine, "u1", "A", slot="s", created_at=days_ago(9))
        add(engine, "u1", "B", slot="s", created_at=days_ago(1))
        add(engine, "u1", "C", created_at=days_ago(9), valid_until=days_ago(1))
        before = snapshot(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        assert snapshot(engine) == before and len(plan["actions"]) == 2
        with engine.connect() as conn:
            applied = build_report(conn, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert changes(applied) == changes(plan)


class TestOffline:
    @pytest.mark.parametrize(("a", "b"), NEAR_MISSES)
    def test_near_miss_pairs_are_deferred_not_obsoleted(self, engine, settings, a, b):
        """Similar near-miss pairs wait for the LLM: zero obsoletes offline."""
        first = add(engine, "u1", a, created_at=days_ago(3), embedding=E0)
        second = add(engine, "u1", b, created_at=days_ago(2), embedding=at_similarity(0.99))
        before = snapshot(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert snapshot(engine) == before
        [deferred] = report["actions"]
        assert (deferred["action"], deferred["reason"]) == ("deferred", "llm_unavailable")
        assert deferred["details"]["memory_ids"] == [str(first), str(second)]

    def test_similarity_threshold_inside_and_outside(self, engine, settings):
        """At 0.7501 a pair is a candidate, at 0.7499 it is not."""
        add(engine, "u1", "a", embedding=E0, created_at=days_ago(2))
        add(engine, "u1", "b", embedding=at_similarity(0.7501))
        add(engine, "u2", "a", embedding=E0, created_at=days_ago(2))
        add(engine, "u2", "b", embedding=at_similarity(0.7499))
        report = run(engine, settings, jobs=["contradiction"])
        assert [a["user_id"] for a in report["actions"]] == ["u1"]

    def test_pairs_the_llm_could_not_change_are_not_listed(self, engine, settings):
        """Exact duplicates (compaction's) and a newer temporary override are not candidates."""
        add(engine, "u1", "Has a dog", embedding=E0, created_at=days_ago(3))
        add(engine, "u1", "has a dog.", embedding=E0, created_at=days_ago(2))
        add(engine, "u2", "No evening meetings", embedding=E0, created_at=days_ago(9))
        add(engine, "u2", "Evening meetings fine", embedding=unit(0.1), created_at=days_ago(1),
            valid_until=NOW + timedelta(days=3))  # fmt: skip
        assert run(engine, settings, jobs=["contradiction"])["totals"]["actions"] == 0

    def test_unusable_embeddings_are_counted(self, engine, settings):
        """A zero vector is reported as skipped."""
        add(engine, "u1", "zero", embedding=[0.0] * len(E0))
        assert (
            run(engine, settings, jobs=["contradiction"])["jobs"]["contradiction"]["skipped"] == 1
        )

    def test_pairs_over_the_per_memory_limit_are_counted(self, engine, settings):
        """Four near-copies (6 similar pairs) with max_pairs_per_memory = 1: two disjoint pairs
        are asked (offline: deferred), the other four are counted in not_asked."""
        for i, text in enumerate(["Lives in Rome", "Lives in Milan", "Lives in Turin",
                                  "Lives in Genoa"]):  # fmt: skip
            add(engine, "u1", text, embedding=at_similarity(1.0 - i * 0.01))
        limited = settings.model_copy(
            update={"contradiction": settings.contradiction.model_copy(
                update={"max_pairs_per_memory": 1})}
        )  # fmt: skip
        report = run(engine, limited, jobs=["contradiction"])
        assert [a["action"] for a in report["actions"]] == ["deferred", "deferred"]
        assert report["jobs"]["contradiction"]["not_asked"] == 4


class TestScopes:
    def test_pairs_of_two_scopes_are_not_judged(self, engine, settings):
        """Similar rows of two scopes are read apart (memory_gc_current), so the model is not
        asked whether they contradict, and nothing changes."""
        from tests.fake_model import FakeModel, fake_port

        add(engine, "u1", "Deadline is Friday", scope="alpha", embedding=E0)
        add(engine, "u1", "Deadline is Monday", scope="beta", embedding=at_similarity(0.95))
        model = FakeModel("good")
        before = snapshot(engine)
        with fake_port(engine, settings, model) as llm:
            report = run(engine, settings, jobs=["contradiction"], llm=llm)
        assert report["actions"] == [] and sum(model.calls.values()) == 0
        assert snapshot(engine) == before


FRIDAY, MONDAY = "Project deadline is Friday", "Project deadline is Monday"


def asked_about(rows, **options) -> tuple[list[tuple[str, str]], int]:
    """The (older, newer) texts put to the model, and the pairs the quota kept from it."""
    asked = []

    def judge(older, newer):
        asked.append((older.content, newer.content))

    _, _, not_asked = plan_contradiction(rows, now=NOW, similarity=0.75, dim=TEST_DIM,
                                         judge=judge, **options)  # fmt: skip
    return asked, not_asked


class TestTheQuotaCountsOnlyPairsThatWouldBeAsked:
    """max_pairs_per_memory is applied after the pairs never asked about are dropped."""

    @pytest.mark.parametrize(
        ("copy", "scope", "reviewed", "not_asked"),
        [
            (FRIDAY, "beta", False, 0),  # another scope: never asked
            ("project deadline is friday.", "alpha", False, 1),  # an exact duplicate
            ("Project deadline is Sunday", "alpha", True, 1),  # a pair with an open review
        ],
        ids=["another_scope", "exact_duplicate", "open_review"],
    )
    def test_a_never_asked_near_copy_does_not_use_up_the_quota(
        self, copy, scope, reviewed, not_asked
    ):
        """With a quota of 1, a near-copy of the old deadline whose pair with it is never asked
        (cosine ~1, so first in line) used to fill the old row's quota, and the real change
        (cosine 0.9) was never asked about. It is asked now; the copy's own askable pair with
        the new row is still cut by the quota and counted in not_asked."""
        old = row(FRIDAY, scope="alpha", observed_at=days_ago(30), embedding=E0)
        near = row(copy, scope=scope, observed_at=days_ago(29), embedding=unit(0.001, axis=2))
        new = row(MONDAY, scope="alpha", observed_at=days_ago(1), embedding=at_similarity(0.9))
        blocked = {frozenset((old.id, near.id))} if reviewed else set()
        asked = asked_about([old, near, new], max_pairs_per_memory=1, blocked=blocked)
        assert asked == ([(FRIDAY, MONDAY)], not_asked)

    def test_a_deadline_change_is_judged_although_other_projects_share_the_old_text(
        self, engine, settings, make_llm
    ):
        """Four projects whose deadline is "Friday" (six cross-scope pairs at cosine ~1, never
        asked) no longer fill the default quota of 3: the change in project alpha is asked
        about and decided in the first run, and nothing counts as not asked."""
        old = add(engine, "u1", FRIDAY, scope="alpha", created_at=days_ago(30), embedding=E0)
        for i, scope in enumerate(["beta", "gamma", "delta"]):
            add(engine, "u1", FRIDAY, scope=scope, created_at=days_ago(29 - i),
                embedding=unit(0.001 * (i + 1)))  # fmt: skip
        new = add(engine, "u1", MONDAY, scope="alpha", created_at=days_ago(1),
                  embedding=at_similarity(0.9))  # fmt: skip
        server = Model(contradicts)
        report = run(engine, settings, jobs=["contradiction"], llm=make_llm(server))
        assert server.chat_requests() == 1 and report["jobs"]["contradiction"]["not_asked"] == 0
        assert changes(report) == [("obsolete", str(old), "contradicted")]
        assert status(engine, new) == "active"


class TestNearestPairs:
    def test_each_memory_joins_at_most_limit_pairs(self):
        """With a limit of 1, a clique of four yields its two most similar disjoint pairs."""
        from jobs.contradiction import nearest_pairs

        pairs = [("a", "b", 0.99), ("a", "c", 0.98), ("c", "d", 0.97), ("b", "d", 0.96)]
        assert nearest_pairs(pairs, 1) == [("a", "b", 0.99), ("c", "d", 0.97)]

    def test_limit_bounds_calls_linearly(self):
        """n near-copies with limit k give at most n·k/2 pairs; no limit gives all n(n−1)/2."""
        from itertools import combinations

        from jobs.contradiction import nearest_pairs

        ids = list(range(20))
        pairs = [(a, b, 1.0 - (a + b) / 100) for a, b in combinations(ids, 2)]
        assert len(nearest_pairs(pairs, 3)) <= 20 * 3 // 2
        assert len(nearest_pairs(pairs, None)) == 190
