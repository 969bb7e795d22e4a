"""A memory the application moved from one user to another (an account merge, a misattributed
row put right): the worker's tables keep what it recorded about the row under each user it
belonged to. Forgetting the memory must take its text out of all of them, not only out of the
current owner's. And a request the application misfiled under the wrong user must not scrub
anything about a memory that is still stored and not erased."""

from __future__ import annotations

from uuid import UUID

import pytest
import sqlalchemy as sa

from gc_worker import erasure, erasure_scrub, restore
from gc_worker.cli import main
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, days_ago, get, run
from tests.test_erasure_helpers import full_text_scan, requests
from tests.test_erasure_residue_review import DAY

SECRET = "quillfeather"


def moved_after_audit(engine: sa.Engine, settings) -> tuple[UUID, dict]:
    """m expired as u1's and was retired by a run (its audit row, under u1, keeps a preview and
    the prior state); the application then moved it to u2 and put it back on the read path."""
    m = add(engine, "u1", "Sees Dr Quillfeather on Tuesdays", expires_at=days_ago(1))
    add(engine, "u2", "Collects stamps")
    first = run(engine, settings, jobs=["ttl_expiry"])
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE memories SET user_id = 'u2', status = 'active',"
                             " status_reason = NULL, deleted_at = NULL, expires_at = NULL"
                             " WHERE id = :id"), {"id": m})  # fmt: skip
    return m, first


def audit_rows(engine: sa.Engine, memory_id: UUID) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT user_id, content_preview, details, prior FROM gc_actions"
                    " WHERE memory_id = :id ORDER BY recorded_at, id"), {"id": memory_id},
        )  # fmt: skip
        return [dict(r._mapping) for r in rows]


def test_forgetting_a_moved_memory_scrubs_its_earlier_users_audit(engine, settings):
    m, _ = moved_after_audit(engine, settings)
    assert full_text_scan(engine, [SECRET])
    request, _ = erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    assert request.user_id == "u2" and requests(engine)[0]["status"] == "completed"
    assert get(engine, m) is None
    assert full_text_scan(engine, [SECRET]) == []
    (earlier, *_) = audit_rows(engine, m)  # the skeleton stays: who, what, why
    assert earlier["user_id"] == "u1" and earlier["content_preview"] is None
    assert earlier["details"].get("scrubbed") is True
    assert verify(engine, now=NOW + 2 * DAY, memory_id=m).residues == []


def test_verification_finds_an_earlier_users_audit_text(engine, settings):
    """What a scrub missed under the earlier user is a residue of the erasure."""
    m, _ = moved_after_audit(engine, settings)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    with engine.begin() as conn:  # as a scrub limited to the current owner left it
        conn.execute(sa.text("UPDATE gc_actions SET content_preview = 'Sees Dr Quillfeather'"
                             " WHERE memory_id = :id AND user_id = 'u1'"), {"id": m})  # fmt: skip
    result = verify(engine, now=NOW + 2 * DAY, memory_id=m)
    assert [(r.table, r.column, r.match) for r in result.residues] == [
        ("gc_actions", "content_preview", "content")
    ]
    assert "gc_actions.content_preview" in result.residues[0].describe()


def test_forgetting_a_moved_memory_the_application_deleted(engine, settings, cli_env):
    """Deleted by the application after the move: the audit names both users; both lose it."""
    m, _ = moved_after_audit(engine, settings)
    run(engine, settings, jobs=["ttl_expiry"], now=NOW + DAY)  # nothing to do: u2's row is live
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE memories SET expires_at = :t WHERE id = :id"),
                     {"t": NOW + DAY, "id": m})  # fmt: skip
    run(engine, settings, jobs=["ttl_expiry"], now=NOW + 2 * DAY)  # retired again, as u2's
    assert {r["user_id"] for r in audit_rows(engine, m)} == {"u1", "u2"}
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": m})
    assert main(["forget", str(m), "--now", (NOW + 3 * DAY).isoformat()]) == 0
    run(engine, settings, now=NOW + 3 * DAY)
    assert requests(engine)[0]["status"] == "completed"
    assert full_text_scan(engine, [SECRET]) == []
    assert verify(engine, now=NOW + 3 * DAY, memory_id=m).residues == []


