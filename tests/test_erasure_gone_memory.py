"""`forget MEMORY_ID` for a memory the application already deleted itself. The worker's audit
may still hold its text (a plan's preview), and a merged record made from it may still be
active. It used to refuse with "no memory with id". Now the user is found in the audit. The
request is filed for that user and carried out like any other. For a user with no rows left,
what the worker kept is scrubbed at once, as `forget-user` does."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa

from gc_worker import erasure, restore
from gc_worker.cli import main
from gc_worker.errors import NotFoundError
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, days_ago, get, run
from tests.test_erasure_helpers import full_text_scan, merge, requests
from tests.test_erasure_residue_review import DAY, LATER, erased, merged_fact


def app_deletes(engine: sa.Engine, where: str, **params) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM memories WHERE {where}"), params)


def test_forgetting_a_deleted_source_erases_the_record_made_from_it(engine, settings, cli_env):
    """A and B were merged into M. The application deletes A, and then the user asks to forget
    A. M still holds A's fact. The request is filed for A's user, and the next run erases M as
    derived from A."""
    a, m = merged_fact(engine)
    app_deletes(engine, "id = :id", id=a)
    assert main(["forget", str(a), "--now", LATER.isoformat()]) == 0
    (filed,) = requests(engine)
    assert (filed["kind"], filed["user_id"], filed["memory_id"]) == ("memory", "u1", a)
    assert filed["status"] == "pending"
    run(engine, settings, now=LATER)
    assert requests(engine)[0]["status"] == "completed" and erased(engine, m)
    run(engine, settings, now=LATER + 2 * DAY)
    assert get(engine, m) is None
    assert verify(engine, now=LATER + 2 * DAY, memory_id=a).residues == []


def test_purge_now_for_a_deleted_memory_runs_at_once(engine, settings):
    """With --purge-now the derived record is erased and purged in the same command."""
    a, m = merged_fact(engine)
    app_deletes(engine, "id = :id", id=a)
    request, run_id = erasure.forget(engine, settings, now=LATER, memory_id=a, purge_now=True)
    assert request.user_id == "u1" and run_id is not None
    assert requests(engine)[0]["status"] == "completed"
    assert get(engine, m) is None


def test_a_deleted_memory_of_a_user_without_rows_is_scrubbed_at_once(
    engine, settings, cli_env, capsys
):
    """A stored plan keeps the previews of two parrot memories. The application deletes every
    row of the user and then asks to forget one of the memories. No batch would visit the user,
    so the worker scrubs what it kept about the memory and completes the request at once."""
    from tests.fake_model import FakeModel, fake_port
    from tests.test_compaction import E0, at_similarity

    parrot = add(engine, "u1", "Keeps a parrot named Quokkaberry", embedding=E0)
    add(engine, "u1", "Has a pet parrot called Quokkaberry", embedding=at_similarity(0.95))
    with fake_port(engine, settings, FakeModel("good")) as llm:
        run(engine, settings, dry_run=True, llm=llm)
    app_deletes(engine, "user_id = 'u1'")
    assert full_text_scan(engine, ["keeps a parrot"])
    assert main(["forget", str(parrot)]) == 0
    assert "no memories of its user left" in capsys.readouterr().out
    (done,) = requests(engine)
    assert (done["kind"], done["memory_id"], done["status"]) == ("memory", parrot, "completed")
    assert full_text_scan(engine, ["keeps a parrot"]) == []
    assert verify(engine, now=NOW, memory_id=parrot).residues == []


def test_the_latest_owner_in_the_audit_is_the_one_asked_about(engine):
    """The application moved a row to another user before deleting it: the request is filed
    for the user who held it last, never for both."""
    a = add(engine, "u1", "Plays the oboe")
    b = add(engine, "u1", "Plays an oboe")
    merge(engine, "u1", [a, b], "Plays the oboe", [1.0] + [0.0] * 7)
    add(engine, "u2", "Collects stamps")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE memories SET user_id = 'u2' WHERE id = :id"), {"id": b})
    merge(engine, "u2", [b], "Plays an oboe (moved)", [0.0, 1.0] + [0.0] * 6)
    app_deletes(engine, "id = :id", id=b)
    with engine.begin() as conn:
        filed = erasure.file_request(conn, memory_id=b)
    assert (filed.kind, filed.user_id, filed.status) == ("memory", "u2", "pending")


def test_a_restores_note_of_a_kept_change_does_not_name_the_owner(engine, settings):
    """A restore records a change it kept under the user of that change: for a row moved to
    another user since, the earlier user. Found by a review: that note, the newest audit row
    naming the memory, made `forget` file the request for the earlier user."""
    m = add(engine, "u1", "Sees Dr Quillfeather on Tuesdays", expires_at=days_ago(1))
    first = run(engine, settings, jobs=["ttl_expiry"])
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE memories SET user_id = 'u2', status = 'active',"
                             " status_reason = NULL, deleted_at = NULL WHERE id = :id"),
                     {"id": m})  # fmt: skip
    run(engine, settings, jobs=["ttl_expiry"], now=NOW + DAY)  # retired again, as u2's
    kept = restore.restore_run(engine, UUID(first["run_id"]), now=NOW + 2 * DAY)
    assert kept.why_not == [(m, "soft_delete", "moved_to_another_user")]
    app_deletes(engine, "id = :id", id=m)
    with engine.begin() as conn:
        assert erasure.file_request(conn, memory_id=m).user_id == "u2"


def test_a_misfiled_completed_request_does_not_answer_for_the_owner(engine, settings):
    """The application filed forget-A under the wrong user and deleted A; that request
    completed without touching the owner's rows. Found by a review: `forget A` then answered
    with it, filing nothing for the owner, and M (A's fact) stayed active."""
    a, m = merged_fact(engine)
    add(engine, "u2", "Collects stamps")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                             " VALUES ('memory', 'u2', :a)"), {"a": a})  # fmt: skip
    app_deletes(engine, "id = :id", id=a)
    run(engine, settings, now=LATER)
    assert [r["status"] for r in requests(engine)] == ["completed"]
    request, _ = erasure.forget(engine, settings, now=LATER, memory_id=a, purge_now=True)
    assert (request.user_id, request.created) == ("u1", True)
    assert get(engine, m) is None
    assert verify(engine, now=LATER, memory_id=a).residues == []


