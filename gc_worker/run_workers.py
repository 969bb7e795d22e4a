"""This process's workers on a run: the calling thread alone, or it and helper threads side by
side, each claiming and doing the run's batches until none is left (gc_worker.batch_run does
one), then closing the run: completed, or failed when some of its batches failed.

Each helper is a participant of its own (gc_worker.claims), as a replica sharing the run is: one
that loses the database leaves the run to the others. A batch rolled back by a write conflict is
tried again (``BATCH_ATTEMPTS``). A worker's error fails the run unless another process still
takes part in it, or it is a daemon's run that lost the database (left running, resumable:
``run_record.RESUMED_TRIGGERS``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.engine import Engine

from gc_worker import claims, erasure
from gc_worker.batch_run import process_next_batch
from gc_worker.claims import participating
from gc_worker.config import Settings
from gc_worker.db import describe_error, retrying, stored_error, transaction, translated_errors
from gc_worker.errors import DatabaseUnavailable, RunFailed, WriteConflict
from gc_worker.queries import q
from gc_worker.run_record import RESUMED_TRIGGERS, load_run, pending_batches

log = structlog.get_logger("memory_gc")
# A batch rolled back by a write conflict (deadlock, serialization failure) is claimed and
# planned again from scratch; the worker itself waits on no row lock, so this is a backstop.
BATCH_ATTEMPTS = 3
Outcome = bool | BaseException  # a worker's: closed the run (or not), or what it raised


def work_batches(
    engine: Engine,
    run_id: UUID,
    settings: Settings,
    llm: Any,
    on_batch: Callable[[int], None] | None,
    should_stop: Callable[[], bool] | None,
    *,
    workers: int,
    participate: bool,
    interrupted: threading.Event,
) -> bool:
    """Work the run's pending batches with up to ``workers`` at once; True when this process
    closed the run (RunFailed when it closed it as failed). ``participate=False``: the caller
    already holds the run's participation lock. ``interrupted`` is set when the caller was
    interrupted while a helper completed the run."""
    helpers = _helpers_wanted(engine, run_id, workers)
    if helpers == 0:
        with participating(engine, run_id) if participate else contextlib.nullcontext():
            return _work_run(engine, run_id, settings, llm, on_batch, should_stop)
    return _work_parallel(
        engine, run_id, settings, llm, on_batch, should_stop, helpers=helpers,
        participate=participate, interrupted=interrupted,
    )  # fmt: skip


def _helpers_wanted(engine: Engine, run_id: UUID, workers: int) -> int:
    """Helper threads worth starting: one fewer than the workers, no more than the batches
    left besides the caller's first (a one-user sweep starts none)."""
    if workers <= 1:
        return 0
    with translated_errors(), engine.connect() as conn:
        pending = pending_batches(conn, run_id)
    return max(0, min(workers, pending) - 1)


class _HelperThreads:
    """A run's helper threads in this process, each a participant of its own. A helper says it
    is done with an Event, not only by ending: an interrupted Thread.join() marks a thread that
    still runs as stopped, and the next join() would not wait for it."""

    def __init__(self, engine: Engine, run_id: UUID, work: Callable[[], bool]) -> None:
        self._engine, self._run_id, self._work = engine, run_id, work
        self._started: list[tuple[threading.Thread, threading.Event]] = []
        self.outcomes: list[Outcome] = []

    def start(self, count: int) -> None:
        for i in range(count):
            done = threading.Event()
            thread = threading.Thread(  # with the caller's log context (a sweep's user_id)
                target=contextvars.copy_context().run, args=(self._help, done), daemon=True,
                name=f"memory-gc-run-{i + 1}",
            )  # fmt: skip
            thread.start()
            self._started.append((thread, done))

    def wait(self) -> None:
        for _, done in self._started:
            done.wait()
        for thread, _ in self._started:  # past their work: at once
            thread.join()

    def _help(self, done: threading.Event) -> None:
        outcome: Outcome = False
        try:
            with participating(self._engine, self._run_id):
                outcome = self._work()
        except BaseException as exc:  # handed to the caller's thread, raised there
            outcome = exc
        finally:
            self.outcomes.append(outcome)
            done.set()


def _work_parallel(
    engine: Engine,
    run_id: UUID,
    settings: Settings,
    llm: Any,
    on_batch: Callable[[int], None] | None,
    should_stop: Callable[[], bool] | None,
    *,
    helpers: int,
    participate: bool,
    interrupted: threading.Event,
) -> bool:
    """The caller and ``helpers`` threads work the run side by side. Each helper participates
    on a session of its own, so one that loses the database leaves the run to the others (as a
    replica would). The caller's interrupt (Ctrl-C, SIGTERM) stops the helpers after their
    current batch. Outcome: completed if any of them closed the run, even if the caller was
    interrupted meanwhile; otherwise an interrupt; RunFailed if one closed it failed; otherwise
    the first error; otherwise False (stopped). ``interrupted`` is set when the caller was
    (the helpers stop at it)."""

    def stopping() -> bool:
        return interrupted.is_set() or bool(should_stop and should_stop())

    batch_done = _one_report_at_a_time(on_batch)

    def work() -> bool:
        return _work_run(engine, run_id, settings, llm, batch_done, stopping)

    threads = _HelperThreads(engine, run_id, work)
    try:  # the caller participates first: a helper failing at once is then not alone
        with participating(engine, run_id) if participate else contextlib.nullcontext():
            threads.start(helpers)
            mine: Outcome = work()
    except BaseException as exc:
        mine = exc
    if isinstance(mine, BaseException) and not isinstance(mine, Exception):
        interrupted.set()  # the helpers finish their batch and stop
    waiting = _wait_for_helpers(threads, interrupted)
    everyone = [mine, *threads.outcomes, *waiting]
    _fail_if_left_alone(engine, run_id, everyone, stopping)
    return _outcome(everyone)


