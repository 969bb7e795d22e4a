"""On-demand single-user sweeps: the ``gc_sweep_requests`` queue and its wake-up channel.

An application (or ``memory-gc request-sweep USER_ID``) inserts a row::

    INSERT INTO gc_sweep_requests (user_id, dry_run) VALUES ('user-42', false) RETURNING id;

and follows it by ``status``: pending → running → done | failed (``error`` says why, ``run_id``
names the run, whose report is ``memory-gc report RUN_ID``). A trigger sends
``NOTIFY memory_gc_sweep``; daemons LISTEN and also poll every ``schedule.poll_seconds``.

A daemon claims the oldest pending request with ``FOR UPDATE SKIP LOCKED``. A claim is a lease of
``run.lease_seconds``, renewed whenever the sweep moves (``Lease``): a request still ``running``
after that whose run no daemon takes part in (its daemon died) is claimed again, and the new
claimer joins the request's run instead of starting another. A live daemon is never taken over,
however long its sweep, and only the holder closes a request. A stopping daemon hands its
request back (``pending``) at once; so does one that lost the database mid-sweep, the attempt
counted (``release_sweep``).
"""

from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
import structlog
from sqlalchemy.engine import Engine

from gc_worker.db import describe_error, transaction
from gc_worker.errors import DatabaseUnavailable, NotFoundError, WriteConflict
from gc_worker.queries import q

log = structlog.get_logger("memory_gc")

CHANNEL = "memory_gc_sweep"
MAX_ATTEMPTS = 3  # a request whose daemon died this many times is failed, not retried forever


@dataclass(frozen=True)
class SweepClaim:
    id: int
    user_id: str
    dry_run: bool
    run_id: UUID | None
    attempts: int
    worker: str  # the claimer: only while it still holds the request may it record a run


# The error of a forgotten user's sweep: the text the erasure's scrub leaves (sql/erasure.sql,
# erasure_scrub_sweep_errors), which its erasure_user_traces does not take for a trace.
ERASED = "removed by erasure"


def request_sweep(
    engine: Engine, user_id: str, *, dry_run: bool = False, requested_by: str = "cli"
) -> int:
    """Queue a sweep of one user (``queue_sweep``); the request's id."""
    return queue_sweep(engine, user_id, dry_run=dry_run, requested_by=requested_by)[0]


def queue_sweep(
    engine: Engine, user_id: str, *, dry_run: bool = False, requested_by: str = "cli"
) -> tuple[int, bool]:
    """Queue a sweep of one user: (id, True); unknown users are refused (NotFoundError, exit 2).
    A request of the same user and kind that no daemon has taken yet answers instead: (its id,
    False) — it sweeps what is there when it is claimed, after this request."""
    with transaction(engine) as conn:
        if not conn.execute(q("known_users"), {"users": [user_id]}).first():
            forgotten = _erasure_of(conn, user_id)
            if forgotten is not None:
                raise NotFoundError(
                    f"no memories for user {user_id!r}: erasure request {forgotten} forgot them "
                    "(`memory-gc forget-user`); there is nothing to sweep"
                )
            raise NotFoundError(f"no memories for user {user_id!r}; check the id")
        pending = conn.execute(q("pending_sweep_of"), {"user_id": user_id, "dry_run": dry_run})
        request_id = pending.scalar()
        if request_id is not None:
            log.info("gc.sweep.already_pending", request_id=request_id, user_id=user_id)
            return int(request_id), False
        params = {"user_id": user_id, "dry_run": dry_run, "requested_by": requested_by}
        request_id = conn.execute(q("insert_sweep_request"), params).scalar_one()
    log.info("gc.sweep.requested", request_id=request_id, user_id=user_id, dry_run=dry_run)
    return int(request_id), True


def unknown_user_error(engine: Engine, user_id: str, error: str) -> str:
    """What a request whose user has no memories records: ERASED when a completed forget-user
    erased them (the sweep was queued before it, or by an application since), so that the
    erasure's promise holds — nothing but ids kept about the user — else ``error``."""
    with engine.connect() as conn:
        return ERASED if _erasure_of(conn, user_id) is not None else error


