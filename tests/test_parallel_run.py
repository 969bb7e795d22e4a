"""Several workers in one process (``run.workers``): the caller's thread and helper threads work
a run's batches side by side, each a participant of its own, as replicas sharing a run do.

They end where one worker ends; a one-user run starts no helper; a participant that loses the
database leaves the run to the other, and when both fail the run is failed, not left
``running`` with nobody on it; Ctrl-C / SIGTERM stops the helpers after their batch and leaves
the run resumable; the model budget is the run's, not each thread's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

import jobs.ttl_expiry as ttl
from gc_worker import batch_run, run_workers
from gc_worker import engine as gc_engine
from gc_worker.config import Settings
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.errors import DatabaseUnavailable, WriteConflict
from gc_worker.report import build_report
from tests.fake_model import FakeModel, fake_port
from tests.interrupts import CtrlC, ctrl_c
from tests.seeding import end_state, lifecycle_rows, seed, state_diff
from tests.store import NOW, run
from tests.test_faults import (  # noqa: F401  (fixtures)
    LLM_SETTINGS,
    databases,
    engine,
    llm_rows,
    seed_both,
    twin,
)

USERS = tuple(f"user-{i}" for i in range(6))
PARALLEL = Settings.model_validate(
    {"embeddings": {"dim": 8}, "run": {"batch_users": 1, "workers": 2}}
)
SERIAL = Settings.model_validate(
    {"embeddings": {"dim": 8}, "run": {"batch_users": 1, "workers": 1}}
)
HELPER = "memory-gc-run-"


def planning_threads(monkeypatch, hook=None) -> list[str]:
    """The threads that plan ttl_expiry, one entry per batch; ``hook(thread_name)`` runs first."""
    seen: list[str] = []
    real = ttl.plan

    def plan(ctx: Any) -> Any:
        name = threading.current_thread().name
        seen.append(name)
        if hook is not None:
            hook(name)
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)
    return seen


def rows() -> list[dict[str, Any]]:
    return [r for u in USERS for r in lifecycle_rows(u)]


def batch_states(engine: sa.Engine, run_id: Any) -> list[str]:  # noqa: F811
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT state FROM gc_run_batches WHERE run_id = :r ORDER BY batch_no"),
                {"r": run_id},
            ).scalars()
        )


def run_status(engine: sa.Engine, run_id: Any) -> tuple[str, str | None]:  # noqa: F811
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT status, error FROM gc_runs WHERE id = :r"), {"r": run_id}
        ).one()


def outline(report: dict[str, Any]) -> dict[str, Any]:
    return {job: (row["actions"], row["by_action"]) for job, row in report["jobs"].items()}


def working_threads(monkeypatch) -> list[str]:
    """The names of the threads that take part in a run, one entry each (``_work_run``)."""
    seen: list[str] = []
    real = run_workers._work_run

    def work_run(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_workers, "_work_run", work_run)
    return seen


def helpers_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(HELPER)]


def test_two_workers_end_where_one_ends(engine, twin, monkeypatch):  # noqa: F811
    """Both threads work batches (they overlap), every batch is done once, and the store, the
    actions and the audit end as a single worker leaves them on an identical copy."""
    ids = seed_both(engine, twin, rows())
    helper_started = threading.Event()

    def hook(name: str) -> None:
        if name == "MainThread":
            assert helper_started.wait(30)  # a loaded machine may start the helper late
        else:
            helper_started.set()
        time.sleep(0.05)

    seen = planning_threads(monkeypatch, hook=hook)
    report = run(engine, PARALLEL)
    assert len(seen) == len(USERS) and {"MainThread", f"{HELPER}1"} <= set(seen), seen
    assert batch_states(engine, report["run_id"]) == ["done"] * len(USERS)
    monkeypatch.undo()
    reference = run(twin, SERIAL)
    assert outline(report) == outline(reference)
    diff = state_diff(end_state(engine, ids), end_state(twin, ids))
    assert not diff, "\n".join(diff)
    assert helpers_alive() == []


def test_a_one_user_run_starts_no_helper(engine, monkeypatch):  # noqa: F811
    seed(engine, rows())
    seen = planning_threads(monkeypatch)
    report = run(engine, PARALLEL, users=[USERS[0]])
    assert seen == ["MainThread"] and report["totals"]["actions"] > 0


def test_a_participant_that_loses_the_database_leaves_the_run_to_the_other(
    engine,  # noqa: F811
    twin,  # noqa: F811
    monkeypatch,
):
    """The helper's every commit fails (its connection keeps conflicting); it gives up, leaves
    the run to the caller's thread, which takes its batch up: the run completes, whole."""
    ids = seed_both(engine, twin, rows())
    real_commit, helper_tried = batch_run._commit_batch, threading.Event()

    def commit(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith(HELPER):
            helper_tried.set()
            raise WriteConflict("deadlock detected (40P01); rolled back whole")
        return real_commit(*args, **kwargs)

    def hook(name: str) -> None:  # the helper has a batch before the caller can take them all
        if name == "MainThread":
            assert helper_tried.wait(30)

    monkeypatch.setattr(batch_run, "_commit_batch", commit)
    planning_threads(monkeypatch, hook=hook)
    request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], PARALLEL))
    run_id = start_run(engine, PARALLEL, request)
    assert gc_engine.process_run(engine, run_id, PARALLEL) is True
    assert run_status(engine, run_id) == ("completed", None)
    assert batch_states(engine, run_id) == ["done"] * len(USERS)
    monkeypatch.undo()
    run(twin, SERIAL)
    diff = state_diff(end_state(engine, ids), end_state(twin, ids))
    assert not diff, "\n".join(diff)


