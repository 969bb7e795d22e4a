"""The daemon's orphans: ``Orphans``, the part of ``Daemon`` that takes up or closes the runs
other processes left ``running``.

A nightly run (or the apply of a nightly plan) a daemon left when it died, or lost the
database, is joined by the next upkeep of any replica and finished with the run's own instant
and settings — unless it is too old, or its settings are refused, then it is closed
(scheduler.close_unresumable). Runs nothing resumes are closed as failed once nobody works
them: a sweep run never recorded on its request (daemon_sweeps), and a `run`, `apply` or
`forget --now` whose process was killed (scheduler.close_stopped_runs).

``Orphans`` is a mixin of ``gc_worker.daemon.Daemon``: it uses the daemon's engine, settings,
clock, metrics, nightly lock, ``work``, ``nightly`` and ``stopping``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

import structlog
from sqlalchemy.engine import Engine

from gc_worker import scheduler
from gc_worker.config import Settings
from gc_worker.metrics import Metrics
from gc_worker.queries import q
from gc_worker.run_record import RESUMED_TRIGGERS

log = structlog.get_logger("memory_gc")


class Orphans:
    """Resuming orphaned nightly runs (``resume_orphans``), closing the runs nothing resumes."""

    # the daemon's (gc_worker.daemon.Daemon sets them)
    engine: Engine
    settings: Settings
    clock: Callable[[], datetime]
    metrics: Metrics
    _nightly: threading.Lock
    _skipped_fire: datetime | None
    work: Callable[..., bool]
    nightly: Callable[[], UUID | None]
    stopping: Callable[[], bool]
    _count: Callable[..., None]
    _close_unrecorded_sweeps: Callable[[], None]

    def resume_orphans(self) -> list[UUID]:
        """Join nightly runs left ``running`` by daemons that died; returns the runs joined.
        One nightly run at a time per daemon: while this daemon's nightly work is under way,
        orphans wait for a later upkeep. A run now too old (the apply of a plan `apply` would
        refuse, a run whose instant is as far behind) or made with settings this version
        refuses is closed, not finished (scheduler.close_unresumable). First, sweep runs a dying
        daemon created but never recorded on their request are closed (daemon_sweeps), and so
        are the runs nothing resumes that a killed process left (scheduler.close_stopped_runs)."""
        self._close_unrecorded_sweeps()
        self._close_stopped_runs()
        if not self._nightly.acquire(blocking=False):
            return []
        try:
            resumed = []
            for run_id in self._orphaned_runs():
                if self.stopping():
                    break
                if scheduler.close_unresumable(
                    self.engine, run_id, self.settings.plan_age_limit_hours, self.clock()
                ):
                    continue
                log.info("gc.schedule.resuming", run_id=str(run_id))
                self.work(run_id)
                resumed.append(run_id)
        finally:
            self._nightly.release()
        if self._skipped_fire is not None:  # a firing came while the orphan held the lock
            self.nightly()
        return resumed

    def _close_stopped_runs(self) -> None:
        """Close the runs nothing resumes that a killed process left running
        (scheduler.close_stopped_runs), counting each as a finished run."""
        lease = self.settings.run.lease_seconds
        for run_id in scheduler.close_stopped_runs(self.engine, lease_seconds=lease):
            self._count(self.metrics.run_finished, run_id)

    def _orphaned_runs(self) -> list[UUID]:
        with self.engine.connect() as conn:
            candidates = list(
                conn.execute(q("running_runs"), {"triggers": list(RESUMED_TRIGGERS)}).scalars()
            )
            orphans = []
            for run_id in candidates:
                if conn.execute(q("try_run_exclusive"), {"run_id": run_id}).scalar():
                    conn.execute(q("unlock_run_exclusive"), {"run_id": run_id})
                    orphans.append(run_id)
            conn.commit()
        return orphans
