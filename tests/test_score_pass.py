"""The score pass (gc_worker.score_pass): a run over every user refreshes decay scores in one
pass over the table after its batches, with the same result as refreshing batch by batch; which
runs have one; rows the application holds, failed batches, a stop, an error, an interrupt."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from gc_worker import batch_run, run_workers, score_pass
from gc_worker import engine as gc_engine
from gc_worker.config import Settings
from gc_worker.errors import RunFailed, StatementFailed
from gc_worker.queries import q
from gc_worker.render import render_markdown
from gc_worker.render_html import render_html
from gc_worker.report import build_report
from jobs import decay
from tests.conftest import check_round_trip
from tests.interrupts import ctrl_c
from tests.seeding import (
    INSERT,
    end_state,
    lifecycle_rows,
    row,
    scratch_database,
    seed,
    state_diff,
)
from tests.store import NOW, execute, run
from tests.test_faults import terminate_backend

USERS = [f"user-{i}" for i in range(7)]
SETTINGS = Settings.model_validate(
    {"embeddings": {"dim": 8}, "run": {"batch_users": 2, "workers": 2}}
)
PER_BATCH = SETTINGS.model_copy(
    update={"run": SETTINGS.run.model_copy(update={"score_pass": False})}
)
ONE = SETTINGS.model_copy(update={"run": SETTINGS.run.model_copy(update={"workers": 1})})


def with_run(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update={"run": settings.run.model_copy(update=changes)})


def store(users: list[str] = USERS, *, padding: int = 0) -> list[dict[str, Any]]:
    """Every deterministic rule's work for each user, scores never computed (NULL); ``padding``
    rows of 1.5 kB per user (under the size PostgreSQL compresses) spread the table over pages."""
    rows = [r for u in users for r in lifecycle_rows(u)]
    rows += [row(u, f"pad {i} " + "x" * 1500) for u in users for i in range(padding)]
    return rows


def scores(engine: sa.Engine) -> dict[Any, tuple[str, float | None]]:
    found = execute(engine, "SELECT id, status, decayed_confidence FROM memories ORDER BY id")
    return {r.id: (r.status, r.decayed_confidence) for r in found}


def unrefreshed(engine: sa.Engine) -> set[str]:
    """Users with an active unpinned row whose score was never computed."""
    found = execute(
        engine,
        "SELECT DISTINCT user_id FROM memories"
        " WHERE status = 'active' AND NOT pinned AND decayed_confidence IS NULL",
    )
    return set(found.scalars())


def run_row(engine: sa.Engine, report: dict[str, Any]) -> Any:
    return execute(
        engine, "SELECT score_pass, scores_refreshed, status FROM gc_runs WHERE id = :r",
        r=report["run_id"],
    ).one()  # fmt: skip


def batch_refreshes(engine: sa.Engine, report: dict[str, Any]) -> int:
    return execute(
        engine,
        "SELECT coalesce(sum((stats -> 'decay' ->> 'refreshed')::int), 0) FROM gc_run_batches"
        " WHERE run_id = :r",
        r=report["run_id"],
    ).scalar_one()


@pytest.fixture
def twin(pg_server, template_db) -> Iterator[sa.Engine]:
    with scratch_database(pg_server, template_db, "score_twin") as engine:
        yield engine


class TestSameAsBatchByBatch:
    def test_the_same_scores_and_counts_as_refreshing_in_each_batch(self, engine, twin):
        seed(engine, store())
        seed(twin, store())
        original = {r["id"] for r in store()}
        passed, batched = run(engine, SETTINGS), run(twin, PER_BATCH)
        left, right = end_state(engine, original), end_state(twin, original)
        assert left == right, state_diff(left, right)
        # the retired rows too: neither refreshes a row its batch retired
        assert {i: s for i, s in scores(engine).items() if i in original} == {
            i: s for i, s in scores(twin).items() if i in original
        }
        refreshed = passed["jobs"]["decay"]["refreshed"]
        assert refreshed == batched["jobs"]["decay"]["refreshed"] > 0
        assert run_row(engine, passed) == ("done", refreshed, "completed")
        assert batch_refreshes(engine, passed) == 0  # the batches left it to the pass
        assert run_row(twin, batched) == (None, None, "completed")
        assert batch_refreshes(twin, batched) == refreshed
        assert unrefreshed(engine) == set()
        # retired rows keep the score they had (NULL): only what is still active is refreshed
        assert any(s == "deleted" and c is None for s, c in scores(engine).values())

    def test_ranges_of_one_page_cover_every_row_once(self, engine, twin, monkeypatch):
        """Range edges ([lo, hi) by tuple id): no row falls between two ranges."""
        seed(engine, store(padding=6))
        seed(twin, store(padding=6))
        monkeypatch.setattr(score_pass, "PAGES", 1)
        passed, batched = run(engine, SETTINGS), run(twin, PER_BATCH)
        pages = execute(engine, "SELECT pg_relation_size('memories') / 8192").scalar_one()
        assert pages > 3
        assert run_row(engine, passed).scores_refreshed == batch_refreshes(twin, batched) > 0
        assert unrefreshed(engine) == set()

    def test_a_second_run_refreshes_nothing(self, engine):
        seed(engine, store())
        run(engine, SETTINGS)
        again = run(engine, SETTINGS)  # jobs the run-start scan cannot answer: every user's batch
        assert again["jobs"]["decay"]["refreshed"] == 0
        assert run_row(engine, again) == ("done", 0, "completed")

    def test_a_run_the_scan_finds_nothing_for_makes_no_pass(self, engine):
        seed(engine, store())
        scanned = ["ttl_expiry", "decay", "usage_prune", "user_cap", "hard_delete"]
        run(engine, SETTINGS, jobs=scanned)
        again = run(engine, SETTINGS, jobs=scanned)
        assert again["jobs"]["decay"]["refreshed"] == 0
        assert run_row(engine, again) == (None, None, "completed")  # no batch, no pass


class TestWhichRunsHaveAPass:
    @pytest.mark.parametrize(
        ("case", "settings", "kwargs"),
        [
            ("one batch", with_run(SETTINGS, batch_users=100), {}),
            ("named users", SETTINGS, {"users": USERS}),
            ("dry run", SETTINGS, {"dry_run": True}),
            ("no decay", SETTINGS, {"jobs": ["ttl_expiry", "usage_prune"]}),
            ("turned off", PER_BATCH, {}),
        ],
    )
    def test_refreshed_in_the_batches(self, engine, case, settings, kwargs):
        seed(engine, store())
        report = run(engine, settings, **kwargs)
        assert run_row(engine, report).score_pass is None, case
        if case != "no decay":
            assert report["jobs"]["decay"]["refreshed"] == batch_refreshes(engine, report) > 0
        if case in ("one batch", "named users", "turned off"):
            assert unrefreshed(engine) == set()

    @pytest.mark.parametrize(("batch_users", "passes"), [(4, True), (7, False)])
    def test_two_batches_have_a_pass_one_has_none(self, engine, batch_users, passes):
        """The rule's boundary: 7 users in batches of 4 are two batches; of 7, one."""
        seed(engine, store())
        report = run(engine, with_run(SETTINGS, batch_users=batch_users))
        batches = execute(engine, "SELECT count(*) FROM gc_run_batches").scalar_one()
        assert batches == (2 if passes else 1)
        assert run_row(engine, report).score_pass == ("done" if passes else None)
        assert unrefreshed(engine) == set()

    def test_the_apply_of_a_plan_over_every_user_has_one(self, engine):
        seed(engine, store())
        original = {r["id"] for r in store()}
        plan = run(engine, SETTINGS, dry_run=True)
        would = plan["jobs"]["decay"]["refreshed"]
        assert would > 0 and unrefreshed(engine) == set(USERS)  # a dry run writes nothing
        applied_id = gc_engine.apply_plan(engine, plan["run_id"])
        with engine.connect() as conn:
            applied = build_report(conn, applied_id)
        # and the records the apply created (a dry run cannot count those), as a batch would
        created = execute(
            engine, "SELECT count(*) FROM memories WHERE status = 'active' AND NOT (id = ANY(:o))",
            o=list(original),
        ).scalar_one()  # fmt: skip
        assert created > 0
        assert run_row(engine, applied) == ("done", would + created, "completed")
        assert applied["jobs"]["decay"]["refreshed"] == would + created
        assert unrefreshed(engine) == set()