@pytest.mark.parametrize("how", ["run", "apply"])
def test_both_participants_failing_fail_the_run(engine, monkeypatch, how):  # noqa: F811
    """Each left the run to the other while it still took part; once both are out the run is
    marked failed (it used to stay `running` with nobody working it)."""
    seed(engine, rows())
    plan_id = None
    if how == "apply":
        plan_id = gc_engine.run_once(
            engine, PARALLEL, RunRequest(mode="dry_run", now=NOW, jobs=resolve_jobs([], PARALLEL))
        )

    def conflict(*a: Any, **k: Any) -> None:
        time.sleep(0.05)  # both threads are inside a batch when the first gives up
        raise WriteConflict("deadlock detected (40P01); rolled back whole")

    monkeypatch.setattr(batch_run, "_commit_batch", conflict)
    with pytest.raises((WriteConflict, DatabaseUnavailable)):
        if plan_id is None:
            gc_engine.run_once(
                engine, PARALLEL, RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], PARALLEL))
            )
        else:
            gc_engine.apply_plan(engine, plan_id)
    with engine.connect() as conn:
        run_id = conn.execute(
            sa.text("SELECT id FROM gc_runs WHERE mode = 'apply' ORDER BY started_at DESC LIMIT 1")
        ).scalar_one()
    status, error = run_status(engine, run_id)
    assert status == "failed" and "deadlock" in (error or ""), (status, error)
    assert "done" not in batch_states(engine, run_id)
    assert helpers_alive() == []


def test_an_interrupt_stops_the_helpers_after_their_batch(engine, twin, monkeypatch):  # noqa: F811
    """Ctrl-C (SIGTERM in a container) lands in the caller's thread, inside its first batch: that
    batch rolls back, the helper finishes the batch it is in and stops, the interrupt is raised,
    and the run stays `running` with its other batches pending — the next process takes it up
    and ends where an undisturbed run ends."""
    ids = seed_both(engine, twin, rows())
    helper_in_batch, caller_waits = threading.Event(), threading.Event()
    real_wait = run_workers._HelperThreads.wait

    def hook(name: str) -> None:
        if name == "MainThread":
            assert helper_in_batch.wait(30)  # a loaded machine may start the helper late
            raise KeyboardInterrupt
        helper_in_batch.set()
        assert caller_waits.wait(30)  # still in its batch when the caller is interrupted

    def wait(threads: Any) -> None:
        caller_waits.set()  # the caller was interrupted: the helpers are told to stop
        real_wait(threads)

    planning_threads(monkeypatch, hook=hook)
    monkeypatch.setattr(run_workers._HelperThreads, "wait", wait)
    request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], PARALLEL))
    run_id = start_run(engine, PARALLEL, request)
    with pytest.raises(KeyboardInterrupt):
        gc_engine.process_run(engine, run_id, PARALLEL)
    assert helpers_alive() == []
    states = batch_states(engine, run_id)
    assert 1 <= states.count("done") <= 2 and states.count("pending") >= len(USERS) - 2, states
    assert run_status(engine, run_id)[0] == "running"
    monkeypatch.undo()
    assert gc_engine.process_run(engine, run_id, PARALLEL) is True
    run(twin, SERIAL)
    diff = state_diff(end_state(engine, ids), end_state(twin, ids))
    assert not diff, "\n".join(diff)


