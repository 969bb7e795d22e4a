"""The model is asked with no transaction open: a batch whose jobs call the model is planned
first (its claim and its users' locks held by a session of its own, every read its own) and
applied afterwards in a short transaction that checks each row's version as planned. So a slow
model never holds a transaction open — no ``idle in transaction`` session for
``idle_in_transaction_session_timeout`` to kill, no snapshot holding back vacuum — and a row
the application changes meanwhile is drifted, never overwritten."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import httpx2
import psycopg
import pytest
import sqlalchemy as sa

from gc_worker import db
from gc_worker import engine as gc_engine
from gc_worker.batch_run import asks_model
from gc_worker.config import Settings, UserCapSettings
from gc_worker.daemon import listen_dsn
from gc_worker.errors import RunFailed
from gc_worker.queries import q
from gc_worker.report import build_report
from tests.conftest import TEST_DIM
from tests.fake_model import FakeModel, fake_port
from tests.store import NOW, add, days_ago, execute, get, run, status
from tests.test_compaction import E0, at_similarity

SETTINGS = Settings.model_validate(
    {"embeddings": {"dim": TEST_DIM}, "user_cap": {"max_memories": 3, "overflow": "summarize"}}
)
TERMINATE_OTHERS = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
"""
USER_FREE = "SELECT pg_try_advisory_lock(4242001, hashtext(:user))"
OPEN_TRANSACTIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
"""


class Watching(FakeModel):
    """A good model that, on every request, first runs ``during(request)``."""

    def __init__(self, during: Any) -> None:
        super().__init__("good", dim=TEST_DIM)
        self.during = during

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.during(request)
        return super().__call__(request)


def seed(engine: sa.Engine) -> tuple[UUID, UUID]:
    """For u1: two paraphrases (compaction), unassessed rows (importance), over a cap of 3
    (user_cap summarize); u2: one row."""
    a = add(engine, "u1", "Likes green tea", created_at=days_ago(9), embedding=E0)
    b = add(engine, "u1", "Enjoys drinking green tea", created_at=days_ago(2),
            embedding=at_similarity(0.95))  # fmt: skip
    for i in range(3):
        add(engine, "u1", f"Fact number {i} about the user", created_at=days_ago(20 + i),
            embedding=at_similarity(0.2, axis=2 + i))  # fmt: skip
    add(engine, "u2", "Another user's memory", embedding=E0)
    return a, b


@pytest.fixture
def monitor(engine: sa.Engine) -> Iterator[sa.Connection]:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def test_no_transaction_is_open_while_the_model_answers(engine, monitor) -> None:
    """Every request of every kind finds no open transaction of the worker, while the batch's
    claim and its user's lock are held all along."""
    seen: list[tuple[int, bool, bool]] = []

    def look(_: httpx2.Request) -> None:
        open_transactions = monitor.execute(sa.text(OPEN_TRANSACTIONS)).scalar()
        user_free = monitor.execute(sa.text(USER_FREE), {"user": "u1"}).scalar()
        run_id = monitor.execute(sa.text("SELECT id FROM gc_runs")).scalar()
        batch_free = monitor.execute(q("try_claim_batch"), {"run_id": run_id, "batch_no": 0})
        seen.append((open_transactions, user_free, batch_free.scalar()))
        monitor.execute(q("unlock_claim"))  # in case the probe got a lock

    model = Watching(look)
    seed(engine)
    with fake_port(engine, SETTINGS, model) as llm:
        report = run(engine, SETTINGS, llm=llm)
    assert report["status"] == "completed"
    assert {"ImportanceAnswer", "MergeAnswer", "SummaryAnswer", "embed"} <= set(model.calls)
    assert seen and seen == [(0, False, False)] * len(seen)
    with engine.connect() as a, engine.connect() as b, engine.connect() as c:  # the pool
        modes = {x.execute(sa.text("SHOW plan_cache_mode")).scalar() for x in (a, b, c)}
    assert modes == {"auto"}  # the claiming session's setting did not go back to the pool


