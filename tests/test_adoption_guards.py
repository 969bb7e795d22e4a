"""Adoption refuses an application's store whose own rules would make the worker act wrongly
(exit 2, naming the fix): row-level security hiding rows, foreign keys that refuse a purge, a
lineage column the worker cannot fill, a trigger that stamps updated_at on any update. Each of
these was adopted before and then failed or misbehaved every night (found by a review)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gc_worker import db
from tests.test_migrate import app_store, as_role, execute, migrate, role, scalar  # noqa: F401


def refused(monkeypatch, url, capsys, *needles: str) -> None:
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    for needle in needles:
        assert needle in err, err
    assert scalar(url, "SELECT to_regclass('gc_runs') IS NULL")  # nothing half-applied


def test_a_lineage_column_the_worker_cannot_fill_is_named(empty_database_url, monkeypatch, capsys):
    lineage = ("CREATE TABLE memory_lineage (derived_id uuid NOT NULL, source_id uuid NOT NULL,"
               " relation text NOT NULL, PRIMARY KEY (derived_id, source_id));")  # fmt: skip
    execute(empty_database_url, app_store(lineage=False) + lineage)
    refused(monkeypatch, empty_database_url, capsys, "memory_lineage.relation is NOT NULL")


def test_a_foreign_key_that_would_refuse_a_purge_is_named(empty_database_url, monkeypatch, capsys):
    votes = ("CREATE TABLE memory_votes (memory_id uuid NOT NULL REFERENCES memories (id),"
             " vote int NOT NULL);")  # fmt: skip
    execute(empty_database_url, app_store() + votes)
    refused(monkeypatch, empty_database_url, capsys, "memory_votes.memory_votes_memory_id_fkey",
            "ON DELETE CASCADE")  # fmt: skip


def test_a_cascading_foreign_key_is_fine(empty_database_url, monkeypatch, capsys):
    votes = ("CREATE TABLE memory_votes (memory_id uuid REFERENCES memories (id)"
             " ON DELETE CASCADE);")  # fmt: skip
    execute(empty_database_url, app_store() + votes)
    assert migrate(monkeypatch, empty_database_url, capsys)[0] == 0


TOUCH = """
CREATE FUNCTION app_touch() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN NEW.updated_at := now(); RETURN NEW; END $$;
"""


def test_a_trigger_on_any_update_is_named_one_on_the_apps_columns_is_fine(
    empty_database_url, monkeypatch, capsys
):
    """A BEFORE UPDATE trigger stamping updated_at on any update would take every score the
    worker writes for an edit (decay never forgets; restore keeps every merge); limited to the
    application's columns (UPDATE OF content, …) it never fires on the worker's writes."""
    url = empty_database_url
    execute(url, app_store() + TOUCH + "CREATE TRIGGER memories_touch BEFORE UPDATE ON memories"
                 " FOR EACH ROW EXECUTE FUNCTION app_touch();")  # fmt: skip
    refused(monkeypatch, url, capsys, "trigger memories_touch", "BEFORE UPDATE OF content")
    execute(url, "DROP TRIGGER memories_touch ON memories;"
                 "CREATE TRIGGER memories_touch BEFORE UPDATE OF content, metadata ON memories"
                 " FOR EACH ROW EXECUTE FUNCTION app_touch();")  # fmt: skip
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_row_level_security_that_hides_rows_is_named(
    pg_server, empty_database_url, role, monkeypatch, capsys  # noqa: F811
):  # fmt: skip
    """Under a per-user policy the worker (the owner, FORCE ROW LEVEL SECURITY) sees no row:
    it used to adopt the table, then complete a user's forget-me request as "no rows left"
    while both of the user's memories stayed active."""
    url = empty_database_url
    name = sa.engine.make_url(url).database
    execute(url, "CREATE EXTENSION vector")
    pg_server.psql(f"ALTER DATABASE {name} OWNER TO {role};")
    mine = as_role(url, role)
    try:
        execute(mine, app_store(lineage=False) +
                "ALTER TABLE memories ENABLE ROW LEVEL SECURITY;"
                "ALTER TABLE memories FORCE ROW LEVEL SECURITY;"
                "CREATE POLICY per_user ON memories"
                " USING (user_id = current_setting('app.user_id', true));")  # fmt: skip
        code, _, err = migrate(monkeypatch, mine, capsys)
        assert code == 2 and "row-level security" in err and "BYPASSRLS" in err, err
        execute(mine, "ALTER TABLE memories NO FORCE ROW LEVEL SECURITY;")  # the owner sees all
        assert migrate(monkeypatch, mine, capsys)[0] == 0
    finally:
        execute(url, f"DROP OWNED BY {role}")
        pg_server.psql(f"ALTER DATABASE {name} OWNER TO postgres;")


