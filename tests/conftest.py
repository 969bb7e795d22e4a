"""Test fixtures: one embedded PostgreSQL + pgvector per session, a migrated template database,
and a fresh clone of it per test (CREATE DATABASE … TEMPLATE), so tests are isolated and fast."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gc_worker import db, schema
from gc_worker.config import EmbeddingSettings, Settings

TEST_DIM = 8
TEMPLATE = "memory_gc_template"
LLM_BASE_URL = "http://llm.test/v1"  # the fake OpenAI-compatible server of make_llm


@contextmanager
def migrating(url: str):
    """(Alembic config, connection) for stepping migrations one by one on an empty database, in
    one transaction, at the tests' embedding dimension."""
    engine = db.make_engine(url)
    try:
        cfg = schema._alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"], cfg.attributes["embedding_dim"] = conn, TEST_DIM
            yield cfg, conn
    finally:
        engine.dispose()


def check_round_trip(url: str, revision: str, previous: str, count: str, present: int) -> None:
    """Upgrade an empty database to ``revision`` (``count`` — a SELECT count(*) of what it
    adds — reads ``present``), downgrade to ``previous`` (it reads 0), upgrade to head again."""
    from alembic import command

    with migrating(url) as (cfg, conn):
        command.upgrade(cfg, revision)
        assert conn.exec_driver_sql(count).scalar() == present
        command.downgrade(cfg, previous)
        assert conn.exec_driver_sql(count).scalar() == 0
        command.upgrade(cfg, "head")


_counter = itertools.count()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stray MEMORY_GC_* / OPENAI_* variable from the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith(("MEMORY_GC_", "OPENAI_")):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def pg_data_dir() -> Iterator[Path]:
    """Outside pytest's numbered temp dirs, which a concurrent session may prune under us."""
    path = Path(tempfile.mkdtemp(prefix="memory-gc-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server(pg_data_dir: Path):
    server = db.embedded_server(pg_data_dir)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def template_db(pg_server) -> str:
    url = pg_server.get_uri(TEMPLATE, driver="psycopg")
    pg_server.psql(f"DROP DATABASE IF EXISTS {TEMPLATE};")
    pg_server.psql(f"CREATE DATABASE {TEMPLATE};")
    engine = db.make_engine(url)
    schema.migrate(engine, embedding_dim=TEST_DIM)
    engine.dispose()
    return TEMPLATE


@pytest.fixture
def database_url(pg_server, template_db: str) -> Iterator[str]:
    name = f"memory_gc_test_{os.getpid()}_{next(_counter)}"
    pg_server.psql(f"CREATE DATABASE {name} TEMPLATE {template_db};")
    yield pg_server.get_uri(name, driver="psycopg")
    pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);")


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    eng = db.make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def settings() -> Settings:
    return Settings(embeddings=EmbeddingSettings(dim=TEST_DIM))


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str) -> str:
    """Point the CLI at this test's database with the test embedding size."""
    monkeypatch.setenv("MEMORY_GC_DATABASE_URL", database_url)
    monkeypatch.setenv("MEMORY_GC_EMBEDDINGS__DIM", str(TEST_DIM))
    return database_url


@pytest.fixture
def empty_database_url(pg_server) -> Iterator[str]:
    """A database with no memory-gc schema at all."""
    name = f"memory_gc_empty_{os.getpid()}_{next(_counter)}"
    pg_server.psql(f"CREATE DATABASE {name};")
    yield pg_server.get_uri(name, driver="psycopg")
    pg_server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE);")


@pytest.fixture
def unreachable_engine() -> Iterator[sa.Engine]:
    """An engine whose every connection fails at once, like a database that is down."""
    eng = sa.create_engine("postgresql+psycopg://memory-gc@/memory_gc?host=/nonexistent-memory-gc")
    yield eng
    eng.dispose()


@pytest.fixture
def make_llm(engine: sa.Engine) -> Iterator[Any]:
    """``make_llm(server, **options)``: the real LLM port (openai client, budget, Postgres
    decision cache) over an ``httpx2.MockTransport`` answering with ``server``; closed after
    the test. (Modules with a port of another shape define their own ``make_llm``.)"""
    import httpx2

    from gc_worker.llm import LLMOptions, open_llm
    from gc_worker.llm_store import PostgresDecisionCache

    ports = []

    def make(server: Any, **options: Any) -> Any:
        http_client = httpx2.Client(transport=httpx2.MockTransport(server))
        values = {"api_key": "test-key", "base_url": LLM_BASE_URL, "backoff_base_seconds": 0,
                  "max_retries": 1, "embedding_dim": TEST_DIM} | options  # fmt: skip
        port = open_llm(
            LLMOptions(**values), http_client=http_client, cache=PostgresDecisionCache(engine)
        )
        ports.append(port)
        return port

    yield make
    for port in ports:
        port.close()
