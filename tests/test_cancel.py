"""`memory-gc cancel RUN_ID`: the operator's stop for a run that must not go on. There was none:
a nightly run retiring far more than it should could only be stopped by stopping every daemon,
and the next one to start took it up again as an orphan; `restore --run` of a run still being
worked undid its committed batches while the later ones went on being applied."""

from __future__ import annotations

import threading
import time
from contextlib import closing
from datetime import timedelta
from uuid import UUID

import pytest

import jobs.ttl_expiry as ttl
from gc_worker import cli
from gc_worker import engine as gc_engine
from gc_worker.cancel import CANCELLED, cancel
from gc_worker.daemon import Daemon
from gc_worker.errors import UsageError
from gc_worker.restore import restore_run
from tests.store import NOW, add, days_ago, execute
from tests.test_schedule import SLOT
from tests.test_schedule_stale_orphans import stopped_after_one_batch
from tests.test_sweep_failures import run_of

USERS = ("u1", "u2", "u3", "u4")


def one_at_a_time(settings):
    return settings.model_copy(
        update={"run": settings.run.model_copy(update={"batch_users": 1, "workers": 1})}
    )


def expired_rows(engine) -> dict[str, UUID]:
    return {user: add(engine, user, expires_at=days_ago(1)) for user in USERS}


def statuses(engine, ids: dict[str, UUID]) -> dict[str, str]:
    rows = execute(engine, "SELECT id, status FROM memories WHERE id = ANY(:ids)",
                   ids=list(ids.values())).all()  # fmt: skip
    by_id = dict(rows)
    return {user: by_id[memory_id] for user, memory_id in ids.items()}


def batch_states(engine, run_id: UUID) -> list[str]:
    query = "SELECT state FROM gc_run_batches WHERE run_id = :r ORDER BY batch_no"
    return execute(engine, query, r=run_id).scalars().all()


def apply_request() -> gc_engine.RunRequest:
    return gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))


class TestCancelAWorkedRun:
    def test_the_worker_stops_after_its_batch_and_restore_undoes_all_it_did(self, engine, settings):
        settings = one_at_a_time(settings)
        ids = expired_rows(engine)
        run_id = gc_engine.start_run(engine, settings, apply_request())
        first_done, go = threading.Event(), threading.Event()

        def after_batch(_: int) -> None:  # the worker, between its first and second batch
            first_done.set()
            go.wait(30)

        worker = threading.Thread(
            target=gc_engine.process_run, args=(engine, run_id, settings),
            kwargs={"on_batch": after_batch},
        )  # fmt: skip
        worker.start()
        assert first_done.wait(30)
        result: list = []
        stopper = threading.Thread(target=lambda: result.append(cancel(engine, run_id)))
        stopper.start()
        deadline = time.monotonic() + 30
        while run_of(engine, run_id).status != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stopper.is_alive()  # it waits for the worker to leave the run
        go.set()
        worker.join(30)
        stopper.join(30)
        assert result and result[0].workers_done
        closed = run_of(engine, run_id)
        assert (closed.status, closed.error) == ("failed", CANCELLED)
        assert batch_states(engine, run_id) == ["done", "pending", "pending", "pending"]
        assert sorted(statuses(engine, ids).values()) == ["active", "active", "active", "deleted"]
        restore_run(engine, run_id)
        assert set(statuses(engine, ids).values()) == {"active"}

    def test_a_run_still_running_is_not_restored_until_cancelled(self, engine, settings):
        settings = one_at_a_time(settings)
        ids = expired_rows(engine)
        run_id = gc_engine.start_run(engine, settings, apply_request())
        stops = iter([False, True])  # one batch, then the process is stopped (left running)
        gc_engine.process_run(engine, run_id, settings, should_stop=lambda: next(stops, True))
        with pytest.raises(UsageError, match=f"memory-gc cancel {run_id}"):
            restore_run(engine, run_id)
        assert cancel(engine, run_id, wait_seconds=0).workers_done
        restore_run(engine, run_id)
        assert set(statuses(engine, ids).values()) == {"active"}

    def test_a_run_that_is_not_running_is_not_cancelled(self, engine, settings):
        expired_rows(engine)
        run_id = gc_engine.run_once(engine, settings, apply_request())
        with pytest.raises(UsageError, match="is completed, not running"):
            cancel(engine, run_id)
        assert run_of(engine, run_id).status == "completed"