def test_row_level_security_is_checked_for_the_role_the_worker_runs_as(
    empty_database_url, role, monkeypatch, capsys  # noqa: F811
):  # fmt: skip
    """migrate, run as the table's owner (RLS does not apply), passed the check; the worker
    then ran as a least-privileged role under the same policy and completed a user's forget-me
    request as "no memories left" while the user's rows stayed (found by a review). Every
    command now refuses such a role (exit 2) before it changes anything."""
    from gc_worker import cli

    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ENABLE ROW LEVEL SECURITY;"
            "CREATE POLICY per_user ON memories"
            " USING (user_id = current_setting('app.user_id', true));")  # fmt: skip
    assert migrate(monkeypatch, url, capsys)[0] == 0  # as the owner: RLS does not apply
    execute(url, f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};"
                 f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role};")  # fmt: skip
    execute(url, "INSERT INTO gc_erasure_requests (kind, user_id) VALUES ('user', 'u1')")
    try:
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", as_role(url, role))
        code = cli.main(["run", "--now", "2026-06-01T03:00:00Z"])
        err = capsys.readouterr().err
    finally:
        execute(url, f"DROP OWNED BY {role}")
    assert code == 2 and "row-level security" in err and "BYPASSRLS" in err, err
    assert scalar(url, "SELECT status FROM gc_erasure_requests WHERE user_id = 'u1'") == "pending"
    assert scalar(url, "SELECT count(*) FROM gc_runs") == 0


def test_a_check_on_a_column_of_yours_that_refuses_its_default_is_named(
    empty_database_url, monkeypatch, capsys
):
    """A column of the application's kept NOT NULL by a CHECK (the online way to add NOT NULL)
    refuses a merged record, which leaves the column at its default: adopted before, every
    compaction batch with a merge then failed, every night (found by a review). A CHECK the
    default passes, or one on a column the worker never writes to a row that has it, is fine."""
    url = empty_database_url
    tenant = ("ALTER TABLE memories ADD COLUMN tenant_id text;"
              "ALTER TABLE memories ADD CONSTRAINT memories_tenant_set"
              " CHECK (tenant_id IS NOT NULL) NOT VALID;")  # fmt: skip
    execute(url, app_store(lineage=False) + tenant)
    refused(monkeypatch, url, capsys, "memories_tenant_set", "a merged record")
    execute(url, "ALTER TABLE memories ALTER COLUMN tenant_id SET DEFAULT 'shared';"
                 "ALTER TABLE memories ADD CONSTRAINT memories_tenant_short"
                 " CHECK (length(tenant_id) < 40);")  # fmt: skip
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_a_unique_index_a_merged_record_would_violate_is_named(
    empty_database_url, monkeypatch, capsys
):
    """An application's dedupe key UNIQUE (user_id, content): the exact-duplicate merge
    inserts a record with its earliest member's text while the member stays (merged), so the
    batch failed every night. A unique key with a column of the application's is fine."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ADD CONSTRAINT memories_user_content_key"
            " UNIQUE (user_id, content);")  # fmt: skip
    refused(monkeypatch, url, capsys, "unique index memories_user_content_key",
            "ALTER TABLE memories DROP CONSTRAINT memories_user_content_key")  # fmt: skip
    execute(
        url,
        "ALTER TABLE memories DROP CONSTRAINT memories_user_content_key;"
        "ALTER TABLE memories ADD COLUMN external_id text;"
        "CREATE UNIQUE INDEX memories_external_key ON memories (user_id, external_id);",
    )
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_a_store_in_another_schema_than_memory_gcs_is_named(
    empty_database_url, monkeypatch, capsys
):
    """search_path=gc,public with the application's memories in public: migrate put its view
    and functions in gc, naming the tables unqualified, and the application's session then
    failed in them (memory_gc_current: relation "gc_actions" does not exist; every insert
    under the tombstone trigger). Found by a review."""
    url = empty_database_url
    execute(url, app_store(lineage=False) + "CREATE SCHEMA gc;")
    code, _, err = migrate(monkeypatch, f"{url}&options=-csearch_path%3Dgc,public", capsys)
    assert code == 2 and "memories is in schema public" in err and "put public first" in err, err
    assert scalar(url, "SELECT to_regclass('gc.gc_runs') IS NULL")


def test_pgvector_outside_the_search_path_is_named(empty_database_url, monkeypatch, capsys):
    """pgvector created in public (as a superuser does), memory-gc given schema app alone:
    migrate failed half-way, exit 1, 'type "vector" does not exist'."""
    url = empty_database_url
    execute(url, "CREATE EXTENSION vector; CREATE SCHEMA app;")
    code, _, err = migrate(monkeypatch, f"{url}&options=-csearch_path%3Dapp", capsys)
    assert code == 2 and "pgvector is installed in schema public" in err, err
    code, _, err = migrate(monkeypatch, f"{url}&options=-csearch_path%3Dapp,public", capsys)
    assert code == 0, err
    assert scalar(url, "SELECT to_regclass('app.memories') IS NOT NULL")


def test_the_probe_lists_a_missing_column_and_spares_the_applications_sequence(
    empty_database_url, monkeypatch, capsys
):
    """The probe of whole merged records named a column the table lacked (exit 1, a raw
    UndefinedColumn, instead of the list of fixes), and drew 24 numbers from the application's
    sequence (nextval is never rolled back). Found by a review of the probe's first version."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ADD COLUMN seq bigserial;"
            "ALTER TABLE memories ADD CONSTRAINT content_set CHECK (content <> '');")  # fmt: skip
    before = scalar(url, "SELECT last_value FROM memories_seq_seq")
    execute(url, "ALTER TABLE memories DROP COLUMN observed_at;")
    refused(monkeypatch, url, capsys, "missing column observed_at")
    assert scalar(url, "SELECT last_value FROM memories_seq_seq") == before
    execute(url, "ALTER TABLE memories ADD COLUMN observed_at timestamptz NOT NULL DEFAULT now()")
    assert migrate(monkeypatch, url, capsys)[0] == 0
    assert scalar(url, "SELECT last_value FROM memories_seq_seq") == before


