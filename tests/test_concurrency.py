"""The request path writes while the worker runs: touches, edits, pins, inserts and deletes of
the same users' memories. No application write is ever overwritten; a row that changed after
it was planned is skipped and reported as drifted (its whole group with it)."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa

import jobs
from gc_worker import batch_run, db
from gc_worker import engine as gc_engine
from gc_worker.config import Settings
from gc_worker.report import build_report
from tests.seeding import Reusable, full_snapshot, lifecycle_rows, reusable_database, row, seed
from tests.store import NOW, run

SETTINGS = Settings.model_validate({"embeddings": {"dim": 8}, "run": {"batch_users": 1}})
USERS = [f"user-{i:02d} 'q'" for i in range(8)] + ["ユーザー", "%s;--"]


@pytest.fixture(scope="module")
def database(pg_server, template_db) -> Iterator[Reusable]:
    with reusable_database(pg_server, template_db, "concurrency") as db:
        yield db


@pytest.fixture
def engine(database) -> sa.Engine:
    return database.fresh()


class App:
    """The request path: short single-statement transactions on its own connection pool, each
    recorded once committed (``lock_timeout`` so a test fails instead of hanging)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = sa.create_engine(
            engine.url,
            pool_size=4,
            pool_pre_ping=True,
            connect_args={"options": "-c lock_timeout=5000"},
        )
        self.values: dict[UUID, dict[str, Any]] = {}
        self.deleted: set[UUID] = set()
        self.inserted: dict[UUID, str] = {}
        self.errors: list[Exception] = []
        self._clock = itertools.count(1)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    def _write(self, memory_id: UUID, sql: str, **values: Any) -> bool:
        with self.engine.begin() as conn:
            done = conn.execute(sa.text(sql + " RETURNING id"), {"id": memory_id, **values}).first()
        if done is not None:
            with self._lock:
                self.values.setdefault(memory_id, {}).update(values)
        return done is not None

    def touch(self, memory_id: UUID) -> bool:
        at = NOW + timedelta(seconds=next(self._clock))
        return self._write(
            memory_id,
            "UPDATE memories SET last_accessed_at = :last_accessed_at,"
            " access_count = access_count + 1 WHERE id = :id",
            last_accessed_at=at,
        )

    def edit(self, memory_id: UUID) -> bool:
        text = f"edited {next(self._clock)}"
        return self._write(
            memory_id, "UPDATE memories SET content = :content WHERE id = :id", content=text
        )

    def pin(self, memory_id: UUID) -> bool:
        return self._write(
            memory_id, "UPDATE memories SET pinned = :pinned WHERE id = :id", pinned=True
        )

    def touch_context(self, ids: list[UUID]) -> bool:
        """Mark several memories as put into a model context, in one statement."""
        at = NOW + timedelta(seconds=next(self._clock))
        with self.engine.begin() as conn:
            done = (
                conn.execute(
                    sa.text(
                        "UPDATE memories SET last_accessed_at = :at"
                        " WHERE id = ANY(:ids) RETURNING id"
                    ),
                    {"ids": ids, "at": at},
                )
                .scalars()
                .all()
            )
        with self._lock:
            for memory_id in done:
                self.values.setdefault(memory_id, {})["last_accessed_at"] = at
        return bool(done)

    def delete(self, memory_id: UUID) -> bool:
        with self.engine.begin() as conn:
            gone = conn.execute(
                sa.text("DELETE FROM memories WHERE id = :id RETURNING id"), {"id": memory_id}
            ).first()
        if gone is not None:
            with self._lock:
                self.deleted.add(memory_id)
        return gone is not None

    def insert(self, user_id: str) -> UUID:
        memory_id, text = uuid4(), f"new memory {next(self._clock)}"
        seed(self.engine, [row(user_id, text, id=memory_id, created_at=NOW, importance=5)])
        with self._lock:
            self.inserted[memory_id] = user_id
        return memory_id

    def check_nothing_overwritten(self, after: dict[UUID, dict[str, Any]]) -> None:
        for memory_id in self.deleted:
            assert memory_id not in after
        for memory_id, values in self.values.items():
            if memory_id in self.deleted:
                continue
            assert {k: after[memory_id][k] for k in values} == values, memory_id
        for memory_id, user_id in self.inserted.items():
            if memory_id not in self.deleted:
                new = after[memory_id]
                assert (new["user_id"], new["status"], new["status_changed_at"]) == (
                    user_id,
                    "active",
                    None,
                )

    @property
    def written(self) -> set[UUID]:
        return set(self.values) | self.deleted


def report_of(engine: sa.Engine, run_id: UUID) -> dict[str, Any]:
    with engine.connect() as conn:
        return build_report(conn, run_id)


