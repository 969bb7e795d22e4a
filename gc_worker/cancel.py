"""Cancelling a run: the operator's stop for a run that must not go on (a nightly run retiring
far more than it should, say), whoever works it.

``cancel(engine, run_id)`` closes a ``running`` run as ``failed`` ("cancelled by an operator"):
no process claims a batch of it any more (a claim needs the run ``running``), a daemon does not
take it up as an orphan, a nightly plan cancelled so is never applied by ``plan_then_apply``. A
process working it finishes the batch it is in — a batch commits whole or not at all — and
stops; ``cancel`` waits for them (each holds the run's participation lock, gc_worker.claims),
at most ``wait_seconds``, so that when it returns nothing more of the run will be applied and
``memory-gc restore --run RUN_ID`` undoes all of it. What the run applied stays until then;
an erasure run's request stays pending (the next run erases); a cancelled apply can still be
finished by ``memory-gc apply PLAN_ID`` (its pending batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy.engine import Engine

from gc_worker.db import transaction
from gc_worker.errors import UsageError
from gc_worker.queries import q
from gc_worker.run_record import CANCELLED, load_run

POLL_SECONDS = 0.2


@dataclass
class Cancelled:
    run_id: UUID
    mode: str
    plan_run_id: UUID | None
    workers_done: bool  # no process works it any more (else they still finish their batch)


def cancel(
    engine: Engine,
    run_id: UUID,
    *,
    wait_seconds: float = 600.0,
    on_wait: Callable[[], None] = lambda: None,
) -> Cancelled:
    """Close ``run_id`` as cancelled, then wait for the processes working it to leave it."""
    with transaction(engine) as conn:
        run = load_run(conn, run_id)
        closed = conn.execute(q("fail_run"), {"run_id": run_id, "error": CANCELLED}).rowcount
    if not closed:
        raise UsageError(
            f"run {run_id} is {run['status']}, not running: nothing to cancel"
            + (f"; `memory-gc restore --run {run_id}` undoes it" if run["mode"] == "apply" else "")
        )
    return Cancelled(
        run_id, run["mode"], run["plan_run_id"], _left(engine, run_id, wait_seconds, on_wait)
    )


def _left(engine: Engine, run_id: UUID, wait_seconds: float, on_wait: Callable[[], None]) -> bool:
    """Whether every process working the run has left it (within ``wait_seconds``)."""
    deadline = time.monotonic() + wait_seconds
    told = False
    with engine.connect() as conn:
        while True:
            if conn.execute(q("try_run_exclusive"), {"run_id": run_id}).scalar():
                conn.execute(q("unlock_run_exclusive"), {"run_id": run_id})
                conn.commit()
                return True
            conn.commit()
            if time.monotonic() >= deadline:
                return False
            if not told:
                on_wait()
                told = True
            time.sleep(POLL_SECONDS)