def test_an_id_the_worker_never_saw_is_still_refused(engine):
    add(engine, "u1", "Likes jazz")
    with engine.begin() as conn, pytest.raises(NotFoundError, match="no memory with id"):
        erasure.file_request(conn, memory_id=uuid4())
    assert requests(engine) == []


SUMMARY = "Summary: keeps a parrot named Zorblax; likes jazz"


def summarised_chain(engine: sa.Engine) -> tuple[UUID, UUID, UUID, UUID]:
    """A and B merged into M; M and C summarised into S, whose text keeps A's fact; the model's
    summary decision cached (it names M and C, not A). Returns (A, M, C, S)."""
    from tests.test_erasure_helpers import cache_decision

    a = add(engine, "u1", "Keeps a parrot named Zorblax")
    b = add(engine, "u1", "Keeps a parrot")
    c = add(engine, "u1", "Likes jazz")
    m = merge(engine, "u1", [a, b], "Keeps a parrot named Zorblax", [1.0] + [0.0] * 7)
    s = merge(engine, "u1", [m, c], SUMMARY, [0.0, 1.0] + [0.0] * 6)
    cache_decision(engine, "u1", [m, c], {"summary": SUMMARY})
    return a, m, c, s


@pytest.mark.parametrize("rows_left", [True, False])
def test_a_summary_of_a_merge_deleted_with_the_memory_keeps_no_copy(engine, settings, rows_left):
    """The application deleted A, the merged record M and the summary S made of M (S states A's
    fact), then asks to forget A. No row is left to erase, but the audit (S's create_merged row:
    its preview and record; the rows merging M into S) and the cached summary decision still
    held S's text: the scrub looked for A's id only, which none of them names. They go with A,
    whether the user still has rows (a run completes the request) or not (completed at once);
    verify-erasure finds nothing."""
    a, m, _, s = summarised_chain(engine)
    if rows_left:
        add(engine, "u1", "Plays chess")
    app_deletes(engine, "id = ANY(:ids)" if rows_left else "user_id = 'u1'", ids=[a, m, s])
    erasure.forget(engine, settings, now=NOW, memory_id=a)
    run(engine, settings, now=NOW)
    assert requests(engine)[0]["status"] == "completed"
    assert full_text_scan(engine, ["zorblax"]) == []
    assert verify(engine, now=NOW, memory_id=a).residues == []


def test_verify_names_what_is_kept_about_a_record_made_from_the_memory(engine, settings):
    """What the worker still keeps about a record made from the forgotten memory, deleted by
    the application (the cached summary of its merge, left by an earlier version), is a residue
    of that erasure: verify-erasure --memory used to look for the memory's own id only."""
    a, m, c, s = summarised_chain(engine)
    add(engine, "u1", "Plays chess")
    app_deletes(engine, "id = ANY(:ids)", ids=[a, m, s])
    erasure.forget(engine, settings, now=NOW, memory_id=a)
    run(engine, settings, now=NOW)
    from tests.test_erasure_helpers import cache_decision

    cache_decision(engine, "u1", [m, c], {"summary": SUMMARY})
    found = verify(engine, now=NOW, memory_id=a).residues
    assert {(r.table, r.column) for r in found} >= {("gc_llm_cache", "memory_ids")}
