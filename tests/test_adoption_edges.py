"""Adopting a store and migrating, edge cases a review reproduced (each failed before its fix):
foreign keys without a lineage table, CHECKs refusing what the worker writes, lock_timeout,
indexes of migrate's names elsewhere, a deferrable key, the scans of a large table."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from gc_worker import cli, db, schema
from tests.test_migrate import app_store, execute, migrate, scalar, untouched

VOTES = ("CREATE TABLE memory_votes (memory_id uuid NOT NULL REFERENCES memories (id),"
         " vote int NOT NULL);")  # fmt: skip


def test_fk_blocking_purge_is_named_when_the_app_has_no_memory_lineage(
    empty_database_url, monkeypatch, capsys
):
    """A foreign key that would refuse a purge is named also when the application has no
    memory_lineage table (the check compared with a NULL and missed every one)."""
    url = empty_database_url
    execute(
        url,
        app_store(lineage=False)
        + VOTES
        + "UPDATE memories SET status = 'deleted', deleted_at = '2026-01-01Z',"
        " status_changed_at = '2026-01-01Z' WHERE content = 'likes tea';"
        "INSERT INTO memory_votes SELECT id, 1 FROM memories WHERE content = 'likes tea';",
    )
    code, _, err = migrate(monkeypatch, url, capsys)
    if code == 0:  # show the consequence: the nightly purge fails its batch
        run = cli.main(["run", "--job", "hard_delete", "--now", "2026-06-01T03:00:00Z"])
        err += capsys.readouterr().err
        pytest.fail(f"adopted (exit 0); hard_delete then exit {run}: {err[-400:]}")
    assert code == 2 and "memory_votes.memory_votes_memory_id_fkey" in err, err
    assert untouched(url)


@pytest.mark.parametrize("name", ["memories_status_check", "app_status_ck"])
def test_an_existing_check_that_forbids_worker_values_is_refused(
    empty_database_url, monkeypatch, capsys, name
):
    """An application CHECK (under migrate's own name or any other) that forbids a status
    the worker writes is named (it was adopted, then every ttl_expiry batch failed)."""
    url = empty_database_url
    execute(url, app_store() + f"ALTER TABLE memories ADD CONSTRAINT {name}"
                 " CHECK (status IN ('active', 'archived'));")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    if code == 0:
        run = cli.main(["run", "--job", "ttl_expiry", "--now", "2026-06-01T03:00:00Z"])
        err += capsys.readouterr().err
        pytest.fail(f"adopted (exit 0); ttl_expiry then exit {run}: {err[-300:]}")
    assert code == 2 and name in err, err


def test_a_check_on_status_reason_that_refuses_the_workers_reasons_is_refused(
    empty_database_url, monkeypatch, capsys
):
    """The application enumerates its own status reasons. The probe set statuses one value at
    a time and never a status_reason: the store was adopted, then every batch that retired a
    row failed, every night (a review found it)."""
    url = empty_database_url
    check = "status_reason IS NULL OR status_reason IN ('user_deleted', 'archived')"
    execute(
        url, app_store() + f"ALTER TABLE memories ADD CONSTRAINT app_reason_ck CHECK ({check});"
    )
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and "app_reason_ck" in err and "ttl_expired" in err, err


def test_a_check_the_worker_satisfies_is_not_refused(empty_database_url, monkeypatch, capsys):
    """'A deleted row has its deleted_at': the worker always stamps deleted_at when it
    soft-deletes, yet the one-value probe inserted status 'deleted' alone and refused the
    store, telling the operator to drop a constraint the worker never violates."""
    url = empty_database_url
    execute(url, app_store() + "ALTER TABLE memories ADD CONSTRAINT app_deleted_ck CHECK"
                 " (status <> 'deleted' OR deleted_at IS NOT NULL);")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err
    execute(url, "INSERT INTO memories (user_id, content, expires_at)"
                 " VALUES ('u1', 'Is in Rome this week', '2026-05-01Z')")  # fmt: skip
    assert cli.main(["run", "--job", "ttl_expiry", "--now", "2026-06-01T03:00:00Z"]) == 0
    rome = (
        "SELECT status, deleted_at IS NOT NULL FROM memories WHERE content = 'Is in Rome this week'"
    )
    assert scalar(url, rome) == "deleted"


@pytest.mark.parametrize(
    ("name", "check"),
    [("app_obsolete_ck", "status <> 'obsolete' OR superseded_by IS NOT NULL"),
     ("app_closed_ck", "status <> 'obsolete' OR valid_until IS NOT NULL")],
)  # fmt: skip
def test_a_check_the_worker_breaks_on_an_ended_or_rejected_fact_is_refused(
    empty_database_url, monkeypatch, capsys, name, check
):
    """ "An obsolete row names what replaced it", "an obsolete row's window is closed": the
    contradiction job retires an override whose window ended with nothing replacing it, and a
    review rejects a fact without closing its window. The whole-row probe gave every obsolete
    row a replacement and a closed window, so both CHECKs were adopted, and every batch with an
    ended override then failed (a review found it)."""
    url = empty_database_url
    execute(url, app_store() + f"ALTER TABLE memories ADD CONSTRAINT {name} CHECK ({check});")
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and name in err, err


def test_the_probe_knows_every_status_change_the_worker_writes():
    """Every reason a job, a restore, a review or an erasure retires (or reactivates) a row
    with is probed against the application's CHECKs, with the status it goes with."""
    import jobs.compaction as compaction
    import jobs.contradiction_rules as contradiction
    import jobs.decay as decay
    import jobs.ttl_expiry as ttl
    import jobs.usage_prune as usage
    import jobs.user_cap_records as user_cap
    from gc_worker.actions import ERASURE_REASONS
    from gc_worker.adoption_probes import STATUS_WRITES
    from gc_worker.read_rule import SUPERSESSION_REASONS

    written = {
        *(("deleted", r) for r in (ttl.REASON, decay.REASON, usage.REASON, user_cap.REASON,
                                    user_cap.SUMMARIZED, *ERASURE_REASONS, "restored")),
        *(("obsolete", r) for r in (*contradiction.REASONS.values(), *SUPERSESSION_REASONS,
                                     "review_rejected")),
        *(("merged", r) for r in (compaction.EXACT, compaction.NEAR)),
        ("active", "erasure_reactivated"),
    }  # fmt: skip
    assert written <= set(STATUS_WRITES)


def test_concurrent_migrate_waits_even_under_the_documented_lock_timeout(
    empty_database_url, monkeypatch, capsys
):
    """With the lock_timeout docs/operations.md suggests in the URL, a second migrate still
    waits for the first (it used to give up with LockNotAvailable, exit 1)."""
    holder = db.make_engine(empty_database_url)
    try:
        with holder.connect() as conn:
            conn.exec_driver_sql(schema._migrate_lock())
            release = threading.Timer(3.0, conn.connection.dbapi_connection.rollback)
            release.start()
            url = f"{empty_database_url}&options=-c%20lock_timeout%3D1s"
            code, out, err = migrate(monkeypatch, url, capsys)
            release.join()
    finally:
        holder.dispose()
    assert code == 0 and "empty ->" in out, err


def test_an_index_of_a_worker_name_on_another_table_does_not_replace_the_worker_index(
    empty_database_url, monkeypatch, capsys
):
    """An index of one of migrate's names on another table (a renamed old table) is named:
    migrate used to take it for its own and leave memories without it."""
    url = empty_database_url
    execute(
        url,
        "CREATE TABLE memories_old (user_id text, status text);"
        " CREATE INDEX memories_user_status_idx ON memories_old (user_id, status);",
    )
    code, _, err = migrate(monkeypatch, url, capsys)
    on_memories = scalar(url, "SELECT count(*) FROM pg_index WHERE indrelid = 'memories'::regclass"
                              " AND indexrelid::regclass::text = 'memories_user_status_idx'") \
        if code == 0 else None  # fmt: skip
    assert code == 2 and "memories_user_status_idx is on memories_old" in err, (code, err)
    assert on_memories is None


def test_a_deferrable_primary_key_on_id_is_refused_with_exit_2(
    empty_database_url, monkeypatch, capsys
):
    """A DEFERRABLE key on id cannot back lineage's foreign key: exit 2 with the fix (it was
    exit 1 with the raw database error)."""
    url = empty_database_url
    execute(url, app_store(lineage=False) + "ALTER TABLE memories DROP CONSTRAINT memories_pkey,"
                 " ADD PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and "id" in err, (code, err)


def test_adoption_validates_the_three_checks_in_one_scan(empty_database_url, monkeypatch, capsys):
    """Under ACCESS EXCLUSIVE, the three CHECKs are added in one ALTER TABLE: one scan of the
    table for all three (6 index builds + 1 = 7 scans; it was three NOT VALID + VALIDATE)."""
    url = empty_database_url
    execute(
        url,
        app_store(lineage=False) + "INSERT INTO memories (user_id, content)"
        " SELECT 'u' || mod(g, 100), 'x' || g FROM generate_series(1, 50000) g;",
    )
    time.sleep(1)
    scans = "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'memories'"
    before = scalar(url, scans)
    code, _, err = migrate(monkeypatch, f"{url}&options=-c%20max_parallel_maintenance_workers%3D0",
                           capsys)  # fmt: skip
    assert code == 0, err
    time.sleep(1)
    assert scalar(url, scans) - before <= 7


def test_a_store_without_observed_at_is_told_to_backfill_it_from_created_at(
    empty_database_url, monkeypatch, capsys
):
    """observed_at is memory-gc's own notion; an application's table usually lacks it. Adding
    it with DEFAULT now() stamped every existing row with one instant, and a slot's values were
    then ranked by id (a review found the stale 2024 value read instead of the 2026 one). The
    message now backfills it from created_at; run as told, the newest value is read."""
    from datetime import UTC, datetime

    from gc_worker import db
    from gc_worker.read_rule import current_memories
    from tests.test_migrate import app_store, execute, migrate

    url = empty_database_url
    execute(url, app_store(lineage=False) + """
        ALTER TABLE memories DROP COLUMN observed_at;
        INSERT INTO memories (id, user_id, content, slot, created_at, updated_at) VALUES
          ('ffffffff-ffff-4fff-bfff-ffffffffffff', 'u9', 'Lives in Berlin', 'home',
           '2024-01-01Z', '2024-01-01Z'),
          ('00000000-0000-4000-8000-000000000001', 'u9', 'Lives in Paris', 'home',
           '2026-01-01Z', '2026-01-01Z');""")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    fix = (
        "ALTER TABLE memories ADD COLUMN observed_at timestamptz; UPDATE memories SET"
        " observed_at = created_at; ALTER TABLE memories ALTER COLUMN observed_at SET DEFAULT"
        " now(), ALTER COLUMN observed_at SET NOT NULL;"
    )
    assert code == 2 and fix in err, err
    execute(url, fix)  # what the message says to run
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err
    engine = db.make_engine(url)
    try:
        shown = [m["content"] for m in current_memories(engine, "u9", None, datetime.now(UTC))]
    finally:
        engine.dispose()
    assert shown == ["Lives in Paris"]


SLOW_CHECK = """
CREATE FUNCTION app_slow_ok(t text) RETURNS boolean LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_sleep(0.12); RETURN true; END $$;
ALTER TABLE memories ADD CONSTRAINT app_slow CHECK (app_slow_ok(content)) NOT VALID;
"""


def test_a_statement_timeout_of_the_database_or_role_does_not_cancel_migrate(
    empty_database_url, monkeypatch, capsys
):
    """A database's or role's statement_timeout (set for the application's queries) cancelled
    migrate: its wait for a concurrent migrate, its probe of the application's CHECKs (then
    misreported as a CHECK that refuses the worker's rows), its index builds on a large table —
    exit 1 or 2 with the wrong fix. Migrate's waits are bounded by its lock_timeout; it now sets
    statement_timeout to 0 in its transaction. Found by a review."""
    url = empty_database_url
    name = sa.engine.make_url(url).database
    execute(url, app_store(lineage=False) + SLOW_CHECK
            + f"ALTER DATABASE {name} SET statement_timeout = '50ms';")  # fmt: skip
    holder = db.make_engine(url)
    try:
        with holder.connect() as conn:
            conn.exec_driver_sql("SET statement_timeout = 0;" + schema._migrate_lock())
            release = threading.Timer(1.0, conn.connection.dbapi_connection.rollback)
            release.start()
            code, out, err = migrate(monkeypatch, url, capsys)
            release.join()
    finally:
        holder.dispose()
    assert code == 0 and out.endswith(f"-> {schema.head_revision()}\n"), err


def test_a_transaction_timeout_of_the_database_does_not_end_migrate(
    empty_database_url, monkeypatch, capsys
):
    """PostgreSQL 17+: a database's or role's transaction_timeout ended migrate's transaction
    (FATAL, exit 1) while it waited for a concurrent migrate, whose wait has no limit by
    design. Found by a review of the statement_timeout fix."""
    url = empty_database_url
    name = sa.engine.make_url(url).database
    execute(url, app_store(lineage=False)
            + f"ALTER DATABASE {name} SET transaction_timeout = '300ms';")  # fmt: skip
    holder = db.make_engine(url)
    try:
        with holder.connect() as conn:
            conn.exec_driver_sql("SET transaction_timeout = 0;" + schema._migrate_lock())
            release = threading.Timer(1.0, conn.connection.dbapi_connection.rollback)
            release.start()
            code, out, err = migrate(monkeypatch, url, capsys)
            release.join()
    finally:
        holder.dispose()
    assert code == 0 and out.endswith(f"-> {schema.head_revision()}\n"), err


def test_the_urls_transaction_timeout_is_kept_and_named_when_it_ends_migrate(
    empty_database_url, monkeypatch, capsys
):
    url = empty_database_url
    execute(url, app_store(lineage=False) + SLOW_CHECK)
    code, _, err = migrate(monkeypatch, f"{url}&options=-c%20transaction_timeout%3D200ms", capsys)
    assert code == 2 and "transaction_timeout" in err and "nothing was changed" in err, err
    assert untouched(url)


def test_the_urls_statement_timeout_is_kept_and_named_when_it_cancels_migrate(
    empty_database_url, monkeypatch, capsys
):
    """One set in the URL (options=-c statement_timeout=…) is the operator's for this
    command: kept, and when it cancels a statement, named with the fix (exit 2), nothing
    applied."""
    url = empty_database_url
    execute(url, app_store(lineage=False) + SLOW_CHECK)
    code, _, err = migrate(monkeypatch, f"{url}&options=-c%20statement_timeout%3D50ms", capsys)
    assert code == 2 and "statement_timeout" in err and "nothing was changed" in err, err
    assert "CHECK of yours" not in err, err
    assert untouched(url)


@pytest.mark.parametrize(
    "check", ["valid_until > valid_from", "valid_until >= valid_from"]
)  # fmt: skip
def test_a_check_that_a_closed_window_is_not_empty_is_refused(
    empty_database_url, monkeypatch, capsys, check
):
    """A slot's loser is closed at the winner's start, which can be the loser's own start (or,
    for a more trusted winner that began earlier, before it). The probe's obsolete rows left
    valid_from NULL, so a natural "the window is not empty" CHECK was adopted, and every
    contradiction batch closing such a row then failed, every night (found by a review)."""
    url = empty_database_url
    execute(url, app_store() + "ALTER TABLE memories ADD CONSTRAINT window_not_empty CHECK"
                 f" (valid_until IS NULL OR valid_from IS NULL OR {check});")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and "CHECK window_not_empty" in err, err
    assert untouched(url)


def test_a_not_null_domain_column_with_a_default_does_not_fail_merges_or_their_restore(
    empty_database_url, monkeypatch, capsys
):
    """An application column whose type is a NOT NULL domain, with a default, is adopted.
    Found by a review: the worker built merged records with
    jsonb_populate_recordset(NULL::memories, …), which runs every field the JSON lacks through
    its type — the domain refused the NULL, and every merging batch failed, every night (and
    so would a restore of a merge)."""
    url = empty_database_url
    emb = "'[1,0,0,0,0,0,0,0]'"
    execute(url, "CREATE EXTENSION IF NOT EXISTS vector; CREATE DOMAIN tenant_id AS text NOT NULL;"
            + app_store() + "ALTER TABLE memories ADD COLUMN tenant tenant_id DEFAULT 'acme';"
            "INSERT INTO memories (user_id, content, embedding, created_at) VALUES"
            f" ('u3', 'likes green tea', {emb}, '2026-04-01T00:00:00Z'),"
            f" ('u3', 'likes green tea', {emb}, '2026-04-02T00:00:00Z');")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err
    assert cli.main(["run", "--job", "compaction", "--now", "2026-06-01T03:00:00Z"]) == 0, (
        capsys.readouterr().err[-1500:]
    )
    merged = "SELECT count(*) FROM memories WHERE user_id = 'u3' AND status = 'merged'"
    assert scalar(url, merged) == 2
    assert scalar(url, "SELECT tenant FROM memories WHERE source = 'gc_merge'") == "acme"
    run_id = scalar(url, "SELECT id FROM gc_runs WHERE mode = 'apply'")
    assert cli.main(["restore", "--run", str(run_id)]) == 0, capsys.readouterr().err[-1500:]
    assert scalar(url, merged) == 0
    assert scalar(url, "SELECT status FROM memories WHERE source = 'gc_merge'") == "deleted"


@pytest.mark.parametrize("runtime_path", ["public,ext", "public"])
def test_records_are_made_with_pgvector_off_the_workers_search_path(
    empty_database_url, monkeypatch, capsys, settings, runtime_path
):
    """pgvector in its own schema, visible when migrate ran, not on the search path the worker
    runs with later (another role, another URL). Found by a review: insert_records named the
    type `vector` and every merging batch failed; it now reads the embedding as real[], which
    pgvector casts on assignment."""
    from tests.store import run

    def with_path(path: str) -> str:
        sep = "&" if "?" in empty_database_url else "?"
        return f"{empty_database_url}{sep}options=-csearch_path%3D{path}"

    execute(empty_database_url, "CREATE SCHEMA ext; CREATE EXTENSION vector SCHEMA ext;")
    store = with_path("public,ext")
    execute(store, app_store().replace("CREATE EXTENSION IF NOT EXISTS vector;", ""))
    code, _, err = migrate(monkeypatch, store, capsys)
    assert code == 0, err
    emb = "[" + ",".join(["1"] + ["0"] * 7) + "]"
    rows = [f"('u9', 'Lives in Lyon', '{emb}', '2026-05-0{d}Z', '2026-05-31Z', 5)" for d in (1, 2)]
    columns = "user_id, content, embedding, created_at, last_accessed_at, importance"
    execute(
        store, f"DELETE FROM memories; INSERT INTO memories ({columns}) VALUES " + ", ".join(rows)
    )
    engine = db.make_engine(with_path(runtime_path))
    try:
        report = run(engine, settings, jobs=["compaction"])
        assert report["status"] == "completed", report.get("error")
        with engine.connect() as conn:
            merged = conn.execute(sa.text("SELECT embedding::text FROM memories"
                                          " WHERE source = 'gc_merge'")).scalar_one()  # fmt: skip
        assert merged == emb
    finally:
        engine.dispose()