def test_a_slow_model_under_idle_in_transaction_session_timeout(database_url: str) -> None:
    """With a server that ends sessions idle in a transaction, or idle at all, for 1 s, a model
    taking 1.2 s per answer still gets its merge and summary applied (the worker's sessions that
    hold locks while idle — a claim, a run's participation — opt out of idle_session_timeout)."""
    options = "-c idle_in_transaction_session_timeout=1000 -c idle_session_timeout=1000"
    slow = db.make_engine(database_url, connect_args={"options": options})
    try:
        a, b = seed(slow)
        model = Watching(lambda _: time.sleep(1.2))
        with fake_port(slow, SETTINGS, model) as llm:
            report = run(slow, SETTINGS, llm=llm, jobs=["compaction", "user_cap"])
        assert report["status"] == "completed"
        assert status(slow, a) == status(slow, b) == "merged"
        kinds = {(x["job"], x["action"]) for x in report["actions"]}
        assert {("compaction", "create_merged"), ("user_cap", "create_merged")} <= kinds
    finally:
        slow.dispose()


def test_a_row_changed_while_the_model_answers_is_drifted(engine) -> None:
    """The application writes to a member of the merge group while the model is answering: the
    whole group is drifted, nothing is merged; the next run merges it (from the cache: the
    member's text is unchanged)."""
    a, b = seed(engine)

    def app_writes(request: httpx2.Request) -> None:
        if b"MergeAnswer" in request.content:
            execute(engine, "UPDATE memories SET metadata = jsonb_build_object('turn', 7)"
                    " WHERE id = :b", b=b)  # fmt: skip

    with fake_port(engine, SETTINGS, Watching(app_writes)) as llm:
        first = run(engine, SETTINGS, llm=llm, jobs=["compaction"])
    assert first["jobs"]["compaction"]["drifted"] >= 3  # the record and both members
    assert status(engine, a) == status(engine, b) == "active"
    model = FakeModel("good", dim=TEST_DIM)
    with fake_port(engine, SETTINGS, model) as llm:
        run(engine, SETTINGS, llm=llm, jobs=["compaction"], now=NOW)
    assert status(engine, a) == status(engine, b) == "merged"
    assert model.calls["MergeAnswer"] == 0  # the decision was cached by the first run


def test_a_read_while_the_model_answers_does_not_drift_the_merge(engine) -> None:
    """The application puts a member into a model context while the model is answering (it
    reads the memories it keeps retrieving): what the merge rests on is unchanged, so it is
    applied in this run; the read stands on the merged member."""
    a, b = seed(engine)

    def app_reads(request: httpx2.Request) -> None:
        if b"MergeAnswer" in request.content:
            execute(engine, "UPDATE memories SET access_count = access_count + 1,"
                    " last_accessed_at = :now WHERE id = :b", b=b, now=NOW)  # fmt: skip

    with fake_port(engine, SETTINGS, Watching(app_reads)) as llm:
        first = run(engine, SETTINGS, llm=llm, jobs=["compaction"])
    assert first["jobs"]["compaction"]["drifted"] == 0
    assert status(engine, a) == status(engine, b) == "merged"
    assert get(engine, b)["last_accessed_at"] == NOW


def test_a_batch_another_worker_claimed_is_left_to_it(engine) -> None:
    """A batch whose claim another session holds is skipped (the run is not completed by this
    worker); once that worker is gone, the batch is taken."""
    for user in ("a", "b"):
        add(engine, user, expires_at=days_ago(1))
    settings = Settings.model_validate({"run": {"batch_users": 1}})
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
    run_id = gc_engine.start_run(engine, settings, request)
    with engine.connect() as other:
        assert other.execute(q("try_claim_batch"), {"run_id": run_id, "batch_no": 0}).scalar()
        other.commit()
        assert gc_engine.process_run(engine, run_id, settings) is False
        states = execute(
            engine, "SELECT state FROM gc_run_batches WHERE run_id = :r ORDER BY batch_no",
            r=run_id,
        ).scalars().all()  # fmt: skip
        assert states == ["pending", "done"]
        other.execute(q("unlock_claim"))  # the other worker is gone
    assert gc_engine.process_run(engine, run_id, settings) is True


