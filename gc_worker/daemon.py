"""The ``memory-gc schedule`` daemon: nightly cron, plan review, on-demand sweeps, resumption.

Threads: an APScheduler 3 ``BackgroundScheduler`` runs the ``nightly`` cron job (coalesce,
max_instances=1, misfire grace from config; it also fires once at start-up to catch up a slot
missed within the grace) and an ``upkeep`` interval job (run a due slot that has no run yet,
apply due plans, resume orphaned nightly runs). The main thread waits on LISTEN/NOTIFY or
``poll_seconds`` and serves sweeps.

A firing is not the only chance of a slot: one that failed (the database was unreachable) is
run by the next upkeep within the grace; one skipped because this daemon's previous nightly run
(or an orphan it resumed) was still going is run when that run ends, however late (the firing
came within the grace: dropping it would cost the night); either way once (the slot is unique).

Any number of daemons share one database: a slot's run is created once (unique
``gc_runs.slot``) and joined by the others; batches are claimed with session-level advisory
locks (gc_worker.claims), each by one worker. A daemon participating in a run holds a
shared advisory lock on it; a ``running`` nightly run that nobody holds is orphaned (its daemons
died) and is resumed by the next upkeep.

Stopping (SIGTERM, SIGINT): the current batch of each thread commits (or, still being planned
before its transaction, is given up at its next model question), then work returns, a claimed
sweep goes back to the queue, and ``serve`` returns.

``Daemon`` is built of three parts: this module (the threads, the nightly run, orphans, health,
taking part in a run), ``gc_worker.daemon_sweeps`` (serving the on-demand sweep queue) and
``gc_worker.daemon_plans`` (applying the plans ``plan_then_apply`` made, once reviewed).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg
import structlog
from apscheduler.schedulers.background import BackgroundScheduler
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import Engine

from gc_worker import batch_run, scheduler, schema, sweeps
from gc_worker.batch_run import WORKER_ID
from gc_worker.claims import participating
from gc_worker.config import Settings
from gc_worker.daemon_orphans import Orphans
from gc_worker.daemon_plans import DuePlans
from gc_worker.daemon_sweeps import SWEEP_TRIGGER, SweepServing
from gc_worker.db import APPLICATION_NAME, describe_error, names_itself
from gc_worker.engine import process_run
from gc_worker.errors import RunFailed, UsageError
from gc_worker.metrics import Metrics
from gc_worker.run_record import RESUMED_TRIGGERS, load_run, settings_of

log = structlog.get_logger("memory_gc")
_DAEMONS = itertools.count(1)  # the daemons of this process, numbered (Daemon.worker_id)

RESUMABLE = RESUMED_TRIGGERS
UPKEEP_SECONDS = 30.0
SCHEMA_CHECK_SECONDS = 10.0  # how often a unit of work first checks the schema is still ours
# While the sweep loop works a sweep, /healthz stays green as long as batches keep committing,
# or model requests keep completing, at most this far apart (a batch of LLM calls can take
# many minutes; a hung one makes no request).
BUSY_LIMIT_SECONDS = 900.0
Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


class Daemon(DuePlans, Orphans, SweepServing):
    """One replica's work; every public method is one unit a test (or ``--once-due``) can call."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        llm_factory: Callable[[], Any] | None = None,
        clock: Clock = system_clock,
        metrics: Metrics | None = None,
    ) -> None:
        self.engine, self.settings, self.clock = engine, settings, clock
        # this daemon, as a sweep request's holder (claimed_by) and in logs and /healthz: the
        # process's WORKER_ID and a part of its own, as a process may run several daemons
        self.worker_id = f"{WORKER_ID}/{next(_DAEMONS)}"
        self.trigger = scheduler.nightly_trigger(settings.schedule)
        self.metrics = metrics or Metrics()
        try:
            self.metrics.load_last_successes(engine, (*RESUMABLE, SWEEP_TRIGGER))
        except Exception as exc:  # the gauge fills with the next success; the daemon starts
            log.warning("gc.daemon.metrics_not_loaded", error=describe_error(exc))
        self._llm_factory = llm_factory or (lambda: None)
        self._stop = threading.Event()
        self._nightly = threading.Lock()  # one nightly run at a time (cron job or upkeep)
        self._skipped_fire: datetime | None = None  # a firing that found the nightly lock taken
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.failures = 0
        self.last_loop = time.monotonic()
        self.last_progress = self.last_loop  # the sweep's last batch commit or model request
        self.sweeping = False  # the sweep loop is inside a unit of work
        self.schema_changed: str | None = None  # why this daemon stopped working, if it did
        self._schema_checked = float("-inf")  # checked before the first unit

    # -- stopping and health -------------------------------------------------------------

    def request_stop(self) -> None:
        """Finish the current batch(es), then return (safe to call from a signal handler)."""
        self._stop.set()
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def wake_fd(self) -> int:
        """Non-blocking pipe end that wakes the sweep loop (``signal.set_wakeup_fd``)."""
        return self._wake_w

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy while the sweep loop turns; while it works a sweep (which may take minutes
        of LLM calls), while batches keep committing, model requests keep completing or the
        sweep keeps turning (see ``work``), ``BUSY_LIMIT_SECONDS`` apart at most."""
        now = time.monotonic()
        age = now - self.last_loop
        if self.sweeping:
            age = min(age, now - self.last_progress)
            limit = BUSY_LIMIT_SECONDS
        else:
            limit = max(60.0, 10 * self.settings.schedule.poll_seconds)
        ok = not self.stopping() and age <= limit
        return ok, {"worker": self.worker_id, "stopping": self.stopping(), "loop_age_seconds": age,
                    "sweeping": self.sweeping}  # fmt: skip

    def close(self) -> None:
        """Release the wake-up pipe (after ``serve`` / ``run_once`` returned)."""
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- units of work -------------------------------------------------------------------

    def nightly(self) -> UUID | None:
        """Start or join the run of the slot due now (within the grace), then of any slot that
        came due while it ran; the last run worked, or None if no slot is due or this daemon's
        nightly work is under way in another thread (which takes the new slot when it ends)."""
        if not self._nightly.acquire(blocking=False):
            self._skipped_fire = self._due_slot() or self._skipped_fire  # whoever holds it runs it
            return None
        try:
            worked, done, failed = None, None, []
            while not self.stopping():
                fire, self._skipped_fire = self._due_slot() or self._skipped_fire, None
                if fire is None or fire == done:
                    break
                worked, _ = scheduler.nightly_run(self.engine, self.settings, fire)
                done = fire
                try:
                    self.work(worked)
                except RunFailed as exc:  # it ended (failed): a slot due meanwhile still runs
                    failed.append(exc)
            if worked is not None:
                self.attempt(self.prune_history)
            if failed:
                raise failed[0]
            return worked
        finally:
            self._nightly.release()

    def prune_history(self) -> None:
        """After the nightly run: the worker's own history past [history] retention_days
        (gc_worker.history; one replica at a time, the others skip)."""
        if self.settings.history.enabled:
            from gc_worker import history

            history.prune(self.engine, self.settings, now=self.clock(), should_stop=self.stopping)

    def catch_up_slot(self) -> UUID | None:
        """Run the slot due now if it has no run yet (its firing failed before the run was
        created: the database was unreachable, say). A slot whose run failed is not run again."""
        fire = self._due_slot()
        if fire is None or scheduler.run_of_slot(self.engine, scheduler.slot_key(fire)) is not None:
            return None
        log.info("gc.schedule.catching_up", slot=scheduler.slot_key(fire))
        return self.nightly()

    def upkeep(self) -> None:
        """The interval job: run a due slot that has no run (a slot has a deadline, the grace),
        apply due plans, resume orphaned runs."""
        self.attempt(self.catch_up_slot)
        self.attempt(self.apply_due_plans)
        self.attempt(self.resume_orphans)
        self.attempt(self.count_held_plans)

    def count_held_plans(self) -> None:
        """The held-plans gauge: a plan held for a person goes stale unapplied, and the store
        with it, unless someone is told (schedule.hold_above_share)."""
        self.metrics.plans_held.set(scheduler.held_plan_count(self.engine))

    def run_once(self) -> int:
        """Everything due now, in order, then return (``schedule --once-due``); failures count."""
        before = self.failures
        for unit in (self.resume_orphans, self.nightly, self.apply_due_plans):
            self.attempt(unit)
        while not self.stopping() and self.attempt(self.sweep_next):
            pass
        return self.failures - before

    # -- the daemon ----------------------------------------------------------------------

    def serve(self) -> None:
        """Run until ``request_stop``: scheduler threads plus the sweep loop in this thread."""
        background = build_scheduler(self)
        background.start()
        listener = sweeps.SweepListener(listen_dsn(self.engine), self._wake_r)
        log.info("gc.daemon.started", worker=self.worker_id, cron=self.settings.schedule.cron)
        try:
            while not self.stopping():
                self.last_loop = time.monotonic()
                while not self.stopping() and self._sweep_step():
                    self.last_loop = time.monotonic()
                self.attempt(self.count_pending_sweeps)
                listener.wait(self.settings.schedule.poll_seconds)
        finally:
            background.shutdown(wait=True)
            listener.close()
            log.info("gc.daemon.stopped", worker=self.worker_id)

    def work(self, run_id: UUID, *, on_progress: Callable[[], None] | None = None) -> bool:
        """Take part in a run until it has no pending batch (or we stop); True if completed
        (RunFailed if it closed as failed).
        ``on_progress`` is called after every committed batch and every model request, and
        each time the run asks whether to stop: between batches, between the users of a plan,
        and every second it waits for a user another worker's batch holds (that worker is
        alive: a dead one's session, and its locks, would be gone)."""
        with participating(self.engine, run_id):
            with self.engine.connect() as conn:
                run = load_run(conn, run_id)
            if run["status"] != "running":
                return run["status"] == "completed"
            llm = self._llm_factory()
            if llm is not None:  # a model request, answered or not, is progress too
                llm.on_request_done = on_progress
            try:
                done = process_run(
                    self.engine, run_id, settings_of(run), llm=llm,
                    should_stop=self._stop_check(on_progress), participate=False,
                    workers=self.settings.run.workers,  # this daemon's, not the plan's
                    on_batch=lambda _: self._batch_committed(run_id, run["trigger"], on_progress),
                )  # fmt: skip
            except Exception:
                self._count(self.metrics.run_finished, run_id)
                raise
            finally:
                self._close_llm(llm)
        if done:
            self._count(self.metrics.run_finished, run_id)
        return done

    # -- internals -----------------------------------------------------------------------

    def _batch_committed(
        self, run_id: UUID, trigger: str, on_progress: Callable[[], None] | None
    ) -> None:
        if on_progress is not None:
            on_progress()
        batch_nos = batch_run.take_committed(run_id)  # this thread's: it just committed them
        self._count(self.metrics.batches_committed, run_id, trigger, batch_nos)

    def _count(self, update: Callable[..., None], run_id: UUID, *args: Any) -> None:
        """Update the counters from the database, best-effort: the update comes after the
        work committed (a batch, inside its run; the run's end), and its read failing (the
        database blinked) must not fail that work: a nightly run would be marked failed
        instead of left resumable, a sweep whose changes are applied reported failed. A batch
        a failed update missed is counted by the next one; a run, not at all."""
        try:
            update(self.engine, run_id, *args)
        except Exception as exc:
            log.warning("gc.metrics_not_updated", update=update.__name__, run_id=str(run_id),
                        error=describe_error(exc))  # fmt: skip

    def _stop_check(self, on_progress: Callable[[], None] | None) -> Callable[[], bool]:
        if on_progress is None:
            return self.stopping

        def should_stop() -> bool:  # asked means turning: the unit is alive
            on_progress()
            return self.stopping()

        return should_stop

    def attempt(self, unit: Callable[[], Any]) -> Any:
        """Run one unit; a failure is logged and counted, and the daemon carries on. Not once
        the schema is no longer the one this code was built for (``schema_changed``)."""
        try:
            if not self._schema_still_matches():
                return None
            return unit()
        except Exception as exc:
            self._unit_failed(unit.__name__, exc)
            return None

    def _schema_still_matches(self) -> bool:
        """Whether the database is still at this code's schema, read at most every
        SCHEMA_CHECK_SECONDS. A rolling update's new image migrates while this daemon runs: its
        code would go on against a schema it does not know (a newer release's hold on large
        plans ignored, say), so it stops instead — ``schema_changed`` says why, and the
        ``schedule`` command exits 2 with it; the next start refuses too until the image is
        the database's."""
        if self.schema_changed is not None:
            return False
        now = time.monotonic()
        if now - self._schema_checked < SCHEMA_CHECK_SECONDS:
            return True
        try:
            schema.require_current(self.engine, embedding_dim=self.settings.embeddings.dim)
        except UsageError as exc:  # SchemaOutdated, ConfigError (the vector size, RLS)
            self.schema_changed = str(exc)
            log.error("gc.daemon.schema_changed", worker=self.worker_id, error=str(exc))
            self.request_stop()
            return False
        self._schema_checked = now
        return True

    def _unit_failed(self, unit: str, exc: Exception) -> None:
        self.failures += 1
        self.metrics.unit_failures.labels(unit).inc()
        log.error("gc.daemon.unit_failed", unit=unit, error=describe_error(exc))

    def _due_slot(self) -> datetime | None:
        """The due fire time in UTC: in the trigger's zone two fire times of the hour that
        repeats compare equal (Python compares wall times within one zone), and ``nightly``
        took the second 02:30 of an hourly cron for the slot it had just run."""
        fire = scheduler.due_slot(
            self.trigger, self.clock(), self.settings.schedule.misfire_grace_seconds
        )
        return None if fire is None else fire.astimezone(UTC)

    def _close_llm(self, llm: Any) -> None:
        if llm is not None:
            self.metrics.llm_used(llm.usage())
            llm.close()


