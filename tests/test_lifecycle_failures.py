"""Run lifecycle with failing batches, stale plans and stops: cases a review reproduced
(each failed before its fix)."""

from __future__ import annotations

import contextlib
import json
from contextlib import closing
from datetime import timedelta

import pytest
import sqlalchemy as sa

import jobs.ttl_expiry as ttl
from gc_worker import engine as gc_engine
from gc_worker import scheduler
from gc_worker.cli import main
from gc_worker.config import ScheduleSettings, Settings
from gc_worker.daemon import Daemon
from gc_worker.errors import RunFailed
from tests.store import NOW, add, days_ago, execute, status

SLOT = NOW  # 2026-06-01 03:00 UTC
# one worker: a stop "after batch 0" stops after batch 0 (several would each have one going)
BATCHED = Settings.model_validate(
    {"embeddings": {"dim": 8}, "run": {"batch_users": 1, "workers": 1}}
)


def seed_users(engine, n=3):
    expired = {}
    for i in range(n):
        user = f"user-{i}"
        expired[user] = add(
            engine, user, "expired", expires_at=days_ago(1), importance_assessed_at=NOW
        )
        add(engine, user, "fresh", created_at=days_ago(1), importance_assessed_at=NOW)
    return expired


def failing_for(user):
    real = ttl.plan

    def plan(ctx):
        if user in ctx.users:
            raise RuntimeError(f"cannot handle a row of {user}")
        return real(ctx)

    return plan


class TestPlanThenApplyWithAFailedBatch:
    def test_one_bad_user_does_not_block_the_nightly_apply_of_everyone(self, engine, monkeypatch):
        """plan_then_apply: the nightly plan had one failed batch (one bad user). After the
        review delay the other users' planned changes are applied, as in plan_and_apply mode
        (the plan used to stay 'failed' and never be applied, every night); the apply ends
        failed too, naming the batch that was never planned."""
        expired = seed_users(engine)
        review = BATCHED.model_copy(
            update={"schedule": ScheduleSettings(mode="plan_then_apply", apply_delay_minutes=60)}
        )
        monkeypatch.setattr(ttl, "plan", failing_for("user-1"))
        with (
            closing(Daemon(engine, review, clock=lambda: SLOT)) as daemon,
            pytest.raises(RunFailed),
        ):
            daemon.nightly()
        monkeypatch.undo()
        with engine.connect() as conn:
            finished = conn.execute(sa.text("SELECT finished_at FROM gc_runs")).scalar()
        with (  # the apply ends failed too: its report names the batch that was never planned
            closing(Daemon(engine, review, clock=lambda: finished + timedelta(hours=2))) as later,
            pytest.raises(RunFailed, match=r"batch 1 \(1 users\): not planned: Runtime"),
        ):
            later.apply_due_plans()
        # the users whose batches were planned get their changes, as in plan_and_apply mode
        assert status(engine, expired["user-0"]) == "deleted"
        assert status(engine, expired["user-2"]) == "deleted"
        assert status(engine, expired["user-1"]) == "active"


class TestCliReportOfAFailedRun:
    def test_run_with_a_failed_batch_still_writes_its_report(
        self, engine, cli_env, tmp_path, capsys, monkeypatch
    ):
        """`run --report PATH`: one batch failed, the two others were applied. Exit 1, and
        the report (which lists failed_batches) and the summary line are still written: they
        are the record of what the run changed (nothing was written before)."""
        seed_users(engine)
        monkeypatch.setenv("MEMORY_GC_RUN__BATCH_USERS", "1")
        monkeypatch.setattr(ttl, "plan", failing_for("user-1"))
        report = tmp_path / "run.json"
        code = main(["run", "--now", NOW.isoformat(), "--report", str(report)])
        out, err = capsys.readouterr()
        assert code == 1
        applied = execute(engine, "SELECT count(*) FROM memories WHERE status = 'deleted'").scalar()
        assert applied == 2  # the two other users' batches were applied
        assert report.exists(), f"no report written; stdout={out!r} stderr={err!r}"
        assert json.loads(report.read_text())["failed_batches"]


def plan_then_apply(settings, **run):
    data = settings.model_dump()
    data["schedule"].update(mode="plan_then_apply", apply_delay_minutes=60)
    data["run"].update(run)
    return Settings.model_validate(data)


def runs(engine):
    with engine.connect() as conn:
        return [
            dict(r)
            for r in conn.execute(sa.text("SELECT * FROM gc_runs ORDER BY started_at")).mappings()
        ]


