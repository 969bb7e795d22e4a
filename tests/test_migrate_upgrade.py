"""`memory-gc migrate` on a store that holds data at an older revision: every row is kept, the
worker refuses the old schema until then and works on the store after, and what an earlier
migration made differently on another server is brought in line."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa
from alembic import command

from gc_worker import cli, db, schema
from gc_worker.migration_modules import load
from jobs.similarity import content_hash
from tests.conftest import TEST_DIM, migrating

PLAN = "10000000-0000-0000-0000-000000000001"
RUNNING = "10000000-0000-0000-0000-000000000002"
TABLES = ("memories", "memory_lineage", "gc_runs", "gc_run_batches", "gc_actions")


def seed(conn: sa.Connection, revision: str) -> None:
    """Memories, lineage, a plan waiting to be applied, a run left running, and (from the
    revision that has their tables) a review, a cached decision, an erasure request and a
    sweep request, as a store of that revision holds them."""
    statements = [
        "INSERT INTO memories (id, user_id, content, slot, created_at, expires_at) VALUES"
        " ('00000000-0000-0000-0000-000000000001', 'u1', 'likes tea', 'p.a',"
        "  now() - interval '10 days', now() - interval '1 day'),"
        " ('00000000-0000-0000-0000-000000000002', 'u1', 'Straße', 'p.a',"
        "  now() - interval '1 day', NULL),"
        " ('00000000-0000-0000-0000-000000000003', 'u2', 'other', NULL,"
        "  now() - interval '100 days', NULL)",
        "INSERT INTO memory_lineage VALUES ('00000000-0000-0000-0000-000000000002',"
        " '00000000-0000-0000-0000-000000000001')",
        "INSERT INTO gc_runs (id, mode, status, now, jobs, finished_at) VALUES"
        f" ('{PLAN}', 'dry_run', 'completed', now(), '{{ttl_expiry}}', now()),"
        f" ('{RUNNING}', 'apply', 'running', now(), '{{ttl_expiry}}', NULL)",
        "INSERT INTO gc_run_batches (run_id, batch_no, users, state) VALUES"
        f" ('{PLAN}', 0, '{{u1,u2}}', 'done'), ('{RUNNING}', 0, '{{u1,u2}}', 'pending')",
        "INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id, reason,"
        " row_version, outcome, content_preview)"
        f" SELECT '{PLAN}', 0, 0, 'ttl_expiry', 'soft_delete', id, user_id, 'ttl_expired',"
        "  xmin::text::bigint, 'planned', content FROM memories"
        " WHERE id = '00000000-0000-0000-0000-000000000001'",
    ]
    if revision >= "0002":
        statements += [
            "INSERT INTO gc_review_items (run_id, user_id, kind, memory_ids, reason) VALUES"
            f" ('{PLAN}', 'u1', 'contradiction', '{{00000000-0000-0000-0000-000000000001}}', 'x')",
            "INSERT INTO gc_llm_cache (key, kind, user_id, value)"
            " VALUES ('k', 'merge', 'u1', '{}')",
        ]
    if revision >= "0003":
        statements.append("INSERT INTO gc_erasure_requests (kind, user_id) VALUES ('user', 'u2')")
    if revision >= "0004":
        statements.append("INSERT INTO gc_sweep_requests (user_id) VALUES ('u1')")
    for statement in statements:
        conn.exec_driver_sql(statement)


def counts(url: str) -> dict[str, int]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return {t: conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar() for t in TABLES}
    finally:
        engine.dispose()


def outcomes(url: str) -> list[str]:
    """The outcomes of the applies of the old plan's soft delete."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return list(
                conn.exec_driver_sql(
                    "SELECT a.outcome FROM gc_actions a JOIN gc_runs r ON r.id = a.run_id"
                    f" WHERE r.plan_run_id = '{PLAN}' AND a.action = 'soft_delete'"
                ).scalars()
            )
    finally:
        engine.dispose()


