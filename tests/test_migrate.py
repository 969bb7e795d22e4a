"""`memory-gc migrate`: two migrates at once, and a schema newer than this build."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gc_worker import cli, db, schema

from .conftest import TEST_DIM

ROOT = Path(__file__).resolve().parents[1]


def execute(url: str, sql: str, *, autocommit: bool = False) -> None:
    engine = db.make_engine(url, **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def migrate(monkeypatch, url: str, capsys, dim: int = TEST_DIM) -> tuple[int, str, str]:
    monkeypatch.setenv("MEMORY_GC_DATABASE_URL", url)
    monkeypatch.setenv("MEMORY_GC_EMBEDDINGS__DIM", str(dim))
    code = cli.main(["migrate"])
    out, err = capsys.readouterr()
    return code, out, err


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