def build_scheduler(daemon: Daemon) -> BackgroundScheduler:
    """The APScheduler 3 scheduler of a daemon (not started)."""
    background = BackgroundScheduler(timezone=daemon.settings.schedule.timezone)
    background.add_job(
        daemon.attempt, daemon.trigger, args=[daemon.nightly], id="nightly", name="nightly",
        coalesce=True, max_instances=1,
        misfire_grace_time=daemon.settings.schedule.misfire_grace_seconds,
        next_run_time=datetime.now(UTC),  # catch up a slot missed within the grace
    )  # fmt: skip
    background.add_job(
        daemon.attempt, "interval", args=[daemon.upkeep], seconds=UPKEEP_SECONDS,
        id="upkeep", name="upkeep", coalesce=True, max_instances=1, next_run_time=datetime.now(UTC),
    )  # fmt: skip
    return background


def listen_dsn(engine: Engine) -> str:
    """A libpq connection string for the LISTEN connection, from the engine's own connect
    arguments (same server, user and URL options), named like the engine's sessions unless the
    URL names one. Not the URL rendered again: it writes a space in the query as `+`, which
    libpq reads literally (`options=-c+lock_timeout…`), and leaves one in a user or password
    unencoded, which libpq refuses."""
    _, params = engine.dialect.create_connect_args(engine.url)
    libpq = {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}
    params = {key: value for key, value in params.items() if key in libpq}  # not psycopg's own
    if not names_itself("application_name" in params):
        params["application_name"] = APPLICATION_NAME
    return make_conninfo(**params)
