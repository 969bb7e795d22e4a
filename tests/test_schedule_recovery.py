"""The daemon after failures: slots due meanwhile, metrics present from the start, stale
applies, one nightly run at a time (cases a review reproduced; each failed before its fix)."""

from __future__ import annotations

from contextlib import closing
from datetime import timedelta

import pytest

import jobs.ttl_expiry as ttl
from gc_worker import scheduler
from gc_worker.config import ScheduleSettings
from gc_worker.daemon import Daemon
from gc_worker.errors import RunFailed
from tests.store import execute
from tests.test_schedule import SLOT, runs, seed
from tests.test_schedule_metrics import endpoint, sample, scrape  # noqa: F401  (fixture)


def overrunning_failure(engine, settings, monkeypatch):
    """A daemon whose slot S1's only batch overruns the next fire time S2 (APScheduler skips
    that firing), then fails: RunFailed after closing S1. Returns (daemon, S2)."""
    seed(engine, users=1)
    nxt = SLOT + timedelta(days=1)
    clock = {"now": SLOT + timedelta(minutes=1)}
    real = ttl.plan

    def plan(ctx):
        if clock["now"] < nxt:
            clock["now"] = nxt + timedelta(minutes=1)
            raise RuntimeError("a row the job cannot handle")
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)
    return Daemon(engine, settings, clock=lambda: clock["now"]), nxt


class TestNightlyGoesOnAfterAFailedRun:
    def test_slot_due_while_a_run_that_ends_failed_ran_is_started(
        self, engine, settings, monkeypatch
    ):
        """S1's run overruns the next fire time S2 and ends failed. The job goes on with the
        slot that came due meanwhile: a failed end is an end (it used to stop at the
        RunFailed)."""
        daemon, nxt = overrunning_failure(engine, settings, monkeypatch)
        with closing(daemon), pytest.raises(RunFailed):
            daemon.nightly()
        assert [r["slot"] for r in runs(engine)] == [
            scheduler.slot_key(SLOT),
            scheduler.slot_key(nxt),
        ], "the slot that came due during the failed run was never started"

    def test_once_due_pass_does_not_lose_the_slot(self, engine, settings, monkeypatch):
        """Same with `schedule --once-due` (no upkeep to catch up): S2 is started in the same
        pass (it used to exit with S2 never started)."""
        daemon, nxt = overrunning_failure(engine, settings, monkeypatch)
        with closing(daemon):
            daemon.run_once()
        assert scheduler.slot_key(nxt) in [r["slot"] for r in runs(engine)]


class TestUnitFailureSeriesExistBeforeTheFirstFailure:
    def test_each_documented_unit_is_exported_at_zero(self, endpoint):  # noqa: F811
        """`increase(memory_gc_unit_failures_total[15m]) > 0` (the documented alert) cannot see
        a series that is born at 1: Prometheus has no earlier sample. The documented units must
        be exported at 0 from the start (they used to appear at 1)."""
        _, url = endpoint
        metrics = scrape(url + "/metrics")
        units = (
            "nightly",
            "catch_up_slot",
            "apply_due_plans",
            "resume_orphans",
            "sweep_next",
            "count_pending_sweeps",
        )
        missing = [
            u for u in units if sample(metrics, "memory_gc_unit_failures_total", unit=u) is None
        ]
        assert missing == []


class TestStalePlanKeepsItsFailure:
    def test_rejecting_a_stale_failed_plan_keeps_why_it_failed(self, engine, settings, monkeypatch):
        """A plan that ended failed (a bad batch) and then went stale: the rejection adds its
        reason and keeps the plan's own error (it used to overwrite it)."""
        seed(engine, users=2)
        review = settings.model_copy(
            update={
                "schedule": ScheduleSettings(mode="plan_then_apply", apply_delay_minutes=60),
                "run": settings.run.model_copy(update={"batch_users": 1}),
            }
        )
        real = ttl.plan

        def plan(ctx):
            if "user-001" in ctx.users:
                raise RuntimeError("a row the job cannot handle")
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", plan)
        with closing(Daemon(engine, review, clock=lambda: SLOT)) as d, pytest.raises(RunFailed):
            d.nightly()
        monkeypatch.undo()
        execute(engine, "UPDATE gc_runs SET finished_at = finished_at - interval '73 hours'")
        with closing(Daemon(engine, review, clock=lambda: SLOT + timedelta(days=4))) as later:
            later.apply_due_plans()
        (plan_run,) = runs(engine)
        assert plan_run["status"] == "rejected"
        assert "RuntimeError: a row the job cannot handle" in (plan_run["error"] or ""), plan_run[
            "error"
        ]


