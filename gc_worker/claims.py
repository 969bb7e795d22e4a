"""Who works what: a process's participation in a run, and a worker's claim on one batch.

Both are advisory locks held by a session of the worker's own, outside any transaction, so they
last exactly as long as that session: a process that dies releases them with its connection,
and nobody waits for a lease to run out. A run nobody participates in was stopped (killed or
failed) and may be taken up again; a batch nobody claims and that is still pending is free.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection, Engine

from gc_worker.db import LOCK_NOT_AVAILABLE, describe_error, translated_errors
from gc_worker.queries import q

log = structlog.get_logger(__name__)
# This process, in gc_run_batches.worker (a daemon's gc_sweep_requests.claimed_by adds a part of
# its own, Daemon.worker_id: a process may run several daemons): host and pid for the
# operator, then a random part, because host and pid do not tell processes apart over time — in
# a container the worker is PID 1 and a Kubernetes pod keeps its host name when it restarts, so
# a restarted daemon had its dead predecessor's identity (its metrics counted the predecessor's
# batches as its own). It is only ever compared whole, never parsed.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
# A batch whose worker died inside it this many times (claimed, never released: killed, out of
# memory) is failed rather than handed to the next worker, which would die the same way.
MAX_LOST_CLAIMS = 3
# Claims this process ended but could not release on their session because the server ended
# the session (a restart, a failover's shutdown): neither the worker nor the batch died there,
# so the release is made on its next claim's session. A session lost without the server saying
# why (a crash; the batch may have crashed it) still counts, so a batch that brings the server
# down every time is given up after MAX_LOST_CLAIMS.
_OWED_RELEASES: set[tuple[UUID, int]] = set()


# The backend pids of this thread's participation sessions, per run (an apply participates
# from before its start commits and again while it works): the run's other holders of its
# shared lock are other workers — processes, or threads of a daemon — and run_workers._fail
# leaves a run they still work to them.
_OWN_SESSIONS: dict[tuple[UUID, int], list[int]] = {}
_OWN_LOCK = threading.Lock()


def own_participation_pids(run_id: UUID) -> list[int]:
    with _OWN_LOCK:
        return list(_OWN_SESSIONS.get((run_id, threading.get_ident()), ()))


@contextlib.contextmanager
def participating(engine: Engine, run_id: UUID) -> Iterator[None]:
    """Hold the run's shared advisory lock on a connection of our own while we work it: a run
    nobody holds is stopped (killed or failed) and may be taken up again."""
    with translated_errors():
        conn = engine.connect()
    pid, key = None, (run_id, threading.get_ident())
    try:
        with translated_errors():
            conn.execute(q("keep_idle_session"))
            conn.execute(q("lock_run_shared"), {"run_id": run_id})
            pid = conn.execute(q("backend_pid")).scalar()
            conn.commit()
        with _OWN_LOCK:
            _OWN_SESSIONS.setdefault(key, []).append(pid)
        yield
    finally:
        if pid is not None and pid in _OWN_SESSIONS.get(key, ()):
            with _OWN_LOCK:
                _OWN_SESSIONS[key].remove(pid)
                if not _OWN_SESSIONS[key]:
                    del _OWN_SESSIONS[key]
        _release(conn, ("unlock_run_shared", {"run_id": run_id}))


@dataclass
class Claim:
    """A batch this worker claimed: ``conn`` (autocommit, no transaction) holds the claim and
    the batch's users' locks until ``claimed`` returns; ``batch`` is its row."""

    conn: Connection
    batch: Any

    def note_unapplied_llm(self, run_id: UUID, spent: dict[str, int]) -> None:
        """Keep the model usage of an attempt at this batch that wrote nothing (given up,
        failed, finished meanwhile by another worker) for the run's report: it was paid for."""
        if not any(spent.values()):
            return
        params = {"run_id": run_id, "batch_no": self.batch.batch_no, "usage": json.dumps(spent)}
        try:
            self.conn.execute(q("note_unapplied_llm"), params)
            return
        except Exception:  # the session may be what failed (a server restart): a new one
            pass
        try:
            with self.conn.engine.begin() as fresh:
                fresh.execute(q("note_unapplied_llm"), params)
        except Exception as exc:  # the server is still away: the report then misses them
            log.warning("gc.llm_usage_unrecorded", error=describe_error(exc), **spent)


