"""The run engine: dry run → apply equality, drift, idempotence, batching, restore."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
from sqlalchemy import text

from gc_worker import engine as gc_engine
from gc_worker import restore
from gc_worker.config import RunSettings, Settings, UserCapSettings
from gc_worker.errors import NotFoundError, RunFailed, UsageError
from gc_worker.report import build_report
from tests.store import (
    NOW,
    acted_on,
    add,
    city_pair,
    days_ago,
    execute,
    get,
    run,
    snapshot,
    status,
)


def seed_mixed_store(engine, users=("alice", "bob", "carol")) -> None:
    """A few users with something for every deterministic job to do."""
    for user in users:
        add(engine, user, "expired", expires_at=days_ago(1))
        add(engine, user, "stale", created_at=days_ago(200), importance=2)
        add(engine, user, "pinned stale", created_at=days_ago(500), importance=1, pinned=True)
        add(engine, user, "fresh", created_at=days_ago(2))
        add(engine, user, "old deleted", status="deleted", deleted_at=days_ago(45))
        for i in range(4):
            add(engine, user, f"filler {i}", created_at=days_ago(10 + i), importance=4)


def report_of(engine, run_id):
    with engine.connect() as conn:
        return build_report(conn, run_id)


def _key(action):
    return (action["job"], action["action"], action["memory_id"], action["reason"])


class TestPlanThenApply:
    def test_dry_run_changes_nothing(self, engine, settings):
        """A dry run writes a plan and report and leaves every memory row as it was."""
        seed_mixed_store(engine)
        before = snapshot(engine)
        report = run(engine, settings, dry_run=True)
        assert report["mode"] == "dry_run" and report["totals"]["actions"] > 0
        assert snapshot(engine) == before

    def test_apply_executes_exactly_the_plan(self, engine, settings):
        """The applied actions equal the planned ones, one for one."""
        seed_mixed_store(engine)
        plan = run(engine, settings, dry_run=True)
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert sorted(map(_key, applied["actions"])) == sorted(map(_key, plan["actions"]))
        assert applied["plan_run_id"] == plan["run_id"]
        for action in plan["actions"]:
            if action["action"] == "soft_delete":
                assert status(engine, UUID(action["memory_id"])) == "deleted"

    def test_plain_run_equals_dry_run_then_apply(self, engine, database_url, settings):
        """A plain run plans the same actions a dry run would."""
        seed_mixed_store(engine)
        plan = run(engine, settings, dry_run=True)
        plain = run(engine, settings)
        assert sorted(map(_key, plain["actions"])) == sorted(map(_key, plan["actions"]))

    def test_second_run_plans_nothing(self, engine, settings):
        """Right after an apply, the next run changes nothing and rewrites no score."""
        seed_mixed_store(engine)
        first = run(engine, settings)
        again = run(engine, settings)
        changes = {k: n for k, n in again["totals"]["by_action"].items() if k != "deferred"}
        assert changes == {}
        assert again["jobs"]["decay"]["refreshed"] == 0
        # offline, LLM candidate groups stay listed as deferred, run after run, and nothing else
        deferred = [a for a in first["actions"] if a["action"] == "deferred"]
        assert again["totals"]["by_action"].get("deferred", 0) <= len(deferred)

    def test_plan_applies_once(self, engine, settings):
        """A plan cannot be applied twice."""
        seed_mixed_store(engine)
        plan = UUID(run(engine, settings, dry_run=True)["run_id"])
        gc_engine.apply_plan(engine, plan)
        with pytest.raises(UsageError, match="already applied"):
            gc_engine.apply_plan(engine, plan)

    def test_only_dry_runs_can_be_applied(self, engine, settings):
        """Applying a run that was not a dry run is refused."""
        seed_mixed_store(engine)
        applied = UUID(run(engine, settings)["run_id"])
        with pytest.raises(UsageError, match="not a dry run"):
            gc_engine.apply_plan(engine, applied)

    def test_unknown_run(self, engine):
        """An unknown run id is a NotFoundError (exit 2)."""
        with pytest.raises(NotFoundError):
            gc_engine.apply_plan(engine, UUID(int=7))


class TestStalePlans:
    @pytest.mark.parametrize(("age", "refused"), [("71 hours 59 minutes", False),
                                                  ("72 hours 1 minute", True)])  # fmt: skip
    def test_the_age_limit_boundary(self, engine, settings, age, refused):
        """Just inside run.max_plan_age_hours (72) a plan applies; just outside it is refused."""
        victim = add(engine, "u1", "expiring", expires_at=days_ago(1))
        plan = run(engine, settings, dry_run=True)
        execute(engine, f"UPDATE gc_runs SET finished_at = clock_timestamp() - interval '{age}'")
        if refused:
            with pytest.raises(UsageError, match="older than"):
                gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        else:
            gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        assert status(engine, victim) == ("active" if refused else "deleted")

    def test_an_old_plan_is_refused_and_a_raised_limit_applies_it(
        self, engine, settings, cli_env, capsys, monkeypatch
    ):
        """A plan applied days after it was made would stamp its changes with its own instant:
        rows soft-deleted now would look deleted since the plan, and be purged that much
        before their retention. `apply` refuses a plan older than run.max_plan_age_hours
        (exit 2, nothing written, saying how to go on); raising the limit applies it."""
        from gc_worker.cli import main

        victim = add(engine, "u1", "expiring", expires_at=days_ago(1))
        plan = run(engine, settings, dry_run=True)
        execute(engine, "UPDATE gc_runs SET finished_at = finished_at - interval '100 hours'")
        runs = execute(engine, "SELECT count(*) FROM gc_runs").scalar()
        assert main(["apply", plan["run_id"]]) == 2
        err = capsys.readouterr().err
        assert "made 100 hours ago" in err and "MEMORY_GC_RUN__MAX_PLAN_AGE_HOURS=101" in err
        assert status(engine, victim) == "active"
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == runs
        with pytest.raises(UsageError, match=r"older than run\.max_plan_age_hours = 72"):
            gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        monkeypatch.setenv("MEMORY_GC_RUN__MAX_PLAN_AGE_HOURS", "101")
        assert main(["apply", plan["run_id"]]) == 0
        assert status(engine, victim) == "deleted"


class TestDrift:
    @pytest.mark.parametrize(
        "change",
        [
            "UPDATE memories SET last_accessed_at = :now WHERE id = :id",
            "UPDATE memories SET content = 'edited' WHERE id = :id",
            "UPDATE memories SET pinned = true WHERE id = :id",
            "UPDATE memories SET expires_at = NULL WHERE id = :id",
        ],
    )
    def test_row_changed_after_planning_is_skipped_and_reported(self, engine, settings, change):
        """An application write between plan and apply wins: the action is skipped, reported."""
        victim = add(engine, "u1", "soon stale", created_at=days_ago(200), expires_at=days_ago(1))
        other = add(engine, "u1", "also expired", expires_at=days_ago(1))
        plan = run(engine, settings, dry_run=True)
        execute(engine, change, id=victim, now=NOW)
        before = get(engine, victim)
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert acted_on(applied) == {str(other)}
        assert [d["memory_id"] for d in applied["drifted"]] == [str(victim)]
        assert applied["jobs"]["ttl_expiry"]["skipped"] == 1
        # every application-owned column is as the application left it (the worker-owned
        # decayed_confidence is recomputed from them, which is not an overwrite)
        after = get(engine, victim)
        assert {k: v for k, v in after.items() if k != "decayed_confidence"} == {
            k: v for k, v in before.items() if k != "decayed_confidence"
        }

    def test_row_deleted_by_application_is_drift(self, engine, settings):
        """A row the application removed after planning is reported as drifted."""
        victim = add(engine, expires_at=days_ago(1))
        plan = run(engine, settings, dry_run=True)
        execute(engine, "DELETE FROM memories WHERE id = :id", id=victim)
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert applied["totals"]["actions"] == 0 and len(applied["drifted"]) == 1

    @pytest.mark.parametrize(
        "change",
        [
            "DELETE FROM memories WHERE id = :id",
            "UPDATE memories SET slot = NULL, content = 'Visited Berlin' WHERE id = :id",
        ],
    )
    def test_a_fact_is_not_closed_for_a_newer_one_changed_since_planning(
        self, engine, settings, change
    ):
        """The older fact is obsoleted *because of* the newer one: if the application
        retracted or corrected the newer one after planning, the older stays current (the
        action drifts) instead of leaving the user with neither."""
        old, new = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        assert acted_on(plan, "obsolete") == {str(old)}
        execute(engine, change, id=new)
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert status(engine, old) == "active" and get(engine, old)["valid_until"] is None
        assert [d["memory_id"] for d in applied["drifted"]] == [str(old)]

    def test_a_newer_fact_the_application_holds_is_not_waited_for(self, engine, settings):
        """The newer fact is share-locked for the apply; one an application transaction holds
        right now is treated as changed (drift), never waited for."""
        old, new = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        with engine.connect() as app:
            app.execute(text("SELECT 1 FROM memories WHERE id = :id FOR UPDATE"), {"id": new})
            applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
            app.rollback()
        assert status(engine, old) == "active" and len(applied["drifted"]) == 1

    def test_evictions_drift_when_the_user_deleted_rows_since_planning(self, engine):
        """Evictions chosen for 5 rows under a cap of 3 are not applied once the application
        deleted 2 of the kept rows: the user would be left with 1."""
        capped = Settings(user_cap=UserCapSettings(max_memories=3))
        rows = [add(engine, "u1", f"fact {i}", created_at=days_ago(10 + i)) for i in range(5)]
        plan = run(engine, capped, jobs=["user_cap"], dry_run=True)
        evicted = acted_on(plan)
        assert len(evicted) == 2
        kept = [r for r in rows if str(r) not in evicted]
        execute(engine, "DELETE FROM memories WHERE id = ANY(:ids)", ids=kept[:2])
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert applied["totals"]["actions"] == 0 and len(applied["drifted"]) == 2
        assert all(status(engine, r) == "active" for r in kept[2:] + [UUID(e) for e in evicted])

    @pytest.mark.parametrize(("deleted", "added", "applied"), [(1, 1, 2), (1, 0, 0)])
    def test_evictions_at_the_same_row_count_apply_one_fewer_drift(
        self, engine, deleted, added, applied
    ):
        """The premise boundary: as many active rows at apply as at planning (one deleted, one
        added) — the evictions apply; one fewer — they drift."""
        capped = Settings(user_cap=UserCapSettings(max_memories=3))
        rows = [add(engine, "u1", f"fact {i}", created_at=days_ago(10 + i)) for i in range(5)]
        plan = run(engine, capped, jobs=["user_cap"], dry_run=True)
        kept = [r for r in rows if str(r) not in acted_on(plan)]
        execute(engine, "DELETE FROM memories WHERE id = ANY(:ids)", ids=kept[:deleted])
        for i in range(added):
            add(engine, "u1", f"new fact {i}")
        report = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert report["totals"]["actions"] == applied
        assert len(report["drifted"]) == 2 - applied

    def test_evictions_still_apply_when_the_user_only_gained_rows(self, engine):
        capped = Settings(user_cap=UserCapSettings(max_memories=3))
        for i in range(5):
            add(engine, "u1", f"fact {i}", created_at=days_ago(10 + i))
        plan = run(engine, capped, jobs=["user_cap"], dry_run=True)
        add(engine, "u1", "a new fact")
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        assert applied["totals"]["actions"] == 2 and applied["drifted"] == []


class TestInvariants:
    def test_pinned_rows_never_change(self, engine, settings):
        """No automatic job changes a pinned row, whatever its state."""
        ids = [
            add(engine, expires_at=days_ago(10), pinned=True),
            add(engine, created_at=days_ago(900), importance=1, pinned=True),
            add(engine, status="deleted", deleted_at=days_ago(900), pinned=True),
        ]
        before = {i: get(engine, i) for i in ids}
        run(engine, Settings(user_cap=UserCapSettings(max_memories=1)))
        assert {i: get(engine, i) for i in ids} == before

    def test_batches_cover_every_user_once(self, engine):
        """With small batches every user is processed exactly once and no action spans users."""
        users = [f"user-{i:02d}" for i in range(7)]
        seed_mixed_store(engine, users)
        settings = Settings(run=RunSettings(batch_users=2))
        report = run(engine, settings)
        with engine.connect() as conn:
            batches = conn.execute(
                text("SELECT users FROM gc_run_batches WHERE run_id = :r"), {"r": report["run_id"]}
            ).scalars()
            flat = [u for batch in batches for u in batch]
        assert sorted(flat) == users
        assert set(report["per_user"]) == set(users)
        for action in report["actions"]:
            if action["memory_id"]:
                assert get_user(engine, action["memory_id"]) in (action["user_id"], None)

    def test_user_scope(self, engine, settings):
        """--user limits a run to that user's memories."""
        seed_mixed_store(engine)
        report = run(engine, settings, users=["bob"])
        assert {a["user_id"] for a in report["actions"]} == {"bob"}

    def test_unknown_user_is_refused(self, engine, settings):
        """A user with no memories is refused before anything runs."""
        seed_mixed_store(engine)
        with pytest.raises(NotFoundError, match="nobody"):
            run(engine, settings, users=["nobody"])

    def test_naive_now_is_refused(self):
        """The run clock must be timezone-aware."""
        with pytest.raises(UsageError, match="timezone"):
            gc_engine.RunRequest(mode="apply", now=NOW.replace(tzinfo=None))

    def test_failure_rolls_back_the_batch(self, engine, settings, monkeypatch):
        """A failure inside a batch leaves no memory change and no audit row of that batch."""
        seed_mixed_store(engine)
        before = snapshot(engine)
        import jobs

        def boom(ctx):
            raise RuntimeError("injected")

        monkeypatch.setattr(jobs.REGISTRY["hard_delete"], "plan", boom)
        with pytest.raises(RunFailed, match="RuntimeError: injected"):
            run(engine, settings)
        assert snapshot(engine) == before
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM gc_actions")).scalar() == 0
            assert conn.execute(text("SELECT status FROM gc_runs")).scalar() == "failed"