@pytest.mark.slow
class TestUpgradeWithData:
    @pytest.mark.parametrize("revision", [f"{n:04d}" for n in range(1, 17)])
    def test_rows_are_kept_and_the_worker_works_after(
        self, empty_database_url, revision, monkeypatch, capsys
    ):
        """A store with data at an older revision: `run` exits 2 naming `memory-gc migrate`;
        migrate keeps every row; then the old plan applies, the daemon's pass, a run and the
        reports all succeed."""
        with migrating(empty_database_url) as (cfg, conn):
            command.upgrade(cfg, revision)
            seed(conn, revision)
        before = counts(empty_database_url)
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", empty_database_url)
        monkeypatch.setenv("MEMORY_GC_EMBEDDINGS__DIM", str(TEST_DIM))
        assert cli.main(["run", "--dry-run"]) == 2
        assert "run `memory-gc migrate`" in capsys.readouterr().err
        assert cli.main(["migrate"]) == 0, capsys.readouterr()
        assert counts(empty_database_url) == before
        assert cli.main(["apply", PLAN]) == 0, capsys.readouterr()
        assert outcomes(empty_database_url) == ["applied"]  # the row did not move: no drift
        for args in (["schedule", "--once-due"], ["run"], ["report", RUNNING]):
            assert cli.main(args) == 0, (args, capsys.readouterr())


class TestFoldAfterAServerUpgrade:
    TEXT = "STRASSE Straße"

    def test_a_lower_fold_made_before_postgresql_18_is_replaced(self, empty_database_url):
        """Migration 0003 folded case with lower() on PostgreSQL before 18; a server upgraded to
        18 (pg_upgrade keeps functions) before 0014 ran kept it: 0014 looked at the server's
        version only. The SQL hash then missed "Straße" against Python's casefold, so an
        erasure left its audit previews unscrubbed and memory_gc_is_tombstoned said no."""
        with migrating(empty_database_url) as (cfg, conn):
            command.upgrade(cfg, "0013")
            made_before_18 = load("0003_erasure.py").normalise_function("lower(s)")
            conn.exec_driver_sql(made_before_18.replace("CREATE", "CREATE OR REPLACE", 1))
        engine = db.make_engine(empty_database_url)
        try:
            schema.migrate(engine, embedding_dim=TEST_DIM)
            with engine.connect() as conn:
                got = conn.execute(
                    sa.text("SELECT memory_gc_content_hash('u1', :t)"), {"t": self.TEXT}
                ).scalar()
        finally:
            engine.dispose()
        assert got == content_hash("u1", self.TEXT)

    def test_a_full_fold_is_kept_without_rebuilding_indexes(self, empty_database_url):
        """A normaliser that already folds fully is left as it is: an application's index on
        the hash is not rebuilt (a REINDEX of a large table for nothing)."""
        index = "CREATE INDEX app_hash_idx ON memories (memory_gc_content_hash(user_id, content))"
        node = "SELECT relfilenode FROM pg_class WHERE relname = 'app_hash_idx'"
        with migrating(empty_database_url) as (cfg, conn):
            command.upgrade(cfg, "0013")
            # the embedded server is PostgreSQL 18, where 0003 already folds fully
            assert conn.exec_driver_sql("SELECT memory_gc_normalise('ß')").scalar() == "ss"
            conn.exec_driver_sql(index)
            built = conn.exec_driver_sql(node).scalar()
            command.upgrade(cfg, "head")
            assert conn.exec_driver_sql(node).scalar() == built


class TestUpgradeAsAnotherRole:
    def test_a_role_that_does_not_own_the_schema_is_told_which_does(
        self, pg_server, empty_database_url, monkeypatch, capsys
    ):
        """An upgrade run as the daemon's role (granted use of the tables, not their owner)
        failed at its first ALTER with exit 1 and the server's "must be owner of table
        gc_runs": now exit 2 naming the role to migrate as, and nothing changed."""
        role = f"gc_upgrader_{os.getpid()}"
        pg_server.psql(f"CREATE ROLE {role} LOGIN;")
        try:
            with migrating(empty_database_url) as (cfg, conn):
                command.upgrade(cfg, "0014")
                conn.exec_driver_sql(
                    f"GRANT CREATE ON SCHEMA public TO {role};"
                    f" GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}"
                )
            url = empty_database_url.replace("postgres:@", f"{role}:@", 1)
            monkeypatch.setenv("MEMORY_GC_DATABASE_URL", url)
            monkeypatch.setenv("MEMORY_GC_EMBEDDINGS__DIM", str(TEST_DIM))
            code = cli.main(["migrate"])
            err = capsys.readouterr().err
        finally:
            with migrating(empty_database_url) as (_, conn):
                conn.exec_driver_sql(f"DROP OWNED BY {role}")
            pg_server.psql(f"DROP ROLE IF EXISTS {role};")
        assert code == 2, err
        assert f"role {role} may not" in err and "must be owner of table gc_runs" in err
        assert "run `memory-gc migrate` as role postgres" in err
        engine = db.make_engine(empty_database_url)
        try:
            assert schema.current_revision(engine) == "0014"
        finally:
            engine.dispose()