class TestStaleApplyIsNotResumed:
    def test_stopped_apply_of_a_stale_plan_is_not_finished_by_the_daemon(self, engine):
        """The nightly apply of plan P stopped after batch 0 (daemons died); they come back 80 h
        after P was made. `memory-gc apply P` refuses to take the apply up (too old), and so
        does the upkeep: the apply is closed as failed with that reason (it used to apply the
        rest of the stale plan)."""
        from datetime import UTC, datetime

        from gc_worker import engine as gc_engine
        from gc_worker.apply_start import start_apply
        from gc_worker.errors import UsageError
        from gc_worker.run_record import load_run
        from tests.store import status
        from tests.test_lifecycle_failures import BATCHED, plan_then_apply, seed_users

        expired = seed_users(engine, 2)
        review = plan_then_apply(BATCHED)
        with closing(Daemon(engine, review, clock=lambda: SLOT)) as maker:
            plan_id = maker.nightly()
        apply_id = start_apply(engine, plan_id, trigger="nightly_apply")
        done: list[int] = []
        gc_engine.process_run(
            engine, apply_id, review, on_batch=done.append, should_stop=lambda: bool(done)
        )  # killed after batch 0
        assert status(engine, expired["user-1"]) == "active"
        execute(
            engine,
            "UPDATE gc_runs SET finished_at = finished_at - interval '80 hours',"
            " started_at = started_at - interval '80 hours' WHERE id = :p",
            p=plan_id,
        )
        with pytest.raises(UsageError, match="older than"):
            start_apply(engine, plan_id)  # the CLI refuses to take it up
        with closing(Daemon(engine, review, clock=lambda: datetime.now(UTC))) as daemon:
            daemon.upkeep()
        assert status(engine, expired["user-1"]) == "active", "a stale plan was applied"
        with engine.connect() as conn:
            closed = load_run(conn, apply_id)
        assert closed["status"] == "failed" and "older than" in closed["error"]

    def test_a_stale_apply_another_replica_took_up_is_left_to_it(self, engine):
        """Between finding the orphan and closing it, another replica may have taken the stale
        apply up: it is then neither failed under that replica nor resumed here."""
        from gc_worker.apply_start import start_apply
        from gc_worker.claims import participating
        from gc_worker.run_record import load_run
        from tests.test_lifecycle_failures import BATCHED, plan_then_apply, seed_users

        seed_users(engine, 2)
        review = plan_then_apply(BATCHED)
        with closing(Daemon(engine, review, clock=lambda: SLOT)) as maker:
            plan_id = maker.nightly()
        apply_id = start_apply(engine, plan_id, trigger="nightly_apply")
        execute(engine, "UPDATE gc_runs SET finished_at = finished_at - interval '80 hours'"
                        " WHERE id = :p", p=plan_id)  # fmt: skip
        with participating(engine, apply_id):  # the other replica works it
            assert scheduler.close_unresumable(engine, apply_id, 72, SLOT) is True
        with engine.connect() as conn:
            assert load_run(conn, apply_id)["status"] == "running"
        assert scheduler.close_unresumable(engine, apply_id, 72, SLOT) is True  # an orphan now
        with engine.connect() as conn:
            assert load_run(conn, apply_id)["status"] == "failed"