def get_user(engine, memory_id):
    row = get(engine, UUID(memory_id))
    return None if row is None else row["user_id"]


class TestRestore:
    def test_restore_run_returns_every_row_to_its_prior_status(self, engine, settings):
        """Restoring a run undoes each of its soft deletes exactly."""
        seed_mixed_store(engine)
        before = snapshot(engine)
        report = run(engine, settings)
        result = restore.restore_run(engine, UUID(report["run_id"]))
        purged = acted_on(report, "hard_delete")
        assert {str(m) for m in result.restored} == acted_on(report) - purged
        after = snapshot(engine)
        for memory_id, row in before.items():
            if str(memory_id) in purged:
                assert memory_id not in after
                continue
            for column in ("status", "status_reason", "status_changed_at", "deleted_at"):
                assert after[memory_id][column] == row[column], (memory_id, column)

    def test_restore_skips_rows_changed_since(self, engine, settings):
        """A row the application changed after the run is not overwritten by restore."""
        m = add(engine, expires_at=days_ago(1))
        report = run(engine, settings)
        execute(
            engine,
            "UPDATE memories SET status = 'active', status_reason = 'app' WHERE id = :id",
            id=m,
        )
        result = restore.restore_run(engine, UUID(report["run_id"]))
        assert result.restored == [] and result.not_restorable == [m]
        assert get(engine, m)["status_reason"] == "app"

    def test_restore_single_memory(self, engine, settings):
        """restore --memory undoes the worker's latest change to that memory only."""
        a = add(engine, expires_at=days_ago(1))
        b = add(engine, expires_at=days_ago(1))
        run(engine, settings)
        restore.restore_memory(engine, a)
        assert status(engine, a) == "active" and status(engine, b) == "deleted"

    def test_restore_is_recorded_as_a_run(self, engine, settings):
        """The undo is itself a run with restore actions."""
        a = add(engine, expires_at=days_ago(1))
        run(engine, settings)
        result = restore.restore_memory(engine, a)
        rep = report_of(engine, result.run_id)
        # report_version 1's modes are dry_run and apply: a restore applies, kind says which
        assert (rep["mode"], rep["kind"]) == ("apply", "restore")
        assert rep["totals"]["by_action"] == {"restore": 1}

    def test_restored_row_is_planned_again(self, engine, settings):
        """Restore is not a pin: the next run may plan the same action again."""
        a = add(engine, expires_at=days_ago(1))
        report = run(engine, settings)
        restore.restore_run(engine, UUID(report["run_id"]))
        assert acted_on(run(engine, settings, dry_run=True, now=NOW + timedelta(days=1))) == {
            str(a)
        }

    def test_dry_run_cannot_be_restored(self, engine, settings):
        """Restoring a dry run is a usage error."""
        add(engine, expires_at=days_ago(1))
        report = run(engine, settings, dry_run=True)
        with pytest.raises(UsageError, match="dry run"):
            restore.restore_run(engine, UUID(report["run_id"]))

    def test_a_restore_run_cannot_be_restored(self, engine, settings):
        """Restoring a restore run would redo the changes it undid: refused, nothing recorded
        (it used to say "0 restored" and record another empty restore run)."""
        add(engine, expires_at=days_ago(1))
        report = run(engine, settings)
        undo = restore.restore_run(engine, UUID(report["run_id"]))
        runs = execute(engine, "SELECT count(*) FROM gc_runs").scalar()
        with pytest.raises(UsageError, match="restore run"):
            restore.restore_run(engine, undo.run_id)
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == runs

    def test_unknown_memory(self, engine):
        """Restoring a memory the worker never touched is refused."""
        with pytest.raises(NotFoundError):
            restore.restore_memory(engine, UUID(int=3))


