"""Forget-user end to end, on a store with history: plain memories, a merge of two of them, a
review item, cached LLM decisions and audit rows → erase → purge → verify finds nothing, and a
scan of every text column of the whole database finds none of the user's content."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
import sqlalchemy as sa

from gc_worker import erasure
from gc_worker.cli import main
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, execute, get, run, snapshot, status
from tests.test_erasure_helpers import (
    cache_decision,
    count,
    full_text_scan,
    merge,
    requests,
    review,
    tombstones,
)

DAY = timedelta(days=1)
EMBEDDING_MARK = "0.271828"
MARKERS = ["quokkaville", "zanzibari", "xylophonist", "marmoset", "oolong", "eighty degrees",
           "sourdough", EMBEDDING_MARK]  # fmt: skip
MERGED = "Drinks oolong tea every morning, brewed at eighty degrees"


def vec(i: int, mark: float = 0.271828) -> list[float]:
    return [mark if j == i else 0.0 for j in range(8)]


def seed_history(engine, settings) -> dict[str, UUID]:
    """User u1 with every kind of trace the worker keeps; user u2 as a bystander."""
    ids = {
        "home": add(engine, "u1", "Lives in Quokkaville near the harbour", embedding=vec(0)),
        "food": add(engine, "u1", "Favourite dish is zanzibari pilau", embedding=vec(1)),
        "job": add(engine, "u1", "Works as a xylophonist at night", embedding=vec(2),
                   pinned=True),
        "note": add(engine, "u1", "Expired note about the marmoset", expires_at=NOW),
        "tea": add(engine, "u1", "Prefers oolong tea brewed at eighty degrees", embedding=vec(3)),
        "morning": add(engine, "u1", "Drinks oolong tea every morning", embedding=vec(4)),
        "bread": add(engine, "u1", "Bakes sourdough " + "on Sundays " * 30, embedding=vec(5)),
        "other": add(engine, "u2", "Keeps bees in the garden", embedding=vec(6, 0.5)),
    }  # fmt: skip
    run(engine, settings, dry_run=True)  # a stored plan with previews
    run(engine, settings)  # audit history: the marmoset note expires
    ids["merged"] = merge(engine, "u1", [ids["tea"], ids["morning"]], MERGED, vec(7))
    review(
        engine,
        "u1",
        [ids["home"], ids["food"]],
        ["Lives in Quokkaville near the harbour", "Favourite dish is zanzibari pilau"],
    )
    cache_decision(
        engine,
        "u1",
        [ids["tea"], ids["morning"]],
        {"merged": MERGED, "members": ["Drinks oolong tea every morning"]},
    )
    cache_decision(engine, "u2", [ids["other"]], {"merged": "Keeps bees in the garden"})
    return ids


def assert_traces_exist(engine) -> None:
    """The seeded store really holds the content in every worker table the test cares about."""
    found = {(table, needle) for table, _, needle in full_text_scan(engine, MARKERS)}
    for table in ("memories", "gc_actions", "gc_llm_cache", "gc_review_items"):
        assert any(t == table for t, _ in found), table
    assert ("gc_actions", EMBEDDING_MARK) in found


class TestForgetUserEndToEnd:
    def test_erase_purge_verify_leaves_nothing(self, engine, settings):
        """After forget-user, a run and a purge, verify and a database-wide scan find nothing."""
        ids = seed_history(engine, settings)
        assert_traces_exist(engine)
        erasure.forget(engine, settings, now=NOW, user_id="u1")
        run(engine, settings, now=NOW + timedelta(hours=1))
        soon = verify(engine, now=NOW + timedelta(hours=1), user_id="u1")
        assert {r.table for r in soon.residues} == {"memories", "memory_lineage"}  # await purge
        assert count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u1'") == 0
        assert count(engine, "SELECT count(*) FROM gc_review_items") == 0
        run(engine, settings, now=NOW + timedelta(hours=1) + DAY)
        result = verify(engine, now=NOW + 2 * DAY, user_id="u1")
        assert result.residues == [] and result.tables >= 6
        assert full_text_scan(engine, MARKERS) == []
        (request,) = requests(engine)
        assert request["verified_at"] == NOW + 2 * DAY
        assert request["result"]["verification"]["residues"] == 0
        self._audit_kept_without_content(engine)
        self._bystander_untouched(engine, ids)

    def _audit_kept_without_content(self, engine) -> None:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT action, reason, memory_id, content_preview FROM gc_actions"
                        " WHERE user_id = 'u1' AND outcome = 'applied'")
            ).all()  # fmt: skip
        assert {r.action for r in rows} >= {"soft_delete", "create_merged", "merge", "hard_delete"}
        assert all(r.content_preview is None for r in rows), rows

    def _bystander_untouched(self, engine, ids) -> None:
        assert status(engine, ids["other"]) == "active"
        assert count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u2'") == 1
        assert full_text_scan(engine, ["Keeps bees"]) != []

    def test_verify_before_the_run_reports_the_pending_request(self, engine, settings):
        """Until a run carries the request out, verification fails and names the request."""
        seed_history(engine, settings)
        request, _ = erasure.forget(engine, settings, now=NOW, user_id="u1")
        result = verify(engine, now=NOW, user_id="u1")
        assert [(r.table, r.row, r.match) for r in result.residues] == [
            ("gc_erasure_requests", str(request.id), "pending")
        ]
        assert requests(engine)[0]["verified_at"] is None

    def test_purge_now_does_it_all_in_one_audited_run(self, engine, settings):
        """--purge-now: soft delete, purge and scrub at once, in one apply run (trigger erasure)."""
        seed_history(engine, settings)
        _, run_id = erasure.forget(engine, settings, now=NOW, user_id="u1", purge_now=True)
        assert count(engine, "SELECT count(*) FROM memories WHERE user_id = 'u1'") == 0
        assert verify(engine, now=NOW, user_id="u1").residues == []
        assert full_text_scan(engine, MARKERS) == []
        with engine.connect() as conn:
            the_run = conn.execute(
                sa.text("SELECT mode, trigger, status FROM gc_runs WHERE id = :id"), {"id": run_id}
            ).one()
        assert tuple(the_run) == ("apply", "erasure", "completed")
        (request,) = requests(engine)
        assert request["status"] == "completed" and request["run_id"] == run_id
        assert request["result"]["purged"] == 8  # 7 plain rows and the merged record
        assert len(tombstones(engine)) == 8  # every row, the expired (ttl) one included


class TestCommandLine:
    def test_forget_user_purge_now_then_verify(self, engine, settings, cli_env, capsys):
        """`forget-user --purge-now` then `verify-erasure` prints 0 residues and exits 0."""
        seed_history(engine, settings)
        assert main(["forget-user", "u1", "--purge-now", "--now", NOW.isoformat()]) == 0
        assert "erased" in capsys.readouterr().out
        assert main(["verify-erasure", "u1"]) == 0
        assert "u1: 0 residues" in capsys.readouterr().out
        assert full_text_scan(engine, MARKERS) == []

    def test_forget_memory_of_a_merge(self, engine, settings, cli_env, capsys):
        """`forget ID --purge-now`: the merge is gone, the other member is active again."""
        ids = seed_history(engine, settings)
        assert main(["forget", str(ids["tea"]), "--purge-now"]) == 0
        assert get(engine, ids["tea"]) is None and get(engine, ids["merged"]) is None
        assert status(engine, ids["morning"]) == "active"
        assert status(engine, ids["home"]) == "active"
        capsys.readouterr()
        assert main(["verify-erasure", "--memory", str(ids["tea"])]) == 0
        assert "0 residues" in capsys.readouterr().out
        assert full_text_scan(engine, ["Prefers oolong", "eighty degrees"]) == []

    def test_asking_again_after_the_purge_says_it_is_done(self, engine, settings, cli_env,
                                                           capsys):  # fmt: skip
        """Repeating forget-user / forget once the target is purged answers with the completed
        request (exit 0), files nothing new; an id that never existed is still exit 2."""
        ids = seed_history(engine, settings)
        assert main(["forget", str(ids["tea"]), "--purge-now"]) == 0
        assert main(["forget-user", "u1", "--purge-now", "--now", NOW.isoformat()]) == 0
        before = requests(engine)
        capsys.readouterr()
        for args in (["forget-user", "u1"], ["forget", str(ids["tea"]), "--purge-now"]):
            assert main(args) == 0
            out = capsys.readouterr().out
            assert "was already erased by request" in out and "verify-erasure" in out
        assert requests(engine) == before
        assert main(["forget-user", "never-existed"]) == 2
        assert "no memories for user" in capsys.readouterr().err

    def test_forget_without_purge_files_a_pending_request_once(self, engine, cli_env, capsys):
        """forget-user twice files one request and says the second is the same."""
        add(engine, "u1")
        assert main(["forget-user", "u1"]) == 0
        assert "filed" in capsys.readouterr().out
        assert main(["forget-user", "u1"]) == 0
        assert "already pending" in capsys.readouterr().out
        assert [r["status"] for r in requests(engine)] == ["pending"]

    def test_forget_suggests_a_command_that_erases_only(self, engine, cli_env, capsys):
        """`forget MEMORY_ID` suggested `memory-gc run --user ID`: a placeholder for a user the
        operator of a memory request does not know, and a run of every job, which retires the
        user's expired and unused rows too (found by an operator walkthrough). It names the
        memory's user and the erasure job; run as printed, it erases and changes nothing else."""
        target = add(engine, "u-7")
        expired = add(engine, "u-7", expires_at=NOW - 3650 * DAY)
        assert main(["forget", str(target)]) == 0
        out = capsys.readouterr().out
        suggested = out.split("`memory-gc ", 1)[1].split("`", 1)[0].split()
        assert suggested == ["run", "--user", "u-7", "--job", "erasure"], out
        assert main(suggested) == 0
        assert status(engine, target) == "deleted"
        assert status(engine, expired) == "active"

    def test_verify_with_residues_exits_1(self, engine, settings, cli_env, capsys):
        """Before the purge, verify-erasure lists each residue with its table and exits 1."""
        add(engine, "u1", "Lives in Quokkaville")
        assert main(["forget-user", "u1"]) == 0
        run(engine, settings)
        capsys.readouterr()
        assert main(["verify-erasure", "u1"]) == 1
        out = capsys.readouterr().out
        assert "residue: memories.id" in out and "residue: memories.content" in out
        assert "2 residues" in out

    def test_verify_prints_an_application_row_key_safely(self, engine, settings, cli_env, capsys):
        """`--all-tables` names residues in the application's own tables by their id: an id
        holding a terminal escape (OSC 0 retitles the window) must not reach the terminal."""
        add(engine, "u1", "Lives in Quokkaville")
        execute(engine, "CREATE TABLE app_notes (id text PRIMARY KEY, body text)")
        execute(engine, "INSERT INTO app_notes VALUES (:id, 'Lives in Quokkaville')",
                id="note\x1b]0;owned\x07\nresidue: forged")  # fmt: skip
        assert main(["forget-user", "u1"]) == 0
        run(engine, settings)
        capsys.readouterr()
        assert main(["verify-erasure", "u1", "--all-tables"]) == 1
        out = capsys.readouterr().out
        assert "app_notes.body row note" in out
        assert "\x1b" not in out and "\x07" not in out
        assert "\nresidue: forged" not in out  # one residue, one line

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["forget-user", "ghost"], "no memories for user 'ghost'"),
            (["forget", "3f1c2b7e-0000-4000-8000-000000000000"], "no memory with id"),
            (["forget", "not-a-uuid"], "is not a UUID"),
            (["verify-erasure", "u1"], "no erasure request for user 'u1'"),
            (["verify-erasure", "--memory", "nope"], "is not a UUID"),
            (["verify-erasure"], "one of the arguments"),
        ],
    )
    def test_bad_input_exits_2_and_changes_nothing(self, engine, cli_env, capsys, argv, message):
        """Unknown or malformed targets: a clear message, exit 2, no row changed or filed."""
        add(engine, "u1")
        before = snapshot(engine)
        assert main(argv) == 2
        assert message in capsys.readouterr().err
        assert snapshot(engine) == before and requests(engine) == []