class TestOneNightlyRunPerDaemon:
    def test_upkeep_does_not_resume_a_nightly_run_beside_the_busy_nightly_job(
        self, engine, settings, monkeypatch
    ):
        """A daemon works one nightly run at a time: while the cron thread works slot S1, the
        upkeep does not join the orphaned run of S0 beside it (it used to; S0's batches, with
        an older `now`, queued behind S1's users); a later upkeep does."""
        import threading

        from gc_worker import engine as gc_engine

        seed(engine, users=1)
        s1 = SLOT + timedelta(days=1)
        orphan = gc_engine.start_run(
            engine,
            settings,
            gc_engine.RunRequest(
                mode="apply", now=SLOT, jobs=gc_engine.resolve_jobs([], settings), trigger="nightly"
            ),
            slot=scheduler.slot_key(SLOT),
        )
        daemon = Daemon(engine, settings, clock=lambda: s1 + timedelta(minutes=1))
        real, in_s1, release = ttl.plan, threading.Event(), threading.Event()

        def plan(ctx):
            if ctx.now == s1:
                in_s1.set()
                assert release.wait(20)
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", plan)
        cron = threading.Thread(target=daemon.nightly)
        cron.start()
        try:
            assert in_s1.wait(10)
            upkeep = threading.Thread(target=daemon.upkeep)
            upkeep.start()
            upkeep.join(3)
            held = execute(
                engine,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND classid = 4242002 AND objsubid = 2 AND granted"
                " AND objid = CAST(hashtext(CAST(:r AS text)) AS oid)",
                r=orphan,
            ).scalar()
        finally:
            release.set()
            cron.join(20)
            upkeep.join(20)
            daemon.close()
        assert held == 0, "the daemon worked two nightly runs at once"


class TestALostDatabaseLeavesTheNightlyRunResumable:
    @pytest.mark.parametrize("workers", [1, 2])
    def test_a_restart_mid_run_is_resumed_by_the_next_upkeep(
        self, engine, settings, monkeypatch, workers
    ):
        """A database restart (a failover, a minor upgrade) ended the nightly run's batch with
        the connection gone: the run was marked failed with its batches pending, and a failed
        slot is not run again — the night was lost for every user left. The run is now left
        running with nobody working it, and the next upkeep takes it up and completes it."""
        from gc_worker import batch_run
        from gc_worker.errors import DatabaseUnavailable

        seed(engine, users=3)
        settings = settings.model_copy(
            update={"run": settings.run.model_copy(update={"batch_users": 1, "workers": workers})}
        )
        real, calls, back = batch_run._commit_batch, [], []

        def restart(*args, **kwargs):  # the first batch commits, then the server restarts
            calls.append(1)
            if len(calls) > 1 and not back:
                raise DatabaseUnavailable("connection lost: terminating connection (57P01)")
            return real(*args, **kwargs)

        monkeypatch.setattr(batch_run, "_commit_batch", restart)
        with closing(Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=1))) as d:
            with pytest.raises(DatabaseUnavailable):
                d.nightly()
            (night,) = runs(engine)
            assert night["status"] == "running" and night["error"] is None
            back.append(True)  # the server is back
            assert d.resume_orphans() == [night["id"]]
            counted = d.metrics.batches.labels("nightly")._value.get()
        (night,) = runs(engine)
        assert night["status"] == "completed"
        assert counted == 3  # the batch committed before the restart is not counted again
        assert (
            execute(engine, "SELECT count(*) FROM memories WHERE status = 'active'").scalar() == 3
        )

    @pytest.mark.parametrize("said", [True, False], ids=["server-restart", "unexplained"])
    def test_restarts_inside_one_batch_do_not_count_as_a_worker_dying_there(
        self, engine, settings, monkeypatch, said
    ):
        """A claim is counted as lost until its worker releases it; three lost claims fail the
        batch as "killed". A worker whose sessions a server restart ended (57P01) is alive and
        so is its batch, but it could not release on that session: three restarts inside one
        batch failed it for good. It now releases on its next session. A session lost with no
        reason from the server (a crash, which the batch itself may cause) still counts, so a
        batch that brings the server down each time is given up after three."""
        import sqlalchemy as sa

        from gc_worker import batch_run
        from gc_worker.errors import DatabaseUnavailable

        seed(engine, users=1)
        real, restarts = batch_run._run_batch, []

        def restart(ctx, *args, **kwargs):  # the server ends the worker's sessions in a batch
            if len(restarts) < 3:
                restarts.append(1)
                batch_pid = ctx.conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
                with engine.connect() as conn:
                    conn.execute(sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        " AND (:said OR pid <> :batch_pid)"
                    ), {"said": said, "batch_pid": batch_pid})  # fmt: skip
                if not said:  # as a crashed backend's session sees its end: no SQLSTATE
                    raise DatabaseUnavailable("the database connection failed mid-transaction")
            return real(ctx, *args, **kwargs)

        monkeypatch.setattr(batch_run, "_run_batch", restart)
        with closing(Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=1))) as d:
            with pytest.raises(DatabaseUnavailable):
                d.nightly()
            for _ in range(2):
                with pytest.raises(DatabaseUnavailable):
                    d.resume_orphans()
            if said:
                d.resume_orphans()
            else:
                with pytest.raises(RunFailed, match="stopped inside this batch 3 times"):
                    d.resume_orphans()
        (night,) = runs(engine)
        assert night["status"] == ("completed" if said else "failed"), night["error"]
        active = execute(engine, "SELECT count(*) FROM memories WHERE status = 'active'")
        assert active.scalar() == (1 if said else 2)

    def test_a_cli_run_that_loses_the_database_is_failed_as_before(
        self, engine, settings, monkeypatch
    ):
        """Nothing resumes a one-shot run: it is closed failed, as it was."""
        from gc_worker import batch_run
        from gc_worker import engine as gc_engine
        from gc_worker.errors import DatabaseUnavailable

        seed(engine, users=2)

        def restart(*args, **kwargs):
            raise DatabaseUnavailable("connection lost: terminating connection (57P01)")

        monkeypatch.setattr(batch_run, "_commit_batch", restart)
        request = gc_engine.RunRequest(mode="apply", now=SLOT, jobs=("ttl_expiry",))
        with pytest.raises(DatabaseUnavailable):
            gc_engine.run_once(engine, settings, request)
        (run,) = runs(engine)
        assert run["status"] == "failed"


