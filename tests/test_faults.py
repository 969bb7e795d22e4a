"""Injected faults: a run aborted between batches or inside a batch's transaction, the database
connection killed or the server restarted mid-batch, the LLM down, slow, flaky or talking
garbage. After each, nothing of the interrupted batch is applied, the run says it failed, and
the next run reaches the same end state as an undisturbed run on an identical copy ("twin").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
import structlog

import jobs
from gc_worker import audit, claims, run_workers
from gc_worker import engine as gc_engine
from gc_worker import execute as executor
from gc_worker.apply_start import start_apply
from gc_worker.config import Settings
from gc_worker.errors import DatabaseUnavailable, RunFailed, UsageError, WriteConflict
from gc_worker.report import build_report
from gc_worker.run_record import load_run
from tests.fake_model import FakeModel, fake_port
from tests.seeding import (
    Reusable,
    end_state,
    full_snapshot,
    lifecycle_rows,
    reusable_database,
    row,
    seed,
    state_diff,
)
from tests.store import NOW, run
from tests.strategies import BASES

USERS = ("u1 'quoted'", "u2 ユーザー", "u3; DROP")
# one worker: each fault lands in a known batch, in order (tests/test_parallel_run.py: several)
BATCHED = Settings.model_validate(
    {"embeddings": {"dim": 8}, "run": {"batch_users": 1, "workers": 1}}
)
# scores refreshed in each batch's transaction (a run over every user otherwise refreshes them
# in one pass after its batches: tests/test_score_pass.py)
BATCH_REFRESH = BATCHED.model_copy(
    update={"run": BATCHED.run.model_copy(update={"score_pass": False})}
)


class Injected(Exception):
    """The fault a test injects."""


@pytest.fixture(scope="module")
def databases(pg_server, template_db) -> Iterator[tuple[Reusable, Reusable]]:
    with (
        reusable_database(pg_server, template_db, "faults") as first,
        reusable_database(pg_server, template_db, "twin") as second,
    ):
        yield first, second


@pytest.fixture
def engine(databases) -> sa.Engine:
    """The store a fault is injected into (emptied for each test)."""
    return databases[0].fresh()


@pytest.fixture
def twin(databases) -> sa.Engine:
    """An identical store for the undisturbed run."""
    return databases[1].fresh()


def seed_both(engine: sa.Engine, twin: sa.Engine, rows: list[dict[str, Any]]) -> set[UUID]:
    seed(engine, rows)
    seed(twin, rows)
    return {r["id"] for r in rows}


def failing_on(call_no: int, real: Callable[..., Any], fault: Callable[..., Any]) -> Callable:
    """``real``, except that its ``call_no``-th call runs ``fault`` after it."""
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        result = real(*args, **kwargs)
        if calls["n"] == call_no:
            fault(*args, **kwargs)
        return result

    return wrapper


def raise_injected(*_: Any, **__: Any) -> None:
    raise Injected("injected fault")


def rows_of(snapshot: dict[UUID, dict[str, Any]], user: str) -> dict[UUID, dict[str, Any]]:
    return {k: v for k, v in snapshot.items() if v["user_id"] == user}


def run_state(engine: sa.Engine) -> tuple[str, str | None]:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT status, error FROM gc_runs ORDER BY started_at")).one()


def batch_outcome(engine: sa.Engine) -> dict[int, tuple[str, int]]:
    """batch_no → (state, audit rows) of the (only) run."""
    query = (
        "SELECT b.batch_no, b.state, count(a.id) FROM gc_run_batches b"
        " LEFT JOIN gc_actions a ON a.run_id = b.run_id AND a.batch_no = b.batch_no"
        " GROUP BY b.batch_no, b.state ORDER BY b.batch_no"
    )
    with engine.connect() as conn:
        return {no: (state, n) for no, state, n in conn.execute(sa.text(query))}


def check_interrupted(engine: sa.Engine, before: dict, failed_batch: int) -> None:
    """The database was lost (or kept conflicting): batches before the fault are done, the
    failed one and later ones left no trace and stay pending; the run failed."""
    outcome = batch_outcome(engine)
    assert [outcome[i][0] for i in sorted(outcome)] == [
        "done" if i < failed_batch else "pending" for i in range(len(USERS))
    ]
    assert all(outcome[i][1] == 0 for i in outcome if i >= failed_batch)
    after = full_snapshot(engine)
    for user in sorted(USERS)[failed_batch:]:
        assert rows_of(after, user) == rows_of(before, user), f"{user} half-applied"
    assert run_state(engine)[0] == "failed"


def check_isolated(engine: sa.Engine, before: dict, failed_batch: int) -> None:
    """The failed batch left no trace (rolled back whole, no audit row) and is marked failed;
    every other batch, before and after it, was applied; the run ends failed, naming it."""
    outcome = batch_outcome(engine)
    assert [outcome[i][0] for i in sorted(outcome)] == [
        "failed" if i == failed_batch else "done" for i in range(len(USERS))
    ]
    assert outcome[failed_batch][1] == 0
    after = full_snapshot(engine)
    user = sorted(USERS)[failed_batch]
    assert rows_of(after, user) == rows_of(before, user), f"{user} half-applied"
    for other in sorted(USERS)[failed_batch + 1 :]:
        assert rows_of(after, other) != rows_of(before, other), f"{other} was not done"
    status, error = run_state(engine)
    assert status == "failed" and f"batch {failed_batch} (1 users): Injected" in error
    with engine.connect() as conn:
        run_id = conn.execute(sa.text("SELECT id FROM gc_runs")).scalar()
        report = build_report(conn, run_id, actions=False)
    assert report["status"] == "failed" and report["error"] == error
    assert report["failed_batches"] == [
        {"batch_no": failed_batch, "users": [user], "error": "Injected: injected fault"}
    ]


def converge(engine: sa.Engine, twin: sa.Engine, ids: set[UUID], settings: Settings) -> None:
    """The next run on the disturbed store ends where one undisturbed run ends."""
    assert run(engine, settings)["status"] == "completed"
    run(twin, settings)
    assert end_state(engine, ids) == end_state(twin, ids)


class TestAbortBetweenBatches:
    def test_failure_planning_the_second_batch(self, engine, twin, monkeypatch):
        """Batch 2 fails while planning: its users are untouched, batches 1 and 3 commit (one
        bad user used to stop every user after it, every night), the run ends failed."""
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        plan = jobs.REGISTRY["hard_delete"].plan
        monkeypatch.setattr(
            jobs.REGISTRY["hard_delete"], "plan", failing_on(2, plan, raise_injected)
        )
        with pytest.raises(RunFailed, match="Injected: injected fault"):
            run(engine, BATCHED)
        check_isolated(engine, before, failed_batch=1)
        assert "Injected: injected fault" in run_state(engine)[1]
        monkeypatch.undo()
        converge(engine, twin, ids, BATCHED)

    def test_log_context_does_not_leak_from_a_failed_batch(self, engine, monkeypatch):
        """After a failed run no batch, user or job stays bound in the log context."""
        seed(engine, lifecycle_rows("u1"))
        monkeypatch.setattr(jobs.REGISTRY["ttl_expiry"], "plan", raise_injected)
        with pytest.raises(RunFailed, match="Injected: injected fault"):
            run(engine, BATCHED)
        assert structlog.contextvars.get_contextvars() == {}

    def test_the_callers_log_context_is_kept(self, engine):
        """A caller's own bindings (a sweep binds its user_id) survive the run's batches, which
        bind and unbind the same keys."""
        seed(engine, lifecycle_rows("u1"))
        structlog.contextvars.bind_contextvars(user_id="u1", sweep_id=7)
        try:
            run(engine, BATCHED)
            assert structlog.contextvars.get_contextvars() == {"user_id": "u1", "sweep_id": 7}
        finally:
            structlog.contextvars.clear_contextvars()


INSIDE_BATCH = {
    # after every memory update of the batch, before its audit rows
    "audit": (audit, "record_outcome"),
    # after the status updates, before the purge
    "purge": (executor, "_purge"),
    # after the actions and the audit, while the decay scores are refreshed
    "refresh": (jobs.REGISTRY["decay"], "refresh"),
}


class TestWorkerDiesInsideABatch:
    @staticmethod
    def die_inside(engine: sa.Engine, run_id: UUID) -> int:
        """A worker claims the first pending batch and dies (its session ends, nothing of the
        claim is released by it): what an OOM kill or a segfault in the middle of a batch
        leaves. Returns the batch number."""
        conn = engine.connect()
        conn.execution_options(isolation_level="AUTOCOMMIT")
        claim = claims._claim(conn, run_id)
        assert claim is not None
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        conn.invalidate()  # the server ends the session: its advisory locks go with it
        conn.close()
        gone = "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = :pid)"
        with engine.connect() as probe:  # the backend exits asynchronously: wait for it
            for _ in range(500):
                if probe.execute(sa.text(gone), {"pid": pid}).scalar():
                    break
                time.sleep(0.01)
        return claim.batch.batch_no

    def test_a_batch_that_kills_its_worker_is_failed_after_three_deaths(self, engine, twin):
        """The third worker to die inside batch 1 is the last: the next one fails the batch
        and does the others, instead of dying there too (every restart of every replica used
        to resume the run into the same crash)."""
        seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        from gc_worker.engine import RunRequest, resolve_jobs, start_run

        request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], BATCHED))
        run_id = start_run(engine, BATCHED, request)
        gc_engine.process_run(engine, run_id, BATCHED, should_stop=iter([False, True]).__next__)
        for _ in range(claims.MAX_LOST_CLAIMS):
            assert self.die_inside(engine, run_id) == 1
        with pytest.raises(RunFailed, match=r"batch 1 \(1 users\): the worker stopped inside"):
            gc_engine.process_run(engine, run_id, BATCHED)
        assert [state for state, _ in batch_outcome(engine).values()] == ["done", "failed", "done"]
        after = full_snapshot(engine)
        user = sorted(USERS)[1]
        assert rows_of(after, user) == rows_of(before, user)

    def test_two_deaths_are_not_yet_enough(self, engine):
        """Just inside the limit: after MAX_LOST_CLAIMS - 1 deaths the next worker still tries
        the batch (and here, where nothing kills it, does it)."""
        seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
        from gc_worker.engine import RunRequest, resolve_jobs, start_run

        request = RunRequest(mode="apply", now=NOW, jobs=resolve_jobs([], BATCHED))
        run_id = start_run(engine, BATCHED, request)
        for _ in range(claims.MAX_LOST_CLAIMS - 1):
            assert self.die_inside(engine, run_id) == 0
        assert gc_engine.process_run(engine, run_id, BATCHED) is True
        assert {state for state, _ in batch_outcome(engine).values()} == {"done"}

    def test_a_worker_that_lives_releases_its_claim(self, engine):
        """Claims that end normally (the batch committed, failed or was given up) are not
        counted as deaths: a batch retried after deadlocks is never failed for it."""
        seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
        run(engine, BATCHED)
        with engine.connect() as conn:
            lost = conn.execute(sa.text("SELECT sum(lost_claims) FROM gc_run_batches")).scalar()
        assert lost == 0

    def test_participants_stop_once_the_run_failed(self, engine):
        """Another replica's participant does not go on applying batches of a run marked
        failed (it used to, and the run then read `failed` with every batch done)."""
        seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
        from gc_worker.engine import RunRequest, resolve_jobs, start_run

        run_id = start_run(engine, BATCHED, RunRequest(mode="apply", now=NOW,
                                                     jobs=resolve_jobs([], BATCHED)))  # fmt: skip
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE gc_runs SET status = 'failed' WHERE id = :r"),
                         {"r": run_id})  # fmt: skip
        assert gc_engine.process_run(engine, run_id, BATCHED) is False
        assert {state for state, _ in batch_outcome(engine).values()} == {"pending"}


class TestAbortInsideBatch:
    @pytest.mark.parametrize("point", sorted(INSIDE_BATCH))
    def test_nothing_of_the_batch_is_applied(self, engine, twin, monkeypatch, point):
        """A fault inside the second batch's transaction rolls all of that batch back."""
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        owner, name = INSIDE_BATCH[point]
        monkeypatch.setattr(owner, name, failing_on(2, getattr(owner, name), raise_injected))
        settings = BATCH_REFRESH if point == "refresh" else BATCHED
        with pytest.raises(RunFailed, match="Injected: injected fault"):
            run(engine, settings)
        check_isolated(engine, before, failed_batch=1)
        monkeypatch.undo()
        converge(engine, twin, ids, settings)

    def test_failed_apply_of_a_plan(self, engine, twin, monkeypatch):
        """An apply that fails in batch 2 keeps batch 1; a fresh plan and apply then converge."""
        from gc_worker import engine as gc_engine

        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        plan = UUID(run(engine, BATCHED, dry_run=True)["run_id"])
        monkeypatch.setattr(
            audit, "record_outcome", failing_on(2, audit.record_outcome, raise_injected)
        )
        with pytest.raises(RunFailed, match="Injected"):
            gc_engine.apply_plan(engine, plan)
        monkeypatch.undo()
        fresh = UUID(run(engine, BATCHED, dry_run=True)["run_id"])
        gc_engine.apply_plan(engine, fresh)
        run(twin, BATCHED)
        assert end_state(engine, ids) == end_state(twin, ids)


