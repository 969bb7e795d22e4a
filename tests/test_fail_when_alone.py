"""run_workers._fail leaves a run to other workers only when sessions other than this worker's own
participation sessions hold it: an apply alone with two sessions of its own is marked failed,
and a replica whose own session died does not fail the run another replica works (it counted
sessions, not workers). Found by a review."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gc_worker import batch_run
from gc_worker import engine as gc_engine
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.errors import DatabaseUnavailable, WriteConflict
from gc_worker.queries import q
from tests.store import NOW
from tests.test_faults import (  # noqa: F401  (fixtures)
    BATCHED,
    USERS,
    databases,
    engine,
    lifecycle_rows,
    seed,
    twin,
)


def status(engine, run_id):  # noqa: F811
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT status, error FROM gc_runs WHERE id = :i"), {"i": run_id}
        ).one()


def test_cli_apply_alone_is_marked_failed(engine, monkeypatch):  # noqa: F811
    """`memory-gc apply` (applying + process_run(participate=True)) holds the run's shared lock
    on two sessions of its own: its DB failure must still mark the run failed."""
    seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
    plan = gc_engine.run_once(
        engine, BATCHED, RunRequest(mode="dry_run", now=NOW, jobs=resolve_jobs([], BATCHED))
    )

    def conflict(*a, **k):
        raise WriteConflict("deadlock detected (40P01); rolled back whole")

    monkeypatch.setattr(batch_run, "_commit_batch", conflict)
    with pytest.raises(DatabaseUnavailable):
        gc_engine.apply_plan(engine, plan)  # what cmd_apply does
    with engine.connect() as conn:
        apply_id = conn.execute(
            sa.text("SELECT applied_by FROM gc_runs WHERE id = :i"), {"i": plan}
        ).scalar_one()
    st, err = status(engine, apply_id)
    assert st == "failed" and err, f"apply run left {st!r} (error={err!r}) with no other process"


def test_replica_whose_own_session_died_does_not_fail_the_shared_run(engine, monkeypatch):  # noqa: F811
    """Replica A loses its connections (its participation session with them); replica B still
    participates. A must leave the run to B, as for any other database trouble."""
    seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
    run_id = start_run(
        engine, BATCHED, RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], BATCHED))
    )
    b = engine.connect()  # replica B's participation session
    b.execute(q("lock_run_shared"), {"run_id": run_id})
    b.commit()
    b_pid = b.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    b.commit()

    def lost(*a, **k):
        # A's network blip: the server drops A's sessions (participation included)
        with engine.connect() as c:
            c.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND classid = 4242002 AND objsubid = 2 "
                    "AND objid = CAST(hashtext(CAST(:r AS text)) AS oid) AND pid <> :b"
                ),
                {"r": str(run_id), "b": b_pid},
            )
            c.commit()
        raise DatabaseUnavailable("the database connection failed mid-transaction")

    monkeypatch.setattr(batch_run, "_commit_batch", lost)
    try:
        with pytest.raises(DatabaseUnavailable):
            gc_engine.process_run(engine, run_id, BATCHED)
        st, err = status(engine, run_id)
        assert st == "running", f"run marked {st!r} while replica B still works it: {err}"
    finally:
        b.close()


def test_a_failed_runs_error_keeps_one_short_line(engine, monkeypatch):  # noqa: F811
    """The run's error is kept for good, where no erasure reaches: like a failed batch's, it is
    the error's first line, cut to 300 characters — a library's message quoting a row below
    its first line, or a very long one, is not stored whole."""
    seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
    plan = gc_engine.run_once(
        engine, BATCHED, RunRequest(mode="dry_run", now=NOW, jobs=resolve_jobs([], BATCHED))
    )

    def conflict(*a, **k):
        raise WriteConflict("deadlock detected " + "x" * 400 + "\nrow: Allergic to peanuts")

    monkeypatch.setattr(batch_run, "_commit_batch", conflict)
    with pytest.raises(DatabaseUnavailable):
        gc_engine.apply_plan(engine, plan)
    with engine.connect() as conn:
        apply_id = conn.execute(
            sa.text("SELECT applied_by FROM gc_runs WHERE id = :i"), {"i": plan}
        ).scalar_one()
    st, err = status(engine, apply_id)
    assert st == "failed" and err.startswith("WriteConflict: deadlock detected")
    assert "peanuts" not in err and len(err) == 300
