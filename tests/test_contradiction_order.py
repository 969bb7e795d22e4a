"""contradiction: the outcome of one run does not depend on row ids or on a future row."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest

from gc_worker import engine as gc_engine
from gc_worker.report import build_report
from jobs.contradiction import plan_contradiction
from tests.store import NOW, add, days_ago, execute, get, run, snapshot, status
from tests.test_contradiction import changes, reviews, row

# three ids in an order and its reverse: rows are read and paired in id order
ID_ORDERS = [(UUID(int=1), UUID(int=2), UUID(int=3)), (UUID(int=3), UUID(int=2), UUID(int=1))]


class TestADeclaredChainIsDecidedWhole:
    @pytest.mark.parametrize("ids", ID_ORDERS)
    def test_every_replaced_version_is_closed_at_its_own_replacement(self, engine, settings, ids):
        """v2 supersedes v1 and v3 supersedes v2, written between two runs: v1 and v2 both
        become obsolete, each closed at its own declarer's start, whatever the ids (with v3's
        id below v2's, v2 lost first, v1 was never closed, and no later run saw v2's
        declaration again: two current versions for good)."""
        v1 = add(engine, "u1", "Works at Acme", id=ids[0], created_at=days_ago(3))
        v2 = add(engine, "u1", "Works at Globex", id=ids[1], created_at=days_ago(2),
                 supersedes=[v1])  # fmt: skip
        v3 = add(engine, "u1", "Works at Initech", id=ids[2], created_at=days_ago(1),
                 supersedes=[v2])  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"])
        assert sorted(changes(report)) == sorted(
            [("obsolete", str(v1), "superseded"), ("obsolete", str(v2), "superseded")]
        )
        assert (get(engine, v1)["superseded_by"], get(engine, v1)["valid_until"]) == (
            v2,
            days_ago(2),
        )
        assert (get(engine, v2)["superseded_by"], get(engine, v2)["valid_until"]) == (
            v3,
            days_ago(1),
        )
        assert status(engine, v3) == "active"

    @pytest.mark.parametrize("ids", ID_ORDERS)
    def test_two_rows_declaring_each_other_are_a_review(self, engine, settings, ids):
        """A supersedes B and B supersedes A: the declarations contradict each other, so no
        winner is guessed (the lower id won, here the older fact closing the newer one): one
        review proposing no winner, nothing changes, and the next run queues no second one."""
        paris = add(engine, "u1", "Lives in Paris", id=ids[0], created_at=days_ago(3))
        berlin = add(engine, "u1", "Lives in Berlin", id=ids[1], created_at=days_ago(1),
                     supersedes=[paris])  # fmt: skip
        execute(engine, "UPDATE memories SET supersedes = ARRAY[CAST(:b AS uuid)] WHERE id = :p",
                b=str(berlin), p=paris)  # fmt: skip
        before = snapshot(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert [(a["action"], a["reason"]) for a in report["actions"]] == [
            ("review", "declared_cycle")
        ]
        assert "proposed_winner" not in report["actions"][0]["details"]
        assert snapshot(engine) == before
        assert reviews(engine) == [("declared_cycle", [paris, berlin])]
        assert run(engine, settings, jobs=["contradiction"])["totals"]["actions"] == 0

    def test_a_cycle_of_three_changes_nothing(self, engine, settings):
        """A → B → C → A: no row of the cycle is closed."""
        a, b, c = UUID(int=1), UUID(int=2), UUID(int=3)
        add(engine, "u1", "Lives in Paris", id=a, created_at=days_ago(3), supersedes=[b])
        add(engine, "u1", "Lives in Berlin", id=b, created_at=days_ago(2), supersedes=[c])
        add(engine, "u1", "Lives in Rome", id=c, created_at=days_ago(1), supersedes=[a])
        before = snapshot(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert {a_["reason"] for a_ in report["actions"]} == {"declared_cycle"}
        assert snapshot(engine) == before


class TestAFutureSlotValueDoesNotHoldTheSlot:
    def test_the_current_value_replaces_the_older_one_now(self, engine, settings):
        """v1 (90 days ago), v2 (5 days ago) and v3 (from next week) in one slot: v1 is closed
        at v2's start now and v3 waits (v3, the newest, was the slot's holder: nothing was
        decided until it took effect, two values stayed active meanwhile, and v1 was then
        closed at v3's start, true for a period v2 had replaced it)."""
        v1 = add(engine, "u1", "English level is B1", slot="english", created_at=days_ago(90))
        v2 = add(engine, "u1", "English level is B2", slot="english", created_at=days_ago(5))
        v3 = add(engine, "u1", "English level is C1", slot="english", created_at=days_ago(1),
                 valid_from=NOW + timedelta(days=7))  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"])
        assert changes(report) == [("obsolete", str(v1), "slot_replaced")]
        stored = get(engine, v1)
        assert (stored["superseded_by"], stored["valid_until"]) == (v2, days_ago(5))
        assert status(engine, v2) == status(engine, v3) == "active"
        later = run(engine, settings, jobs=["contradiction"], now=NOW + timedelta(days=8))
        assert changes(later) == [("obsolete", str(v2), "slot_replaced")]
        assert get(engine, v2)["valid_until"] == NOW + timedelta(days=7)


class TestTwoDeclarersOfOneTarget:
    @pytest.mark.parametrize("ids", ID_ORDERS)
    def test_the_earliest_declarer_closes_the_target(self, ids):
        """B (5 days ago) and C (1 day ago) both supersede A: A is closed at B's start, the
        first replacement, whatever the ids (the lower id's declaration was taken)."""
        a = row("Works at Acme", id=ids[0], observed_at=days_ago(9))
        b = row("Works at Globex", id=ids[1], observed_at=days_ago(5), supersedes=[a.id])
        c = row("Works at Initech", id=ids[2], observed_at=days_ago(1), supersedes=[a.id])
        actions, _, _ = plan_contradiction(
            sorted([a, b, c], key=lambda r: r.id), now=NOW, similarity=0.75, dim=4,
            judge=lambda older, newer: None,
        )  # fmt: skip
        [closed] = actions
        assert closed.memory_id == a.id and closed.details["superseded_by"] == str(b.id)
        assert closed.details["close_valid_until"] == days_ago(5).isoformat()


class TestAChainPlannedThenApplied:
    def test_a_version_deleted_since_the_dry_run_keeps_what_it_replaced(self, engine, settings):
        """v3 → v2 → v1 planned in a dry run; the application deletes v3 before the apply: v2's
        obsolete drifts (its newer fact is gone), v1 still closes for v2, active as planned."""
        v1 = add(engine, "u1", "Works at Acme", created_at=days_ago(3))
        v2 = add(engine, "u1", "Works at Globex", created_at=days_ago(2), supersedes=[v1])
        v3 = add(engine, "u1", "Works at Initech", created_at=days_ago(1), supersedes=[v2])
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        assert len(plan["actions"]) == 2
        execute(engine, "DELETE FROM memories WHERE id = :id", id=v3)
        with engine.connect() as conn:
            applied = build_report(conn, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert changes(applied) == [("obsolete", str(v1), "superseded")]
        assert (get(engine, v1)["superseded_by"], status(engine, v2)) == (v2, "active")