class TestApplyTakenUpAgain:
    """`memory-gc apply RUN_ID` of a plan whose apply stopped part-way takes that apply up
    again: the batches it committed stay, the rest are applied, the end state is an
    undisturbed run's."""

    def plan(self, engine: sa.Engine, twin: sa.Engine) -> tuple[set[UUID], UUID]:
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        run(twin, BATCHED)
        return ids, UUID(run(engine, BATCHED, dry_run=True)["run_id"])

    def test_after_a_failed_batch(self, engine, twin, monkeypatch):
        ids, plan = self.plan(engine, twin)
        monkeypatch.setattr(
            audit, "record_outcome", failing_on(2, audit.record_outcome, raise_injected)
        )
        with pytest.raises(RunFailed, match="Injected"):
            gc_engine.apply_plan(engine, plan)
        monkeypatch.undo()
        assert [state for state, _ in batch_outcome_of(engine, plan).values()] == [
            "done", "failed", "done"
        ]  # fmt: skip
        # nothing is pending: applying the plan again is refused (a failed batch is not retried
        # behind the operator's back, by hand or by a daemon); a new plan takes its users
        with pytest.raises(UsageError, match=r"ended failed.*make a new plan"):
            gc_engine.apply_plan(engine, plan)
        fresh = gc_engine.apply_plan(engine, UUID(run(engine, BATCHED, dry_run=True)["run_id"]))
        assert run_status(engine, fresh) == "completed"
        assert end_state(engine, ids) == end_state(twin, ids)

    def test_after_the_process_was_killed(self, engine, twin):
        """A process that stopped after one batch (killed: it holds no lock any more)."""
        ids, plan = self.plan(engine, twin)
        apply_id = start_apply(engine, plan)
        stops = iter([False, True])
        gc_engine.process_run(engine, apply_id, BATCHED, should_stop=lambda: next(stops))
        assert run_status(engine, apply_id) == "running"
        assert gc_engine.apply_plan(engine, plan) == apply_id
        assert run_status(engine, apply_id) == "completed"
        assert end_state(engine, ids) == end_state(twin, ids)

    def test_refused_while_someone_applies_it_or_once_it_is_done(self, engine, twin):
        _, plan = self.plan(engine, twin)
        apply_id = start_apply(engine, plan)
        with (
            claims.participating(engine, apply_id),
            pytest.raises(UsageError, match="right now"),
        ):
            start_apply(engine, plan)
        gc_engine.process_run(engine, apply_id, BATCHED)
        with pytest.raises(UsageError, match="already applied"):
            start_apply(engine, plan)