def test_a_worker_whose_claim_was_lost_is_waited_for(engine) -> None:
    """A batch row held by another transaction (a worker whose claiming session was ended while
    it applied the batch): this worker waits for it, finds the batch done and goes on; the run
    completes, nothing is applied twice, nothing fails."""
    for user in ("a", "b"):
        add(engine, user, expires_at=days_ago(1))
    settings = Settings.model_validate({"run": {"batch_users": 1}})
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
    run_id = gc_engine.start_run(engine, settings, request)
    key = {"r": run_id}
    with engine.connect() as other:  # the other worker's batch transaction
        other.execute(sa.text("SELECT 1 FROM gc_run_batches WHERE run_id = :r AND batch_no = 0"
                              " FOR UPDATE"), key)  # fmt: skip
        result: list[bool] = []
        thread = threading.Thread(
            target=lambda: result.append(gc_engine.process_run(engine, run_id, settings))
        )
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # waiting for batch 0's row, not failing
        other.execute(sa.text("UPDATE gc_run_batches SET state = 'done'"
                              " WHERE run_id = :r AND batch_no = 0"), key)  # fmt: skip
        other.commit()
    thread.join(30)
    assert result == [True]
    applied = execute(engine, "SELECT batch_no, user_id FROM gc_actions WHERE run_id = :r",
                      r=run_id).all()  # fmt: skip
    assert [tuple(x) for x in applied] == [(1, "b")]  # batch 0 was the other worker's


def test_user_cap_evict_mode_does_not_ask(engine) -> None:
    """Only jobs that may call the model are planned before the transaction."""
    settings = SETTINGS.model_copy(update={"user_cap": UserCapSettings(max_memories=3)})
    run_row = {"plan_run_id": None, "jobs": ["ttl_expiry", "user_cap"]}
    assert asks_model(run_row, settings, object()) is False
    assert asks_model(run_row, SETTINGS, object()) is True
    assert asks_model(run_row | {"plan_run_id": "x"}, SETTINGS, object()) is False
    assert asks_model(run_row, SETTINGS, None) is False


def test_model_requests_are_a_sign_of_life_for_the_daemon(engine) -> None:
    """A sweep whose one batch spends minutes asking the model keeps /healthz green: every
    completed model request counts as progress, not only committed batches."""
    from gc_worker import sweeps
    from gc_worker.daemon import Daemon

    progress_seen: list[float] = []
    model = Watching(lambda _: progress_seen.append(daemon.last_progress))
    seed(engine)
    daemon = Daemon(engine, SETTINGS, clock=lambda: NOW,
                    llm_factory=lambda: fake_port(engine, SETTINGS, model))  # fmt: skip
    try:
        sweeps.request_sweep(engine, "u1")  # one user: one batch, several model requests
        assert daemon.sweep_next()
    finally:
        daemon.close()
    assert sum(model.calls.values()) >= 3 and len(progress_seen) == sum(model.calls.values())
    # each request after the first saw the progress the one before it recorded
    assert all(later > earlier for earlier, later in itertools.pairwise(progress_seen))


def test_the_worker_sessions_are_named(engine, database_url: str) -> None:
    """pg_stat_activity shows the worker's sessions as memory-gc (so a script that reaps idle
    sessions can spare them); a URL that names the application wins."""
    with engine.connect() as conn:
        assert conn.execute(sa.text("SHOW application_name")).scalar() == "memory-gc"
    with psycopg.connect(listen_dsn(engine)) as listening:  # the daemon's LISTEN connection
        assert listening.execute("SHOW application_name").fetchone() == ("memory-gc",)
    named = db.make_engine(database_url + "&application_name=gc-eu-1")  # the URL has ?host=
    try:
        with named.connect() as conn:
            assert conn.execute(sa.text("SHOW application_name")).scalar() == "gc-eu-1"
    finally:
        named.dispose()


