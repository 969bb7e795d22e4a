"""What memory-gc emits outside its audit about a failure — log lines, the CLI's stderr, the
error columns of gc_runs, gc_run_batches and gc_sweep_requests — names the failure (exception
type, SQLSTATE, constraint, table, function, memory ids) but quotes no row value: a server's
first line can quote one too (an application trigger's RAISE formatting NEW.content, a cast of a
metadata value in a CHECK), and a forgotten fact must not survive there. `forget` removes the
erased ids from those columns, so verify-erasure comes out clean."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest
import sqlalchemy as sa

from gc_worker import db, erasure
from gc_worker.cli import main
from gc_worker.daemon import Daemon
from gc_worker.errors import RunFailed
from gc_worker.sweeps import request_sweep
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, days_ago, execute

SECRET = "Quokkaberry"  # the distinctive fact: nowhere outside the memory row, ever

RAISE = "RAISE EXCEPTION 'memory % (%) is under legal hold', NEW.id, NEW.content"
ASSERT = "ASSERT false, format('memory %s (%s) is under legal hold', NEW.id, NEW.content)"
GUARD = "CREATE FUNCTION app_guard() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {}; END $$"


def stored_errors(engine: sa.Engine) -> str:
    rows = execute(
        engine,
        "SELECT error FROM gc_runs WHERE error IS NOT NULL UNION ALL "
        "SELECT error FROM gc_run_batches WHERE error IS NOT NULL UNION ALL "
        "SELECT error FROM gc_sweep_requests WHERE error IS NOT NULL",
    ).scalars()
    return "\n".join(rows)


def guarded(engine: sa.Engine, body: str = RAISE) -> object:
    """A memory with a distinctive text that the worker will try to soft-delete, and an
    application trigger that refuses the update with a message quoting the row."""
    memory_id = add(engine, "u1", f"Keeps a parrot named {SECRET}", expires_at=days_ago(1))
    execute(engine, GUARD.format(body))
    execute(engine, "CREATE TRIGGER app_guard BEFORE UPDATE ON memories"
                    " FOR EACH ROW EXECUTE FUNCTION app_guard()")  # fmt: skip
    return memory_id


@pytest.mark.parametrize(
    ("body", "error", "state"),
    [(RAISE, "RaiseException", "P0001"), (ASSERT, "AssertFailure", "P0004")],
)
def test_a_triggers_message_quoting_the_row_is_not_kept(
    engine, settings, capsys, cli_env, body, error, state
):
    """The trigger's RAISE (or ASSERT) text quotes the content: the stored errors, the log
    lines and the CLI's message keep the SQLSTATE, the function and the memory id instead."""
    memory_id = guarded(engine, body)
    assert main(["run", "--now", NOW.isoformat()]) == 1
    captured = capsys.readouterr()
    errors = stored_errors(engine)
    (batch_error,) = execute(engine, "SELECT error FROM gc_run_batches").scalars()
    for part in (error, state, "app_guard()", str(memory_id)):
        assert part in batch_error
    assert f"batch 0 (1 users): {error}" in errors
    assert SECRET not in errors + captured.out + captured.err
    assert "gc.batch_failed" in captured.err and "app_guard()" in captured.err


def test_a_cast_quoting_a_metadata_value_is_not_kept(engine, settings, capsys):
    """An application CHECK casting a metadata value fails the worker's UPDATE with
    `invalid input syntax for type integer: "<the value>"`: kept without the value."""
    add(engine, "u1", "plain", expires_at=days_ago(1))
    execute(
        engine,
        "UPDATE memories SET metadata = jsonb_build_object('score', CAST(:s AS text))",
        s=SECRET,
    )
    execute(engine, "ALTER TABLE memories ADD CONSTRAINT app_score CHECK"
                    " ((metadata ->> 'score') IS NULL OR (metadata ->> 'score')::int >= 0)"
                    " NOT VALID")  # fmt: skip
    from tests.store import run

    with pytest.raises(RunFailed) as failed:
        run(engine, settings)
    errors = stored_errors(engine)
    assert "invalid input syntax for type integer" in errors and "22P02" in errors
    assert SECRET not in errors + str(failed.value) + capsys.readouterr().out


