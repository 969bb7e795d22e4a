"""Runs nothing resumes, left `running` by a process that was killed: a `memory-gc run`, an
`apply`, a `forget --now`. They stayed `running` for ever (`memory-gc runs`: stopped), and
history retention, which only prunes runs that ended, kept them for ever too. The upkeep now
closes one nobody works, a lease after it started, as failed, saying why; an apply closed so is
still taken up again by `memory-gc apply PLAN_ID`."""

from __future__ import annotations

from contextlib import closing
from datetime import timedelta
from uuid import UUID

import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker.apply_start import start_apply
from gc_worker.claims import participating
from gc_worker.daemon import Daemon
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from tests.store import NOW, add, days_ago, execute, status
from tests.test_schedule_sweeps import NOON
from tests.test_sweep_failures import run_of

LEASE = 300


def stopped(engine, settings, trigger: str, *, age_seconds: float, mode: str = "apply") -> UUID:
    """A run of ``trigger`` its process created ``age_seconds`` ago and then died with."""
    request = RunRequest(
        mode=mode, now=NOW, users=("alice",), jobs=resolve_jobs([], settings), trigger=trigger
    )
    run_id = start_run(engine, settings, request)
    aged(engine, run_id, age_seconds)
    return run_id


def aged(engine, run_id: UUID, age_seconds: float) -> None:
    execute(engine, "UPDATE gc_runs SET started_at = clock_timestamp()"
            " - make_interval(secs => :age) WHERE id = :r", age=age_seconds, r=run_id)  # fmt: skip


def upkeep(engine, settings) -> Daemon:
    with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:  # no slot due
        daemon.upkeep()
    return daemon


def expired(engine, user: str = "alice") -> UUID:
    return add(engine, user, expires_at=days_ago(1))


class TestStoppedRunsAreClosed:
    def test_killed_cli_and_erasure_runs_are_failed_saying_why(self, engine, settings):
        expired(engine)
        cli_run = stopped(engine, settings, "cli", age_seconds=LEASE + 1)
        plan = stopped(engine, settings, "cli", age_seconds=LEASE + 1, mode="dry_run")
        forget = stopped(engine, settings, "erasure", age_seconds=LEASE + 1)
        assert upkeep(engine, settings).failures == 0
        for run_id in (cli_run, plan, forget):
            closed = run_of(engine, run_id)
            assert closed.status == "failed", run_id
            assert "stopped" in closed.error and "no process" in closed.error

    def test_a_fresh_run_a_worked_one_and_the_daemons_own_are_left(self, engine, settings):
        """A run just created (its process is about to take part), one a process works, and a
        nightly run (the upkeep resumes those instead) are not closed."""
        expired(engine)
        fresh = stopped(engine, settings, "cli", age_seconds=10)
        worked = stopped(engine, settings, "cli", age_seconds=LEASE + 1)
        with participating(engine, worked):
            upkeep(engine, settings)
        for run_id in (fresh, worked):
            assert run_of(engine, run_id).status == "running"

    def test_a_closed_apply_is_still_taken_up_again(self, engine, settings):
        """`memory-gc apply PLAN_ID` after a killed apply finishes its pending batches even
        once the upkeep closed it: the closure only says nobody works it."""
        memory = expired(engine)
        plan = gc_engine.run_once(
            engine, settings, RunRequest(mode="dry_run", now=NOW, jobs=("ttl_expiry",))
        )
        apply_id = start_apply(engine, plan)  # then the process died
        aged(engine, apply_id, LEASE + 1)
        upkeep(engine, settings)
        assert run_of(engine, apply_id).status == "failed"
        assert status(engine, memory) == "active"
        assert gc_engine.apply_plan(engine, plan) == apply_id
        assert run_of(engine, apply_id).status == "completed"
        assert status(engine, memory) == "deleted"

    def test_history_prunes_a_closed_run_after_retention(self, engine, settings):
        from gc_worker import history

        expired(engine)
        run_id = stopped(engine, settings, "cli", age_seconds=LEASE + 1)
        upkeep(engine, settings)
        later = NOW + timedelta(days=settings.history.retention_days + 1)
        execute(engine, "UPDATE gc_runs SET finished_at = :t WHERE id = :r",
                t=NOW, r=run_id)  # fmt: skip
        history.prune(engine, settings, now=later)
        assert execute(engine, "SELECT count(*) FROM gc_runs WHERE id = :r", r=run_id).scalar() == 0


def test_a_run_whose_start_took_a_lease_is_not_closed_before_it_is_worked(
    engine, settings, monkeypatch
):
    """The lease counts from the run row's insert, at the start of its transaction: one whose
    batches took longer to record (a large store, a slow machine) was already "a lease old"
    when it committed, and an upkeep in the moment before its process took part closed it as
    stopped — a live run failed, nothing done. The process takes part before the commit."""
    from gc_worker import run_workers

    memory = expired(engine)
    real_insert, real_work = gc_engine._insert_batches, run_workers.work_batches

    def slow_insert(conn, run_id, batches, found):
        real_insert(conn, run_id, batches, found)
        older = "UPDATE gc_runs SET started_at = started_at - make_interval(secs => :age)"
        conn.execute(sa.text(older + " WHERE id = :r"), {"age": LEASE + 1, "r": run_id})

    def upkeep_first(*args, **kwargs):  # another daemon's upkeep, before this process takes part
        upkeep(engine, settings)
        return real_work(*args, **kwargs)

    monkeypatch.setattr(gc_engine, "_insert_batches", slow_insert)
    monkeypatch.setattr(run_workers, "work_batches", upkeep_first)
    run_id = gc_engine.run_once(engine, settings, RunRequest(mode="apply", now=NOW,
                                                             jobs=("ttl_expiry",)))  # fmt: skip
    assert run_of(engine, run_id).status == "completed"
    assert status(engine, memory) == "deleted"
