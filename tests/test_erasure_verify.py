"""verify-erasure and the tombstone check a request path can run: residues in tables the code
does not know, ids inside json, the SQL twin of the content hash, the refusing trigger."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gc_worker import erasure
from gc_worker.migration_modules import load as load_migration
from gc_worker.verify_erasure import verify
from jobs.similarity import content_hash, normalise_text
from tests.store import NOW, add, execute, run, status
from tests.test_erasure_helpers import requests

SAMPLES = [
    "Likes tea", "  LIKES   tea!! ", "«Straße»", "ﬁne Ａｂｃ", "tab\tand\nnewline\u2003end",
    "¿Qué tal?", "…ellipsis…", "emoji 😀 ok", "ΣΑΣ", "İstanbul", "\u00a0nbsp\u00a0", "x" * 300,
    "", "!!!", "a--b", "Ǆemal", "ﬃ", "K\u212a", "(parens) [brackets] {braces}", "$5 + 3 = 8",
]  # fmt: skip


def sql_hash(engine, user: str, text: str) -> str:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT memory_gc_content_hash(:u, :t)"), {"u": user, "t": text}
        ).scalar_one()


def erased(engine, settings, content="Lives in Quokkaville", user="u1"):
    """A memory erased and purged through the normal path; returns its id."""
    memory_id = add(engine, user, content)
    erasure.forget(engine, settings, now=NOW, memory_id=memory_id, purge_now=True)
    return memory_id


class TestSqlContentHash:
    @pytest.mark.parametrize("text", SAMPLES)
    def test_sql_twin_matches_python(self, engine, text):
        """memory_gc_content_hash equals jobs.similarity.content_hash on tricky texts."""
        assert sql_hash(engine, "u1", text) == content_hash("u1", text)

    @hsettings(max_examples=150, deadline=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cn", "Co"]),
                   max_size=40))  # fmt: skip
    def test_sql_twin_matches_python_on_generated_text(self, engine, text):
        """The two hashes agree on generated text of assigned code points."""
        if "\x00" in text:
            return  # PostgreSQL text cannot hold NUL
        assert sql_hash(engine, "u", text) == content_hash("u", text)

    @pytest.mark.parametrize("fold", ["fallback", "lower"])
    def test_the_fold_before_postgresql_18_is_pythons(self, engine, fold):
        """Before PostgreSQL 18 the normaliser folds case with Python's own table (migration
        0014), built here as a session-local function on this server: it agrees with Python on
        the samples and on every character that folds. The `lower` it replaced did not
        ("Straße", a final sigma)."""
        migration = load_migration("0014_python_casefold.py")
        erasure_0003 = load_migration("0003_erasure.py")
        expression = migration.python_fold("s") if fold == "fallback" else "lower(s)"
        create = erasure_0003.normalise_function(expression).replace(
            "CREATE FUNCTION memory_gc_normalise(", "CREATE FUNCTION pg_temp.normalise_before_18("
        )
        folding = "".join(chr(c) for c in range(0x110000)
                          if not 0xD800 <= c <= 0xDFFF and chr(c).casefold() != chr(c))  # fmt: skip
        texts = [*SAMPLES, folding, folding[::-1], "Ⅻ ﬀ ŉ ΐ ᾳ"]
        with engine.connect() as conn:
            conn.execute(sa.text(create))
            got = [conn.execute(sa.text("SELECT pg_temp.normalise_before_18(:t)"), {"t": t})
                   .scalar_one() for t in texts]  # fmt: skip
        wrong = [t for t, g in zip(texts, got, strict=True) if g != normalise_text(t)]
        if fold == "fallback":
            assert wrong == []
        else:
            assert "«Straße»" in wrong and folding in wrong

    def test_an_index_on_the_hash_is_found_for_rebuilding(self, engine):
        """Migration 0014 rebuilds the application's indexes on the hash (their values were
        computed by the old fold): it finds one on memory_gc_content_hash, none otherwise."""
        migration = load_migration("0014_python_casefold.py")
        with engine.begin() as conn:
            assert migration.hash_indexes(conn) == []
            conn.execute(sa.text(
                'CREATE INDEX "app hash idx" ON memories (memory_gc_content_hash(user_id, content))'
            ))  # fmt: skip
            assert migration.hash_indexes(conn) == ['"app hash idx"']
            conn.execute(sa.text(  # a wrapper of the application's (found by a review)
                "CREATE FUNCTION app_hash(u text, c text) RETURNS text LANGUAGE sql IMMUTABLE"
                " RETURN memory_gc_content_hash(u, c);"
                " CREATE INDEX app_wrapped ON memories (app_hash(user_id, content))"
            ))  # fmt: skip
            assert migration.hash_indexes(conn) == ['"app hash idx"', "app_wrapped"]
            migration._reindex(conn)
            conn.rollback()

    def test_migration_0014_round_trip(self, empty_database_url):
        """0014 goes down to 0013 and up again (on this PostgreSQL 18 both keep casefold)."""
        from alembic import command

        from tests.conftest import migrating

        with migrating(empty_database_url) as (cfg, conn):
            command.upgrade(cfg, "head")
            command.downgrade(cfg, "0013")
            command.upgrade(cfg, "0014")
            folded = "SELECT memory_gc_normalise('STRASSE Straße')"
            assert conn.exec_driver_sql(folded).scalar() == "strasse strasse"

    def test_is_tombstoned_and_refusing_trigger(self, engine, settings):
        """After an erasure the request-path check says yes, and the trigger refuses the write."""
        memory_id = erased(engine, settings, "Allergic to peanuts")
        with engine.connect() as conn:
            check = sa.text("SELECT memory_gc_is_tombstoned(:u, :t)")
            assert conn.execute(check, {"u": "u1", "t": "allergic to PEANUTS."}).scalar()
            assert not conn.execute(check, {"u": "u1", "t": "Allergic to cats"}).scalar()
            assert not conn.execute(check, {"u": "u2", "t": "Allergic to peanuts"}).scalar()
            by_id = sa.text("SELECT memory_gc_is_tombstoned('u1', 'anything', :id)")
            assert conn.execute(by_id, {"id": memory_id}).scalar()
        execute(engine, "CREATE TRIGGER refuse BEFORE INSERT ON memories FOR EACH ROW"
                        " EXECUTE FUNCTION memory_gc_refuse_tombstoned()")  # fmt: skip
        with pytest.raises(sa.exc.IntegrityError, match="erased on request"):
            add(engine, "u1", "Allergic to peanuts!")
        add(engine, "u1", "Allergic to cats")


class TestVerify:
    def test_residue_in_a_table_the_code_does_not_know(self, engine, settings):
        """A new gc_* table holding the erased text, or the erased id in a json key, is found."""
        memory_id = erased(engine, settings)
        execute(engine, "CREATE TABLE gc_future_notes (id serial PRIMARY KEY, user_id text,"
                        " note varchar(200), extra jsonb)")  # fmt: skip
        execute(engine, "INSERT INTO gc_future_notes (user_id, note, extra) VALUES"
                        " ('u1', ' lives in quokkaville. ', '{}'),"
                        " ('u1', 'unrelated', CAST(:extra AS jsonb))",
                extra=f'{{"{memory_id}": 1}}')  # fmt: skip
        result = verify(engine, now=NOW, user_id="u1")
        found = {(r.table, r.column, r.row, r.match) for r in result.residues}
        assert found == {("gc_future_notes", "note", "1", "content"),
                         ("gc_future_notes", "extra", "2", "id")}  # fmt: skip
        assert requests(engine)[0]["verified_at"] is None

    def test_other_users_same_text_is_no_residue(self, engine, settings):
        """The same text kept by another user is not that user's erased content."""
        erased(engine, settings)
        add(engine, "u2", "Lives in Quokkaville")
        assert verify(engine, now=NOW, user_id="u1").residues == []

    def test_a_user_the_jobs_picked_candidates_of_verifies_clean(self, engine, settings):
        """Rows the run-start scan picked (decay / usage_prune candidates) were listed by id in
        their batch's work: a batch drops them when done, so a forgotten user whose rows the
        jobs acted on verifies clean (it used to fail for good on gc_run_batches.work)."""
        old = NOW - timedelta(days=400)
        for i in range(3):
            add(engine, "u1", f"Old fact number {i}", importance=1, created_at=old, updated_at=old)
        add(engine, "u1", "Fresh fact")
        run(engine, settings)
        works = execute(engine, "SELECT work FROM gc_run_batches").scalars().all()
        assert works and all("ids" not in (w or {}) for w in works)
        erasure.forget(engine, settings, now=NOW, user_id="u1", purge_now=True)
        assert verify(engine, now=NOW, user_id="u1").residues == []

    def test_long_content_found_through_its_preview(self, engine, settings):
        """A 200-character preview of a long erased text is recognised."""
        long_text = "Plans a trip " + "around the fjords " * 20
        erased(engine, settings, long_text)
        execute(engine, "CREATE TABLE gc_previews (user_id text, preview text)")
        execute(engine, "INSERT INTO gc_previews VALUES ('u1', :p)", p=long_text[:200])
        (residue,) = verify(engine, now=NOW, user_id="u1").residues
        assert (residue.table, residue.match) == ("gc_previews", "content")

    def test_stale_reinsert_is_a_residue_until_the_next_run(self, engine, settings):
        """A re-inserted erased text is reported, and gone after the next run and purge."""
        erased(engine, settings)
        add(engine, "u1", "LIVES IN QUOKKAVILLE")
        kept = add(engine, "u1", "Lives in Oslo")
        assert {r.table for r in verify(engine, now=NOW, user_id="u1").residues} == {"memories"}
        run(engine, settings)
        run(engine, settings, now=NOW + timedelta(days=1))
        assert verify(engine, now=NOW, user_id="u1").residues == []
        assert status(engine, kept) == "active"

    def test_verify_memory_checks_that_memory_only(self, engine, settings):
        """--memory scans for that memory's erasure and ignores the user's other rows."""
        memory_id = erased(engine, settings)
        add(engine, "u1", "Still likes tea")
        result = verify(engine, now=NOW, memory_id=memory_id)
        assert result.clean and result.target == f"memory {memory_id}"
        assert requests(engine)[0]["verified_at"] == NOW

    def test_unknown_target_raises(self, engine):
        """No request for the user or memory: a NotFoundError (exit 2) naming what to do."""
        from gc_worker.errors import NotFoundError

        with pytest.raises(NotFoundError, match="memory-gc forget"):
            verify(engine, now=NOW, memory_id=uuid4())