def test_a_default_that_fails_outside_the_applications_session_is_named(
    empty_database_url, monkeypatch, capsys
):
    """A default reading the application's session setting fails in every merged record the
    worker inserts: named (exit 2), not a raw exit 1."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ADD COLUMN tenant text;"
            "ALTER TABLE memories ALTER COLUMN tenant SET DEFAULT current_setting('app.tenant');"
            "ALTER TABLE memories ADD CONSTRAINT content_set CHECK (content <> '');")  # fmt: skip
    refused(monkeypatch, url, capsys, "a row the worker writes fails in a default or CHECK",
            "app.tenant")  # fmt: skip


def test_unique_indexes_a_merged_record_cannot_violate_are_fine(
    empty_database_url, monkeypatch, capsys
):
    """Keyed on id (a merged record has a new one), an expression or a predicate over a column
    of the application's (NULL in a merged record): the first version refused all three."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ADD COLUMN external_ref text;"
            "ALTER TABLE memories ADD CONSTRAINT memories_id_user_key UNIQUE (id, user_id);"
            "CREATE UNIQUE INDEX memories_ext ON memories (user_id, lower(external_ref));"
            "CREATE UNIQUE INDEX memories_imported ON memories (user_id, content)"
            " WHERE external_ref IS NOT NULL;")  # fmt: skip
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_an_exclusion_constraint_a_merged_record_would_violate_is_named(
    empty_database_url, monkeypatch, capsys
):
    """An exclusion constraint is a unique rule too (EXCLUDE (user_id WITH =, content WITH =),
    or a hash of the text among active rows): it was adopted, and every batch merging exact
    duplicates then failed, every night. One keyed on id is fine. Found by a review."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ADD CONSTRAINT app_dedupe"
            " EXCLUDE USING btree (user_id WITH =, content WITH =);")  # fmt: skip
    refused(monkeypatch, url, capsys, "exclusion constraint app_dedupe",
            "ALTER TABLE memories DROP CONSTRAINT app_dedupe")  # fmt: skip
    execute(url, "ALTER TABLE memories DROP CONSTRAINT app_dedupe;"
                 "ALTER TABLE memories ADD CONSTRAINT app_active_text EXCLUDE USING hash"
                 " ((user_id || ':' || content) WITH =) WHERE (status = 'active');")  # fmt: skip
    refused(monkeypatch, url, capsys, "exclusion constraint app_active_text")
    execute(url, "ALTER TABLE memories DROP CONSTRAINT app_active_text;"
                 "ALTER TABLE memories ADD CONSTRAINT app_id_user"
                 " EXCLUDE USING btree (id WITH =, user_id WITH =);")  # fmt: skip
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_a_unique_constraint_is_dropped_as_a_constraint(empty_database_url, monkeypatch, capsys):
    """DROP INDEX of an index that backs a UNIQUE constraint fails ("constraint … requires
    it"): the advice names ALTER TABLE … DROP CONSTRAINT; a bare unique index, DROP INDEX."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "ALTER TABLE memories ADD CONSTRAINT memories_user_content_key"
            " UNIQUE (user_id, content);")  # fmt: skip
    refused(
        monkeypatch, url, capsys, "ALTER TABLE memories DROP CONSTRAINT memories_user_content_key"
    )
    execute(url, "ALTER TABLE memories DROP CONSTRAINT memories_user_content_key;"
                 "CREATE UNIQUE INDEX app_text ON memories (user_id, content);")  # fmt: skip
    refused(monkeypatch, url, capsys, "DROP INDEX app_text")