def unexplained_drift(report: dict[str, Any], written: set[UUID]) -> list[dict[str, Any]]:
    """Drifted actions whose row, and every row of whose group, the application never wrote
    (a review or deferred group names its rows in details.memory_ids)."""

    def wrote(d: dict[str, Any]) -> bool:
        named = [d["memory_id"], *d["details"].get("memory_ids", ())]
        return any(m and UUID(str(m)) in written for m in named)

    touched_groups = {d["details"].get("group") for d in report["drifted"] if wrote(d)}
    return [
        d
        for d in report["drifted"]
        if not wrote(d)
        and (d["details"].get("group") is None or d["details"]["group"] not in touched_groups)
    ]


def planned_ids(report: dict[str, Any], action: str) -> list[UUID]:
    return [UUID(a["memory_id"]) for a in report["actions"] if a["action"] == action]


class TestBetweenPlanAndApply:
    def test_app_writes_after_a_dry_run_win(self, engine):
        """Rows the application touched, edited, pinned or deleted after the plan are skipped
        and reported as drifted; everything else of the plan is applied."""
        seed(engine, [r for u in USERS[:3] for r in lifecycle_rows(u)])
        plan = run(engine, SETTINGS, dry_run=True)
        victims = planned_ids(plan, "soft_delete")[:4] + planned_ids(plan, "hard_delete")[:1]
        assert len(victims) == 5
        app = App(engine)
        try:
            for write, memory_id in zip(
                (app.touch, app.edit, app.pin, app.delete, app.touch), victims, strict=True
            ):
                assert write(memory_id)
            fresh = app.insert(USERS[0])
            applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        finally:
            app.close()
        assert {UUID(d["memory_id"]) for d in applied["drifted"]} == set(victims)
        assert len(applied["actions"]) == len(plan["actions"]) - len(victims)
        assert str(fresh) not in {a["memory_id"] for a in applied["actions"]}
        app.check_nothing_overwritten(full_snapshot(engine))

    def test_one_touched_member_holds_back_its_whole_group(self, engine):
        """A merge is all or nothing: editing one duplicate skips the merge of all of them.
        (Merely reading one does not: tests/test_content_version.py.)"""
        seed(engine, lifecycle_rows("u1"))
        plan = run(engine, SETTINGS, dry_run=True)
        merged = planned_ids(plan, "merge")
        assert len(merged) == 2
        app = App(engine)
        try:
            app.edit(merged[0])
            applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        finally:
            app.close()
        skipped = {(d["action"], d["memory_id"]) for d in applied["drifted"]}
        assert {a for a, _ in skipped} == {"merge", "create_merged"}
        assert {UUID(m) for a, m in skipped if a == "merge"} == set(merged)
        after = full_snapshot(engine)
        assert {after[m]["status"] for m in merged} == {"active"}


def during_batch(hook: Callable[[Any], None]) -> Callable:
    """hard_delete.plan (the last job planned), then ``hook(ctx)`` before the batch applies."""
    real = jobs.REGISTRY["hard_delete"].plan

    def plan(ctx: Any) -> Any:
        actions = real(ctx)
        if not ctx.dry_run:
            hook(ctx)
        return actions

    return plan


class TestDuringABatch:
    def test_write_between_planning_and_applying_in_one_transaction(self, engine, monkeypatch):
        """An app write that commits after the batch planned its rows drifts them."""
        seed(engine, lifecycle_rows("u1") + lifecycle_rows("u2"))
        expected = run(engine, SETTINGS, dry_run=True)
        targets = {
            UUID(a["memory_id"]): a["user_id"]
            for a in expected["actions"]
            if a["action"] == "soft_delete"
        }
        app = App(engine)

        def write(ctx: Any) -> None:
            for memory_id, user_id in sorted(targets.items(), key=str):
                if user_id not in ctx.users:
                    continue
                if user_id == "u1":
                    app.touch(memory_id)
                else:
                    app.edit(memory_id)

        monkeypatch.setattr(jobs.REGISTRY["hard_delete"], "plan", during_batch(write))
        try:
            report = run(engine, SETTINGS)
        finally:
            app.close()
        drifted = {UUID(d["memory_id"]) for d in report["drifted"]}
        assert drifted >= set(targets) and unexplained_drift(report, app.written) == []
        assert report["jobs"]["ttl_expiry"]["drifted"] >= 2
        app.check_nothing_overwritten(full_snapshot(engine))

    def test_a_newer_fact_retracted_while_the_batch_plans_keeps_the_older_one(
        self, engine, monkeypatch
    ):
        """The application deletes the newer fact of a slot after the batch planned to close
        the older one for it: the older fact stays current (drift), in a plain run too."""
        from tests.store import add, days_ago, get

        old = add(engine, "u1", "Lives in Paris", slot="profile.city", created_at=days_ago(10))
        new = add(engine, "u1", "Lives in Berlin", slot="profile.city", created_at=days_ago(1))
        add(engine, "u1", "long gone", status="deleted", deleted_at=days_ago(45))  # plans a purge

        def retract(ctx: Any) -> None:
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": new})

        monkeypatch.setattr(jobs.REGISTRY["hard_delete"], "plan", during_batch(retract))
        report = run(engine, SETTINGS, jobs=["contradiction", "hard_delete"])
        assert get(engine, old)["status"] == "active"
        assert [d["memory_id"] for d in report["drifted"]] == [str(old)]