def test_library_warnings_are_json_lines_too():
    """APScheduler's "skipped: maximum number of running instances reached", logged every 30 s
    while an upkeep resumes a long run, went through Python's last-resort handler as plain
    text into the daemon's JSON-lines log. Library warnings are now JSON lines; their info
    lines (an HTTP client's per-request line) stay out, and so do warnings under
    MEMORY_GC_LOG_LEVEL=error."""
    import json
    import subprocess
    import sys

    script = (
        "import logging; from gc_worker import logs; logs.configure({level!r});"
        "logging.getLogger('apscheduler.scheduler').warning("
        "'Execution of job %s skipped: maximum number of running instances reached (1)', 'x');"
        "logging.getLogger('httpx').info('HTTP Request: POST http://model/v1');"
        "logging.getLogger('apscheduler.scheduler').error('gave up');"
        "logging.getLogger('openai').setLevel(logging.INFO);"  # what OPENAI_LOG=info does
        "logging.getLogger('openai').info('Retrying request')"
    )
    for level, expected in (("info", ["warning", "error", "info"]), ("error", ["error"])):
        done = subprocess.run(
            [sys.executable, "-c", script.format(level=level)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        lines = [json.loads(line) for line in done.stderr.splitlines()]
        assert [line["level"] for line in lines] == expected
        assert {line["logger"] for line in lines} <= {"apscheduler.scheduler", "openai"}


class TestMetricsOfAFreshReplica:
    def test_the_last_success_comes_from_the_store_and_every_run_series_starts_at_zero(
        self, engine, settings
    ):
        """A replica started after the last nightly success (a deploy, a restart) exported no
        last-success series, so the documented staleness alert saw nothing; and the dry-run
        sweep's completed/failed series were not exported at 0 (a first failure was no
        increase)."""
        from prometheus_client.parser import text_string_to_metric_families

        seed(engine, users=1)
        with closing(Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=1))) as d:
            d.nightly()
        (night,) = runs(engine)
        with closing(Daemon(engine, settings, clock=lambda: SLOT + timedelta(hours=2))) as fresh:
            text = fresh.metrics.exposition().decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        last = samples[("memory_gc_last_success_timestamp_seconds", (("trigger", "nightly"),))]
        assert last == night["finished_at"].timestamp()
        for status in ("completed", "failed"):
            key = (("mode", "dry_run"), ("status", status), ("trigger", "sweep"))
            assert samples[("memory_gc_runs_total", key)] == 0