@pytest.mark.parametrize("action", ["SET NULL", "SET DEFAULT"])
def test_a_key_set_to_null_on_a_not_null_column_is_named(
    empty_database_url, monkeypatch, capsys, action
):
    """ON DELETE SET NULL (or SET DEFAULT, with no default) onto a NOT NULL column refuses the
    purge as surely as NO ACTION: it was adopted, then hard_delete failed its batch every night
    and a forget-me with --purge-now never completed. Nullable, it is fine. Found by a review."""
    url = empty_database_url
    execute(url, app_store() + "CREATE TABLE memory_votes (memory_id uuid NOT NULL"
                 f" REFERENCES memories (id) ON DELETE {action}, vote int);")  # fmt: skip
    refused(monkeypatch, url, capsys, "memory_votes.memory_votes_memory_id_fkey",
            "memory_id is NOT NULL")  # fmt: skip
    execute(url, "ALTER TABLE memory_votes ALTER COLUMN memory_id DROP NOT NULL;")
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_a_key_setting_only_its_nullable_column_is_fine(empty_database_url, monkeypatch, capsys):
    """ON DELETE SET NULL (memory_id) on a key (user_id, memory_id) sets memory_id alone:
    user_id being NOT NULL does not matter."""
    url = empty_database_url
    execute(url, app_store()
            + "ALTER TABLE memories ADD CONSTRAINT memories_user_id_key UNIQUE (user_id, id);"
            "CREATE TABLE memory_votes (user_id text NOT NULL, memory_id uuid,"
            " FOREIGN KEY (user_id, memory_id) REFERENCES memories (user_id, id)"
            " ON DELETE SET NULL (memory_id));")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err


def test_a_check_that_recurses_past_the_stack_limit_is_named(
    empty_database_url, monkeypatch, capsys
):
    """A program limit (54001, stack depth) is the CHECK's own failure, named like any other,
    not a database error of migrate's (the first version of the timeout fix re-raised it)."""
    url = empty_database_url
    execute(url, app_store(lineage=False)
            + "CREATE FUNCTION app_deep(n int) RETURNS boolean LANGUAGE plpgsql AS"
            " $$ BEGIN RETURN app_deep(n + 1); END $$;"
            "ALTER TABLE memories ADD CONSTRAINT app_deep_ok"
            " CHECK (app_deep(0)) NOT VALID;")  # fmt: skip
    refused(monkeypatch, url, capsys, "a row the worker writes fails in a default or CHECK",
            "stack depth")  # fmt: skip


SOFT_DELETE = {
    "trigger": """
CREATE FUNCTION app_soft_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
    UPDATE memories SET status = 'deleted', deleted_at = now() WHERE id = OLD.id; RETURN NULL;
END $$;
CREATE TRIGGER memories_soft_delete BEFORE DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION app_soft_delete();""",
    "rule": """
CREATE RULE memories_soft_delete AS ON DELETE TO memories DO INSTEAD
    UPDATE memories SET status = 'deleted', deleted_at = now() WHERE id = OLD.id;""",
    "dedupe trigger": """
CREATE FUNCTION app_dedupe() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
    IF EXISTS (SELECT 1 FROM memories m WHERE m.user_id = NEW.user_id
                                          AND m.content = NEW.content) THEN RETURN NULL; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER memories_soft_delete BEFORE INSERT ON memories
    FOR EACH ROW EXECUTE FUNCTION app_dedupe();""",
}