def test_the_model_budget_is_the_runs_not_each_threads(engine):  # noqa: F811
    """`llm.max_calls_per_run` bounds the run: two threads asking at once spend one budget."""
    seed(engine, [r for u in USERS for r in llm_rows(u)])
    settings = Settings.model_validate(
        LLM_SETTINGS.model_dump()
        | {"run": {"batch_users": 1, "workers": 2}, "llm": {"max_calls_per_run": 3}}
    )
    model = FakeModel("good")
    with fake_port(engine, settings, model) as llm:
        report = run(engine, settings, llm=llm)
    assert sum(model.calls.values()) == 3 and report["llm"]["calls"] == 3
    with engine.connect() as conn:
        deferred = build_report(conn, report["run_id"])["totals"]["by_action"].get("deferred", 0)
    assert deferred > 0  # the rest waits for the next run, and says so


def interrupt_while_the_caller_waits(
    monkeypatch, interrupt: CtrlC
) -> tuple[threading.Thread, threading.Event]:
    """Hold the helper's first batch and send Ctrl-C to the main thread once the caller's thread
    has run out of batches and waits for the helper; the helper's batch goes on once the caller
    has taken the interrupt. The signal is sent only while the helper holds its batch (checked
    under the lock the helper takes to leave it), so the run cannot have returned: a late signal
    could otherwise land in whatever test runs next on this process (it did once: an xdist
    worker was interrupted). Returns the (started) sender and an Event set once the caller took
    the signal."""
    gate = threading.Lock()
    sent = threading.Event()
    helper_in, holding = threading.Event(), threading.Event()
    caller_waits, caller_interrupted = threading.Event(), threading.Event()

    def hook(name: str) -> None:
        if name.startswith(HELPER) and not helper_in.is_set():
            holding.set()
            helper_in.set()
            caller_interrupted.wait(30)
            with gate:
                holding.clear()
        elif name == "MainThread":  # a loaded machine may start the helper late: the caller
            helper_in.wait(30)  # waits for it, or it could take every batch and nobody would
            # be left to wait for

    planning_threads(monkeypatch, hook=hook)
    real_wait = run_workers._HelperThreads.wait

    def wait(threads: Any) -> None:  # the caller's: the first, then again after Ctrl-C
        (caller_interrupted if caller_waits.is_set() else caller_waits).set()
        real_wait(threads)

    monkeypatch.setattr(run_workers._HelperThreads, "wait", wait)

    def send() -> None:
        if not caller_waits.wait(30):
            return
        with gate:
            if holding.is_set() and interrupt.send():
                sent.set()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender, sent


def test_an_interrupt_while_waiting_for_the_helpers_stops_them_too(engine, monkeypatch):  # noqa: F811
    """The caller's thread ran out of batches and waits for a helper's slow one when SIGINT
    lands: the helper still finishes its batch and stops before the interrupt is raised (it
    used to be left running, to die with the process mid-transaction)."""
    seed(engine, rows()[: 4 * len(lifecycle_rows("x"))])  # four users, four batches
    request = RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
    run_id = start_run(engine, PARALLEL, request)
    with ctrl_c() as interrupt:
        sender, sent = interrupt_while_the_caller_waits(monkeypatch, interrupt)
        completed = gc_engine.process_run(engine, run_id, PARALLEL)
        sender.join()
    assert sent.is_set()  # the interrupt did land while the caller waited
    assert helpers_alive() == []
    assert batch_states(engine, run_id) == ["done"] * 4  # the helper's batch was finished
    # ... and it was the last: the helper completed the run, which is what the caller reports
    assert completed is True and run_status(engine, run_id) == ("completed", None)


