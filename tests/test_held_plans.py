"""plan_then_apply: a nightly plan too large to apply unattended waits for a person.

A plan retiring more than ``schedule.hold_above_share`` of the active memories (and at least
``schedule.hold_min_rows``) is held: the daemon does not apply it, ``gc_runs.held`` and `memory-gc
runs` say why and what to do, `memory-gc apply` and `reject` work as for any plan, and the
erasures users asked for are carried out meanwhile rather than waiting for that person."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gc_worker import cli, erasure, scheduler
from gc_worker import engine as gc_engine
from gc_worker.config import load_settings
from gc_worker.errors import ConfigError
from tests.conftest import TEST_DIM
from tests.store import NOW, add, execute, status
from tests.test_schedule import SLOT, make_daemon, runs, seed, with_schedule

__all__ = ["make_daemon"]  # the fixture, used by name


def review(settings, share=0.25, min_rows=1):
    return with_schedule(
        settings, mode="plan_then_apply", apply_delay_minutes=60, hold_above_share=share,
        hold_min_rows=min_rows,
    )  # fmt: skip


def expired_ids(engine):
    return list(execute(engine, "SELECT id FROM memories WHERE content = 'expired'").scalars())


def night(engine, settings, make_daemon):
    """Four users, each one expired row of two: the plan retires 4 of the 8 active rows (50 %).
    Returns the plan's id and the daemon that finds it due."""
    plan_id = make_daemon(settings, SLOT).nightly()
    (plan,) = runs(engine)
    return plan_id, make_daemon(settings, plan["finished_at"] + timedelta(minutes=60))


class TestHold:
    def test_a_plan_retiring_more_than_the_share_waits_for_a_person(
        self, engine, settings, make_daemon
    ):
        seed(engine, users=4)
        plan_id, due = night(engine, review(settings), make_daemon)
        assert due.apply_due_plans() == [] and due.apply_due_plans() == []
        assert {status(engine, i) for i in expired_ids(engine)} == {"active"}
        (plan,) = runs(engine)
        assert plan["applied_by"] is None and plan["status"] == "completed"
        assert plan["held"].startswith("retires 4 of the 8 active memories (50.0%)")
        assert f"`memory-gc apply {plan_id}`" in plan["held"]
        assert f"`memory-gc reject {plan_id}`" in plan["held"]

    @pytest.mark.parametrize(
        ("share", "min_rows", "held"),
        [(0.49, 4, True), (0.5, 4, False), (0.25, 5, False), (0.0, 0, True), (1.0, 0, False)],
    )
    def test_the_limits_are_exact(self, engine, settings, make_daemon, share, min_rows, held):
        """Held only for more than the share (4 of 8 is not more than 0.5) and at least
        hold_min_rows retired rows; 1.0 never holds."""
        seed(engine, users=4)
        _, due = night(engine, review(settings, share, min_rows), make_daemon)
        applied = due.apply_due_plans()
        assert (applied == []) is held
        assert {status(engine, i) for i in expired_ids(engine)} == (
            {"active"} if held else {"deleted"}
        )

    def test_rows_gone_since_the_plan_do_not_count(self, engine, settings, make_daemon):
        """The plan retires 4 rows; the application deleted 5 (one of them planned) before it
        fell due: 3 of the 3 active rows are retired, not "4 of 3", and 1.0 still never holds."""
        seed(engine, users=4)
        _, due = night(engine, review(settings, 1.0, 0), make_daemon)
        execute(engine, "DELETE FROM memories WHERE content = 'fresh'"
                " OR id = (SELECT min(CAST(id AS text))::uuid FROM memories"
                "          WHERE content = 'expired')")  # fmt: skip
        assert len(due.apply_due_plans()) == 1
        assert runs(engine)[0]["held"] is None
        assert {status(engine, i) for i in expired_ids(engine)} == {"deleted"}

    def test_an_erasures_retirements_do_not_count(self, engine, settings, make_daemon):
        """A user asked for them: a plan whose retirements are mostly an erasure's is applied."""
        seed(engine, users=4)
        execute(engine, "UPDATE memories SET expires_at = NULL")  # nothing else to retire
        erasure.forget(engine, settings, now=SLOT, user_id="user-000")
        erasure.forget(engine, settings, now=SLOT, user_id="user-001")
        _, due = night(engine, review(settings, 0.25, 1), make_daemon)
        assert len(due.apply_due_plans()) == 1
        gone = execute(engine, "SELECT count(*) FROM memories WHERE status = 'deleted'").scalar()
        assert gone == 4