@pytest.mark.parametrize("guard", sorted(SOFT_DELETE))
def test_a_trigger_or_rule_that_can_skip_the_workers_writes_is_named(
    empty_database_url, monkeypatch, capsys, guard
):
    """A soft-delete BEFORE DELETE trigger returning NULL, or an ON DELETE DO INSTEAD rule, was
    adopted: every purging batch then failed every night ("purge_rows touched 0 rows", "cannot
    perform DELETE RETURNING") and a forget-user --purge-now never completed; a dedupe BEFORE
    INSERT trigger returning NULL failed every merging batch. Found by a review."""
    url = empty_database_url
    execute(url, app_store() + SOFT_DELETE[guard])
    kind = "rule" if guard == "rule" else "trigger"
    refused(monkeypatch, url, capsys, f"{kind} memories_soft_delete",
            f"DROP {kind.upper()} memories_soft_delete ON memories;")  # fmt: skip


def test_after_triggers_and_replica_triggers_are_fine(empty_database_url, monkeypatch, capsys):
    """An AFTER trigger cannot skip the row, and a BEFORE one enabled only for replication
    (ENABLE REPLICA TRIGGER) does not fire in the worker's session: both are adopted."""
    url = empty_database_url
    execute(
        url,
        app_store()
        + """
CREATE FUNCTION app_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER memories_audit AFTER INSERT OR DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION app_noop();
CREATE TRIGGER memories_replicated BEFORE DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION app_noop();
ALTER TABLE memories ENABLE REPLICA TRIGGER memories_replicated;""",
    )
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err


def test_a_search_vector_trigger_and_an_audit_rule_are_fine(
    empty_database_url, monkeypatch, capsys
):
    """A trigger that fills a column of each new row (PostgreSQL's tsvector_update_trigger, or
    a plpgsql one returning NEW) skips nothing, and a DO ALSO rule adds a statement beside the
    worker's. Found by a review: the first version of the guard refused both."""
    url = empty_database_url
    execute(
        url,
        app_store()
        + """
ALTER TABLE memories ADD COLUMN search tsvector;
CREATE TRIGGER memories_search BEFORE INSERT OR UPDATE OF content ON memories
    FOR EACH ROW EXECUTE FUNCTION tsvector_update_trigger(search, 'pg_catalog.english', content);
CREATE FUNCTION app_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.metadata := coalesce(NEW.metadata, '{}'); RETURN NEW; END $$;
CREATE TRIGGER memories_stamp BEFORE INSERT ON memories
    FOR EACH ROW EXECUTE FUNCTION app_stamp();
CREATE TABLE memory_deletions (id uuid, at timestamptz DEFAULT now());
CREATE RULE log_delete AS ON DELETE TO memories
    DO ALSO INSERT INTO memory_deletions (id) VALUES (OLD.id);""",
    )
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err


def test_a_key_onto_a_table_a_purge_empties_by_cascade_is_named(
    empty_database_url, monkeypatch, capsys
):
    """memory_citations.memory_id → memories ON DELETE CASCADE, answers.citation_id →
    memory_citations NO ACTION: the guard looked at keys onto memories only, adopted it, and
    every purge of a cited memory then failed, every night (found by a review). Keys are now
    followed through every cascade, a cycle once; a cascade all the way down is fine."""
    url = empty_database_url
    execute(
        url,
        app_store()
        + """
CREATE TABLE memory_citations (id bigserial PRIMARY KEY, parent bigint,
    memory_id uuid NOT NULL REFERENCES memories (id) ON DELETE CASCADE);
ALTER TABLE memory_citations ADD FOREIGN KEY (parent) REFERENCES memory_citations (id)
    ON DELETE CASCADE;
CREATE TABLE answers (id bigserial PRIMARY KEY,
    citation_id bigint NOT NULL REFERENCES memory_citations (id));""",
    )
    refused(monkeypatch, url, capsys, "answers.answers_citation_id_fkey references "
            "memory_citations (whose rows a purge deletes by cascade: memories → "
            "memory_citations)")  # fmt: skip
    execute(url, "ALTER TABLE answers DROP CONSTRAINT answers_citation_id_fkey, ADD FOREIGN KEY"
                 " (citation_id) REFERENCES memory_citations (id) ON DELETE SET NULL")  # fmt: skip
    refused(monkeypatch, url, capsys, "answers.citation_id is NOT NULL")
    execute(url, "ALTER TABLE answers ALTER COLUMN citation_id DROP NOT NULL")
    assert migrate(monkeypatch, url, capsys)[0] == 0