class TestWhatThePassLeaves:
    def test_a_row_the_application_holds_is_skipped_not_waited_for(self, engine):
        seed(engine, store())
        held = execute(
            engine, "SELECT id FROM memories WHERE user_id = 'user-3' AND content = 'fresh'"
        ).scalar_one()
        with engine.connect() as app:
            app.execute(sa.text("SELECT 1 FROM memories WHERE id = :i FOR UPDATE"), {"i": held})
            report = run(engine, SETTINGS)  # would hang here if the pass waited
            app.rollback()
        assert run_row(engine, report).scores_refreshed > 0
        assert unrefreshed(engine) == {"user-3"}
        assert execute(engine, "SELECT decayed_confidence FROM memories WHERE id = :i",
                       i=held).scalar_one() is None  # fmt: skip
        run(engine, SETTINGS)  # the next run refreshes it
        assert unrefreshed(engine) == set()

    def test_the_users_of_a_failed_batch_are_left_as_they_were(self, engine, monkeypatch):
        seed(engine, store())
        ttl = gc_engine.jobs.REGISTRY["ttl_expiry"]
        plan = ttl.plan

        def failing(ctx: Any) -> Any:
            if "user-3" in ctx.users:
                raise ValueError("a row this job cannot handle")
            return plan(ctx)

        monkeypatch.setattr(ttl, "plan", failing)
        with pytest.raises(RunFailed, match="a row this job cannot handle"):
            run(engine, SETTINGS)
        failed = set(execute(engine, "SELECT unnest(users) FROM gc_run_batches"
                                     " WHERE state = 'failed'").scalars())  # fmt: skip
        assert "user-3" in failed
        assert unrefreshed(engine) == failed  # everyone else's scores were refreshed
        (status,) = execute(engine, "SELECT status FROM gc_runs").one()
        assert status == "failed"

    def test_a_stop_ends_the_pass_after_its_range_and_the_next_run_finishes(
        self, engine, monkeypatch
    ):
        seed(engine, store(padding=6))
        monkeypatch.setattr(score_pass, "PAGES", 1)
        stop = threading.Event()
        refresh_range = score_pass._refresh_range

        def then_stop(*args: Any) -> int:
            done = refresh_range(*args)
            if done:
                stop.set()
            return done

        monkeypatch.setattr(score_pass, "_refresh_range", then_stop)
        run_id = gc_engine.start_run(engine, SETTINGS, request())
        assert gc_engine.process_run(engine, run_id, SETTINGS, should_stop=stop.is_set) is True
        with engine.connect() as conn:
            report = build_report(conn, run_id)
        first = run_row(engine, report)
        assert (first.status, first.score_pass) == ("completed", "stopped")
        assert report["score_pass"] == {"state": "stopped", "refreshed": first.scores_refreshed}
        shown = f"stopped, {first.scores_refreshed:,} scores refreshed (stopped early"
        assert shown in render_markdown(report) and shown in render_html(report)
        assert first.scores_refreshed > 0
        left = unrefreshed(engine)
        assert left, "the pass was stopped: some scores are left to the next run"
        monkeypatch.undo()
        again = run(engine, SETTINGS)
        assert unrefreshed(engine) == set()
        assert again["jobs"]["decay"]["refreshed"] > 0

    def test_an_error_in_the_pass_does_not_fail_the_run(self, engine, monkeypatch):
        seed(engine, store(padding=6))
        monkeypatch.setattr(score_pass, "PAGES", 1)
        refresh_range = score_pass._refresh_range
        calls = []

        def second_fails(*args: Any) -> int:
            calls.append(args[1])
            if len(calls) == 2:
                raise StatementFailed("the server refused a statement")
            return refresh_range(*args)

        monkeypatch.setattr(score_pass, "_refresh_range", second_fails)
        report = run(engine, with_run(SETTINGS, workers=1))
        row_ = run_row(engine, report)
        assert (row_.status, row_.score_pass) == ("completed", "stopped")
        assert len(calls) == 2  # it stopped at the error
        assert unrefreshed(engine), "the ranges after the error are left to the next run"
        monkeypatch.undo()
        run(engine, SETTINGS)
        assert unrefreshed(engine) == set()

    def test_an_interrupt_stops_the_helpers_and_goes_on(self, engine, monkeypatch):
        seed(engine, store(padding=6))
        monkeypatch.setattr(score_pass, "PAGES", 1)
        refresh_range = score_pass._refresh_range
        main = threading.main_thread()

        def interrupted(*args: Any) -> int:
            if threading.current_thread() is main:
                raise KeyboardInterrupt
            return refresh_range(*args)

        monkeypatch.setattr(score_pass, "_refresh_range", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run(engine, SETTINGS)
        alive = [t.name for t in threading.enumerate() if t.name.startswith("memory-gc-scores")]
        assert alive == []
        row_ = execute(engine, "SELECT status, score_pass FROM gc_runs").one()
        assert tuple(row_) == ("completed", "stopped")  # not left `due` for good


class TestTheRunAroundThePass:
    def test_a_lost_database_as_the_pass_starts_does_not_fail_the_completed_run(
        self, engine, monkeypatch
    ):
        seed(engine, store())
        real, calls = score_pass.transaction, []

        @contextlib.contextmanager
        def dying(eng: Any) -> Iterator[Any]:
            calls.append(1)
            with real(eng) as conn:
                if len(calls) == 1:  # the pass's first transaction: its backend dies
                    terminate_backend(conn)
                yield conn

        monkeypatch.setattr(score_pass, "transaction", dying)
        run_id = gc_engine.start_run(engine, ONE, request())
        assert gc_engine.process_run(engine, run_id, ONE) is True  # no error escapes
        row_ = execute(engine, "SELECT status, score_pass FROM gc_runs").one()
        assert tuple(row_) == ("completed", "due")  # the pass never began: the next run's
        monkeypatch.undo()
        run(engine, SETTINGS)
        assert unrefreshed(engine) == set()

    def test_an_interrupt_while_a_helper_completes_the_run_starts_no_pass(
        self, engine, monkeypatch
    ):
        seed(engine, store(users=USERS[:4], padding=6))
        monkeypatch.setattr(score_pass, "PAGES", 1)
        main, real_commit, started = threading.main_thread(), batch_run._commit_batch, []
        real_range, real_wait = score_pass._refresh_range, run_workers._HelperThreads.wait
        helper_claimed, caller_waits, caller_interrupted = (threading.Event() for _ in range(3))

        def helper_interrupts(eng: Any, run_: Any, batch_no: int, *args: Any) -> Any:
            if threading.current_thread() is main:
                # a loaded machine may start the helper late: the caller would take both batches
                assert helper_claimed.wait(30)
            else:
                helper_claimed.set()
                # the caller's batch is done and it waits for this helper: Ctrl-C then, and this
                # batch completes the run only once the caller has taken the interrupt
                assert caller_waits.wait(30)
                assert interrupt.send()
                assert caller_interrupted.wait(30)
            return real_commit(eng, run_, batch_no, *args)

        def wait(threads: Any) -> None:  # the caller's: the first, then again after Ctrl-C
            (caller_interrupted if caller_waits.is_set() else caller_waits).set()
            real_wait(threads)

        monkeypatch.setattr(run_workers._HelperThreads, "wait", wait)
        monkeypatch.setattr(batch_run, "_commit_batch", helper_interrupts)
        monkeypatch.setattr(
            score_pass, "_refresh_range", lambda *a: started.append(a[1]) or real_range(*a)
        )
        run_id = gc_engine.start_run(engine, SETTINGS, request())
        with ctrl_c() as interrupt, contextlib.suppress(KeyboardInterrupt):
            gc_engine.process_run(engine, run_id, SETTINGS)
        assert caller_interrupted.is_set()  # Ctrl-C landed while the caller waited
        row_ = execute(engine, "SELECT status, score_pass FROM gc_runs").one()
        assert row_.status == "completed"  # the helper's batch closed it
        assert started == [] and row_.score_pass == "stopped"

    def test_a_stopped_run_leaves_every_score_to_the_next_run(self, engine):
        """Known limit (docs/architecture.md): a run that stops before it closes has refreshed
        no score, not even its done batches' users' (batch by batch it had); the next run
        over every user does."""
        seed(engine, store())
        run_id = gc_engine.start_run(engine, ONE, request())
        done = []
        assert (
            gc_engine.process_run(
                engine, run_id, ONE, on_batch=done.append, should_stop=lambda: len(done) >= 2
            )
            is False
        )
        assert unrefreshed(engine) == set(USERS)
        run(engine, SETTINGS)
        assert unrefreshed(engine) == set()

    def test_a_user_a_batch_holds_is_left_alone(self, engine, monkeypatch):
        """A sweep of one user planned while the pass runs does not drift on its account: the
        pass skips the rows of users whose per-user lock a batch holds."""
        seed(engine, store())
        planned, refreshed, sweep = threading.Event(), threading.Event(), {}
        real_execute, real_range = batch_run.execute, score_pass._refresh_range

        def gated_execute(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread().name == "sweep":
                planned.set()  # the sweep's batch has planned, in its transaction
                assert refreshed.wait(30)
            return real_execute(*args, **kwargs)

        def sweep_user_3() -> None:
            req = gc_engine.RunRequest(mode="apply", now=NOW, users=("user-3",),
                                       jobs=gc_engine.resolve_jobs([], ONE))  # fmt: skip
            sweep["id"] = gc_engine.run_once(engine, ONE, req)

        def first_range(*args: Any) -> int:
            if planned.is_set():
                return real_range(*args)
            # the nightly run's batches are done and its pass begins: the application writes a
            # memory the sweep will expire, and the sweep plans it
            seed(engine, [row("user-3", "expired later", expires_at=NOW - timedelta(hours=1))])
            threading.Thread(target=sweep_user_3, name="sweep").start()
            assert planned.wait(30)
            try:
                return real_range(*args)
            finally:
                refreshed.set()

        monkeypatch.setattr(batch_run, "execute", gated_execute)
        monkeypatch.setattr(score_pass, "_refresh_range", first_range)
        run(engine, ONE)
        for thread in threading.enumerate():
            if thread.name == "sweep":
                thread.join(30)
        with engine.connect() as conn:
            swept = build_report(conn, sweep["id"])
        assert swept["drifted"] == [] and swept["totals"]["actions"] > 0
        assert unrefreshed(engine) == set()  # the sweep refreshed its own user


class TestWhoIsRefreshed:
    def test_the_apply_of_a_plan_refreshes_only_the_users_it_planned(self, engine):
        seed(engine, store())
        plan = run(engine, SETTINGS, dry_run=True)
        seed(engine, [row("newcomer", "written after the plan")])  # in no batch of the plan
        applied = gc_engine.apply_plan(engine, plan["run_id"])
        assert execute(engine, "SELECT score_pass FROM gc_runs WHERE id = :r",
                       r=applied).scalar_one() == "done"  # fmt: skip
        assert unrefreshed(engine) == {"newcomer"}  # as the batches would have left it

    def test_a_lock_on_the_same_user_id_in_another_database_is_not_a_batch_of_this_one(
        self, engine, twin
    ):
        seed(engine, store())
        with twin.connect() as other:  # another store on the same server holds "user-3"
            other.execute(sa.text("SELECT pg_advisory_lock(4242001, hashtext('user-3'))"))
            report = run(engine, SETTINGS)
            other.execute(sa.text("SELECT pg_advisory_unlock_all()"))
        assert run_row(engine, report).score_pass == "done"
        assert unrefreshed(engine) == set()

    def test_a_store_with_child_tables_keeps_the_batch_refresh(self, engine):
        """Tuple ids name rows of one table: a pass over the parent's pages would not reach a
        child's rows (and a join on tuple ids alone could reach the wrong ones)."""
        seed(engine, store())
        execute(engine, "CREATE TABLE memories_archive () INHERITS (memories)")
        archived = [row("archived", f"kept {i}", pinned=True) for i in range(5)]
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    INSERT.text.replace("INSERT INTO memories ", "INSERT INTO memories_archive ")
                ),
                [r | {"embedding": None, "metadata": "{}"} for r in archived],
            )
        report = run(engine, SETTINGS)
        assert run_row(engine, report).score_pass is None
        assert report["jobs"]["decay"]["refreshed"] == batch_refreshes(engine, report) > 0
        refreshed = (
            "SELECT count(*) FROM ONLY memories_archive WHERE decayed_confidence IS NOT NULL"
        )
        assert execute(engine, refreshed).scalar_one() == 0