@contextlib.contextmanager
def claimed(
    engine: Engine, run_id: UUID, should_stop: Callable[[], bool] | None = None
) -> Iterator[Claim | None]:
    """Claim the first pending batch of the run nobody else holds (None when there is none, or
    when ``should_stop`` says so while its users are held by another batch), and lock its users,
    on a session of our own: the claim spans the batch's plan and the transaction that applies
    it, needs no transaction open in between, and dies with the session if the worker does."""
    ending: BaseException | None = None
    with translated_errors():
        conn = engine.connect()
        try:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(q("keep_idle_session"))
            _pay_owed_releases(conn)
            claimed_no = None
            claim = _claim(conn, run_id)
            if claim is not None:
                claimed_no = claim.batch.batch_no
                if not _lock_users(conn, list(claim.batch.users), should_stop):
                    claim = None  # asked to stop while waiting: the batch stays pending
            yield claim
        except BaseException as exc:
            ending = exc
            raise
        finally:
            alive = [("release_claim", {"run_id": run_id, "batch_no": claimed_no})]
            released = _release(
                conn, ("reset_session", {}), ("reset_lock_timeout", {}),
                *(alive if claimed_no is not None else []), ("unlock_claim", {}),
            )  # fmt: skip
            if not released and claimed_no is not None and not _may_have_crashed(ending):
                with _OWN_LOCK:
                    _OWED_RELEASES.add((run_id, claimed_no))


def _may_have_crashed(ending: BaseException | None) -> bool:
    """The claim ended with its session lost and the server not saying why: it may be the
    batch that brought the server down."""
    return getattr(ending, "connection_lost", False) and not getattr(
        ending, "server_restart", False
    )


def _pay_owed_releases(conn: Connection) -> None:
    """Release the claims this process could not release on their own session; one that fails
    again stays owed."""
    with _OWN_LOCK:
        owed = list(_OWED_RELEASES)
    for run_id, batch_no in owed:
        conn.execute(q("release_claim"), {"run_id": run_id, "batch_no": batch_no})
        with _OWN_LOCK:
            _OWED_RELEASES.discard((run_id, batch_no))


def _lock_users(conn: Connection, users: list[str], should_stop: Callable[[], bool] | None) -> bool:
    """Lock the batch's users (lock_batch_users), waiting as long as it takes unless asked to
    stop; False if asked. A slice that times out keeps the locks it got (session locks), and
    unlock_claim releases every count of them."""
    conn.execute(q("user_lock_slice"))
    try:
        while True:
            try:
                conn.execute(q("lock_batch_users"), {"users": users})
                return True
            except sa.exc.OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                if should_stop is not None and should_stop():
                    log.info("gc.batch_abandoned", reason="stop requested while a user was held")
                    return False
    finally:
        conn.execute(q("reset_lock_timeout"))


def _release(conn: Connection, *statements: tuple[str, dict[str, Any]]) -> bool:
    """Undo what the session took, and give it back to the pool; if that fails, end the
    session instead (the server then releases its locks) and return False."""
    try:
        for name, params in statements:
            conn.execute(q(name), params)
        conn.commit()  # a no-op on an autocommit session
    except Exception:
        conn.invalidate()
        conn.close()
        return False
    conn.close()
    return True


def _claim(conn: Connection, run_id: UUID) -> Claim | None:
    for batch_no in conn.execute(q("pending_batches"), {"run_id": run_id}).scalars().all():
        key = {"run_id": run_id, "batch_no": batch_no}
        if conn.execute(q("try_claim_batch"), key).scalar():
            batch = conn.execute(q("claimed_batch"), key).first()
            lost = conn.execute(q("count_claim"), key).scalar() if batch is not None else None
            if lost is not None and lost >= MAX_LOST_CLAIMS:
                error = (
                    f"the worker stopped inside this batch {lost} times (killed, out of "
                    "memory, or the server crashed under it?); given up so that the run's "
                    "other batches get done"
                )
                conn.execute(q("fail_batch"), key | {"error": error, "worker": WORKER_ID})
                log.error("gc.batch_failed", batch_no=batch_no, error=error)
            elif lost is not None:
                return Claim(conn, batch)
            conn.execute(q("unlock_claim"))  # finished meanwhile by another worker, or failed
    return None