def test_a_stop_while_the_model_is_asked_gives_the_batch_up(engine) -> None:
    """SIGTERM during an early plan does not wait for the rest of the batch's model calls: at
    the next user the batch is given up, nothing of it written, still pending; the next worker
    does it whole, and the answer already paid for comes from the cache."""
    seed(engine)
    stop = threading.Event()
    first = Watching(lambda _: stop.set())  # the stop arrives during the first request
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("importance", "compaction"))
    run_id = gc_engine.start_run(engine, SETTINGS, request)
    with fake_port(engine, SETTINGS, first) as llm:
        assert gc_engine.process_run(engine, run_id, SETTINGS, llm=llm, should_stop=stop.is_set) \
            is False  # fmt: skip
    assert sum(first.calls.values()) == 1
    state = execute(engine, "SELECT state FROM gc_run_batches WHERE run_id = :r", r=run_id)
    assert state.scalars().all() == ["pending"]
    assert execute(engine, "SELECT count(*) FROM gc_actions").scalar() == 0
    second = FakeModel("good", dim=TEST_DIM)
    with fake_port(engine, SETTINGS, second) as llm:
        assert gc_engine.process_run(engine, run_id, SETTINGS, llm=llm) is True
    assert second.calls["ImportanceAnswer"] == 1  # u2's; u1's was answered before the stop
    assert execute(engine, "SELECT count(*) FROM gc_actions WHERE outcome = 'applied'").scalar()
    with engine.connect() as conn:  # the request the given-up attempt paid for is reported
        spent = build_report(conn, run_id, actions=False)["llm"]
    assert spent["calls"] == sum(first.calls.values()) + sum(second.calls.values())
    assert spent["cache_hits"] >= 1  # u1's answer, taken from the cache by the second worker


def test_model_calls_of_a_failed_attempt_are_reported(engine) -> None:
    """A batch attempt that fails after asking the model (here: marking the batch done is
    refused) writes nothing; the calls it made are still in the run's report."""
    seed(engine)
    failures = iter([True])

    def fail_once(_: Any) -> None:
        if next(failures, False):  # first request: make the batch transaction fail
            execute(engine, "ALTER TABLE gc_run_batches ADD CONSTRAINT no_done "
                            "CHECK (state <> 'done') NOT VALID")  # fmt: skip

    model = Watching(fail_once)
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("importance",))
    run_id = gc_engine.start_run(engine, SETTINGS, request)
    with fake_port(engine, SETTINGS, model) as llm, pytest.raises(RunFailed, match="no_done"):
        gc_engine.process_run(engine, run_id, SETTINGS, llm=llm)
    execute(engine, "ALTER TABLE gc_run_batches DROP CONSTRAINT no_done")
    assert execute(engine, "SELECT count(*) FROM gc_actions").scalar() == 0
    with engine.connect() as conn:
        spent = build_report(conn, run_id, actions=False)["llm"]
    assert spent["calls"] == sum(model.calls.values()) == 2  # u1 and u2, one batch


def test_model_calls_of_an_attempt_a_server_restart_ended_are_reported(engine, monkeypatch) -> None:
    """The server restarts while the model answers, and is still starting when the batch
    would commit: the batch's claiming session is gone, so the paid calls could not be noted
    there (``gc.llm_usage_unrecorded``) and the report missed them. They are noted on a new
    session."""
    from gc_worker import batch_run
    from gc_worker.errors import DatabaseUnavailable

    seed(engine)
    restarts, real = iter([True]), batch_run._commit_batch
    starting = iter([True])

    def commit(*args: Any, **kwargs: Any) -> Any:
        if next(starting, False):
            raise DatabaseUnavailable("the database system is starting up (57P03)")
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_run, "_commit_batch", commit)

    def restart(_: Any) -> None:
        if next(restarts, False):
            execute(engine, TERMINATE_OTHERS)

    first = Watching(restart)
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("importance",))
    run_id = gc_engine.start_run(engine, SETTINGS, request)
    with fake_port(engine, SETTINGS, first) as llm, pytest.raises(DatabaseUnavailable):
        gc_engine.process_run(engine, run_id, SETTINGS, llm=llm)
    assert sum(first.calls.values()) == 2  # u1 and u2, paid for; nothing written
    assert execute(engine, "SELECT count(*) FROM gc_actions").scalar() == 0
    with engine.connect() as conn:  # a one-shot run is failed, its report complete
        spent = build_report(conn, run_id, actions=False)["llm"]
    assert spent["calls"] == 2