class TestReplicas:
    def test_a_replica_that_listed_the_plan_before_another_held_it_does_not_apply_it(
        self, engine, settings, make_daemon
    ):
        """Replica B (a larger share, say mid-rollout, or more active rows counted a moment
        later) listed the plan as due; replica A held it meanwhile. B leaves it held."""
        seed(engine, users=4)
        plan_id, due = night(engine, review(settings), make_daemon)
        assert due.apply_due_plans() == []  # A holds it
        assert scheduler.hold_if_large(engine, plan_id, review(settings, 0.9).schedule)
        assert {status(engine, i) for i in expired_ids(engine)} == {"active"}

    def test_the_daemon_does_not_start_the_apply_of_a_held_plan(
        self, engine, settings, make_daemon
    ):
        """B decided not to hold it, A held it before B's apply started: B's apply is refused
        (a person may still apply it, TestCommands)."""
        seed(engine, users=4)
        plan_id, _ = night(engine, review(settings), make_daemon)
        assert scheduler.hold_if_large(engine, plan_id, review(settings).schedule)
        with scheduler.apply_run_of(engine, plan_id) as apply_id:
            assert apply_id is None
        assert runs(engine)[0]["applied_by"] is None
        assert {status(engine, i) for i in expired_ids(engine)} == {"active"}


class TestWhileHeld:
    def test_erasures_are_carried_out_while_the_plan_waits(self, engine, settings, make_daemon):
        """A held plan holds its users' erasure requests too, for as long as nobody looks at
        it: the daemon runs the erasure job alone for the users with a pending request."""
        seed(engine, users=4)
        request, _ = erasure.forget(engine, settings, now=SLOT, user_id="user-000")
        plan_id, due = night(engine, review(settings), make_daemon)
        assert due.apply_due_plans() == []
        user0 = execute(engine, "SELECT DISTINCT status_reason FROM memories"
                        " WHERE user_id = 'user-000'").scalars().all()  # fmt: skip
        assert user0 == ["erasure"]
        others = execute(engine, "SELECT count(*) FROM memories WHERE user_id <> 'user-000'"
                         " AND status = 'active'").scalar()  # fmt: skip
        assert others == 6  # the held plan's own changes wait
        done = execute(engine, "SELECT status FROM gc_erasure_requests WHERE id = :id",
                       id=request.id).scalar()  # fmt: skip
        assert done == "completed"
        erasing = [r for r in runs(engine) if r["trigger"] == "erasure"]
        assert [(r["mode"], r["status"], r["jobs"]) for r in erasing] == [
            ("apply", "completed", ["erasure"])
        ]

        # the person applies the plan: the erasure's actions drift, the rest applies
        applied = gc_engine.apply_plan(engine, plan_id)
        assert {status(engine, i) for i in expired_ids(engine)} == {"deleted"}
        drifted = execute(
            engine, "SELECT count(*) FROM gc_actions WHERE run_id = :r AND outcome = 'drifted'"
            " AND job = 'erasure'", r=applied,
        ).scalar()  # fmt: skip
        assert drifted > 0

    def test_applied_by_hand_after_the_erasure_it_makes_nothing_of_the_erased_rows(
        self, engine, settings, make_daemon
    ):
        """The held plan merges two duplicates of a user who then asked to be forgotten: once
        the erasure ran meanwhile, the person's apply must not make a record of them."""
        seed(engine, users=4)
        for _ in range(2):
            add(engine, "user-000", "I live in Lisbon", importance_assessed_at=NOW,
                embedding=[1.0] + [0.0] * (TEST_DIM - 1))  # fmt: skip
        plan_id, due = night(engine, review(settings), make_daemon)
        planned = execute(engine, "SELECT count(*) FROM gc_actions WHERE run_id = :r"
                          " AND action = 'create_merged'", r=plan_id).scalar()  # fmt: skip
        assert planned == 1
        erasure.forget(engine, settings, now=SLOT, user_id="user-000")
        assert due.apply_due_plans() == []  # held; the erasure runs meanwhile
        applied = gc_engine.apply_plan(engine, plan_id)
        alive = execute(engine, "SELECT count(*) FROM memories WHERE user_id = 'user-000'"
                        " AND status = 'active'").scalar()  # fmt: skip
        assert alive == 0
        made = execute(engine, "SELECT count(*) FROM gc_actions WHERE run_id = :r"
                       " AND action = 'create_merged' AND outcome = 'applied'",
                       r=applied).scalar()  # fmt: skip
        assert made == 0

    def test_a_request_filed_after_the_hold_is_carried_out_too(self, engine, settings, make_daemon):
        """The plan was held at an earlier pass (or by a replica that stopped before erasing):
        a pending request does not wait for the person either."""
        seed(engine, users=4)
        _, due = night(engine, review(settings), make_daemon)
        assert due.apply_due_plans() == []  # held, nothing to erase yet
        request, _ = erasure.forget(engine, settings, now=SLOT, user_id="user-000")
        assert due.apply_due_plans() == []
        done = execute(engine, "SELECT status FROM gc_erasure_requests WHERE id = :id",
                       id=request.id).scalar()  # fmt: skip
        assert done == "completed"
        assert runs(engine)[0]["held"] is not None and runs(engine)[0]["applied_by"] is None

    def test_a_replica_that_held_and_stopped_leaves_the_erasures_to_the_next_pass(
        self, engine, settings, make_daemon
    ):
        seed(engine, users=4)
        request, _ = erasure.forget(engine, settings, now=SLOT, user_id="user-000")
        plan_id, due = night(engine, review(settings), make_daemon)
        assert scheduler.hold_if_large(engine, plan_id, review(settings).schedule)  # then died
        due.apply_due_plans()
        done = execute(engine, "SELECT status FROM gc_erasure_requests WHERE id = :id",
                       id=request.id).scalar()  # fmt: skip
        assert done == "completed"

    def test_a_request_that_stays_pending_is_not_tried_at_every_pass(
        self, engine, settings, make_daemon
    ):
        """A request the erasure run leaves pending (misfiled: the memory is another user's)
        waits for the next night, not a new run every upkeep."""
        seed(engine, users=4)
        execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                " SELECT 'memory', 'user-000', id FROM memories WHERE user_id = 'user-001'"
                " LIMIT 1")  # fmt: skip
        _, due = night(engine, review(settings), make_daemon)
        for _ in range(3):
            due.apply_due_plans()
        erasing = [r for r in runs(engine) if r["trigger"] == "erasure"]
        assert len(erasing) == 1
        # the next night's plan, held too: the request is tried again, once
        make_daemon(review(settings), SLOT + timedelta(days=1)).nightly()
        plan2 = runs(engine)[-1]
        assert plan2["trigger"] == "nightly"
        due2 = make_daemon(review(settings), plan2["finished_at"] + timedelta(minutes=60))
        for _ in range(2):
            due2.apply_due_plans()
        erasing = [r for r in runs(engine) if r["trigger"] == "erasure"]
        assert len(erasing) == 2

    def test_no_erasure_run_without_a_pending_request(self, engine, settings, make_daemon):
        seed(engine, users=4)
        _, due = night(engine, review(settings), make_daemon)
        due.apply_due_plans()
        assert [r["trigger"] for r in runs(engine)] == ["nightly"]