def _one_report_at_a_time(on_batch: Callable[[int], None] | None) -> Callable[[int], None]:
    """``on_batch`` for several threads: a progress bar, the daemon's metrics, one at a time."""
    reported = threading.Lock()

    def batch_done(n: int) -> None:
        if on_batch is not None:
            with reported:
                on_batch(n)

    return batch_done


def _wait_for_helpers(threads: _HelperThreads, stop: threading.Event) -> list[BaseException]:
    """Wait for the helpers to end; the interrupt that came meanwhile, if one did (the helpers
    are then stopped after their batch, and waited for all the same)."""
    try:
        threads.wait()
    except BaseException as exc:  # interrupted while waiting for them: the same
        stop.set()
        threads.wait()
        return [exc]
    return []


def _fail_if_left_alone(
    engine: Engine, run_id: UUID, everyone: list[Outcome], stopping: Callable[[], bool]
) -> None:
    """A participant failed while another still took part (if only waiting for the helpers,
    its batches done) and left the run to it; nobody took its batch up. Failed now unless
    another process works the run. (Stopped or interrupted: left resumable, as a replica would
    leave it.)"""
    failures = [o for o in everyone if isinstance(o, Exception) and not isinstance(o, RunFailed)]
    if not failures or any(o is True for o in everyone) or stopping():
        return
    with contextlib.suppress(Exception):  # the database may be the trouble; say the first
        with engine.connect() as conn:
            trigger = load_run(conn, run_id)["trigger"]
        _fail(engine, run_id, failures[0], trigger=trigger)


def _outcome(outcomes: list[Outcome]) -> bool:
    # a helper's last batch completed the run while the caller was interrupted: the run is
    # done, and the caller (the CLI) reports it as done rather than as interrupted
    if any(o is True for o in outcomes):
        return True
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if not errors:
        return False  # stopped
    interrupt = next((e for e in errors if not isinstance(e, Exception)), None)  # Ctrl-C, SIGTERM
    closed_failed = next((e for e in errors if isinstance(e, RunFailed)), None)
    raise interrupt or closed_failed or errors[0]


def _work_run(
    engine: Engine,
    run_id: UUID,
    settings: Settings,
    llm: Any,
    on_batch: Callable[[int], None] | None,
    should_stop: Callable[[], bool] | None,
) -> bool:
    with engine.connect() as conn:
        run = load_run(conn, run_id)
    caller_context = structlog.contextvars.get_contextvars()  # e.g. a sweep's own user_id
    structlog.contextvars.bind_contextvars(run_id=str(run_id), dry_run=run["mode"] == "dry_run")
    try:
        while not (should_stop and should_stop()):
            if not retrying(
                BATCH_ATTEMPTS, lambda: process_next_batch(engine, run, settings, llm, should_stop)
            ):  # no batch left to claim (or one given up at a stop)
                if not (should_stop and should_stop()):  # the requests no batch visits
                    structlog.contextvars.unbind_contextvars("batch_no")
                    erasure.complete_rowless(engine, run)
                break
            if on_batch:
                on_batch(1)
    except Exception as exc:  # logged without the batch's context (its user, job, batch_no)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**{**caller_context, "run_id": str(run_id)})
        _fail(engine, run_id, exc, trigger=run["trigger"])
        raise
    finally:
        # batch_no / user_id / job are bound per batch; a failed batch must not leak them either,
        # and what the caller had bound (a sweep's user_id) is its again
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**caller_context)
    return _close(engine, run_id)


def _close(engine: Engine, run_id: UUID) -> bool:
    """Close the run if no batch of it is left pending: True when this call did (RunFailed
    when it closed it failed, some batches having failed)."""
    with transaction(engine) as conn:
        closed = conn.execute(q("complete_run"), {"run_id": run_id}).first()
    if closed is not None and closed.status == "failed":
        with engine.connect() as conn:
            error = load_run(conn, run_id)["error"]
        log.error("gc.run_failed", run_id=str(run_id), error=error)
        raise RunFailed(f"run {run_id}: {error}; see `memory-gc report {run_id}`")
    if closed is not None:
        log.info("gc.run_completed", run_id=str(run_id))
    return closed is not None


def _fail(engine: Engine, run_id: UUID, exc: Exception, *, trigger: str) -> None:
    """Mark the run failed — unless another process still takes part in it (another replica of
    the same nightly run): this one's database trouble must not stop the others — or it is a
    daemon's run that lost the database (a restart, a failover; not a conflict that kept
    coming back, nor an error the server answered with, which would come back again, every
    upkeep, for ever): left running, with nobody working it, so that the next upkeep of any
    daemon takes it up where it stopped, as after a daemon's death. (A failed nightly run is
    not run again: a blip at 03:00 would cost the night.)"""
    lost = (
        isinstance(exc, DatabaseUnavailable)
        and not isinstance(exc, WriteConflict)
        and exc.connection_lost
    )
    if lost and trigger in RESUMED_TRIGGERS:
        log.error("gc.run_left_resumable", run_id=str(run_id), error=describe_error(exc))
        return
    error = stored_error(exc)
    with transaction(engine) as conn:
        own = claims.own_participation_pids(run_id)
        failed = conn.execute(
            q("fail_run_if_alone"), {"run_id": run_id, "error": error, "own_pids": own}
        ).first()
    if failed is None:
        log.error("gc.run_left_to_others", run_id=str(run_id), error=error)
        return
    log.error("gc.run_failed", run_id=str(run_id), error=error)
