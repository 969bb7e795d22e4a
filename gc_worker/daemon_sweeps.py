"""The daemon's on-demand sweeps: ``SweepServing``, the part of ``Daemon`` that serves the queue.

A sweep request (``memory_gc_sweep_requests``, gc_worker.sweeps) is claimed by one daemon under
a lease it renews with every batch and model request; the sweep is a run of its user alone
(trigger ``sweep``), the one an earlier holder started and recorded if it can still finish.
A request is closed done when its run completed, failed with the reason (a user with no
memories, a run that failed), or handed back to the queue: at a stop, or after losing the
database (its attempt counted; after ``sweeps.MAX_ATTEMPTS`` the next claimer gives up).
Sweep runs a dying daemon created but never recorded on their request are closed by the upkeep.

``SweepServing`` is a mixin of ``gc_worker.daemon.Daemon``: it uses the daemon's engine,
settings, clock, worker_id, metrics, ``work``, ``attempt``, ``stopping`` and counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

import structlog
from sqlalchemy.engine import Engine

from gc_worker import scheduler, sweeps
from gc_worker.config import Settings
from gc_worker.db import describe_error
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.errors import NotFoundError
from gc_worker.metrics import Metrics
from gc_worker.run_record import SWEEP_TRIGGER, load_run


class SweepServing:
    """Serving the sweep queue, one request at a time (``sweep_next``)."""

    # the daemon's (gc_worker.daemon.Daemon sets them)
    engine: Engine
    settings: Settings
    clock: Callable[[], datetime]
    worker_id: str
    metrics: Metrics
    last_progress: float
    sweeping: bool

    def sweep_next(self) -> bool:
        """Serve the oldest on-demand sweep request; False when the queue is empty. A sweep that
        failed counts as a failure of this unit and is still True: the requests after it are
        served now, not at the next poll (or, for ``--once-due``, the next pass)."""
        claim = sweeps.claim_sweep(
            self.engine, worker=self.worker_id, lease_seconds=self.settings.run.lease_seconds
        )
        if claim is None:
            return False
        structlog.contextvars.bind_contextvars(sweep_id=claim.id, user_id=claim.user_id)
        try:
            self._serve_sweep(claim)
        except Exception as exc:  # closed failed, or handed back: not claimable again at once
            self._unit_failed("sweep_next", exc)
        finally:
            structlog.contextvars.unbind_contextvars("sweep_id", "user_id")
        return True

    def count_pending_sweeps(self) -> None:
        """The queue-length gauge."""
        self.metrics.sweep_queue.set(sweeps.pending_count(self.engine))

    def _sweep_step(self) -> bool:
        self.sweeping = True
        try:
            return bool(self.attempt(self.sweep_next))
        finally:
            self.sweeping = False

    def _sweep_progressed(self) -> None:
        """The sweep loop's unit of work moved on (what /healthz follows while it is inside
        one; the nightly and upkeep threads' runs do not count: they cannot vouch for it)."""
        self.last_progress = time.monotonic()

    def _serve_sweep(self, claim: sweeps.SweepClaim) -> None:
        if claim.attempts > sweeps.MAX_ATTEMPTS:
            own = sweeps.own_run_status(self.engine, claim)
            if own != "completed":  # (a holder that completed the run did the sweep: done)
                self._give_up(claim, own)
                return
        lease = sweeps.Lease(
            self.engine, claim.id, worker=self.worker_id, seconds=self.settings.run.lease_seconds
        )

        def progressed() -> None:  # a sign of life for /healthz and for the other replicas
            self._sweep_progressed()
            lease.renew()

        try:
            run_id = self._sweep_run(claim)
            if run_id is None:  # the claim was lost: its new holder sweeps and closes it
                return
            done = self.work(run_id, on_progress=progressed)
        except NotFoundError as exc:  # the user has no memories (any more)
            self._sweep_failed(
                claim.id, sweeps.unknown_user_error(self.engine, claim.user_id, str(exc))
            )
            return
        except Exception as exc:
            if sweeps.lost_the_database(exc) and claim.attempts < sweeps.MAX_ATTEMPTS:
                sweeps.release_sweep(
                    self.engine, claim.id, worker=self.worker_id, attempt_counts=True
                )
            else:
                self._sweep_failed(claim.id, describe_error(exc))
            raise
        with self.engine.connect() as conn:
            run = load_run(conn, run_id)
        status = run["status"]
        if done or status == "completed":
            if sweeps.finish_sweep(self.engine, claim.id, worker=self.worker_id):
                self.metrics.sweeps.labels("done").inc()
        elif status == "failed":  # closed under it: `memory-gc cancel`
            self._sweep_failed(claim.id, run["error"] or "its run failed")
        elif self.stopping():
            sweeps.release_sweep(self.engine, claim.id, worker=self.worker_id)
        # else: another worker still holds the run's last batch (say a holder whose lease ran out
        # before it joined the run); once the lease runs out, the next claimer finds the run
        # completed and closes the request

    def _sweep_run(self, claim: sweeps.SweepClaim) -> UUID | None:
        """The run of a claimed sweep: the one an earlier daemon started for it (handed back at
        a stop) unless it is too old to finish, else a new one (also when the run the request
        names is not a sweep of its user and kind: an application may have named any). None
        when the claim was lost before the new run was recorded: that run is failed unworked."""
        status = sweeps.own_run_status(self.engine, claim)
        if status == "completed" or (
            status == "running"
            and not scheduler.close_unresumable(
                self.engine, claim.run_id, self.settings.plan_age_limit_hours, self.clock()
            )
        ):
            return claim.run_id
        request = RunRequest(
            mode="dry_run" if claim.dry_run else "apply", now=self.clock(),
            users=(claim.user_id,), jobs=resolve_jobs([], self.settings), trigger=SWEEP_TRIGGER,
        )  # fmt: skip
        run_id = start_run(self.engine, self.settings, request)
        if not sweeps.attach_run(self.engine, claim, run_id):
            if sweeps.fail_abandoned_run(
                self.engine, run_id, error=sweeps.LOST_CLAIM, query="fail_unrecorded_sweep_run"
            ):
                self._count(self.metrics.run_finished, run_id)
            return None
        return run_id

    def _sweep_failed(self, request_id: int, error: str) -> None:
        if sweeps.finish_sweep(self.engine, request_id, worker=self.worker_id, error=error):
            self.metrics.sweeps.labels("failed").inc()

    def _give_up(self, claim: sweeps.SweepClaim, own: str | None) -> None:
        """Its daemons died MAX_ATTEMPTS times: fail the request, and the run they left (its
        own, ``own`` its status: not one an application named)."""
        error = f"gave up after {sweeps.MAX_ATTEMPTS} attempts"
        self._sweep_failed(claim.id, error)
        if own == "running" and sweeps.fail_abandoned_run(
            self.engine, claim.run_id, error=f"sweep request {claim.id} {error}"
        ):
            self._count(self.metrics.run_finished, claim.run_id)

    def _close_unrecorded_sweeps(self) -> None:
        """Close the sweep runs a dying daemon created but never recorded on their request
        (gc_worker.sweeps.close_unrecorded_runs), counting each as a finished run."""
        lease = self.settings.run.lease_seconds
        for run_id in sweeps.close_unrecorded_runs(self.engine, lease_seconds=lease):
            self._count(self.metrics.run_finished, run_id)