def batch_outcome_of(engine: sa.Engine, plan: UUID) -> dict[int, tuple[str, int]]:
    apply_id = applied_by(engine, plan)
    query = "SELECT batch_no, state FROM gc_run_batches WHERE run_id = :r ORDER BY batch_no"
    with engine.connect() as conn:
        return {no: (state, 0) for no, state in conn.execute(sa.text(query), {"r": apply_id})}


def applied_by(engine: sa.Engine, plan: UUID) -> UUID:
    with engine.connect() as conn:
        return load_run(conn, plan)["applied_by"]


def run_status(engine: sa.Engine, run_id: UUID) -> str:
    with engine.connect() as conn:
        return load_run(conn, run_id)["status"]


def terminate_backend(conn: Any, *_: Any, **__: Any) -> None:
    """Kill the batch's own server process from another connection (a crashed backend)."""
    pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    killer = sa.create_engine(conn.engine.url, poolclass=sa.pool.NullPool)
    with killer.connect() as other:
        other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    killer.dispose()


class TestDatabaseLost:
    def test_backend_killed_mid_batch(self, engine, twin, monkeypatch):
        """The batch's connection dies after its updates: DatabaseUnavailable, nothing kept."""
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        monkeypatch.setattr(
            executor, "_set_status", failing_on(2, executor._set_status, terminate_backend)
        )
        with pytest.raises(DatabaseUnavailable, match="connection failed mid-transaction"):
            run(engine, BATCHED)
        check_interrupted(engine, before, failed_batch=1)
        monkeypatch.undo()
        converge(engine, twin, ids, BATCHED)

    def test_backend_killed_as_the_audit_is_written(self, engine, twin, monkeypatch):
        """The batch's connection dies as its audit rows are copied (the COPY is the driver's
        own, under SQLAlchemy): a lost database, not a failed batch."""
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        real, copies = audit.record, []

        def killing(conn, run_id, batch_no, actions, **kwargs):
            if actions:
                copies.append(batch_no)
                if len(copies) == 2:  # the second batch's
                    terminate_backend(conn)
            return real(conn, run_id, batch_no, actions, **kwargs)

        monkeypatch.setattr(audit, "record", killing)
        with pytest.raises(DatabaseUnavailable, match="connection failed mid-transaction"):
            run(engine, BATCHED)
        check_interrupted(engine, before, failed_batch=1)
        monkeypatch.undo()
        converge(engine, twin, ids, BATCHED)

    def test_lock_timeout_as_the_audit_is_written_is_retried(self, engine, twin, monkeypatch):
        """The audit's COPY waits for the run's row (its foreign key) while another session
        holds it, past the batch's lock_timeout: a conflict, retried — the COPY's error is the
        driver's own, and the batch used to be marked failed for it."""
        from gc_worker import batch_run

        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        monkeypatch.setattr(batch_run, "BATCH_LOCK_TIMEOUT_MS", 300)
        real, held, locked, release = audit.record, [], threading.Event(), threading.Event()

        def hold_run_row(run_id: UUID) -> None:
            with engine.begin() as other:
                other.execute(sa.text("SELECT 1 FROM gc_runs WHERE id = :r FOR UPDATE"),
                              {"r": run_id})  # fmt: skip
                locked.set()
                release.wait(30)

        def contended(conn, run_id, batch_no, actions, **kwargs):
            if actions and not held:  # the first batch's first try: its COPY times out
                held.append(threading.Thread(target=hold_run_row, args=(run_id,)))
                held[0].start()
                locked.wait(10)
            elif actions and not release.is_set():  # tried again: the other session is done
                release.set()
                held[0].join(10)
            return real(conn, run_id, batch_no, actions, **kwargs)

        monkeypatch.setattr(audit, "record", contended)
        report = run(engine, BATCHED)
        assert report["status"] == "completed", report.get("failed_batches")
        monkeypatch.undo()
        run(twin, BATCHED)  # undisturbed
        assert end_state(engine, ids) == end_state(twin, ids)

    @pytest.mark.slow
    def test_server_restarted_mid_run(self, engine, twin, monkeypatch, pg_server):
        """The server stops inside batch 2 and comes back after the run gave up: the run
        ends with DatabaseUnavailable, and the next run converges."""
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        monkeypatch.setattr(
            executor,
            "_set_status",
            failing_on(2, executor._set_status, lambda *_, **__: pg_server.stop()),
        )
        try:
            with pytest.raises(DatabaseUnavailable):
                run(engine, BATCHED)
        finally:
            pg_server.ensure_postgres_running()
        monkeypatch.undo()
        outcome = batch_outcome(engine)
        assert outcome[0][0] == "done" and outcome[1] == ("pending", 0)
        after = full_snapshot(engine)
        for user in sorted(USERS)[1:]:
            assert rows_of(after, user) == rows_of(before, user)
        # the run could not even be marked failed while the server was down
        assert run_state(engine)[0] in ("running", "failed")
        converge(engine, twin, ids, BATCHED)