class TestManyUsers:
    def test_the_done_users_stay_a_hashed_set_at_160k_users(self, engine):
        """The planner hashes the done users only if it expects them to fit in work_mem x
        hash_mem_multiplier: from ~150k users (4 MB) it compared every row with every user,
        4 ms a row, and held its row locks for minutes per range. Statistics as autovacuum's
        ANALYZE leaves them."""
        users, rows = 160_000, 1_000
        run_id = execute(
            engine,
            "INSERT INTO gc_runs (id, mode, now, jobs, status, score_pass) VALUES "
            "(gen_random_uuid(), 'apply', :now, ARRAY['decay'], 'completed', 'due') RETURNING id",
            now=NOW,
        ).scalar_one()
        execute(
            engine,
            "INSERT INTO gc_run_batches (run_id, batch_no, users, state) "
            "SELECT :r, u / 1000, array_agg('user-' || lpad(u::text, 8, '0') ORDER BY u), 'done' "
            "FROM generate_series(0, :n - 1) u GROUP BY u / 1000",
            r=run_id, n=users,
        )  # fmt: skip
        execute(
            engine,
            "INSERT INTO memories (user_id, content, created_at, updated_at) "
            "SELECT 'user-' || lpad((g * 7919 % :n)::text, 8, '0'), 'm ' || g, :t, :t "
            "FROM generate_series(1, :r) g",
            n=users, r=rows, t=NOW - timedelta(days=40),
        )  # fmt: skip
        execute(engine, "ANALYZE gc_run_batches")
        execute(engine, "ANALYZE memories")
        params = decay.rule_params(SETTINGS.decay, NOW) | {
            "now": NOW, "run_id": run_id, "lo": "(0,0)", "hi": "(1024,0)", "held": [],
        }  # fmt: skip
        with engine.begin() as conn:
            conn.execute(q("score_pass_plan"), {"work_mem_kb": score_pass.work_mem_kb(users)})
            explain = sa.text("EXPLAIN " + q("decay_refresh_pages").text)
            plan = "\n".join(r[0] for r in conn.execute(explain, params))
        assert "hashed SubPlan" in plan, plan
        run_row = {"id": run_id, "now": NOW}
        assert score_pass.refresh_scores(engine, run_row, SETTINGS, workers=1) == rows
        assert execute(
            engine, "SELECT count(*) FROM memories WHERE decayed_confidence IS NULL"
        ).scalar_one() == 0  # fmt: skip


def request() -> gc_engine.RunRequest:
    return gc_engine.RunRequest(mode="apply", now=NOW, jobs=gc_engine.resolve_jobs([], SETTINGS))


def test_ranges_cover_every_page_and_the_last_is_open():
    assert score_pass.ranges(0) == [(0, score_pass.LAST_PAGE)]
    assert score_pass.ranges(3, size=2) == [(0, 2), (2, score_pass.LAST_PAGE)]
    assert score_pass.ranges(4, size=2) == [(0, 2), (2, score_pass.LAST_PAGE)]
    assert score_pass.ranges(5, size=2) == [(0, 2), (2, 4), (4, score_pass.LAST_PAGE)]


def test_migration_0011_round_trip(empty_database_url):
    columns = (
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'gc_runs'"
        " AND column_name IN ('score_pass', 'scores_refreshed')"
    )
    check_round_trip(empty_database_url, "0011", "0010", columns, present=2)