def test_a_misfiled_request_scrubs_nothing_about_a_stored_memory(engine, settings):
    """The application filed forget-m under u2, who never held m; m is u1's and stays on the
    read path. The request waits for the operator, and u1's audit of m keeps its text, so the
    run that retired m can still be restored — with u1 and u2 in the same batch."""
    m = add(engine, "u1", "Sees Dr Quillfeather on Tuesdays", expires_at=days_ago(1))
    add(engine, "u2", "Collects stamps")
    first = run(engine, settings, jobs=["ttl_expiry"])
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                             " VALUES ('memory', 'u2', :m)"), {"m": m})  # fmt: skip
    run(engine, settings, now=NOW + DAY)
    assert requests(engine)[0]["status"] == "pending"
    with engine.begin() as conn:  # scrubbing by id directly: m is stored and not erased
        erasure_scrub.scrub(conn, [m], users=["u2"])
    (retired,) = audit_rows(engine, m)
    assert retired["content_preview"] == "Sees Dr Quillfeather on Tuesdays"
    assert "scrubbed" not in retired["details"]
    undone = restore.restore_run(engine, UUID(first["run_id"]), now=NOW + 2 * DAY)
    assert undone.why_not == [] and get(engine, m)["status"] == "active"


def test_the_earlier_users_cached_decisions_and_reviews_go_too(engine, settings):
    """u1's cached decision and open review about m (a quoted text) are dropped; u1's
    dismissal of a restored merge of m, k and j loses m and keeps the other two apart."""
    m, _ = moved_after_audit(engine, settings)
    k, j = add(engine, "u1", "Likes jazz"), add(engine, "u1", "Likes blues")
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO gc_llm_cache (key, kind, user_id, memory_ids, value)"
            " VALUES ('c1', 'merge_group', 'u1', ARRAY[CAST(:m AS uuid)],"
            "         '{\"text\": \"Sees Dr Quillfeather\"}')"
        ), {"m": m})  # fmt: skip
        conn.execute(sa.text(
            "INSERT INTO gc_review_items (user_id, kind, memory_ids, reason, details)"
            " VALUES ('u1', 'contradiction', ARRAY[CAST(:m AS uuid), :k], 'x',"
            "         '{\"texts\": [\"Sees Dr Quillfeather\"]}'),"
            "        ('u1', 'compaction', ARRAY[CAST(:m AS uuid), :k, :j], 'restored', '{}')"
        ), {"m": m, "k": k, "j": j})  # fmt: skip
        conn.execute(sa.text("UPDATE gc_review_items SET status = 'resolved'"
                             " WHERE reason = 'restored'"))  # fmt: skip
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    assert full_text_scan(engine, [SECRET]) == []
    with engine.connect() as conn:
        kept = conn.execute(sa.text("SELECT user_id, memory_ids FROM gc_review_items")).all()
        assert conn.execute(sa.text("SELECT count(*) FROM gc_llm_cache")).scalar() == 0
    assert [(u, sorted(ids, key=str)) for u, ids in kept] == [("u1", sorted([k, j], key=str))]


def test_asking_again_scrubs_what_an_earlier_completion_left(engine, settings, cli_env, capsys):
    """A request completed before every user's rows were scrubbed left the earlier user's
    preview; verification names it, and `forget` of the gone memory again takes it out."""
    m, _ = moved_after_audit(engine, settings)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE gc_actions SET content_preview = 'Sees Dr Quillfeather'"
                             " WHERE memory_id = :id AND user_id = 'u1'"), {"id": m})  # fmt: skip
    assert main(["verify-erasure", "--memory", str(m)]) == 1
    assert main(["forget", str(m)]) == 0
    assert full_text_scan(engine, [SECRET]) == []
    assert main(["verify-erasure", "--memory", str(m)]) == 0
    (request,) = requests(engine)
    assert request["status"] == "completed" and request["verified_at"] is not None