def test_a_cancelled_nightly_run_is_not_taken_up_again(engine, settings, monkeypatch):
    """Stopping the daemons was the only stop, and the next upkeep resumed the run."""
    settings = one_at_a_time(settings)
    ids = expired_rows(engine)
    run_id = stopped_after_one_batch(engine, settings, monkeypatch, SLOT + timedelta(minutes=1))
    cancel(engine, run_id, wait_seconds=0)
    with closing(Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=5))) as again:
        again.upkeep()
    assert run_of(engine, run_id).status == "failed"
    assert sorted(statuses(engine, ids).values()) == ["active", "active", "active", "deleted"]
    assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 1  # the slot is spent


class TestTheCommand:
    def test_cancel_prints_what_to_do_next(self, engine, settings, cli_env, capsys):
        expired_rows(engine)
        run_id = gc_engine.start_run(engine, settings, apply_request())  # its process died
        assert cli.main(["cancel", str(run_id)]) == 0
        out = capsys.readouterr().out
        assert "cancelled; nothing more of it will be applied" in out
        assert f"memory-gc restore --run {run_id}" in out

    @pytest.mark.parametrize(
        "argv",
        [["cancel", "not-a-uuid"], ["cancel", str(UUID(int=7))],
         ["cancel", str(UUID(int=7)), "--wait-seconds", "-1"]],
    )  # fmt: skip
    def test_bad_input_exits_2(self, engine, cli_env, capsys, argv):
        assert cli.main(argv) == 2
        assert capsys.readouterr().err

    def test_a_run_cancelled_under_the_cli_exits_1_saying_so(
        self, engine, cli_env, capsys, monkeypatch
    ):
        for user in USERS:
            add(engine, user, expires_at=days_ago(1))
        monkeypatch.setenv("MEMORY_GC_RUN__BATCH_USERS", "1")
        monkeypatch.setenv("MEMORY_GC_RUN__WORKERS", "1")
        real, seen = ttl.plan, []

        def plan(ctx):  # an operator cancels the run while its first batch is planned
            seen.append(1)
            if len(seen) == 1:
                (run_id,) = execute(engine, "SELECT id FROM gc_runs").scalars().all()
                cancel(engine, run_id, wait_seconds=0)
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", plan)
        assert cli.main(["run", "--job", "ttl_expiry", "--now", NOW.isoformat()]) == 1
        assert "cancelled by an operator" in capsys.readouterr().err
        assert len(seen) == 1  # no batch after it


def test_a_sweep_whose_run_is_cancelled_is_closed_failed(engine, settings, monkeypatch):
    """The sweep's request is closed with the reason, not swept again after its lease."""
    from gc_worker import run_workers, sweeps
    from tests.test_schedule_sweeps import NOON, request_row

    add(engine, "u1", expires_at=days_ago(1))
    request_id = sweeps.request_sweep(engine, "u1")
    real = run_workers.process_next_batch

    def cancelled_first(engine_, run, *args, **kwargs):
        cancel(engine_, run["id"], wait_seconds=0)
        return real(engine_, run, *args, **kwargs)

    monkeypatch.setattr(run_workers, "process_next_batch", cancelled_first)
    with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
        assert daemon.sweep_next() is True
    row = request_row(engine, request_id)
    assert row["status"] == "failed" and "cancelled by an operator" in row["error"]


def test_a_cancelled_erasure_run_leaves_rowless_requests_pending(engine, settings, monkeypatch):
    """A run ends by completing the requests of users with no memory rows (an application's
    INSERT); a cancelled one did too, though nothing more of it is to be applied: the request
    stays pending, and the next run completes it."""
    from gc_worker import run_workers

    add(engine, "u1", "kept")
    execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id) VALUES ('user', 'gone')")
    real = run_workers.process_next_batch

    def cancelled_first(engine_, run, *args, **kwargs):
        cancel(engine_, run["id"], wait_seconds=0)
        return real(engine_, run, *args, **kwargs)

    monkeypatch.setattr(run_workers, "process_next_batch", cancelled_first)
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("erasure",))
    run_id = gc_engine.start_run(engine, settings, request)
    gc_engine.process_run(engine, run_id, settings)
    assert run_of(engine, run_id).error == CANCELLED
    query = "SELECT status, run_id FROM gc_erasure_requests"
    assert tuple(execute(engine, query).one()) == ("pending", None)
    monkeypatch.undo()
    again = gc_engine.run_once(engine, settings, request)
    assert tuple(execute(engine, query).one()) == ("completed", again)
