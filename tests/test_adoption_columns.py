"""Adopting a store whose columns differ from the contract's: NOT NULL where the worker writes
NULL (and NULL means something), and other types, with statements that convert them faithfully."""

from __future__ import annotations

import re

import pytest

from tests.test_migrate import app_store, execute, migrate, scalar, untouched

EMB = "'[1,0,0,0,0,0,0,0]'"


@pytest.mark.parametrize(
    ("column", "value", "hint"),
    [
        ("scope", "''", None),
        ("slot", "''", "UPDATE memories SET slot = NULL WHERE slot = '';"),
        ("valid_from", "created_at", None),
        ("valid_until", "'infinity'", "UPDATE memories SET valid_until = NULL"),
        ("superseded_by", "gen_random_uuid()", None),
        ("deleted_at", "created_at", None),
    ],
)
def test_a_column_the_worker_writes_null_into_that_is_not_null_is_refused(
    empty_database_url, monkeypatch, capsys, column, value, hint
):
    """A NOT NULL scope, slot, valid_from or valid_until was adopted, and every user_cap batch
    folding rows into a summary (which has no slot, no validity, and no scope when its rows had
    several) failed every night (NotNullViolation); a NOT NULL superseded_by or deleted_at
    failed every erasure putting back the rows an erased record had absorbed. And a slot that
    is never NULL holds a value meaning "no slot" ('' here): memory-gc took it for one slot, so
    the read path showed one of those rows per user and the contradiction job obsoleted the
    rest. Found by a review: each is named at adoption with its fix, exit 2."""
    url = empty_database_url
    execute(url, app_store() + f"UPDATE memories SET {column} = {value};"
                 f"ALTER TABLE memories ALTER COLUMN {column} SET NOT NULL;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    assert f"ALTER TABLE memories ALTER COLUMN {column} DROP NOT NULL;" in err
    assert hint is None or hint in err, err
    assert untouched(url)


@pytest.mark.parametrize(
    ("column", "value"),
    [("embedding", EMB), ("last_accessed_at", "created_at"), ("expires_at", "'infinity'"),
     ("importance_assessed_at", "created_at")],
)  # fmt: skip
def test_a_not_null_column_the_worker_never_writes_null_into_is_adopted(
    empty_database_url, monkeypatch, capsys, column, value
):
    """An application that always embeds, stamps use from creation, or keeps a far-off TTL
    makes those columns NOT NULL: the worker's records copy them from their rows, so they are
    adopted as they are."""
    url = empty_database_url
    execute(url, app_store() + f"UPDATE memories SET {column} = {value};"
                 f"ALTER TABLE memories ALTER COLUMN {column} SET NOT NULL;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err


def test_the_advice_converting_a_timestamp_without_time_zone_keeps_its_instants(
    empty_database_url, monkeypatch, capsys
):
    """An application that wrote UTC instants into `timestamp` columns is told to convert them:
    the advice was `ALTER … TYPE timestamptz;`, which reads them in the session's time zone, so
    run from a session in New York every TTL, validity and age moved four hours (found by a
    review). It now says in which zone they are read (UTC, the one to change if yours differ),
    and converts text ids (`::uuid`), which the bare statement refused."""
    url = empty_database_url
    execute(url, app_store(lineage=False) + "ALTER TABLE memories"
                 " ALTER COLUMN created_at TYPE timestamp, ALTER COLUMN expires_at TYPE timestamp,"
                 " ALTER COLUMN supersedes DROP DEFAULT, ALTER COLUMN supersedes TYPE text[],"
                 " ALTER COLUMN superseded_by TYPE text;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    fixes = re.findall(r"ALTER TABLE memories ALTER COLUMN \w+ TYPE [^;]*;", err)
    assert len(fixes) == 4, err
    execute(url, "SET TIME ZONE 'America/New_York'; " + " ".join(fixes)
                 + " ALTER TABLE memories ALTER COLUMN supersedes SET DEFAULT '{}';")  # fmt: skip
    expires = "SELECT expires_at FROM memories WHERE content = 'likes tea'"
    assert scalar(url, expires).isoformat() == "2026-05-01T00:00:00+00:00"
    assert migrate(monkeypatch, url, capsys)[0] == 0


@pytest.mark.parametrize("column", ["decayed_confidence", "status_reason", "status_changed_at"])
def test_a_not_null_column_a_merged_record_leaves_to_its_default_needs_one(
    empty_database_url, monkeypatch, capsys, column
):
    """A merged record or summary is inserted without decayed_confidence, status_reason and
    status_changed_at (they take their defaults): NOT NULL without a default, every merging
    batch failed, every night (found by a review). Named at adoption, exit 2; with a default,
    adopted."""
    url = empty_database_url
    value = {"decayed_confidence": "0.5", "status_reason": "'new'"}.get(column, "created_at")
    execute(url, app_store() + f"UPDATE memories SET {column} = {value};"
                 f"ALTER TABLE memories ALTER COLUMN {column} SET NOT NULL;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    assert f"column {column} is NOT NULL without a default" in err
    assert untouched(url)
    default = "now()" if column == "status_changed_at" else value
    execute(url, f"ALTER TABLE memories ALTER COLUMN {column} SET DEFAULT {default};")
    assert migrate(monkeypatch, url, capsys)[0] == 0


def test_a_user_id_under_a_nondeterministic_collation_is_refused(
    empty_database_url, monkeypatch, capsys
):
    """Under a nondeterministic (case-insensitive, say) collation 'Alice' = 'alice' to the
    database, two users to memory-gc: a batch's `user_id = ANY(:users)`, the score pass and a
    cap would span both. Refused at adoption with the statement that fixes it. (This build of
    PostgreSQL has no ICU, the only provider of such collations: the catalog's flag is set on a
    copy of "C", which is what adoption reads.)"""
    url = empty_database_url
    store = app_store().replace("user_id text NOT NULL", "user_id text COLLATE loose NOT NULL")
    assert "COLLATE loose" in store
    execute(url, 'CREATE COLLATION loose FROM "C";'
                 " UPDATE pg_collation SET collisdeterministic = false WHERE collname = 'loose';"
                 + store)  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    assert "column user_id uses the nondeterministic collation loose" in err
    assert 'ALTER COLUMN user_id TYPE text COLLATE "default";' in err
    assert untouched(url)


def test_a_deterministic_collation_other_than_the_default_is_adopted(
    empty_database_url, monkeypatch, capsys
):
    url = empty_database_url
    store = app_store().replace("user_id text NOT NULL", 'user_id text COLLATE "C" NOT NULL')
    execute(url, store)
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    ("column", "default", "fix"),
    [
        ("status", "'live'", "ALTER TABLE memories ALTER COLUMN status SET DEFAULT 'active';"),
        ("importance", "0", "ALTER TABLE memories ALTER COLUMN importance SET DEFAULT 3;"),
        ("confidence", "2", "ALTER TABLE memories ALTER COLUMN confidence SET DEFAULT 1.0;"),
    ],
)
def test_a_default_of_yours_outside_a_check_migrate_adds_is_named(
    empty_database_url, monkeypatch, capsys, column, default, fix
):
    """An application whose status defaults to 'live' (its rows mapped to 'active' as the
    refusal of its rows says) was adopted with that default kept, and migrate's own CHECK
    added: from then on every insert of the application's that leaves status to its default
    failed (CheckViolation) — adopting broke the application's writes (found by an operator
    walkthrough). Named at adoption with the default to set, exit 2, nothing changed."""
    url = empty_database_url
    execute(url, app_store() + f"ALTER TABLE memories ALTER COLUMN {column} SET DEFAULT {default};")
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    assert fix in err, err
    assert untouched(url)


def test_defaults_of_yours_inside_migrates_checks_are_kept(empty_database_url, monkeypatch, capsys):
    """A default of the application's that the contract's CHECKs accept (importance 5, a
    confidence of 0.9) is adopted as it is."""
    url = empty_database_url
    execute(url, app_store() + "ALTER TABLE memories ALTER COLUMN importance SET DEFAULT 5,"
                 " ALTER COLUMN confidence SET DEFAULT 0.9;")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err
    kept = scalar(url, "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef JOIN pg_attribute"
                       " ON attrelid = adrelid AND attnum = adnum"
                       " WHERE adrelid = 'memories'::regclass"
                       " AND attname = 'importance'")  # fmt: skip
    assert kept == "5"


@pytest.mark.parametrize("id_column", ["bigserial", "bigint GENERATED ALWAYS AS IDENTITY"])
def test_the_advice_converting_integer_ids_and_flags_runs_and_keeps_them(
    empty_database_url, monkeypatch, capsys, id_column
):
    """An application with a `bigserial` id and a `smallint` pinned flag (0/1) was told
    `ALTER … id TYPE uuid USING id::uuid;` and `… pinned TYPE boolean USING pinned::boolean;`:
    PostgreSQL has neither cast ("cannot cast type bigint to uuid"), and the serial's default
    cannot be cast either, so the advice failed as written; the probe also listed the id's
    type once more, as a default or CHECK of the application's refusing the worker's rows
    (found by an operator walkthrough). The advice now runs: the id maps to a uuid holding its
    number (the same mapping converts a column of the application's that names one), the flag
    to `<> 0`, and each column's default is swapped for the contract's."""
    url = empty_database_url
    execute(url, app_store(lineage=False) + "ALTER TABLE memories DROP COLUMN id,"
                 f" ADD COLUMN id {id_column} PRIMARY KEY, ALTER COLUMN pinned DROP DEFAULT,"
                 " ALTER COLUMN pinned TYPE smallint USING pinned::int,"
                 " ALTER COLUMN pinned SET DEFAULT 0;"
                 " UPDATE memories SET pinned = 1 WHERE content = 'likes tea';"
                 " ALTER TABLE memories ADD CONSTRAINT app_text"
                 " CHECK (content <> '');")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    assert "a row the worker writes fails" not in err, err
    fixes = re.findall(r"ALTER TABLE memories ALTER COLUMN (?:id|pinned) [^;]*;", err)
    assert len(fixes) == 2 + ("IDENTITY" in id_column), err
    execute(url, " ".join(fixes))
    assert migrate(monkeypatch, url, capsys)[0] == 0
    pinned = "SELECT id::text || ' ' || pinned::text FROM memories WHERE content = 'likes tea'"
    assert scalar(url, pinned) == "00000000-0000-0000-0000-000000000001 true"
    assert scalar(url, "SELECT count(*) FROM memories WHERE NOT pinned") == 1


@pytest.mark.parametrize(
    ("column", "default", "stored"),
    [("slot", "''", "'likes'"), ("valid_until", "'infinity'", "'2027-01-01T00:00:00Z'")],
)
@pytest.mark.parametrize("not_null", [True, False])
def test_a_default_standing_for_none_on_slot_or_valid_until_is_refused(
    empty_database_url, monkeypatch, capsys, column, default, stored, not_null
):
    """An application whose slot was `NOT NULL DEFAULT ''` followed the advice (DROP NOT NULL,
    set the '' rows to NULL) and was adopted with the default kept: every memory it wrote
    afterwards without a slot got '' again, one slot per user, and the next run obsoleted all
    of a user's new rows but the latest (slot_replaced); a valid_until defaulting to
    'infinity' made every new row a temporary override (found by an operator walkthrough).
    The default is named with DROP DEFAULT (and the rows holding it), NOT NULL or not; the
    statements listed then adopt the table, and a row written after keeps no slot."""
    url = empty_database_url
    execute(
        url,
        app_store() + f"UPDATE memories SET {column} = {default};"
        f" UPDATE memories SET {column} = {stored} WHERE content = 'likes tea';"
        f" ALTER TABLE memories ALTER COLUMN {column} SET DEFAULT {default};"
        + f" ALTER TABLE memories ALTER COLUMN {column} SET NOT NULL;"
        * not_null,
    )
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 2, err
    assert f"ALTER TABLE memories ALTER COLUMN {column} DROP DEFAULT;" in err, err
    assert untouched(url)
    fixes = re.findall(rf"(?:ALTER TABLE|UPDATE) memories (?:ALTER COLUMN {column}|SET) [^;]*;",
                       err)  # fmt: skip
    execute(url, " ".join(dict.fromkeys(fixes)))
    assert migrate(monkeypatch, url, capsys)[0] == 0
    execute(url, "INSERT INTO memories (user_id, content) VALUES ('u1', 'new')")
    assert scalar(url, f"SELECT count(*) FROM memories WHERE {column} IS NULL") == 2


def test_a_validity_window_default_is_adopted(empty_database_url, monkeypatch, capsys):
    """A valid_until defaulting to now() + 30 days gives each row a window of the
    application's, not a value standing for none: adopted as it is."""
    url = empty_database_url
    execute(url, app_store() + "ALTER TABLE memories ALTER COLUMN valid_until"
                 " SET DEFAULT now() + interval '30 days';")  # fmt: skip
    code, _, err = migrate(monkeypatch, url, capsys)
    assert code == 0, err