def test_a_run_a_helper_completed_during_ctrl_c_gets_its_summary_and_report(
    cli_env, monkeypatch, tmp_path, capsys
):
    """`memory-gc run --report`: Ctrl-C while the caller waits for the helper's last batch; the
    helper completes the run. The command reports the completed run (it printed "interrupted",
    exit 1, no summary, no report, for a run stored as completed). Found by a third review."""
    from gc_worker import db
    from gc_worker.cli import main

    cli_engine = db.make_engine(cli_env)
    seed(cli_engine, [r for u in ("user-a", "user-b") for r in lifecycle_rows(u)])
    monkeypatch.setenv("MEMORY_GC_RUN__BATCH_USERS", "1")
    report = tmp_path / "r.json"
    with ctrl_c() as interrupt:
        sender, sent = interrupt_while_the_caller_waits(monkeypatch, interrupt)
        code = main(["run", "--job", "ttl_expiry", "--report", str(report)])
        sender.join()
    assert sent.is_set()  # the interrupt did land while the caller waited
    out, err = capsys.readouterr()
    assert helpers_alive() == []
    with cli_engine.connect() as conn:
        status = conn.execute(sa.text("SELECT status FROM gc_runs")).scalar_one()
    cli_engine.dispose()
    assert status == "completed"  # the helper closed it
    assert (code, report.exists(), "completed" in out) == (0, True, True), (code, out, err)


def helper_loses_the_database(monkeypatch) -> threading.Event:
    """The helper's commit fails; the Event is set once the helper has left the run (to the
    caller's thread, which still takes part)."""
    real_commit, real_work = batch_run._commit_batch, run_workers._work_run
    failed = threading.Event()

    def commit(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name != "MainThread":
            raise DatabaseUnavailable("the helper's connection was lost")
        return real_commit(*args, **kwargs)

    def work_run(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_work(*args, **kwargs)
        finally:
            if threading.current_thread().name != "MainThread":
                failed.set()

    monkeypatch.setattr(batch_run, "_commit_batch", commit)
    monkeypatch.setattr(run_workers, "_work_run", work_run)
    return failed


def test_a_stop_after_a_helper_failed_leaves_the_run_resumable(engine, monkeypatch):  # noqa: F811
    """The helper loses the database and leaves the run to the caller's thread; then the daemon
    is asked to stop: the caller finishes its batch and stops. Nobody failed the run *last*: it
    stays `running`, its other batches pending, for the next upkeep (it was marked failed: some
    participant had an error and nobody completed it). Found by a review."""
    seed(engine, rows())
    stop = threading.Event()

    def hook(name: str) -> None:
        if name == "MainThread":
            assert failed.wait(30)  # the helper has failed
            stop.set()

    failed = helper_loses_the_database(monkeypatch)
    planning_threads(monkeypatch, hook=hook)
    request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], PARALLEL))
    run_id = start_run(engine, PARALLEL, request)
    with pytest.raises(DatabaseUnavailable):  # the caller is told what happened to the helper
        gc_engine.process_run(engine, run_id, PARALLEL, should_stop=stop.is_set)
    states = batch_states(engine, run_id)
    assert states.count("done") == 1 and states.count("pending") == len(USERS) - 1, states
    assert run_status(engine, run_id) == ("running", None)


def test_an_interrupt_after_a_helper_failed_leaves_the_run_resumable(engine, monkeypatch):  # noqa: F811
    seed(engine, rows())

    def hook(name: str) -> None:
        if name == "MainThread":
            assert failed.wait(30)
            raise KeyboardInterrupt

    failed = helper_loses_the_database(monkeypatch)
    planning_threads(monkeypatch, hook=hook)
    request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], PARALLEL))
    run_id = start_run(engine, PARALLEL, request)
    with pytest.raises(KeyboardInterrupt):
        gc_engine.process_run(engine, run_id, PARALLEL)
    assert batch_states(engine, run_id) == ["pending"] * len(USERS)
    assert run_status(engine, run_id) == ("running", None)