class TestVerifyOneMemoryOfSeveralRequests:
    def test_a_misfiled_earlier_request_does_not_hide_the_owners_residue(self, engine, settings):
        """Requests for one memory filed under two users (the first under the wrong one: it
        completes once the row is gone) are each checked with their own user's rows and hashes:
        the erased text written back under its owner is a residue, not "clean"."""
        add(engine, "u2", "Something of u2's")
        memory_id = add(engine, "u1", "Lives in Quokkaville")
        execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, memory_id, requested_at)"
                        " VALUES ('memory', 'u2', :m, :at)",
                m=memory_id, at=NOW - timedelta(hours=1))  # fmt: skip
        erasure.forget(engine, settings, now=NOW, memory_id=memory_id, purge_now=True)
        run(engine, settings, jobs=("erasure",))
        assert {r["user_id"]: r["status"] for r in requests(engine)} == {
            "u1": "completed", "u2": "completed"}  # fmt: skip
        clean = verify(engine, now=NOW, memory_id=memory_id)
        assert clean.residues == []
        add(engine, "u1", "lives in Quokkaville.")  # a stale writer puts it back
        result = verify(engine, now=NOW, memory_id=memory_id)
        assert [(r.table, r.column, r.match) for r in result.residues] == [
            ("memories", "content", "content")]  # fmt: skip