def llm_rows(user_id: str) -> list[dict[str, Any]]:
    """Work only the LLM can do (scores, near duplicates, a similar pair), plus rules that do
    not depend on it (a TTL, a purge), so runs with and without answers are comparable."""
    near = [*BASES[1][:-1], 0.1]
    never = {"importance_assessed_at": None}
    return [
        row(user_id, "Prefers morning meetings.", embedding=list(BASES[1]), **never),
        row(user_id, "Likes meetings in the morning.", embedding=near, **never),
        row(user_id, "Is vegetarian.", embedding=list(BASES[2]), **never),
        row(user_id, "Eats meat on Sundays.", embedding=[*BASES[2][:-1], 0.2], **never),
        row(user_id, "expired", expires_at=row(user_id, "x")["created_at"]),
        row(
            user_id,
            "old deleted",
            status="deleted",
            status_reason="unused",
            deleted_at=row(user_id, "x")["created_at"].replace(year=2025),
        ),
    ]


LLM_SETTINGS = Settings.model_validate(
    {
        "embeddings": {"dim": 8},
        "run": {"batch_users": 1, "workers": 1},  # a fake model's "every other request" is global
        "llm": {"max_retries": 1},
        "compaction": {"similarity": 0.9},
        "contradiction": {"similarity": 0.9},
    }
)