def test_the_gauge_counts_held_plans_until_a_person_acts(engine, settings, make_daemon):
    """Unattended, a held plan goes stale and the store is not cleaned: the daemon exports how
    many wait (memory_gc_plans_held), so that someone can be told."""
    seed(engine, users=4)
    plan_id, due = night(engine, review(settings), make_daemon)

    def held_gauge() -> float:
        due.upkeep()
        return due.metrics.plans_held._value.get()

    assert held_gauge() == 1.0  # this upkeep held it
    gc_engine.apply_plan(engine, plan_id)
    assert held_gauge() == 0.0


class TestCommands:
    def test_runs_shows_the_hold_and_apply_takes_it(
        self, engine, settings, make_daemon, cli_env, capsys
    ):
        seed(engine, users=4)
        plan_id, due = night(engine, review(settings), make_daemon)
        due.apply_due_plans()
        assert cli.main(["runs"]) == 0
        out = capsys.readouterr().out
        assert f"{plan_id}  dry_run  held" in out
        assert "held: retires 4 of the 8 active memories" in out
        assert cli.main(["report", str(plan_id), "--format", "md"]) == 0
        assert "held for a person" in capsys.readouterr().out
        assert cli.main(["apply", str(plan_id)]) == 0
        assert {status(engine, i) for i in expired_ids(engine)} == {"deleted"}
        assert cli.main(["runs"]) == 0
        assert f"{plan_id}  dry_run  completed" in capsys.readouterr().out

    def test_a_held_plan_can_be_rejected(self, engine, settings, make_daemon):
        seed(engine, users=4)
        plan_id, due = night(engine, review(settings), make_daemon)
        due.apply_due_plans()
        scheduler.reject_plan(engine, plan_id)
        assert runs(engine)[0]["status"] == "rejected"
        assert {status(engine, i) for i in expired_ids(engine)} == {"active"}


@pytest.mark.parametrize(
    ("line", "named"),
    [("hold_above_share = 1.5", "schedule.hold_above_share"),
     ("hold_min_rows = -1", "schedule.hold_min_rows"),
     ("hold_above_share = true", "schedule.hold_above_share")],
)  # fmt: skip
def test_bad_hold_settings_are_refused(tmp_path, line, named):
    config = tmp_path / "gc.toml"
    config.write_text(f"[schedule]\n{line}\n")
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_settings(config)