def app_traffic(app: App, ids: list[UUID], users: list[str], stop: threading.Event, seed_: int):
    """One request-path thread: random single-row writes on its own share of the rows."""
    rng = random.Random(seed_)
    try:
        _traffic(app, ids, users, stop, rng)
    except Exception as exc:  # reported by the test, not lost in the thread
        app.errors.append(exc)


def _traffic(app: App, ids: list[UUID], users: list[str], stop: threading.Event, rng) -> None:
    while not stop.is_set():
        op = rng.choice(
            ["touch"] * 4 + ["context"] * 3 + ["edit"] * 3 + ["pin", "delete", "insert"]
        )
        if op == "insert":
            app.insert(rng.choice(users))
        elif op == "context":
            app.touch_context(rng.sample(ids, min(4, len(ids))))
        elif ids:
            memory_id = rng.choice(ids)
            if getattr(app, op)(memory_id) is False or op == "delete":
                ids.remove(memory_id)
        time.sleep(rng.uniform(0, 0.004))


class TestUnderLoad:
    def test_app_traffic_during_a_run(self, engine, monkeypatch):
        """Three request-path threads write while a run walks ten one-user batches: the run
        completes, every committed app write is still visible, every drift is an app write."""
        rows = [r for u in USERS for r in lifecycle_rows(u)]
        seed(engine, rows)
        active = [r["id"] for r in rows if r["status"] == "active"]
        shares = [active[i::3] for i in range(3)]
        monkeypatch.setattr(
            jobs.REGISTRY["hard_delete"], "plan", during_batch(lambda _: time.sleep(0.02))
        )
        app, stop = App(engine), threading.Event()
        threads = [
            threading.Thread(target=app_traffic, args=(app, share, USERS, stop, i))
            for i, share in enumerate(shares)
        ]
        for thread in threads:
            thread.start()
        try:
            report = run(engine, SETTINGS)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            app.close()
        assert report["status"] == "completed"
        app.check_nothing_overwritten(full_snapshot(engine))
        assert unexplained_drift(report, app.written) == []
        assert len(app.written) > 20
        assert app.errors == []


def waiting_on_a_lock(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        ).scalar_one()


def by_content(rows: list[dict[str, Any]], content: str) -> UUID:
    return next(r["id"] for r in rows if r["content"] == content)


