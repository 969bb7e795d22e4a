"""Interleavings of two processes on one database, forced with events (no sleeps as
synchronisation): each test holds one side at a chosen point, lets the other side run into it,
and checks the invariant that interleaving used to break."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from gc_worker import erasure, restore
from tests.store import NOW, add, days_ago, execute, run, status

WAIT = 30  # seconds any side may take before the test fails instead of hanging
ADVISORY_WAITERS = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted
"""


class Side(threading.Thread):
    """One side of an interleaving, run in a thread; its result or error kept for the test."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # raised in the test's thread by outcome()
            self.error = exc

    def outcome(self) -> Any:
        self.join(WAIT)
        assert not self.is_alive(), "a side of the interleaving hung"
        if self.error is not None:
            raise self.error
        return self.result


def finished_or_waiting_for_a_lock(engine: sa.Engine, side: Side) -> None:
    """Return once ``side`` has finished, or waits for an advisory lock another session holds."""
    deadline = time.monotonic() + WAIT
    while side.is_alive() and time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(sa.text(ADVISORY_WAITERS)).scalar():
                return
        side.join(0.05)


class TestRestoreAndErasure:
    def test_a_restore_in_flight_does_not_bring_back_what_forget_purge_now_erases(
        self, engine, settings, monkeypatch
    ):
        """A restore has found a retired row in place (no request names it yet) when
        `forget-user --purge-now` of its user runs: the erasure waits for the restore, then
        erases the row it brought back. It used to skip the row the restore held, complete
        nothing, and leave the row on the read path with the request pending (exit 1)."""
        gone = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
        add(engine, "u1", "Likes green tea")
        retired = run(engine, settings, jobs=["ttl_expiry"])
        assert status(engine, gone) == "deleted"

        in_place, go = threading.Event(), threading.Event()
        restore_status = restore._restore_status

        def held_restore_status(conn: Any, rows: list[Any]) -> set[UUID]:
            back = restore_status(conn, rows)
            in_place.set()  # the row is found in place, locked and put back: uncommitted
            assert go.wait(WAIT)
            return back

        monkeypatch.setattr(restore, "_restore_status", held_restore_status)
        undo = Side(
            lambda: restore.restore_run(
                engine, UUID(retired["run_id"]), now=NOW + timedelta(hours=1)
            )
        )
        undo.start()
        assert in_place.wait(WAIT)
        forget = Side(
            lambda: erasure.forget(
                engine, settings, now=NOW + timedelta(hours=2), user_id="u1", purge_now=True
            )
        )
        forget.start()
        finished_or_waiting_for_a_lock(engine, forget)
        go.set()
        undo.outcome()
        request, _ = forget.outcome()
        done = execute(engine, "SELECT status FROM gc_erasure_requests WHERE id = :id",
                       id=request.id).scalar()  # fmt: skip
        left = execute(engine, "SELECT count(*) FROM memories WHERE user_id = 'u1'").scalar()
        assert (status(engine, gone), left, done) == (None, 0, "completed"), (
            "the restore put an erased user's row back on the read path"
        )


class TestErasureOfAMemoryMovedDuringABatch:
    @pytest.mark.parametrize("dry_run", [True, False])
    def test_a_batch_planned_in_its_transaction_keeps_nothing_of_it(
        self, engine, settings, monkeypatch, dry_run
    ):
        """u1's batch (no model: planned inside its transaction) has read m when the
        application moves m to u2 and u2's `forget m --purge-now` completes (u2's batch waits
        for no lock of u1's). What u1's batch then recorded — the planned or drifted soft
        delete with m's preview — kept m's text, and verification found the residue; only a
        batch planned before its transaction (one that asks the model) was scrubbed."""
        from gc_worker import batch_run
        from gc_worker.verify_erasure import verify
        from tests.test_erasure_helpers import full_text_scan

        m = add(engine, "u1", "Sees Dr Quillfeather on Tuesdays", expires_at=days_ago(1))
        add(engine, "u1", "Likes green tea")
        add(engine, "u2", "Collects stamps")
        run_batch, moved = batch_run._run_batch, []

        def move_and_forget_first(ctx: Any, run_row: Any, batch_no: int, actions: Any) -> Any:
            if not moved and run_row["trigger"] != "erasure":
                moved.append(m)
                execute(engine, "UPDATE memories SET user_id = 'u2' WHERE id = :id", id=m)
                erasure.forget(engine, settings, now=NOW, memory_id=m, purge_now=True)
                assert status(engine, m) is None  # purged while u1's batch is still open
            return run_batch(ctx, run_row, batch_no, actions)

        monkeypatch.setattr(batch_run, "_run_batch", move_and_forget_first)
        report = run(engine, settings, jobs=["ttl_expiry"], users=["u1"], dry_run=dry_run)
        assert moved and report["status"] == "completed"
        assert full_text_scan(engine, ["Quillfeather"]) == []
        assert verify(engine, now=NOW + timedelta(days=1), memory_id=m).residues == []