def test_apply_works_with_this_processs_workers_not_the_plans(cli_env, monkeypatch):
    """`MEMORY_GC_RUN__WORKERS=1 memory-gc apply PLAN` uses one thread although the plan was
    made with two (it read the plan's stored settings, as every older plan would: default 2)."""
    from gc_worker import db
    from gc_worker.cli import main

    cli_engine = db.make_engine(cli_env)
    seed(cli_engine, rows())
    plan_id = gc_engine.run_once(
        cli_engine, PARALLEL, RunRequest(mode="dry_run", now=NOW, jobs=resolve_jobs([], PARALLEL))
    )
    cli_engine.dispose()
    seen = working_threads(monkeypatch)  # an apply plans nothing: its threads work the run
    monkeypatch.setenv("MEMORY_GC_RUN__WORKERS", "1")
    assert main(["apply", str(plan_id)]) == 0
    assert seen == ["MainThread"], seen


def test_a_pool_timeout_is_the_database_not_the_batch():
    """A pool that gives no connection in time is database trouble (the run stops, resumable),
    not a failure of the batch's users (failed for good)."""
    from gc_worker.db import translated_errors

    with (
        pytest.raises(DatabaseUnavailable, match="no database connection"),
        translated_errors(),
    ):
        raise sa.exc.TimeoutError("QueuePool limit of size 5 overflow 40 reached")


def test_a_sqlite_url_is_still_a_configuration_error():
    """The pool setting for PostgreSQL must not turn a wrong URL into a traceback."""
    from gc_worker import db
    from gc_worker.errors import ConfigError

    with pytest.raises(ConfigError, match="sqlite"):
        db.make_engine("sqlite://")


TWO_USERS = ("user-a", "user-b")  # two batches: one for the caller's thread, one for a helper


def two_batch_settings(workers: int) -> Settings:
    return Settings.model_validate(
        {"embeddings": {"dim": 8}, "run": {"batch_users": 1, "workers": workers}}
    )