@pytest.mark.parametrize("kind", ["STORED", "VIRTUAL"])
def test_a_generated_contract_column_is_named(empty_database_url, monkeypatch, capsys, kind):
    """slot GENERATED ALWAYS AS (metadata ->> 'slot') STORED was adopted, and every merging
    batch then failed (a merged record names slot), every night; VIRTUAL (PostgreSQL 18's
    default) failed migrate itself, exit 1, on its index over slot. Found by a review. Each is
    named with the statements that make it a plain column; run as told, migrate adopts."""
    url = empty_database_url
    if kind == "VIRTUAL" and int(scalar(url, "SHOW server_version_num")) < 180000:
        pytest.skip("VIRTUAL generated columns are PostgreSQL 18+")
    execute(url, app_store().replace(
        "slot text,", f"slot text GENERATED ALWAYS AS (metadata ->> 'slot') {kind},"))  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and "column slot is generated" in err, err
    fix = err.partition("make it a plain column the application writes: ")[2].partition("\n")[0]
    execute(url, fix)
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_an_identity_always_contract_column_is_named(empty_database_url, monkeypatch, capsys):
    """access_count GENERATED ALWAYS AS IDENTITY refuses the worker's merged records (they
    write access_count 0), and BY DEFAULT refuses migrate's DEFAULT 0 (exit 1): both named;
    without the identity, migrate adopts."""
    url = empty_database_url
    execute(url, app_store().replace(
        "access_count integer NOT NULL DEFAULT 0,",
        "access_count integer NOT NULL GENERATED ALWAYS AS IDENTITY,"))  # fmt: skip
    fix = "ALTER TABLE memories ALTER COLUMN access_count DROP IDENTITY;"
    refused(monkeypatch, url, capsys, "column access_count is an identity column", fix)
    execute(url, "ALTER TABLE memories ALTER COLUMN access_count SET GENERATED BY DEFAULT")
    refused(monkeypatch, url, capsys, "column access_count is an identity column", fix)
    execute(url, fix)
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_a_check_of_migrates_name_wider_than_the_contract_is_named_with_its_rows(
    empty_database_url, monkeypatch, capsys
):
    """An inline CHECK (importance BETWEEN 0 AND 10) is named memories_importance_check by
    PostgreSQL, and migrate kept it in place of its own: rows with importance 0 and 7 were
    adopted and their decay score stayed NULL forever (found by a review). It is named with
    the rows outside 1..5 and the UPDATE; run as told, migrate's own CHECK is in force. One
    saying what migrate's says, however written, is kept."""
    url = empty_database_url
    execute(url, app_store().replace(
        "importance smallint NOT NULL DEFAULT 3,",
        "importance smallint NOT NULL DEFAULT 3 CHECK (importance BETWEEN 0 AND 10),")
        + "INSERT INTO memories (user_id, content, importance) VALUES ('u2', 'zero', 0),"
          " ('u2', 'seven', 7), ('u2', 'one', 1);")  # fmt: skip
    fix = (
        "UPDATE memories SET importance = least(greatest(importance, 1), 5)"
        " WHERE NOT importance BETWEEN 1 AND 5;"
    )
    refused(monkeypatch, url, capsys, "CHECK memories_importance_check is yours",
            "ALTER TABLE memories DROP CONSTRAINT memories_importance_check;",
            f"2 rows are outside it: {fix}")  # fmt: skip
    execute(url, fix + "ALTER TABLE memories DROP CONSTRAINT memories_importance_check;"
                 "ALTER TABLE memories ADD CONSTRAINT memories_importance_check"
                 " CHECK (importance >= 1 AND importance <= 5);")  # fmt: skip
    assert migrate(monkeypatch, url, capsys)[0] == 0
    with pytest.raises(sa.exc.IntegrityError, match="memories_importance_check"):
        execute(url, "INSERT INTO memories (user_id, content, importance) VALUES ('u', 'x', 0)")