def test_a_row_the_application_soft_deleted_without_a_reason_is_not_erased(engine, settings):
    """The application soft-deletes m itself (status 'deleted', status_reason NULL: the
    contract allows it), the user asks to forget m, and the application holds m's row while the
    nightly run would erase it. Found by a review: `NOT (status = 'deleted' AND status_reason =
    ANY(…))` is NULL for a NULL reason, so the request completed with m still stored (its text
    kept until retention) and the earlier user's audit was scrubbed as if m were erased."""
    m, _ = moved_after_audit(engine, settings)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE memories SET status = 'deleted', deleted_at = :t"
                             " WHERE id = :m"), {"t": NOW, "m": m})  # fmt: skip
        assert erasure_scrub.gone_ids(conn, [m]) == []
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m)
    with engine.connect() as app:  # holds m: the erasure drifts
        app.execute(sa.text("SELECT 1 FROM memories WHERE id = :m FOR UPDATE"), {"m": m})
        run(engine, settings, jobs=["erasure"], now=NOW + DAY)
        app.rollback()
    assert requests(engine)[0]["status"] == "pending"
    assert audit_rows(engine, m)[0]["content_preview"] == "Sees Dr Quillfeather on Tuesdays"
    run(engine, settings, jobs=["erasure"], now=NOW + DAY)  # not held now: erased, completed
    assert requests(engine)[0]["status"] == "completed"
    assert get(engine, m)["status_reason"] == "erasure"
    assert audit_rows(engine, m)[0]["content_preview"] is None


def _move_and_forget_during_the_call(engine, settings, m: UUID, reply):
    """A model answer that first lets the application move m to u2 and u2 forget it with
    --purge-now (it waits only for u2's batches), then answers ``reply(payload)``."""
    state: dict = {}

    def answer(kind, payload):
        if not state:
            state["done"] = True
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE memories SET user_id = 'u2' WHERE id = :id"),
                             {"id": m})  # fmt: skip
            erasure.forget(engine, settings, now=NOW, memory_id=m, purge_now=True)
            assert get(engine, m) is None
        return reply(payload)

    return answer, state


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("model", ["merges", "is_down"])
def test_an_earlier_owners_batch_keeps_nothing_of_a_memory_erased_meanwhile(
    engine, settings, make_llm, dry_run, model
):
    """u1's batch reads m and asks the model (minutes); meanwhile the application moves m to
    u2 and u2's `forget m --purge-now` completes. Found by a review: what u1's batch then
    recorded — the merge plan's text, a deferred group's preview, the cached decision — kept
    m's text, and verification said clean. The batch scrubs, in its transaction, what it
    records about a memory erased or gone since it read it."""
    import httpx2

    from tests.test_compaction import E0, at_similarity
    from tests.test_llm_guards import Model

    m = add(engine, "u1", "Sees Dr Quillfeather on Tuesdays", created_at=days_ago(9),
            embedding=E0)  # fmt: skip
    add(engine, "u1", "Sees Dr. Quillfeather every Tuesday", created_at=days_ago(2),
        embedding=at_similarity(0.95))  # fmt: skip
    add(engine, "u2", "Collects stamps")
    replies = {
        "merges": lambda payload: {"is_duplicate_set": True, "reason": None,
                                   "member_ids": [x["id"] for x in payload],
                                   "merged_text": "Sees Dr Quillfeather on Tuesdays"},
        "is_down": lambda payload: httpx2.Response(503, json={"error": {"message": "busy"}}),
    }  # fmt: skip
    answer, state = _move_and_forget_during_the_call(engine, settings, m, replies[model])
    run(engine, settings, jobs=["compaction"], users=["u1"], dry_run=dry_run,
        llm=make_llm(Model(answer)))  # fmt: skip
    assert state and requests(engine)[0]["status"] == "completed"
    assert full_text_scan(engine, ["Quillfeather on Tuesdays"]) == []
    assert verify(engine, now=NOW + DAY, memory_id=m).residues == []