class TestTheWorkerNeverWaitsOnTheApp:
    """The worker takes row locks with SKIP LOCKED only, so it can never be one side of a
    deadlock with the request path; a row the application holds is drifted or refreshed next
    run, never waited for."""

    def test_no_deadlock_when_the_app_holds_a_row_and_waits_for_ours(self, engine, monkeypatch):
        """The app holds row B and then blocks on row A, which the batch has just retired;
        the batch's score refresh then reaches B. Waiting for B would deadlock (PostgreSQL
        would kill one side after deadlock_timeout); the batch skips B and commits."""
        rows = lifecycle_rows("u1")
        seed(engine, rows)
        a, b = by_content(rows, "expired"), by_content(rows, "fresh")
        app = sa.create_engine(engine.url, connect_args={"options": "-c lock_timeout=20000"})
        holder = app.connect()
        holder.begin()
        holder.execute(sa.text("UPDATE memories SET access_count = 7 WHERE id = :b"), {"b": b})
        errors: list[Exception] = []

        def app_wants_a() -> None:
            try:
                holder.execute(
                    sa.text("UPDATE memories SET access_count = 9 WHERE id = :a"), {"a": a}
                )
                holder.commit()
            except Exception as exc:  # reported by the test
                errors.append(exc)

        blocked = threading.Thread(target=app_wants_a)
        real_after_apply = batch_run._after_apply

        def after_apply(ctx: Any, run_row: Any, applied: Any) -> None:
            real_after_apply(ctx, run_row, applied)
            blocked.start()
            deadline = time.monotonic() + 10
            while waiting_on_a_lock(engine) == 0:
                assert time.monotonic() < deadline, "the app never blocked on the retired row"
                time.sleep(0.01)

        monkeypatch.setattr(batch_run, "_after_apply", after_apply)
        try:
            report = run(engine, SETTINGS, jobs=["ttl_expiry", "decay"])
            blocked.join(timeout=30)
        finally:
            holder.close()
            app.dispose()
        assert errors == [] and not blocked.is_alive()
        assert report["status"] == "completed"
        after = full_snapshot(engine)
        assert after[a]["status"] == "deleted" and after[a]["access_count"] == 9
        assert after[b]["access_count"] == 7
        assert after[b]["decayed_confidence"] is None  # skipped while the app held it
        active = [r for r in rows if r["status"] == "active" and not r["pinned"]]
        # every active row but the ones retired in the batch and b, which the app held
        assert report["jobs"]["decay"]["refreshed"] == len(active) - len(report["actions"]) - 1
        monkeypatch.setattr(batch_run, "_after_apply", real_after_apply)
        run(engine, SETTINGS, jobs=["ttl_expiry", "decay"])
        assert full_snapshot(engine)[b]["decayed_confidence"] is not None

    def test_rows_the_app_holds_are_drifted_not_waited_for(self, engine):
        """While an app transaction holds every row of a user, a run over that user completes
        at once, changes none of them and reports each planned action as drifted; once the
        app is done, the next run applies the same plan."""
        seed(engine, lifecycle_rows("u1") + lifecycle_rows("u2"))
        plan = run(engine, SETTINGS, dry_run=True)
        before = full_snapshot(engine)
        held = {m for m, r in before.items() if r["user_id"] == "u1"}
        worker = db.make_engine(  # waiting on a lock would fail the run, not hang the test
            engine.url.render_as_string(hide_password=False),
            connect_args={"options": "-c lock_timeout=3000"},
        )
        with engine.connect() as app:
            app.execute(sa.text("SELECT id FROM memories WHERE user_id = 'u1' FOR UPDATE")).all()
            try:
                report = run(worker, SETTINGS)
            finally:
                worker.dispose()
            app.rollback()
        planned_u1 = [a for a in plan["actions"] if a["user_id"] == "u1"]
        drifted = [d for d in report["drifted"] if d["user_id"] == "u1"]
        assert report["status"] == "completed"
        assert len(drifted) == len(planned_u1) > 0
        after = full_snapshot(engine)
        assert {m: after[m] for m in held} == {m: before[m] for m in held}
        assert {a["user_id"] for a in report["actions"]} == {"u2"}
        again = run(engine, SETTINGS)
        assert outline(again["actions"]) == outline(planned_u1)

    def test_a_purge_does_not_wait_on_lineage_rows_the_app_holds(self, engine):
        """The application deletes a merged record (its cascade locks the record's lineage
        rows) while hard_delete purges the record's members past the history retention: their
        own cascade would wait on those lineage rows — holding the members, which the
        application deletes next: a deadlock PostgreSQL ends by killing one side. The purges
        are held back (drifted) instead, and done by the next run (a review reproduced it)."""
        from tests.store import add, days_ago, execute, status

        record = add(engine, "u1", "Likes tea (merged)", source="gc_merge")
        members = [
            add(engine, "u1", f"Likes tea {i}", status="merged", status_reason="duplicate",
                status_changed_at=days_ago(400), superseded_by=record, created_at=days_ago(500))
            for i in range(2)
        ]  # fmt: skip
        for m in members:
            execute(engine, "INSERT INTO memory_lineage VALUES (:d, :s)", d=record, s=m)
        worker = db.make_engine(  # waiting on a lock would fail the run, not hang the test
            engine.url.render_as_string(hide_password=False),
            connect_args={"options": "-c lock_timeout=3000"},
        )
        with engine.connect() as app:
            app.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": record})
            try:
                report = run(worker, SETTINGS, jobs=["hard_delete"])
            finally:
                worker.dispose()
            assert report["status"] == "completed"
            assert sorted(UUID(d["memory_id"]) for d in report["drifted"]) == sorted(members)
            assert [status(engine, m) for m in members] == ["merged", "merged"]
            app.execute(sa.text("DELETE FROM memories WHERE id = ANY(:ids)"), {"ids": members})
            app.rollback()  # (the application changed its mind: the members are still there)
        again = run(engine, SETTINGS, jobs=["hard_delete"])
        assert sorted(UUID(a["memory_id"]) for a in again["actions"]) == sorted(members)
        assert [status(engine, m) for m in members] == [None, None]


def outline(actions: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(action, memory id) of each action; a created record's id is new every run."""
    return sorted(
        (a["action"], None if a["action"] == "create_merged" else a["memory_id"]) for a in actions
    )