def test_a_stop_while_waiting_for_a_users_lock_gives_the_batch_up(engine) -> None:
    """A worker whose batch's user is held by another worker's batch (a sweep behind a long
    nightly plan) notices a stop while it waits: the batch stays pending, nothing written;
    once the user is free, the next worker does it."""
    ids = [add(engine, user, expires_at=days_ago(1)) for user in ("a", "b")]
    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
    run_id = gc_engine.start_run(engine, SETTINGS, request)
    stop = threading.Event()
    result: list[bool] = []
    with engine.connect() as other:  # the other worker's claiming session holds user "b"
        other.execution_options(isolation_level="AUTOCOMMIT")
        assert other.execute(sa.text(USER_FREE), {"user": "b"}).scalar()
        thread = threading.Thread(
            target=lambda: result.append(
                gc_engine.process_run(engine, run_id, SETTINGS, should_stop=stop.is_set)
            )
        )
        thread.start()
        try:
            time.sleep(1.5)  # longer than one wait slice
            assert thread.is_alive()  # waiting for "b", not failing
            stop.set()
            thread.join(5)
            assert not thread.is_alive() and result == [False]
        finally:
            other.execute(q("unlock_claim"))
            thread.join(30)
    assert execute(engine, "SELECT state FROM gc_run_batches WHERE run_id = :r",
                   r=run_id).scalars().all() == ["pending"]  # fmt: skip
    assert execute(engine, "SELECT count(*) FROM gc_actions").scalar() == 0
    assert gc_engine.process_run(engine, run_id, SETTINGS) is True
    assert [status(engine, i) for i in ids] == ["deleted", "deleted"]


def test_forget_user_waits_for_a_batch_still_asking_the_model(engine) -> None:
    """The application deletes a user's rows and asks to forget them while a batch of that
    user is still planning (asking the model) from rows it read before: forget-user waits for
    the batch (the user's lock), so what the batch writes — drifted actions with previews,
    cached decisions — is scrubbed too (it used to complete at once, and the batch's writes
    stayed)."""
    from gc_worker import erasure
    from tests.test_erasure_helpers import full_text_scan

    seed(engine)
    forgetting: list[threading.Thread] = []
    waited: list[bool] = []

    def app_forgets(_: Any) -> None:
        if forgetting:
            return
        execute(engine, "DELETE FROM memories WHERE user_id = 'u1'")
        thread = threading.Thread(
            target=erasure.forget, args=(engine, SETTINGS), kwargs={"now": NOW, "user_id": "u1"}
        )
        forgetting.append(thread)
        thread.start()
        time.sleep(1.0)
        waited.append(thread.is_alive())  # blocked on the user's lock, not done

    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("importance", "compaction"))
    run_id = gc_engine.start_run(engine, SETTINGS, request)
    with fake_port(engine, SETTINGS, Watching(app_forgets)) as llm:
        gc_engine.process_run(engine, run_id, SETTINGS, llm=llm)
    forgetting[0].join(30)
    assert waited == [True]
    done = execute(engine, "SELECT status FROM gc_erasure_requests WHERE user_id = 'u1'")
    assert done.scalars().all() == ["completed"]
    assert full_text_scan(engine, ["green tea", "fact number"]) == []