def run_model(engine: sa.Engine, behaviour: str) -> tuple[dict[str, Any], FakeModel]:
    model = FakeModel(behaviour)
    with fake_port(engine, LLM_SETTINGS, model) as llm:
        return run(engine, LLM_SETTINGS, llm=llm), model


class TestLLMFaults:
    @pytest.mark.parametrize("behaviour", ["down", "timeout", "garbage"])
    def test_bad_model_changes_what_no_model_changes(self, engine, twin, behaviour):
        """With the model failing, slow or talking garbage the run completes, counts errors,
        and leaves exactly the state an offline run leaves."""
        ids = seed_both(engine, twin, [r for u in USERS[:2] for r in llm_rows(u)])
        report, model = run_model(engine, behaviour)
        assert report["status"] == "completed" and sum(model.calls.values()) > 0
        assert sum(job.get("errors", 0) for job in report["jobs"].values()) > 0
        assert not {"set_importance", "create_merged", "obsolete"} & set(
            report["totals"]["by_action"]
        )
        run(twin, LLM_SETTINGS)
        assert end_state(engine, ids) == end_state(twin, ids)

    @pytest.mark.parametrize("behaviour", ["down", "timeout", "garbage"])
    def test_next_run_converges_once_the_model_answers(self, engine, twin, behaviour):
        """After a run with a bad model, a run with a good one ends where a good run ends."""
        ids = seed_both(engine, twin, [r for u in USERS[:2] for r in llm_rows(u)])
        run_model(engine, behaviour)
        report, _ = run_model(engine, "good")
        assert {"set_importance", "create_merged"} <= set(report["totals"]["by_action"])
        run_model(twin, "good")
        diff = state_diff(end_state(engine, ids), end_state(twin, ids))
        assert not diff, "\n".join(diff)

    def test_a_flaky_model_is_retried_to_the_same_end(self, engine, twin):
        """A 503 on every other request costs retries, not decisions: the end state is the one
        a healthy model gives."""
        ids = seed_both(engine, twin, [r for u in USERS[:2] for r in llm_rows(u)])
        report, _ = run_model(engine, "flaky")
        assert report["llm"]["retries"] > 0
        assert sum(job.get("errors", 0) for job in report["jobs"].values()) == 0
        run_model(twin, "good")
        diff = state_diff(end_state(engine, ids), end_state(twin, ids))
        assert not diff, "\n".join(diff)

    def test_retries_are_bounded(self, engine):
        """A dead model is asked at most 1 + max_retries times per question, then deferred."""
        seed(engine, llm_rows("u1"))
        report, model = run_model(engine, "down")
        assert report["llm"]["calls"] <= sum(model.calls.values())
        deferred = [a for a in report["actions"] if a["action"] == "deferred"]
        asked = [a for a in deferred if a["reason"] != "near_miss"]  # never asked: facts differ
        assert asked and {a["reason"] for a in asked} == {"llm_unavailable"}
        assert all(n <= 2 * len(asked) for n in model.calls.values())


