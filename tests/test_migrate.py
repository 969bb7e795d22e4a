"""`memory-gc migrate`: adopting an application's existing store, its prerequisites (pgvector,
privileges), two migrates at once, and a schema newer than this build."""

from __future__ import annotations

import contextlib
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

from gc_worker import adoption, adoption_columns, cli, db, schema

from .conftest import TEST_DIM

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = ROOT / "docs" / "operations.md"
_roles = itertools.count()

# DESIGN.md section 2's table as an application made it before adopting memory-gc (no CHECKs,
# no worker indexes, no version table), with {lineage} and {view} optional.
APP_MEMORIES = """
CREATE EXTENSION IF NOT EXISTS vector;
CREATE TABLE memories (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id {user_id_type} NOT NULL, content text NOT NULL, embedding vector({dim}),
    memory_type text NOT NULL DEFAULT 'semantic',
    source text NOT NULL DEFAULT 'explicit_user_statement',
    scope text, slot text, supersedes uuid[] NOT NULL DEFAULT '{{}}',
    importance smallint NOT NULL DEFAULT 3, importance_assessed_at timestamptz,
    confidence real NOT NULL DEFAULT 1.0, decayed_confidence real,
    pinned boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    last_accessed_at timestamptz, access_count integer NOT NULL DEFAULT 0,
    observed_at timestamptz NOT NULL DEFAULT now(),
    valid_from timestamptz, valid_until timestamptz, expires_at timestamptz,
    status text NOT NULL DEFAULT 'active', status_reason text, status_changed_at timestamptz,
    superseded_by uuid, deleted_at timestamptz, metadata jsonb NOT NULL DEFAULT '{{}}'
);
INSERT INTO memories (user_id, content, expires_at, created_at) VALUES
    ('u1', 'likes tea', '2026-05-01T00:00:00Z', '2026-04-01T00:00:00Z'),
    ('u1', 'lives in Paris', NULL, '2026-04-01T00:00:00Z');
"""
APP_LINEAGE = """
CREATE TABLE memory_lineage (derived_id uuid NOT NULL, source_id uuid NOT NULL,
                             PRIMARY KEY (derived_id, source_id));
"""
APP_VIEW = """
CREATE VIEW active_memories AS SELECT id, user_id, content FROM memories WHERE status = 'active';
"""


def app_store(dim: int = TEST_DIM, user_id_type: str = "text", *, lineage: bool = True) -> str:
    sql = APP_MEMORIES.format(dim=dim, user_id_type=user_id_type)
    return sql + (APP_LINEAGE + APP_VIEW if lineage else "")


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


@contextlib.contextmanager
def application_writing(url: str) -> Iterator[None]:
    """An application transaction that inserted a memory and has not committed yet."""
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("INSERT INTO memories (user_id, content) VALUES ('u2', 'x')")
            yield
            conn.rollback()
    finally:
        engine.dispose()


def online_statements() -> list[str]:
    """The SQL block of docs/operations.md's 'Adopting an existing store', one by one."""
    text = OPERATIONS.read_text(encoding="utf-8").split("### Adopting an existing store", 1)[1]
    block = text.split("```sql", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if not line.lstrip().startswith("--")]
    return [part.strip() for part in "\n".join(lines).split(";") if part.strip()]


def untouched(url: str) -> bool:
    """Nothing of memory-gc's is in the database (the failed migration rolled back whole)."""
    return not scalar(
        url,
        "SELECT to_regclass('memory_gc_alembic_version') IS NOT NULL"
        " OR to_regclass('gc_runs') IS NOT NULL"
        " OR to_regclass('memories_ttl_idx') IS NOT NULL"
        " OR EXISTS (SELECT 1 FROM pg_constraint WHERE conname LIKE 'memories_%_check')",
    )