class TestForgetAfterTheRealJobs:
    def test_every_trace_the_jobs_made_is_removed(self, engine, settings):
        """The traces come from the jobs themselves (an LLM merge and its embedding, a judged
        contradiction pair, importance scores, a stored dry-run plan) through the fake model at
        the HTTP boundary — not seeded. forget-user --purge-now then leaves no residue for
        verify-erasure, none in a database-wide text scan, and no cached decision of the user."""
        from tests.fake_model import FakeModel, fake_port
        from tests.test_compaction import E0, at_similarity

        rows = [
            ("Keeps a parrot named Quokkaberry", E0),
            ("Has a pet parrot called Quokkaberry", at_similarity(0.95)),
            # judged by the contradiction job (cosine 0.8), far from the parrot pair
            ("Commutes to Zanzibarville by ferry", [0.0] * 4 + [1.0, 0.0, 0.0, 0.0]),
            ("Commutes to Zanzibarville by plane", [0.0] * 4 + [0.8, 0.6, 0.0, 0.0]),
        ]
        for text, vector in rows:
            add(engine, "u1", text, embedding=vector)
        bystander = add(engine, "u2", "Keeps bees in the garden", embedding=E0)
        markers = ["quokkaberry", "zanzibarville"]
        with fake_port(engine, settings, FakeModel("good")) as llm:
            run(engine, settings, dry_run=True, llm=llm)
            applied = run(engine, settings, llm=llm)
        assert "create_merged" in {a["action"] for a in applied["actions"]}
        assert count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u1'") >= 3
        assert {t for t, _, _ in full_text_scan(engine, markers)} >= {"memories", "gc_actions",
                                                                       "gc_llm_cache"}  # fmt: skip
        erasure.forget(engine, settings, now=NOW + DAY, user_id="u1", purge_now=True)
        assert verify(engine, now=NOW + DAY, user_id="u1").residues == []
        assert full_text_scan(engine, markers) == []
        assert count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u1'") == 0
        assert status(engine, bystander) == "active"

    @pytest.mark.parametrize("gone_by", ["application", "retention"])
    def test_traces_of_memories_already_gone_are_removed(self, engine, settings, gone_by):
        """The user's rows the jobs wrote about are no longer in the store when the user is
        forgotten (the application deleted them after a dry run; or the history retention
        purged a merge's members): what the worker kept about them — a stored plan's merged
        record and previews, cached merge decisions and embeddings — goes too."""
        from tests.fake_model import FakeModel, fake_port
        from tests.test_compaction import E0, at_similarity

        a = add(engine, "u1", "Keeps a parrot named Quokkaberry", embedding=E0)
        b = add(engine, "u1", "Has a pet parrot called Quokkaberry", embedding=at_similarity(0.95))
        now = NOW
        with fake_port(engine, settings, FakeModel("good")) as llm:
            run(engine, settings, dry_run=True, llm=llm)  # a plan, never applied
            if gone_by == "retention":
                run(engine, settings, llm=llm)  # the merge is applied; members kept as history
        if gone_by == "application":
            sa_delete = "DELETE FROM memories WHERE id = ANY(:ids)"
            with engine.begin() as conn:
                conn.execute(sa.text(sa_delete), {"ids": [a, b]})
        else:
            now = NOW + 400 * DAY
            run(engine, settings, now=now, jobs=["hard_delete"])
        assert get(engine, a) is None and get(engine, b) is None
        add(engine, "u1", "Likes jazz")  # the user still has a row to forget
        assert full_text_scan(engine, ["quokkaberry"])  # the worker's tables still hold it
        erasure.forget(engine, settings, now=now, user_id="u1", purge_now=True)
        assert full_text_scan(engine, ["quokkaberry"]) == []
        assert count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u1'") == 0
        assert verify(engine, now=now, user_id="u1").residues == []

    def test_verify_finds_what_the_worker_kept_about_a_forgotten_user(self, engine, settings):
        """Anything kept about a forgotten user from before the request completed is a residue
        (a cache row, a review item, an audit row with content), even with no erased id or
        content hash to find it by; what the user's new activity brings later is not."""
        add(engine, "u1", "Likes jazz")
        erasure.forget(engine, settings, now=NOW, user_id="u1", purge_now=True)
        assert verify(engine, now=NOW, user_id="u1").residues == []
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO gc_llm_cache (key, kind, user_id, value, created_at)"
                " VALUES ('old', 'merge_group', 'u1', '{}', '2000-01-01'),"
                "        ('new', 'merge_group', 'u1', '{}', now() + interval '1 minute')"
            ))  # fmt: skip
        found = verify(engine, now=NOW, user_id="u1").residues
        assert [(r.table, r.row, r.match) for r in found] == [("gc_llm_cache", "old", "user")]

    def test_a_user_whose_rows_are_all_gone_is_still_forgotten(
        self, engine, settings, cli_env, capsys
    ):
        """The application deleted every row of the user, then asks to forget them: no run
        would ever visit a user without rows, so `forget-user` scrubs what the worker kept
        (a stored plan's previews and merged record, cached decisions) and completes at once
        (it used to refuse: "no memories for user")."""
        from tests.fake_model import FakeModel, fake_port
        from tests.test_compaction import E0, at_similarity

        add(engine, "u1", "Keeps a parrot named Quokkaberry", embedding=E0)
        add(engine, "u1", "Has a pet parrot called Quokkaberry", embedding=at_similarity(0.95))
        with fake_port(engine, settings, FakeModel("good")) as llm:
            run(engine, settings, dry_run=True, llm=llm)
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM memories WHERE user_id = 'u1'"))
        assert full_text_scan(engine, ["quokkaberry"])
        assert main(["forget-user", "u1"]) == 0
        assert "no memories left" in capsys.readouterr().out
        assert full_text_scan(engine, ["quokkaberry"]) == []
        assert requests(engine)[0]["status"] == "completed"
        assert verify(engine, now=NOW, user_id="u1").residues == []
        assert main(["forget-user", "nobody-at-all"]) == 2  # no rows, no traces: unknown

    @pytest.mark.parametrize("kind", ["user", "memory"])
    def test_a_request_the_application_inserts_for_a_user_without_rows_is_completed(
        self, engine, settings, kind
    ):
        """The application files the request with an INSERT (as docs/erasure.md shows) and
        deletes the user's rows itself. No batch visits a user without rows, so the request
        used to stay pending for ever with the worker's traces of the user. A dry run leaves it
        pending; the next applying run scrubs those traces and completes it."""
        from tests.fake_model import FakeModel, fake_port
        from tests.test_compaction import E0, at_similarity

        parrot = add(engine, "u1", "Keeps a parrot named Quokkaberry", embedding=E0)
        add(engine, "u1", "Has a pet parrot called Quokkaberry", embedding=at_similarity(0.95))
        bystander = add(engine, "u2", "Keeps bees in the garden")
        with fake_port(engine, settings, FakeModel("good")) as llm:
            run(engine, settings, dry_run=True, llm=llm)  # a stored plan: previews, a record
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                    " VALUES (:kind, 'u1', :memory_id)"
                ),
                {"kind": kind, "memory_id": parrot if kind == "memory" else None},
            )
            conn.execute(sa.text("DELETE FROM memories WHERE user_id = 'u1'"))
        assert full_text_scan(engine, ["quokkaberry"])
        run(engine, settings, dry_run=True)
        assert requests(engine)[0]["status"] == "pending"  # a dry run never completes one
        applied = run(engine, settings)
        request = requests(engine)[0]
        assert request["status"] == "completed"
        assert str(request["run_id"]) == applied["run_id"]
        assert request["result"]["scrubbed_at"]
        if kind == "user":
            assert full_text_scan(engine, ["quokkaberry"]) == []
            assert verify(engine, now=NOW, user_id="u1").residues == []
        else:  # what was kept about that memory goes: its plan row, the record naming it
            assert verify(engine, now=NOW, memory_id=parrot).residues == []
            assert (
                count(
                    engine,
                    "SELECT count(*) FROM gc_actions WHERE memory_id = :id"
                    " AND content_preview IS NOT NULL",
                    id=parrot,
                )
                == 0
            )
        assert status(engine, bystander) == "active"

    @pytest.mark.parametrize("rows_left", [True, False])
    def test_sweep_errors_of_a_forgotten_user_are_cleared(self, engine, settings, rows_left):
        """A failed sweep request's error text (which once quoted driver messages) is cleared
        by forget-user, whether the user still has rows or only such traces are left."""
        if rows_left:
            add(engine, "u1", "Keeps a parrot named Quokkaberry")
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO gc_sweep_requests (user_id, status, error)"
                " VALUES ('u1', 'failed', 'DataError: … Quokkaberry …')"
            ))  # fmt: skip
        request, _ = erasure.forget(engine, settings, now=NOW, user_id="u1", purge_now=True)
        assert request.status == "completed" or requests(engine)[0]["status"] == "completed"
        assert full_text_scan(engine, ["quokkaberry"]) == []
        assert count(engine, "SELECT count(*) FROM gc_sweep_requests WHERE status = 'failed'") == 1