class TestMaxPlanAgeInTheDaemon:
    def test_a_raised_limit_lets_the_daemon_apply_an_older_plan(self, engine, settings):
        """The daemons were down for the weekend: the nightly plan is 80 hours old. The
        operator raises run.max_plan_age_hours to 200 (as `apply` says to) and restarts the
        daemons: the daemon applies with its own limit, as the CLI does (it used to check the
        plan's stored 72 and swallow the refusal, at every upkeep)."""
        expired = seed_users(engine, 1)["user-0"]
        old = plan_then_apply(settings)
        with closing(Daemon(engine, old, clock=lambda: SLOT)) as daemon:
            daemon.nightly()
        execute(
            engine,
            "UPDATE gc_runs SET finished_at = clock_timestamp() - interval '80 hours',"
            " started_at = clock_timestamp() - interval '80 hours 1 second'",
        )
        raised = plan_then_apply(settings, max_plan_age_hours=200)
        from datetime import UTC, datetime

        with closing(Daemon(engine, raised, clock=lambda: datetime.now(UTC))) as later:
            applied = later.apply_due_plans()
        plan = runs(engine)[0]
        assert plan["status"] == "completed" and plan["applied_by"] == applied[0]  # not rejected
        assert status(engine, expired) == "deleted"


class TestFailedBatchesInTheRunError:
    @pytest.mark.parametrize(("failing", "cut"), [(5, False), (6, True)])
    def test_the_error_names_at_most_five_failed_batches(self, engine, monkeypatch, failing, cut):
        """Five failed batches are all named in the run's error; the sixth is left to the
        report's failed_batches ("; …"), so the stored and logged error stays short."""
        seed_users(engine, failing)
        monkeypatch.setattr(ttl, "plan", lambda ctx: (_ for _ in ()).throw(RuntimeError("x")))
        request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
        run_id = gc_engine.start_run(engine, BATCHED, request)
        with pytest.raises(RunFailed) as raised:
            gc_engine.process_run(engine, run_id, BATCHED)
        assert f"{failing} batch(es) failed" in str(raised.value)
        assert str(raised.value).count("RuntimeError: x") == 5
        assert ("; …" in str(raised.value)) == cut


class TestApplyDelayVersusPlanAge:
    def test_just_past_the_review_window_and_its_hour_a_plan_is_rejected(self, engine, settings):
        """Outside the widened limit (73 h window + 1 h = 74 h): a plan 74 h 1 min old is
        rejected by the upkeep, not applied."""
        from datetime import UTC, datetime

        data = settings.model_dump()
        data["schedule"].update(mode="plan_then_apply", apply_delay_minutes=73 * 60)
        long_review = Settings.model_validate(data)
        expired = seed_users(engine, 1)["user-0"]
        with closing(Daemon(engine, long_review, clock=lambda: SLOT)) as daemon:
            daemon.nightly()
        aged = ("UPDATE gc_runs SET finished_at = clock_timestamp() - interval '74 h 1 min',"
                " started_at = clock_timestamp() - interval '74 h 2 min'")  # fmt: skip
        execute(engine, aged)
        with closing(Daemon(engine, long_review, clock=lambda: datetime.now(UTC))) as later:
            assert later.apply_due_plans() == []
        assert runs(engine)[0]["status"] == "rejected"
        assert status(engine, expired) == "active"

    def test_a_review_window_longer_than_the_plan_age_limit_still_applies(self, engine, settings):
        """schedule.apply_delay_minutes = 73 h (a review window over a long weekend) with the
        default run.max_plan_age_hours = 72: the window wins (the limit is never shorter than
        the window plus an hour), so the plan is applied when the window ends instead of
        being rejected as too old; such settings load as they did before the limit existed."""
        from datetime import UTC, datetime

        data = settings.model_dump()
        data["schedule"].update(mode="plan_then_apply", apply_delay_minutes=73 * 60)
        long_review = Settings.model_validate(data)
        assert long_review.plan_age_limit_hours == 74
        expired = seed_users(engine, 1)["user-0"]
        with closing(Daemon(engine, long_review, clock=lambda: SLOT)) as daemon:
            daemon.nightly()
        execute(
            engine,
            "UPDATE gc_runs SET"
            " finished_at = clock_timestamp() - interval '73 hours 1 minute',"
            " started_at = clock_timestamp() - interval '73 hours 2 minutes'",
        )
        with closing(Daemon(engine, long_review, clock=lambda: datetime.now(UTC))) as later:
            assert len(later.apply_due_plans()) == 1
        assert status(engine, expired) == "deleted"


