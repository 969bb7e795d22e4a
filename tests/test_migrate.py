"""`memory-gc migrate`: its prerequisites (pgvector, privileges), two migrates at once, and a
schema newer than this build."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from gc_worker import cli, db, schema

from .conftest import TEST_DIM

ROOT = Path(__file__).resolve().parents[1]
_roles = itertools.count()


def execute(url: str, sql: str, *, autocommit: bool = False) -> None:
    engine = db.make_engine(url, **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def scalar(url: str, sql: str):
    engine = db.make_engine(url)
    with engine.connect() as conn:
        value = conn.execute(sa.text(sql)).scalar()
    engine.dispose()
    return value


def migrate(monkeypatch, url: str, capsys, dim: int = TEST_DIM) -> tuple[int, str, str]:
    monkeypatch.setenv("MEMORY_GC_DATABASE_URL", url)
    monkeypatch.setenv("MEMORY_GC_EMBEDDINGS__DIM", str(dim))
    code = cli.main(["migrate"])
    out, err = capsys.readouterr()
    return code, out, err


def untouched(url: str) -> bool:
    """Nothing of memory-gc's is in the database (the failed migration rolled back whole)."""
    return not scalar(
        url,
        "SELECT to_regclass('memory_gc_alembic_version') IS NOT NULL"
        " OR to_regclass('gc_runs') IS NOT NULL"
        " OR to_regclass('memories_ttl_idx') IS NOT NULL"
        " OR EXISTS (SELECT 1 FROM pg_constraint WHERE conname LIKE 'memories_%_check')",
    )


@pytest.fixture
def role(pg_server) -> Iterator[str]:
    """A login role that is not a superuser."""
    name = f"gc_role_{os.getpid()}_{next(_roles)}"
    pg_server.psql(f"CREATE ROLE {name} LOGIN;")
    yield name
    pg_server.psql(f"DROP ROLE IF EXISTS {name};")


def as_role(url: str, role: str) -> str:
    return url.replace("postgres:@", f"{role}:@", 1)


class TestPrerequisites:
    def test_no_privilege_for_pgvector_says_a_superuser_must_create_it(
        self, pg_server, empty_database_url, role, monkeypatch, capsys
    ):
        """The database's owner, not a superuser, cannot CREATE EXTENSION vector: exit 2."""
        name = sa.engine.make_url(empty_database_url).database
        pg_server.psql(f"ALTER DATABASE {name} OWNER TO {role};")
        try:
            code, _, err = migrate(monkeypatch, as_role(empty_database_url, role), capsys)
        finally:
            pg_server.psql(f"ALTER DATABASE {name} OWNER TO postgres;")
        assert code == 2, err
        assert f"have a superuser run CREATE EXTENSION vector; in database {name}" in err
        assert untouched(empty_database_url)

    def test_pgvector_created_by_a_superuser_is_enough(
        self, pg_server, empty_database_url, role, monkeypatch, capsys
    ):
        """Once a superuser created the extension, the database's owner migrates (exit 0)."""
        name = sa.engine.make_url(empty_database_url).database
        execute(empty_database_url, "CREATE EXTENSION vector")
        pg_server.psql(f"ALTER DATABASE {name} OWNER TO {role};")
        try:
            code, _, err = migrate(monkeypatch, as_role(empty_database_url, role), capsys)
            execute(empty_database_url, f"DROP OWNED BY {role}")
        finally:
            pg_server.psql(f"ALTER DATABASE {name} OWNER TO postgres;")
        assert code == 0, err

    def test_pgvector_not_installed_on_the_server(
        self, empty_database_url, monkeypatch, capsys, tmp_path
    ):
        """No pgvector on the server (PostgreSQL 18's extension_control_path hides it): exit 2."""
        url = f"{empty_database_url}&options=-c%20extension_control_path%3D{tmp_path}"
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "install pgvector on the server" in err
        assert untouched(empty_database_url)

    def test_no_create_on_the_schema_names_the_grant(
        self, empty_database_url, role, monkeypatch, capsys
    ):
        """A role without CREATE on schema public: exit 2 with the GRANT to run."""
        execute(empty_database_url, "CREATE EXTENSION vector")
        code, _, err = migrate(monkeypatch, as_role(empty_database_url, role), capsys)
        assert code == 2, err
        assert f"GRANT CREATE ON SCHEMA public TO {role};" in err
        assert untouched(empty_database_url)


class TestConcurrentMigrates:
    def test_a_second_migrate_waits_for_the_first(self, empty_database_url):
        """migrate takes its advisory lock before it reads the revision: while another
        transaction holds it, migrate waits; then it creates the schema."""
        holder = db.make_engine(empty_database_url)
        engine = db.make_engine(empty_database_url)
        result: list[object] = []
        try:
            with holder.connect() as conn:
                conn.exec_driver_sql(schema.MIGRATE_LOCK)
                worker = threading.Thread(
                    target=lambda: result.append(schema.migrate(engine, embedding_dim=TEST_DIM))
                )
                worker.start()
                time.sleep(1.0)
                assert worker.is_alive() and result == []
                conn.rollback()
            worker.join(timeout=60)
        finally:
            holder.dispose()
        assert result == [(None, schema.head_revision())]
        engine.dispose()

    @pytest.mark.slow
    def test_two_migrates_at_once_both_succeed(self, empty_database_url):
        """Two replicas' init containers run `memory-gc migrate` at the same time: both exit 0,
        one creates the schema and the other finds it current."""
        env = dict(os.environ, MEMORY_GC_DATABASE_URL=empty_database_url,
                   MEMORY_GC_EMBEDDINGS__DIM=str(TEST_DIM), PYTHONPATH=str(ROOT))  # fmt: skip
        command = [sys.executable, "-m", "gc_worker.cli", "migrate"]
        pipe = subprocess.PIPE
        procs = [
            subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe, text=True)
            for _ in range(2)
        ]
        results = [(proc.communicate(timeout=120), proc.returncode) for proc in procs]
        assert [code for _, code in results] == [0, 0], results
        outs = sorted(out for (out, _), _ in results)
        assert outs[0].startswith("schema is current") and "empty ->" in outs[1], results


class TestNewerSchema:
    def test_migrate_on_a_schema_newer_than_this_build(self, database_url, monkeypatch, capsys):
        """A revision this build does not know: exit 2 with require_current's message."""
        execute(database_url, "UPDATE memory_gc_alembic_version SET version_num = '9999'")
        code, _, err = migrate(monkeypatch, database_url, capsys)
        assert code == 2, err
        assert "the database schema (9999) is newer than this memory-gc" in err
        assert "Traceback" not in err
        assert cli.main(["run", "--dry-run"]) == 2
        assert "the database schema (9999) is newer than this memory-gc" in capsys.readouterr().err