def server_deadlock(conn: Any, *_: Any, **__: Any) -> None:
    """The server reports a deadlock in the batch's transaction (SQLSTATE 40P01)."""
    conn.execute(
        sa.text(
            "DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = 'deadlock_detected'; END $$"
        )
    )


class TestWriteConflicts:
    def test_a_batch_rolled_back_by_a_deadlock_is_run_again(self, engine, twin, monkeypatch):
        """Batch 2 is killed by a deadlock once: it rolls back whole, is planned and applied
        again, and the run ends where an undisturbed run ends."""
        ids = seed_both(engine, twin, [r for u in USERS for r in lifecycle_rows(u)])
        monkeypatch.setattr(
            executor, "_set_status", failing_on(2, executor._set_status, server_deadlock)
        )
        report = run(engine, BATCHED)
        assert report["status"] == "completed"
        assert batch_outcome(engine) == {
            no: ("done", n) for no, (_, n) in batch_outcome(engine).items()
        }
        run(twin, BATCHED)
        assert end_state(engine, ids) == end_state(twin, ids)

    def test_a_batch_that_keeps_deadlocking_fails_the_run_cleanly(self, engine, monkeypatch):
        """Three conflicts in a row: WriteConflict (exit 1, 'safe to retry'), nothing of the
        batch kept."""
        seed(engine, [r for u in USERS for r in lifecycle_rows(u)])
        before = full_snapshot(engine)
        real = executor._set_status
        calls = {"n": 0}

        def always_from_the_second(conn: Any, *args: Any, **kwargs: Any) -> None:
            calls["n"] += 1
            real(conn, *args, **kwargs)
            if calls["n"] >= 2:
                server_deadlock(conn)

        monkeypatch.setattr(executor, "_set_status", always_from_the_second)
        with pytest.raises(WriteConflict, match=r"40P01.*safe to retry"):
            run(engine, BATCHED)
        assert calls["n"] == 1 + run_workers.BATCH_ATTEMPTS
        check_interrupted(engine, before, failed_batch=1)

    def test_restore_is_retried_after_a_deadlock(self, engine, twin, monkeypatch):
        """An undo that deadlocks with the application once is rolled back and run again; it
        ends where an undisturbed undo ends."""
        from gc_worker import restore

        ids = seed_both(engine, twin, lifecycle_rows("u1"))
        applied, untouched = run(engine, BATCHED), run(twin, BATCHED)
        monkeypatch.setattr(
            restore, "_restore_status", failing_on(1, restore._restore_status, server_deadlock)
        )
        result = restore.restore_run(engine, UUID(applied["run_id"]), now=NOW)
        monkeypatch.undo()
        expected = restore.restore_run(twin, UUID(untouched["run_id"]), now=NOW)
        assert len(result.restored) == len(expected.restored) > 0
        assert end_state(engine, ids) == end_state(twin, ids)