def test_a_not_valid_check_of_migrates_name_is_named(empty_database_url, monkeypatch, capsys):
    """A NOT VALID memories_status_check was kept with the rows it never checked."""
    url = empty_database_url
    execute(url, app_store() + "UPDATE memories SET status = 'archived';"
                 "ALTER TABLE memories ADD CONSTRAINT memories_status_check CHECK"
                 " (status IN ('active', 'obsolete', 'merged', 'deleted')) NOT VALID;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and "VALIDATE CONSTRAINT memories_status_check" in err, err
    assert "is yours" not in err, err


def test_a_role_without_temporary_tables_is_told_the_grant(
    empty_database_url, role, monkeypatch, capsys  # noqa: F811
):  # fmt: skip
    """REVOKE TEMPORARY ON DATABASE … FROM PUBLIC (a common hardening): adopting, which probes
    the application's CHECKs on a temporary copy, failed with exit 1 ("permission denied to
    create temporary tables"). Now exit 2 with the GRANT; granted, migrate adopts."""
    url = empty_database_url
    name = sa.engine.make_url(url).database
    execute(url, app_store() + f"GRANT CREATE ON SCHEMA public TO {role};"
            f"ALTER TABLE memories OWNER TO {role}; ALTER TABLE memory_lineage OWNER TO {role};"
            f"ALTER VIEW active_memories OWNER TO {role};"
            f"REVOKE TEMPORARY ON DATABASE {name} FROM PUBLIC;")  # fmt: skip
    try:
        code, _, err = migrate(monkeypatch, as_role(url, role), capsys)
        assert code == 2 and f"GRANT TEMPORARY ON DATABASE {name} TO {role};" in err, err
        assert scalar(url, "SELECT to_regclass('gc_runs') IS NULL")
        execute(url, f"GRANT TEMPORARY ON DATABASE {name} TO {role};")
        code, _, err = migrate(monkeypatch, as_role(url, role), capsys)
        assert code == 0, err
    finally:
        execute(url, f"DROP OWNED BY {role}")


@pytest.mark.parametrize(
    ("clash", "named"),
    [("CREATE TABLE gc_runs (id int);", "table gc_runs is yours"),
     ("CREATE FUNCTION memory_gc_trust(source text, metadata jsonb) RETURNS integer"
      " LANGUAGE sql RETURN 1;", "function memory_gc_trust is yours"),
     ("CREATE TYPE memory_gc_current AS ENUM ('a');", "type memory_gc_current is yours")],
)  # fmt: skip
def test_an_object_of_a_name_memory_gc_creates_is_named(
    empty_database_url, monkeypatch, capsys, clash, named
):
    """An application's gc_runs table or memory_gc_trust function made migrate fail half-way
    with exit 1 (DuplicateTable, DuplicateFunction; found by a review): named, exit 2."""
    url = empty_database_url
    execute(url, app_store() + clash)
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2 and named in err and "RENAME TO" in err, err
    assert scalar(url, "SELECT to_regclass('memory_gc_alembic_version') IS NULL")


def test_the_names_adoption_reserves_are_all_that_migrate_creates(database_url):
    """Every table, view, index, function and type migrate creates in a migrated database is
    among adoption_guards.created_names() (read from the migrations' text), but for those
    adoption checks apart (memories, memory_lineage, their indexes, active_memories) and those
    PostgreSQL names itself (sequences, constraints' indexes: it picks a free name)."""
    from gc_worker import adoption_guards, schema

    created = f"""
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind <> 'S'
          AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = c.oid)
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'e')
          AND c.relname <> '{schema.VERSION_TABLE}'
        UNION SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
        UNION SELECT t.typname FROM pg_type t WHERE t.typnamespace = 'public'::regnamespace
          AND t.typrelid = 0 AND t.typelem = 0
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = t.oid AND d.deptype = 'e')"""
    engine = db.make_engine(database_url)
    try:
        with engine.connect() as conn:
            names = set(conn.execute(sa.text(created)).scalars())
    finally:
        engine.dispose()
    assert "gc_runs" in names and "memory_gc_trust" in names
    assert names - adoption_guards.ADOPTED == adoption_guards.created_names()