def test_a_unique_violation_names_its_key_columns_not_their_values(engine):
    """A unique violation's DETAIL (`Key (user_id, content)=(u1, <the text>)`) is cut to the
    key's columns; the constraint and table stay."""
    add(engine, "u1", f"Keeps a parrot named {SECRET}")
    execute(engine, "CREATE UNIQUE INDEX app_unique ON memories (user_id, content)")
    with pytest.raises(sa.exc.IntegrityError) as refused, engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO memories (user_id, content) "
                             "SELECT user_id, content FROM memories")  # fmt: skip
    described = db.describe_error(refused.value)
    assert SECRET in str(refused.value)  # the server did quote it
    assert described.startswith("UniqueViolation: ") and SECRET not in described
    for part in ('"app_unique"', "23505", "key (user_id, content)"):
        assert part in described


def test_a_check_violation_names_the_failing_rows_id(engine, settings):
    """`Failing row contains (<id>, <user>, <content>, …)` is cut to the row's id."""
    memory_id = add(engine, "u1", f"Keeps a parrot named {SECRET}", expires_at=days_ago(1))
    execute(engine, "ALTER TABLE memories ADD CONSTRAINT app_rule"
                    " CHECK (status <> 'deleted') NOT VALID")  # fmt: skip
    from tests.store import run

    with pytest.raises(RunFailed):
        run(engine, settings)
    (batch_error,) = execute(engine, "SELECT error FROM gc_run_batches").scalars()
    assert f"failing row ({memory_id}, …)" in batch_error and "23514" in batch_error
    assert SECRET not in batch_error


def test_a_failed_sweep_keeps_no_row_value(engine, settings):
    """A sweep whose batch the trigger refused: the request's error is as bare as the run's;
    the daemon's metrics (no user label either) and /healthz body say nothing of the row."""
    guarded(engine)
    request_id = request_sweep(engine, "u1")
    daemon = Daemon(engine, settings, clock=lambda: NOW)
    try:
        assert daemon.sweep_next() is True  # served, failed: the queue goes on
        exposition = daemon.metrics.exposition().decode()
        health = json.dumps(daemon.health()[1])
    finally:
        daemon.close()
    assert 'memory_gc_sweep_requests_total{status="failed"} 1.0' in exposition
    assert SECRET not in exposition + health and "u1" not in exposition
    (error,) = execute(engine, "SELECT error FROM gc_sweep_requests WHERE id = :i",
                       i=request_id).scalars()  # fmt: skip
    assert "RaiseException" in error and SECRET not in error


@pytest.mark.parametrize("target", ["memory", "user"])
def test_forget_removes_the_erased_id_from_stored_errors(engine, settings, target):
    """The failed batch's error names the memory; once it is forgotten (the hold lifted), the
    error columns no longer do, and verify-erasure finds nothing."""
    memory_id = guarded(engine)
    request_sweep(engine, "u1")
    daemon = Daemon(engine, settings, clock=lambda: NOW)
    try:
        assert daemon.sweep_next() is True  # served, failed: the queue goes on
    finally:
        daemon.close()
    assert stored_errors(engine).count(str(memory_id)) >= 3  # batch, run, sweep request
    execute(engine, "DROP TRIGGER app_guard ON memories")
    named = {"memory_id": memory_id} if target == "memory" else {"user_id": "u1"}
    erasure.forget(engine, settings, now=NOW, purge_now=True, **named)
    errors = stored_errors(engine)
    assert str(memory_id) not in errors and "an erased memory" in errors
    assert "RaiseException" in errors  # the failure itself stays recorded
    assert verify(engine, now=NOW, **named).residues == []