def _erasure_of(conn: Any, user_id: str) -> UUID | None:
    """The completed forget-user request of ``user_id``, if any."""
    params = {"user_id": user_id, "memory_id": None}
    return conn.execute(q("erasure_completed_for"), params).scalar()


def claim_sweep(engine: Engine, *, worker: str, lease_seconds: float) -> SweepClaim | None:
    with transaction(engine) as conn:
        row = conn.execute(
            q("claim_sweep_request"), {"worker": worker, "lease": lease_seconds}
        ).first()
    return None if row is None else SweepClaim(*row, worker=worker)


def own_run_status(engine: Engine, claim: SweepClaim) -> str | None:
    """The status of the claimed request's run, if it has one that is a sweep of its user and
    kind: an application inserting the row may have named any run (``sweep_run_status``)."""
    if claim.run_id is None:
        return None
    params = {"run_id": claim.run_id, "user_id": claim.user_id, "dry_run": claim.dry_run}
    with engine.connect() as conn:
        return conn.execute(q("sweep_run_status"), params).scalar()


def attach_run(engine: Engine, claim: SweepClaim, run_id: UUID) -> bool:
    """Record ``run_id`` as the claimed request's run; False (nothing recorded) when the
    claimer no longer holds it: it stalled past its lease and another daemon claimed it, whose
    run sweeps the user (working this one too would sweep the user twice)."""
    params = {"id": claim.id, "run_id": run_id, "worker": claim.worker}
    with transaction(engine) as conn:
        attached = conn.execute(q("attach_sweep_run"), params).rowcount > 0
    if not attached:
        log.info("gc.sweep.not_held", request_id=claim.id, run_id=str(run_id))
    return attached


def finish_sweep(engine: Engine, request_id: int, *, worker: str, error: str | None = None) -> bool:
    """Close a request ``worker`` holds as done (or failed with ``error``); False if it does
    not hold it any more (taken over: the new holder closes it)."""
    status = "failed" if error else "done"
    params = {"id": request_id, "status": status, "error": error, "worker": worker}
    with transaction(engine) as conn:
        finished = conn.execute(q("finish_sweep_request"), params).rowcount > 0
    if finished:
        log.info("gc.sweep.finished", request_id=request_id, status=status, error=error)
    else:
        log.info("gc.sweep.not_held", request_id=request_id, status=status)
    return finished


class Lease:
    """The lease of a claimed request, renewed (``claimed_at``) each time ``renew`` is called as
    its sweep moves, at most every tenth of the lease; a renewal that fails is only logged (the
    run's participation lock still shows the daemon alive)."""

    def __init__(self, engine: Engine, request_id: int, *, worker: str, seconds: float) -> None:
        self._engine, self._params = engine, {"id": request_id, "worker": worker}
        self._every = seconds / 10
        self._renewed = time.monotonic()  # the claim itself

    def renew(self) -> None:
        if time.monotonic() - self._renewed < self._every:
            return
        self._renewed = time.monotonic()
        try:
            with transaction(self._engine) as conn:
                conn.execute(q("renew_sweep_request"), self._params)
        except Exception as exc:
            log.warning("gc.sweep.renew_failed", request_id=self._params["id"],
                        error=describe_error(exc))  # fmt: skip


UNRECORDED = (
    "no sweep request names it and nobody works it: its daemon stopped (died, or lost the "
    "database) before recording it on the request, whose next claim swept with another run, "
    "or its request was closed without it; nothing resumes a sweep run"
)


LOST_CLAIM = (
    "its sweep request was claimed by another daemon while this one stalled past its lease; "
    "that daemon's run sweeps the user"
)