class TestAdoption:
    def test_adopts_a_contract_shaped_store_and_keeps_its_rows(
        self, empty_database_url, monkeypatch, capsys
    ):
        """An application's memories, lineage and view are kept; a run then works on them."""
        url = empty_database_url
        execute(url, app_store())
        code, out, err = migrate(monkeypatch, url, capsys)
        assert code == 0, err
        assert f"empty -> {schema.head_revision()}" in out
        assert scalar(url, "SELECT count(*) FROM memories") == 2
        assert scalar(url, "SELECT count(*) FROM pg_constraint WHERE conname LIKE"
                           " 'memories_%_check' AND convalidated") == 3  # fmt: skip
        indexes = adoption_columns.INDEXES
        assert scalar(url, "SELECT count(*) FROM pg_class WHERE relname = ANY(ARRAY"
                           f"{list(indexes)})") == len(indexes) - 1  # fmt: skip
        # the application's primary key stands for the pair key; its narrower view is kept
        assert scalar(url, "SELECT count(*) FROM active_memories") == 2
        assert cli.main(["run", "--job", "ttl_expiry", "--now", "2026-06-01T03:00:00Z"]) == 0
        deleted = "SELECT content FROM memories WHERE status = 'deleted'"
        assert scalar(url, deleted) == "likes tea"

    def test_adds_lineage_keys_and_the_view_when_missing(
        self, empty_database_url, monkeypatch, capsys
    ):
        """Only memories exists: migrate creates memory_lineage (cascading keys) and the view."""
        url = empty_database_url
        execute(url, app_store(lineage=False))
        assert migrate(monkeypatch, url, capsys)[0] == 0
        keys = "SELECT count(*) FROM pg_constraint WHERE conrelid = 'memory_lineage'::regclass" \
               " AND contype = 'f' AND confdeltype = 'c'"  # fmt: skip
        assert scalar(url, keys) == 2
        assert scalar(url, "SELECT count(*) FROM active_memories") == 1  # the expired row hides

    def test_lineage_without_keys_gets_them(self, empty_database_url, monkeypatch, capsys):
        """An application's lineage table without foreign keys or pair key gets both."""
        url = empty_database_url
        lineage = "CREATE TABLE memory_lineage (derived_id uuid, source_id uuid);"
        execute(url, app_store(lineage=False) + lineage)
        assert migrate(monkeypatch, url, capsys)[0] == 0
        keys = "SELECT count(*) FROM pg_constraint WHERE conrelid = 'memory_lineage'::regclass" \
               " AND contype = 'f' AND confdeltype = 'c' AND convalidated"  # fmt: skip
        assert scalar(url, keys) == 2
        assert scalar(url, "SELECT to_regclass('memory_lineage_pair_key') IS NOT NULL")

    def test_an_invalid_pair_index_is_no_pair_key(self, empty_database_url, monkeypatch, capsys):
        """A unique (derived_id, source_id) index left invalid (a failed CREATE INDEX
        CONCURRENTLY) enforces nothing: it was taken for the pair key, and lineage stayed
        without one (duplicate pairs double-count merged use)."""
        url = empty_database_url
        lineage = ("CREATE TABLE memory_lineage (derived_id uuid, source_id uuid);"
                   "CREATE UNIQUE INDEX lineage_pair_uq ON memory_lineage (derived_id, source_id);"
                   "UPDATE pg_index SET indisvalid = false"
                   " WHERE indexrelid = 'lineage_pair_uq'::regclass;")  # fmt: skip
        execute(url, app_store(lineage=False) + lineage)
        assert migrate(monkeypatch, url, capsys)[0] == 0
        assert scalar(url, "SELECT to_regclass('memory_lineage_pair_key') IS NOT NULL")

    def test_keeps_an_index_built_concurrently_beforehand(
        self, empty_database_url, monkeypatch, capsys
    ):
        """An index the operator built CONCURRENTLY under migrate's name is kept, not rebuilt."""
        url = empty_database_url
        execute(url, app_store())
        execute(url, "CREATE INDEX CONCURRENTLY memories_user_status_idx ON memories"
                     " (user_id, status)", autocommit=True)  # fmt: skip
        before = scalar(url, "SELECT 'memories_user_status_idx'::regclass::oid")
        assert migrate(monkeypatch, url, capsys)[0] == 0
        assert scalar(url, "SELECT 'memories_user_status_idx'::regclass::oid") == before

    def test_an_invalid_index_of_migrates_name_is_refused(
        self, empty_database_url, monkeypatch, capsys
    ):
        """A failed CREATE INDEX CONCURRENTLY leaves an invalid index: exit 2, drop it first."""
        url = empty_database_url
        execute(url, app_store())
        with pytest.raises(sa.exc.IntegrityError):  # u1 has two rows: the build fails
            execute(url, "CREATE UNIQUE INDEX CONCURRENTLY memories_user_status_idx"
                         " ON memories (user_id)", autocommit=True)  # fmt: skip
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "DROP INDEX memories_user_status_idx" in err
        assert untouched(url)

    def test_what_the_docs_build_beforehand_spares_a_live_table_the_long_locks(
        self, empty_database_url, monkeypatch, capsys
    ):
        """With docs/operations.md's online statements run first, migrate waits on no open
        transaction of the application (it would time out without them, changing nothing)."""
        url = empty_database_url
        execute(url, app_store())
        impatient = f"{url}&options=-c%20lock_timeout%3D2s"
        monkeypatch.setattr(schema, "MIGRATE_ATTEMPTS", 1)
        with application_writing(url):
            code, _, err = migrate(monkeypatch, impatient, capsys)
        assert code == 1 and "could not take a lock" in err, err
        assert untouched(url)
        for statement in online_statements():
            execute(url, statement, autocommit=True)
        with application_writing(url):
            code, _, err = migrate(monkeypatch, impatient, capsys)
        assert code == 0, err

    def test_migrate_never_queues_the_application_without_a_limit(
        self, empty_database_url, monkeypatch, capsys
    ):
        """Without a lock_timeout of the operator's, migrate waited for an open application
        transaction without limit, and every read and write of memories queued behind it. It
        now gives up after its own timeout, tries again, and then exits 1 with nothing
        changed; once the application's transaction ends it goes through."""
        url = empty_database_url
        execute(url, app_store())
        monkeypatch.setattr(schema, "MIGRATE_LOCK_TIMEOUT", "500ms")
        monkeypatch.setattr(schema, "MIGRATE_ATTEMPTS", 2)
        with application_writing(url):
            started = time.monotonic()
            code, _, err = migrate(monkeypatch, url, capsys)
            waited = time.monotonic() - started
        assert code == 1 and "could not take a lock" in err and "2 times" in err, err
        assert waited < 30 and untouched(url)
        assert migrate(monkeypatch, url, capsys)[0] == 0

    def test_a_lock_released_within_the_timeout_is_waited_for(
        self, empty_database_url, monkeypatch, capsys
    ):
        """Just inside migrate's lock timeout: an application transaction that ends sooner is
        waited for, and migrate goes through on its first attempt."""
        import threading

        url = empty_database_url
        execute(url, app_store())
        monkeypatch.setattr(schema, "MIGRATE_LOCK_TIMEOUT", "3s")
        monkeypatch.setattr(schema, "MIGRATE_ATTEMPTS", 1)
        with application_writing(url):
            done: list[tuple[int, str, str]] = []
            worker = threading.Thread(target=lambda: done.append(migrate(monkeypatch, url, capsys)))
            worker.start()
            time.sleep(0.5)  # migrate now waits on the application's transaction …
        worker.join(30)  # … which ended as the block closed, well within 3 s
        assert done and done[0][0] == 0, done

    def test_a_lock_timeout_of_the_urls_is_kept_even_zero(self, engine):
        """The URL's lock_timeout wins over migrate's default, 0 (wait without limit) too."""
        url = engine.url.render_as_string(hide_password=False)
        for options, expected in (("", "5s"), ("&options=-c%20lock_timeout%3D0", "0"),
                                  ("&options=-c%20lock_timeout%3D2s", "2s")):  # fmt: skip
            probe = db.make_engine(url + options)
            try:
                with probe.begin() as conn:
                    conn.exec_driver_sql(schema._migrate_lock())
                    assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == expected
            finally:
                probe.dispose()

    def test_another_dimension_names_the_setting(self, empty_database_url, monkeypatch, capsys):
        """A store of vector(1536) under embeddings.dim = 8: exit 2 with the value to set."""
        url = empty_database_url
        execute(url, app_store(dim=1536))
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "embeddings.dim = 1536" in err and "MEMORY_GC_EMBEDDINGS__DIM=1536" in err
        assert untouched(url)

    def test_a_table_that_does_not_fit_names_each_column_and_its_fix(
        self, empty_database_url, monkeypatch, capsys
    ):
        """Missing, mistyped and nullable columns are all listed with the statement to fix them;
        nothing is changed."""
        url = empty_database_url
        execute(url, app_store(user_id_type="varchar(64)"))
        execute(url, "ALTER TABLE memories DROP COLUMN slot, ALTER COLUMN pinned DROP NOT NULL,"
                     " ADD COLUMN tenant text NOT NULL DEFAULT 't';"
                     " ALTER TABLE memories ALTER COLUMN tenant DROP DEFAULT")  # fmt: skip
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "missing column slot: ALTER TABLE memories ADD COLUMN slot text;" in err
        assert "ALTER TABLE memories ALTER COLUMN user_id TYPE text USING user_id::text;" in err
        assert "ALTER TABLE memories ALTER COLUMN pinned SET NOT NULL;" in err
        assert "column tenant is NOT NULL without a default" in err
        assert untouched(url) and scalar(url, "SELECT to_regclass('active_memories')") is not None

    def test_a_use_never_tracked_is_explained_before_it_is_added(
        self, empty_database_url, monkeypatch, capsys
    ):
        """An application that never tracked last_accessed_at: the column the advice added was
        NULL, "never used", and the first usage_prune retired every row past unused_days at
        importance 3 or less, the default included (found by a review). The advice says so
        and how to start counting use at adoption instead."""
        url = empty_database_url
        execute(
            url, app_store(lineage=False) + "ALTER TABLE memories DROP COLUMN last_accessed_at;"
        )
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "ALTER TABLE memories ADD COLUMN last_accessed_at timestamptz;" in err
        assert "UPDATE memories SET last_accessed_at = now();" in err
        assert "[usage_prune] enabled = false" in err

    def test_scores_never_marked_assessed_are_explained_before_the_column_is_added(
        self, empty_database_url, monkeypatch, capsys
    ):
        """An application that kept importance but not importance_assessed_at: the column the
        advice added was NULL, "never assessed", so the first importance run had the model
        re-score every row, replacing the application's own scores (a 5 it set scored 1 is
        retired by decay, usage_prune or user_cap from the next run). Found by a review. The
        advice says so and how to keep them."""
        url = empty_database_url
        execute(
            url,
            app_store(lineage=False) + "ALTER TABLE memories DROP COLUMN importance_assessed_at;",
        )
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "ALTER TABLE memories ADD COLUMN importance_assessed_at timestamptz;" in err
        assert "UPDATE memories SET importance_assessed_at = now() WHERE importance <> 3;" in err
        assert "[importance] enabled = false" in err
        assert untouched(url)

    def test_rows_breaking_a_check_roll_the_whole_migration_back(
        self, empty_database_url, monkeypatch, capsys
    ):
        """A row with importance 7 fails the CHECK's validation: exit 2, nothing applied."""
        url = empty_database_url
        execute(url, app_store(lineage=False) + "UPDATE memories SET importance = 7;")
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "memories_importance_check" in err and "importance must be 1..5" in err
        assert untouched(url)
        assert scalar(url, "SELECT to_regclass('memory_lineage')") is None
        assert scalar(url, "SELECT count(*) FROM memories WHERE importance = 7") == 2

    def test_lineage_naming_a_missing_memory_is_refused(
        self, empty_database_url, monkeypatch, capsys
    ):
        """A lineage row whose source is gone cannot get the cascading key: exit 2."""
        url = empty_database_url
        dangling = (
            "CREATE TABLE memory_lineage (derived_id uuid, source_id uuid);"
            "INSERT INTO memory_lineage SELECT id, gen_random_uuid() FROM memories LIMIT 1;"
        )
        execute(url, app_store(lineage=False) + dangling)
        code, _, err = migrate(monkeypatch, url, capsys)
        assert code == 2, err
        assert "every source_id must be the id of a memory" in err
        assert untouched(url)

    def test_the_contract_matches_a_freshly_created_store(self, engine):
        """adoption_columns.MEMORIES and INDEXES say what migration 0001 creates on an empty
        database."""
        with engine.connect() as conn:
            columns = {col.name: col for col in adoption_columns.columns_of(conn, "memories")}
            assert list(columns) == [spec[0] for spec in adoption_columns.MEMORIES]
            for name, type_, not_null, default in adoption_columns.MEMORIES:
                assert (
                    adoption_columns._column_problems(columns[name], type_, not_null, TEST_DIM)
                    == []
                )
                assert columns[name].not_null == not_null
                assert columns[name].filled == (default is not None)
            assert adoption.memories_problems(conn, TEST_DIM) == []
            assert adoption_columns.lineage_problems(conn) == []
            indexes = set(
                conn.exec_driver_sql(
                    "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid IN"
                    " ('memories'::regclass, 'memory_lineage'::regclass)"
                ).scalars()
            )
        assert set(adoption_columns.INDEXES) - indexes == {
            "memory_lineage_pair_key"
        }  # the primary key


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

    def test_a_store_owned_by_another_role_names_the_owner(
        self, empty_database_url, role, monkeypatch, capsys
    ):
        """migrate alters the application's table, so it must run as its owner: exit 2."""
        url = empty_database_url
        execute(url, app_store() + f"GRANT CREATE ON SCHEMA public TO {role};")
        try:
            code, _, err = migrate(monkeypatch, as_role(url, role), capsys)
        finally:
            execute(url, f"REVOKE CREATE ON SCHEMA public FROM {role};")
        assert code == 2, err
        assert "memories belongs to role postgres" in err
        assert untouched(url)


class TestConcurrentMigrates:
    def test_a_second_migrate_waits_for_the_first(self, empty_database_url):
        """migrate takes its advisory lock before it reads the revision: while another
        transaction holds it, migrate waits; then it creates the schema."""
        holder = db.make_engine(empty_database_url)
        engine = db.make_engine(empty_database_url)
        result: list[object] = []
        try:
            with holder.connect() as conn:
                conn.exec_driver_sql(schema._migrate_lock())
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