def test_a_driver_error_outside_sqlalchemy_is_described_the_same(engine):
    """The audit is written with the driver's own COPY, whose errors SQLAlchemy never wraps: a
    raw psycopg error is described from its diagnostics too, not as its whole text (DETAIL and
    CONTEXT quote the row)."""
    add(engine, "u1", f"Keeps a parrot named {SECRET}")
    execute(engine, "CREATE UNIQUE INDEX app_unique ON memories (user_id, content)")
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        with pytest.raises(psycopg.errors.UniqueViolation) as refused, driver.cursor() as cur:
            cur.execute("INSERT INTO memories (user_id, content) "
                        "SELECT user_id, content FROM memories")  # fmt: skip
        conn.rollback()
    described = db.describe_error(refused.value)
    assert SECRET in str(refused.value)
    assert described.startswith("UniqueViolation: ") and "23505" in described
    assert SECRET not in described


@pytest.mark.parametrize("behaviour", ["good", "garbage", "obey"])
def test_llm_runs_log_no_memory_text(engine, capsys, behaviour):
    """Merges, summaries, importance and contradiction checks, with a model that answers well,
    answers garbage (rejections are logged with their reason) or obeys the memory text: at
    debug level, no log line quotes a memory, a merged text or a summary."""
    from gc_worker import logs
    from tests.fake_model import FakeModel, fake_port
    from tests.store import run
    from tests.test_llm_outside_transaction import SETTINGS, seed

    seed(engine)
    execute(engine, "UPDATE memories SET content = content || ' near ' || :s", s=SECRET)
    logs.configure("debug")
    try:
        with fake_port(engine, SETTINGS, FakeModel(behaviour, dim=8)) as llm:
            run(engine, SETTINGS, llm=llm)
        err = capsys.readouterr().err
    finally:
        logs.configure("info")
    assert "gc.batch_committed" in err  # the lines were captured
    assert SECRET not in err


def test_the_embedded_servers_log_keeps_no_row(engine, settings, pg_server):
    """The embedded PostgreSQL's log (MEMORY_GC_DATA_DIR/pgdata/log) is the worker's to keep:
    a statement it refuses is not logged there (the server's line, DETAIL "Failing row contains
    (…)" and the statement all quote the row); the worker's own log says what failed."""
    marker = f"Parrot{uuid4().hex}"  # this test's own: the log is the whole session's
    add(engine, "u1", f"Keeps a parrot named {marker}", expires_at=days_ago(1))
    execute(engine, "ALTER TABLE memories ADD CONSTRAINT app_rule"
                    " CHECK (status <> 'deleted') NOT VALID")  # fmt: skip
    from tests.store import run

    with pytest.raises(RunFailed):
        run(engine, settings)
    log = Path(pg_server.log).read_text(errors="replace")
    assert marker not in log and "app_rule" not in log


def test_a_purge_that_failed_on_an_erased_row_leaves_no_id_once_it_is_done(engine, settings):
    """An erased memory's purge (after [erasure] retention_days) refused by an application's
    DELETE trigger names it in the batch's error; the purge that succeeds later takes the id
    out of the error columns, as the erasure did for earlier errors: verify-erasure is clean."""
    from datetime import timedelta

    from tests.store import run

    memory_id = add(engine, "u1", f"Keeps a parrot named {SECRET}")
    erasure.forget(engine, settings, now=NOW, memory_id=memory_id)
    run(engine, settings)  # erased; purged after a day
    execute(engine, GUARD.format(RAISE.replace("NEW.", "OLD.")).replace("app_guard", "app_hold"))
    execute(engine, "CREATE TRIGGER app_hold BEFORE DELETE ON memories"
                    " FOR EACH ROW EXECUTE FUNCTION app_hold()")  # fmt: skip
    later = NOW + timedelta(days=2)
    with pytest.raises(RunFailed):
        run(engine, settings, now=later)
    assert str(memory_id) in stored_errors(engine) and SECRET not in stored_errors(engine)
    execute(engine, "DROP TRIGGER app_hold ON memories")
    run(engine, settings, now=later)
    assert str(memory_id) not in stored_errors(engine)
    assert verify(engine, now=later, memory_id=memory_id).residues == []