def helper_fails_after_the_caller_ran_out(monkeypatch) -> None:
    """The caller's thread commits its batch once the helper holds the other one, finds
    nothing left to claim and waits; then the helper loses the database."""
    real_commit, real_work = batch_run._commit_batch, run_workers._work_run
    helper_in, caller_out = threading.Event(), threading.Event()

    def commit(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name.startswith(HELPER):
            helper_in.set()
            assert caller_out.wait(30)  # the caller's thread found nothing to claim, and waits
            raise DatabaseUnavailable("the helper's connection was lost")
        assert helper_in.wait(30)
        return real_commit(*args, **kwargs)

    def work_run(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_work(*args, **kwargs)
        finally:
            if threading.current_thread().name == "MainThread":
                caller_out.set()

    monkeypatch.setattr(batch_run, "_commit_batch", commit)
    monkeypatch.setattr(run_workers, "_work_run", work_run)


def second_commit_fails(monkeypatch) -> None:
    real_commit = batch_run._commit_batch
    calls = {"n": 0}

    def commit(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise DatabaseUnavailable("the helper's connection was lost")
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(batch_run, "_commit_batch", commit)


def work_two_batches(how: str, engine, workers: int, inject) -> Any:  # noqa: F811
    """Work a two-batch run as the daemon or `memory-gc apply` does (both hold a participation
    of their own around process_run), the fault injected once the run (or plan) is made."""
    from gc_worker.daemon import Daemon

    settings = two_batch_settings(workers)
    jobs = resolve_jobs([], settings)
    if how == "daemon":
        run_id = start_run(engine, settings, RunRequest(mode="apply", now=NOW, jobs=jobs))
        inject()
        daemon = Daemon(engine, settings)
        try:
            with pytest.raises(DatabaseUnavailable):
                daemon.work(run_id)
        finally:
            daemon.close()
        return run_id
    plan_id = gc_engine.run_once(engine, settings, RunRequest(mode="dry_run", now=NOW, jobs=jobs))
    inject()
    with pytest.raises(DatabaseUnavailable):
        gc_engine.apply_plan(engine, plan_id, workers=workers)
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT applied_by FROM gc_runs WHERE id = %(p)s", {"p": plan_id}
        ).scalar_one()


@pytest.mark.parametrize("how", ["daemon", "apply"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failure_after_the_others_ran_out_fails_the_run(engine, monkeypatch, how, workers):  # noqa: F811
    """The last batch loses the database. One worker: the run is failed. Two, the helper's
    batch failing while the caller's thread, its own batch done, only waits: the helper left
    the run to the caller (its participation is held around the whole call by the daemon and
    by `applying`), nobody took the batch up — the run must be failed too, not left `running`
    with nobody on it. Found by a second review."""
    seed(engine, [r for u in TWO_USERS for r in lifecycle_rows(u)])
    inject = (
        (lambda: second_commit_fails(monkeypatch))
        if workers == 1
        else (lambda: helper_fails_after_the_caller_ran_out(monkeypatch))
    )
    run_id = work_two_batches(how, engine, workers, inject)
    assert helpers_alive() == []
    assert sorted(batch_states(engine, run_id)) == ["done", "pending"]
    status, error = run_status(engine, run_id)
    assert status == "failed" and "connection was lost" in (error or ""), (status, error)


@pytest.mark.parametrize(("workers", "threads"), [("1", 1), ("8", len(USERS))])
def test_run_workers_at_its_bounds(cli_env, monkeypatch, workers, threads):
    """`run.workers` 1 and 8 are accepted; the threads are never more than the batches (8
    workers, six one-user batches: the caller and five helpers)."""
    from gc_worker import db
    from gc_worker.cli import main

    cli_engine = db.make_engine(cli_env)
    seed(cli_engine, rows())
    seen = working_threads(monkeypatch)
    monkeypatch.setenv("MEMORY_GC_RUN__BATCH_USERS", "1")
    monkeypatch.setenv("MEMORY_GC_RUN__WORKERS", workers)
    assert main(["run", "--job", "ttl_expiry"]) == 0
    assert len(set(seen)) == threads, seen
    assert batch_states(cli_engine, _only_run(cli_engine)) == ["done"] * len(USERS)
    cli_engine.dispose()


@pytest.mark.parametrize("workers", ["0", "9"])
def test_run_workers_outside_its_bounds_is_refused(cli_env, monkeypatch, capsys, workers):
    """0 or 9: exit 2 naming the setting and its range; no run is started."""
    from gc_worker import db
    from gc_worker.cli import main

    cli_engine = db.make_engine(cli_env)
    seed(cli_engine, rows())
    monkeypatch.setenv("MEMORY_GC_RUN__WORKERS", workers)
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert "MEMORY_GC_RUN__WORKERS" in err and ">= 1 and <= 8" in err, err
    with cli_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM gc_runs")).scalar_one() == 0
    cli_engine.dispose()


def _only_run(engine_: sa.Engine) -> Any:
    with engine_.connect() as conn:
        return conn.execute(sa.text("SELECT id FROM gc_runs")).scalar_one()


def test_replicas_joining_a_run_together_share_its_model_budget(engine, monkeypatch):  # noqa: F811
    """Two processes (replicas: each its own port, its own counters) join one run at the same
    moment, before either has spent anything: together they make at most
    `llm.max_calls_per_run` calls. Each used to start from the run's spend at that moment (none)
    and could spend the whole budget again."""
    seed(engine, [r for u in USERS for r in llm_rows(u)])
    settings = Settings.model_validate(
        LLM_SETTINGS.model_dump()
        | {"run": {"batch_users": 1, "workers": 1}, "llm": {"max_calls_per_run": 3}}
    )
    request = RunRequest(mode="apply", now=NOW, users=None, jobs=resolve_jobs([], settings))
    run_id = start_run(engine, settings, request)
    model = FakeModel("good")
    both_joined = threading.Barrier(2, timeout=30)
    closed: list[bool] = []

    def replica() -> None:
        with fake_port(engine, settings, model) as llm:
            begin = llm.begin_run

            def begin_together(**spent: int) -> Any:
                budget = begin(**spent)
                both_joined.wait()  # neither has called the model yet
                return budget

            llm.begin_run = begin_together
            closed.append(gc_engine.process_run(engine, run_id, settings, llm=llm))

    threads = [threading.Thread(target=replica) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert closed.count(True) == 1 and len(closed) == 2
    assert sum(model.calls.values()) <= 3
    with engine.connect() as conn:
        report = build_report(conn, run_id)
    assert report["llm"]["calls"] == sum(model.calls.values())
    assert report["totals"]["by_action"].get("deferred", 0) > 0