class TestPerBatchServerErrorsStopTheRun:
    def test_a_batch_over_statement_timeout_is_isolated_like_any_failing_batch(
        self, engine, monkeypatch
    ):
        """One user's batch is too heavy for the role's statement_timeout (57014
        query_canceled: a failure of that batch's work, not a lost database). The batch fails
        alone and the users after it are done (it used to be taken for a lost database and stop
        the whole run, every night)."""
        from gc_worker.errors import DatabaseUnavailable

        expired = seed_users(engine)
        real = ttl.plan

        def heavy_for_user_1(ctx):
            if "user-1" in ctx.users:  # this user's query runs over the role's timeout
                ctx.conn.execute(sa.text("SET LOCAL statement_timeout = '50ms'"))
                ctx.conn.execute(sa.text("SELECT pg_sleep(1)"))
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", heavy_for_user_1)
        request = gc_engine.RunRequest(
            mode="apply", now=NOW, jobs=gc_engine.resolve_jobs([], BATCHED)
        )
        raised = None
        try:
            gc_engine.run_once(engine, BATCHED, request)
        except (RunFailed, DatabaseUnavailable) as exc:
            raised = exc
        states = execute(
            engine, "SELECT array_agg(state ORDER BY batch_no) FROM gc_run_batches"
        ).scalar()
        assert states == ["done", "failed", "done"], f"{states}: {raised!r}"
        assert status(engine, expired["user-2"]) == "deleted"


class TestRowlessCompletionOnStop:
    def test_a_stopping_worker_does_not_start_the_rowless_erasures(self, engine):
        """A stop (SIGTERM) while the run's next batch waits for a user another batch holds:
        the batch is given up and the worker returns promptly; it does not go on to the
        requests of users without rows (erasure.complete_rowless), whose wait for a user held
        elsewhere would hang the stop."""
        import threading
        import time

        seed_users(engine, 1)  # user-0: the run's only batch
        execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id) VALUES ('user', 'ghost')")
        request = gc_engine.RunRequest(
            mode="apply", now=NOW, jobs=gc_engine.resolve_jobs([], BATCHED)
        )
        run_id = gc_engine.start_run(engine, BATCHED, request)
        other = engine.connect()  # another worker's batch holds user-0 and ghost (rows read
        for user in ("user-0", "ghost"):  # before the application deleted ghost's)
            other.execute(sa.text("SELECT pg_advisory_lock(4242001, hashtext(:u))"), {"u": user})
        other.commit()
        stop = {"asked": False}

        def should_stop():
            return stop["asked"]

        done = threading.Event()

        def work():
            try:
                gc_engine.process_run(engine, run_id, BATCHED, should_stop=should_stop)
            finally:
                done.set()

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        time.sleep(1.5)  # the batch waits for user-0
        stop["asked"] = True  # SIGTERM
        stopped = done.wait(20)  # a hang is forever (until the unlock below): generous
        other.execute(sa.text("SELECT pg_advisory_unlock_all()"))
        other.commit()
        other.close()
        thread.join(30)
        ghost = execute(engine, "SELECT status FROM gc_erasure_requests").scalar()
        assert stopped, f"the stopping worker hung in complete_rowless (then: request {ghost})"


class TestStaleDuePlanListRetriesAFailedApply:
    def test_a_replica_with_the_plan_still_listed_does_not_retry_a_failed_apply(
        self, engine, monkeypatch
    ):
        """Replicas A and B both listed the due plan. A applies it; one batch fails and A's
        apply run ends failed with nothing pending. B then reaches the plan: it does not take
        the failed apply up and retry its failed batch (for a batch that kills its worker:
        three more deaths); a failed batch is left to the next plan."""
        seed_users(engine)
        review = plan_then_apply(BATCHED)
        with closing(Daemon(engine, review, clock=lambda: SLOT)) as maker:
            plan_id = maker.nightly()
        calls = []
        from datetime import UTC, datetime

        a = Daemon(engine, review, clock=lambda: datetime.now(UTC) + timedelta(hours=2))
        b = Daemon(engine, review, clock=lambda: datetime.now(UTC) + timedelta(hours=2))
        try:  # the apply replays the stored plan: its batch 1 (user-1) fails to apply
            from gc_worker import audit as audit_mod

            real_record = audit_mod.record_outcome

            def record_outcome(conn, run_id, batch_no, outcome):
                if batch_no == 1:
                    calls.append(batch_no)
                    raise RuntimeError("cannot apply batch 1")
                return real_record(conn, run_id, batch_no, outcome)

            monkeypatch.setattr(audit_mod, "record_outcome", record_outcome)
            with pytest.raises(RunFailed):
                a.apply_due_plans()
            apply_id = runs(engine)[1]["id"]
            assert calls == [1]
            monkeypatch.setattr(scheduler, "due_plans", lambda *_: [plan_id])  # B's listing
            with contextlib.suppress(RunFailed):
                b.apply_due_plans()
        finally:
            a.close()
            b.close()
        assert calls == [1], "B retried the failed batch of A's failed apply run"
        assert (
            execute(engine, "SELECT status FROM gc_runs WHERE id = :r", r=apply_id).scalar()
            == "failed"
        )
