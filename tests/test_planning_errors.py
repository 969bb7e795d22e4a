"""Driver errors while a batch is planned before its transaction (a job asks the model; reads
run on the claiming session) are treated as in a transaction: a lost session stops the run with
DatabaseUnavailable (it became a traceback from marking the batch failed on the dead session),
a lock timeout is a conflict retried (it failed the batch for good). Found by a review."""

from __future__ import annotations

import threading

import httpx2
import pytest
import sqlalchemy as sa

from gc_worker import db
from gc_worker import engine as gc_engine
from gc_worker.engine import RunRequest, resolve_jobs
from gc_worker.errors import DatabaseUnavailable
from tests.fake_model import fake_port
from tests.store import NOW
from tests.test_llm_outside_transaction import SETTINGS, Watching, seed

CLAIMER = """
SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 4242001 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
LIMIT 1
"""


def _start(engine: sa.Engine):
    request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], SETTINGS))
    return gc_engine.start_run(engine, SETTINGS, request)


def _batches(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(sa.text("SELECT state FROM gc_run_batches ORDER BY batch_no")).scalars()
        )


def test_claim_session_lost_while_the_model_answers_is_database_unavailable(engine) -> None:
    killed: list[int] = []

    def kill(_: httpx2.Request) -> None:
        if killed:
            return
        with engine.connect() as c:
            c.execution_options(isolation_level="AUTOCOMMIT")
            pid = c.execute(sa.text(CLAIMER)).scalar()
            c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            killed.append(pid)

    seed(engine)
    with fake_port(engine, SETTINGS, Watching(kill)) as llm:
        run_id = _start(engine)
        with pytest.raises(Exception) as info:
            gc_engine.process_run(engine, run_id, SETTINGS, llm=llm)
    assert killed
    assert isinstance(info.value, DatabaseUnavailable), repr(info.value)
    assert _batches(engine)[0] == "pending"


def test_lock_timeout_while_planning_is_retried_not_a_failed_batch(database_url: str) -> None:
    """The worker's URL sets lock_timeout (docs/operations.md suggests it); the application's
    ALTER TABLE holds `memories` for a moment while the model answers the first question."""
    eng = db.make_engine(database_url, connect_args={"options": "-c lock_timeout=300"})
    ddl = db.make_engine(database_url)
    held: list[sa.Connection] = []

    def app_ddl(_: httpx2.Request) -> None:
        if held:
            return
        conn = ddl.connect()
        conn.execute(sa.text("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE"))
        held.append(conn)

        def done() -> None:
            conn.rollback()
            conn.close()

        threading.Timer(0.6, done).start()

    try:
        seed(eng)
        with fake_port(eng, SETTINGS, Watching(app_ddl)) as llm:
            run_id = _start(eng)
            try:
                gc_engine.process_run(eng, run_id, SETTINGS, llm=llm)
            except Exception as exc:
                print("raised", repr(exc))
        assert held
        assert _batches(eng)[0] == "done", _batches(eng)
    finally:
        eng.dispose()
        ddl.dispose()