def fail_abandoned_run(
    engine: Engine, run_id: UUID, *, error: str, query: str = "fail_run"
) -> bool:
    """Fail the run of a request given up after MAX_ATTEMPTS, unless a worker still takes part
    in it: nothing resumes a sweep run, so it would stay ``running`` for ever. True if failed.
    ``query``: the UPDATE that fails it (``fail_unrecorded_sweep_run`` checks it is still
    nobody's request's)."""
    with engine.connect() as conn:
        if not conn.execute(q("try_run_exclusive"), {"run_id": run_id}).scalar():
            conn.commit()
            return False
        try:
            failed = conn.execute(q(query), {"run_id": run_id, "error": error}).rowcount > 0
            conn.commit()
        finally:
            conn.rollback()  # a no-op, or after a failed statement lets the unlock run
            conn.execute(q("unlock_run_exclusive"), {"run_id": run_id})
            conn.commit()
    if failed:
        log.info("gc.sweep.run_failed", run_id=str(run_id), error=error)
    return failed


def close_unrecorded_runs(engine: Engine, *, lease_seconds: float) -> list[UUID]:
    """Fail the sweep runs no open request names, started more than a lease ago, that nobody
    works (``unrecorded_sweep_runs``): nothing else would ever close them. Returns them."""
    with engine.connect() as conn:
        found = conn.execute(q("unrecorded_sweep_runs"), {"lease": lease_seconds}).scalars()
        candidates = list(found)
    return [
        run_id
        for run_id in candidates
        if fail_abandoned_run(engine, run_id, error=UNRECORDED, query="fail_unrecorded_sweep_run")
    ]


def release_sweep(
    engine: Engine, request_id: int, *, worker: str, attempt_counts: bool = False
) -> None:
    """Hand a request ``worker`` holds back to the queue (``pending``, its run kept). A stop
    gives its attempt back; a lost database (``attempt_counts``) does not."""
    params = {"id": request_id, "worker": worker, "refund": 0 if attempt_counts else 1}
    with transaction(engine) as conn:
        conn.execute(q("release_sweep_request"), params)
    log.info("gc.sweep.released", request_id=request_id, attempt_counts=attempt_counts)


def lost_the_database(exc: BaseException) -> bool:
    """The sweep's connection went away (a restart, a failover): a blip another attempt gets
    past, not something of the user's data, nor an error the server answered with (it would come
    back), nor a conflict (retried inside the run already). Its batch rolled back whole."""
    return (
        isinstance(exc, DatabaseUnavailable)
        and not isinstance(exc, WriteConflict)
        and exc.connection_lost
    )


def get_sweep(engine: Engine, request_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(q("get_sweep_request"), {"id": request_id}).mappings().first()
    return None if row is None else dict(row)


def pending_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(q("pending_sweep_count")).scalar_one())


class SweepListener:
    """LISTEN on the sweep channel; ``wait`` returns on a notification, a wake-up or timeout.

    ``wake_fd`` is a pipe the daemon writes to when it must stop. Without a working connection
    (the server restarted) ``wait`` still sleeps the timeout, and reconnects on the next call.
    """

    def __init__(self, dsn: str, wake_fd: int) -> None:
        self._dsn, self._wake_fd = dsn, wake_fd
        self._conn: psycopg.Connection | None = None

    def wait(self, timeout: float) -> bool:
        """True when a request was announced (the caller polls the queue either way)."""
        conn = self._connect()
        fds = [self._wake_fd] + ([conn.fileno()] if conn is not None else [])
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._wake_fd in ready:
            os.read(self._wake_fd, 1024)
        return conn is not None and conn.fileno() in ready and self._drain(conn)

    def _connect(self) -> psycopg.Connection | None:
        if self._conn is None or self._conn.closed:
            self.close()
            try:
                self._conn = psycopg.connect(self._dsn, autocommit=True)
                self._conn.execute(f"LISTEN {CHANNEL}")
            except psycopg.Error as exc:
                log.warning("gc.sweep.listen_failed", error=str(exc))
                self.close()
        return self._conn

    def _drain(self, conn: psycopg.Connection) -> bool:
        try:
            conn.pgconn.consume_input()
        except psycopg.Error:
            self.close()
            return False
        announced = False
        while conn.pgconn.notifies() is not None:
            announced = True
        return announced

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
