"""Merges and contradictions are versioned by content: a read between plan and apply does not
drift them, any other write does; the jobs whose rules read the access columns keep ``xmin``.

Before migration 0010 every action compared ``xmin``, so the application putting a stale fact
into a model context between a dry run and its apply (which it does with the facts it retrieves
most) drifted the obsolete that closes it — under ``plan_then_apply``, every night again."""

from __future__ import annotations

from uuid import UUID

import pytest
from alembic import command

from gc_worker import db, schema
from gc_worker import engine as gc_engine
from gc_worker.actions import CONTENT_VERSIONED, Kind
from gc_worker.report import build_report
from tests.conftest import TEST_DIM
from tests.store import NOW, acted_on, add, city_pair, days_ago, execute, get, run, status
from tests.test_compaction import E0

# what the request path writes when it puts a memory into a model context, and the worker's
# own score refresh (another run of the user between plan and apply)
READ = (
    "UPDATE memories SET last_accessed_at = :now, access_count = access_count + 1,"
    " decayed_confidence = 0.5 WHERE id = ANY(:ids)"
)

EDITS = [
    "UPDATE memories SET content = 'Lives in Lyon' WHERE id = ANY(:ids)",
    "UPDATE memories SET metadata = jsonb_build_object('turn', 7) WHERE id = ANY(:ids)",
    "UPDATE memories SET pinned = true WHERE id = ANY(:ids)",
    "UPDATE memories SET importance = 5 WHERE id = ANY(:ids)",
    "UPDATE memories SET valid_from = now() - interval '3 days' WHERE id = ANY(:ids)",
    "UPDATE memories SET updated_at = now() WHERE id = ANY(:ids)",
]


def apply(engine, plan):
    run_id = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    with engine.connect() as conn:
        return build_report(conn, run_id)


class TestContradiction:
    @pytest.mark.parametrize("read", ["older", "newer", "both"])
    def test_a_read_between_plan_and_apply_does_not_drift_the_obsolete(
        self, engine, settings, read
    ):
        old, new = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        assert acted_on(plan, "obsolete") == {str(old)}
        ids = {"older": [old], "newer": [new], "both": [old, new]}[read]
        execute(engine, READ, ids=ids, now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == [] and acted_on(applied) == {str(old)}
        closed = get(engine, old)
        assert closed["status"] == "obsolete" and closed["superseded_by"] == new
        if read != "newer":  # what the read wrote stands
            assert closed["access_count"] == 1 and closed["last_accessed_at"] == NOW

    @pytest.mark.parametrize("edit", EDITS)
    @pytest.mark.parametrize("target", ["older", "newer"])
    def test_any_other_write_still_drifts_it(self, engine, settings, edit, target):
        """Of the older fact: its action drifts; of the newer one: the premise is broken."""
        old, new = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        execute(engine, edit, ids=[old if target == "older" else new])
        applied = apply(engine, plan)
        assert [d["memory_id"] for d in applied["drifted"]] == [str(old)]
        assert status(engine, old) == "active" and get(engine, old)["valid_until"] is None

    def test_a_plan_recorded_with_xmin_drifts(self, engine, settings):
        """A plan made before the content version (its obsolete carries ``xmin``) is not applied
        on a version it did not record: it drifts and is planned again."""
        old, _ = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        execute(
            engine,
            "UPDATE gc_actions a SET row_version = m.xmin::text::bigint FROM memories m"
            " WHERE a.run_id = :run AND a.memory_id = m.id",
            run=UUID(plan["run_id"]),
        )
        applied = apply(engine, plan)
        assert len(applied["drifted"]) == 1 and status(engine, old) == "active"


class TestCompaction:
    def test_a_read_of_a_member_does_not_drift_the_merge(self, engine, settings):
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", "has a dog named Rex", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        assert acted_on(plan, "merge") == {str(a), str(b)}
        execute(engine, READ, ids=[a], now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == []
        assert status(engine, a) == status(engine, b) == "merged"

    def test_an_edit_of_a_member_drifts_the_whole_merge(self, engine, settings):
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", "has a dog named Rex", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        execute(engine, "UPDATE memories SET content = 'Had a dog' WHERE id = ANY(:ids)", ids=[a])
        applied = apply(engine, plan)
        assert {d["memory_id"] for d in applied["drifted"]} >= {str(a), str(b)}
        assert status(engine, a) == status(engine, b) == "active"
        assert execute(engine, "SELECT count(*) FROM memories").scalar() == 2


class TestAccessRulesKeepXmin:
    def test_a_read_still_drifts_a_usage_prune(self, engine, settings):
        """usage_prune decides on the last use: a use since planning wins."""
        unused = add(engine, "u1", "never used", created_at=days_ago(200), importance=3)
        plan = run(engine, settings, jobs=["usage_prune"], dry_run=True)
        assert acted_on(plan) == {str(unused)}
        execute(engine, READ, ids=[unused], now=NOW)
        applied = apply(engine, plan)
        assert [d["memory_id"] for d in applied["drifted"]] == [str(unused)]
        assert status(engine, unused) == "active"

    def test_every_planned_version_is_the_one_its_job_compares(self, engine, settings):
        """The versions a dry run records: content versions for CONTENT_VERSIONED actions,
        xmin for the rest — the executor compares each against the same kind."""
        city_pair(engine)
        add(engine, "u1", "Has a cat", embedding=E0)
        add(engine, "u1", "has a cat", embedding=E0)
        add(engine, "u1", "expired", expires_at=days_ago(1))
        add(engine, "u1", "never used", created_at=days_ago(200), importance=3)
        plan = run(engine, settings, dry_run=True)
        rows = execute(
            engine,
            "SELECT a.job, a.action, a.row_version, m.xmin::text::bigint AS xmin,"
            " memory_gc_content_version(m) AS content FROM gc_actions a"
            " JOIN memories m ON m.id = a.memory_id"
            " WHERE a.run_id = :run AND a.row_version IS NOT NULL",
            run=UUID(plan["run_id"]),
        ).all()
        kinds = {(r.job, Kind(r.action)) for r in rows}
        assert kinds >= CONTENT_VERSIONED and len(kinds) > len(CONTENT_VERSIONED)
        for r in rows:
            versioned = (r.job, Kind(r.action)) in CONTENT_VERSIONED
            assert r.row_version == (r.content if versioned else r.xmin), r


def test_migration_0010_round_trip(empty_database_url):
    engine = db.make_engine(empty_database_url)
    try:
        cfg = schema._alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"], cfg.attributes["embedding_dim"] = conn, TEST_DIM
            command.upgrade(cfg, "0010")
            exists = "SELECT count(*) FROM pg_proc WHERE proname = 'memory_gc_content_version'"
            assert conn.exec_driver_sql(exists).scalar() == 1
            command.downgrade(cfg, "0009")
            assert conn.exec_driver_sql(exists).scalar() == 0
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