class TestLogs:
    def test_batch_lines_carry_the_run_batch_and_user(self, engine, settings):
        """Every batch line names its run, batch and mode; a one-user batch names the user;
        nothing stays bound after the run."""
        import structlog
        from structlog.testing import capture_logs

        from gc_worker import logs as gc_logs

        gc_logs.configure("info")  # an earlier test (the demo) may have raised the level
        add(engine, "u1", "expired", expires_at=NOW - timedelta(days=1))
        add(engine, "u2", "kept")
        one_user = Settings.model_validate(settings.model_dump() | {"run": {"batch_users": 1}})
        with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
            report = run(engine, one_user)
        committed = [e for e in logs if e["event"] == "gc.batch_committed"]
        # two workers (the default): the batches may commit in either order, each from its thread
        assert sorted((e["batch_no"], e["user_id"]) for e in committed) == [(0, "u1"), (1, "u2")]
        assert {(e["run_id"], e["dry_run"]) for e in committed} == {(report["run_id"], False)}
        assert structlog.contextvars.get_contextvars() == {}


def test_a_failure_is_recorded_without_the_rows_content(engine, settings, capsys, cli_env):
    """A statement the server refuses (here a CHECK the application added) fails the run;
    what is kept of the error — gc_runs.error, the log line, the CLI's message — names the
    failure but quotes neither the statement's parameters nor the server's DETAIL (the failing
    row, content included), which no erasure could reach there."""

    from gc_worker.cli import main

    add(engine, "u1", "Keeps a parrot named Quokkaberry", expires_at=days_ago(1))
    execute(engine, "ALTER TABLE memories ADD CONSTRAINT app_rule"
                    " CHECK (status <> 'deleted') NOT VALID")  # fmt: skip
    with pytest.raises(RunFailed):
        run(engine, settings)
    (error,) = execute(engine, "SELECT error FROM gc_runs WHERE status = 'failed'").scalars()
    (batch_error,) = execute(engine, "SELECT error FROM gc_run_batches").scalars()
    assert batch_error.startswith("CheckViolation: ") and "app_rule" in batch_error
    assert "batch 0 (1 users): CheckViolation: " in error
    assert "Quokkaberry" not in error + batch_error
    assert "Quokkaberry" not in capsys.readouterr().out
    assert main(["run", "--now", NOW.isoformat()]) == 1
    err = capsys.readouterr().err
    assert "CheckViolation" in err and "Quokkaberry" not in err


def test_a_disabled_job_named_by_hand_runs_with_a_warning():
    """`--job decay` with `[decay] enabled = false` runs decay (the operator named it) and says
    that the configuration disables it; without --job a disabled job does not run."""
    from structlog.testing import capture_logs

    settings = Settings.model_validate({"decay": {"enabled": False}})
    with capture_logs() as logs:
        assert gc_engine.resolve_jobs(["decay"], settings) == ("decay",)
        assert "decay" not in gc_engine.resolve_jobs([], settings)
    warned = [e for e in logs if e["event"] == "gc.disabled_job_requested"]
    assert [(e["job"], e["log_level"]) for e in warned] == [("decay", "warning")]
