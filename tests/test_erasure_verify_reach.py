"""verify-erasure names every residue the scrub removes, under any user: deferred groups and
merges naming the memory, cached decisions and review items naming it. Found by a review: it
read only audit rows about the memory itself, and the other tables for the request's user only,
so it said clean with an earlier user's deferred preview or a plan's merged text still there."""

from __future__ import annotations

import json
from uuid import uuid4

import sqlalchemy as sa

from gc_worker import erasure
from gc_worker.actions import Action, Kind
from gc_worker.verify_erasure import verify
from tests.store import NOW, add
from tests.test_erasure_helpers import apply_actions, full_text_scan, requests
from tests.test_erasure_residue_review import DAY

TEXT = "Sees Dr Quillfeather on Tuesdays"


def _move(engine, m, to):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE memories SET user_id = :u WHERE id = :id"), {"u": to, "id": m})


def deferred_group(engine, m, k, *, preview: str | None) -> None:
    """u1's compaction deferred the group {m, k} (no model), with ``preview`` as its text."""
    group = Action(job="compaction", action=Kind.DEFERRED, user_id="u1",
                   reason="llm_unavailable", details={"memory_ids": [str(m), str(k)]},
                   preview=preview)  # fmt: skip
    apply_actions(engine, [group])


def test_verify_names_an_earlier_users_deferred_group_preview(engine, settings):
    """Docs: 'Requests completed before this version may have left an earlier user's rows:
    verify-erasure names them'. A deferred group of u1 naming m, with m's text as preview, is
    such a row (the scrub under every user now removes it)."""
    m = add(engine, "u1", TEXT)
    k = add(engine, "u1", "Likes jazz")
    deferred_group(engine, m, k, preview=TEXT)
    _move(engine, m, "u2")
    add(engine, "u2", "Collects stamps")
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    assert requests(engine)[0]["status"] == "completed"
    assert full_text_scan(engine, ["Quillfeather"]) == []  # the scrub handled it
    # what a completion before this version left (the scrub only covered the owner's rows)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE gc_actions SET content_preview = :t, details ="
                " details - 'scrubbed' WHERE memory_id IS NULL"
            ),
            {"t": TEXT},
        )
    assert full_text_scan(engine, ["Quillfeather"])
    result = verify(engine, now=NOW + 2 * DAY, memory_id=m)
    assert result.residues, "verify-erasure says clean while u1's audit still states m's text"


def test_verify_names_an_unscrubbed_merge_plan_naming_the_memory(engine, settings):
    """Docs (Limits): texts quoting the memory are removed by id '(any audit row, cached
    decision or review item naming the memory), which verification checks'. A plan's merged
    record made from m (details.sources names m) that still holds its text is not seen."""
    m = add(engine, "u1", TEXT)
    k = add(engine, "u1", "Likes jazz")
    merged = "Sees Dr Quillfeather on Tuesdays and likes jazz"
    deferred_group(engine, m, k, preview=None)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    assert requests(engine)[0]["status"] == "completed"
    # an (unapplied) plan's create_merged row naming m whose record still holds the text
    with engine.begin() as conn:
        run_id = conn.execute(sa.text("SELECT run_id FROM gc_actions LIMIT 1")).scalar()
        conn.execute(
            sa.text(
                "INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id,"
                " reason, details, outcome, content_preview) VALUES (:r, 0, 99, 'compaction',"
                " 'create_merged', :id, 'u1', 'near_duplicate', CAST(:d AS jsonb), 'planned', NULL)"
            ),
            {
                "r": run_id,
                "id": uuid4(),
                "d": json.dumps({"record": {"content": merged}, "sources": [str(m), str(k)]}),
            },
        )
    assert full_text_scan(engine, ["Quillfeather"])
    result = verify(engine, now=NOW + 2 * DAY, memory_id=m)
    assert result.residues, "verify-erasure says clean while a plan row naming m quotes it"


def test_verify_names_another_users_cached_decision_and_review_item(engine, settings):
    m = add(engine, "u1", TEXT)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=m, purge_now=True)
    assert verify(engine, now=NOW + DAY, memory_id=m).residues == []
    with engine.begin() as conn:  # written by a batch that read m before it was erased
        conn.execute(sa.text("INSERT INTO gc_llm_cache (key, kind, user_id, memory_ids, value)"
                             " VALUES ('c', 'merge_group', 'u9', ARRAY[CAST(:m AS uuid)], '{}')"),
                     {"m": m})  # fmt: skip
        conn.execute(sa.text("INSERT INTO gc_review_items (user_id, kind, memory_ids, reason)"
                             " VALUES ('u9', 'contradiction', ARRAY[CAST(:m AS uuid)], 'x')"),
                     {"m": m})  # fmt: skip
    found = {(r.table, r.match) for r in verify(engine, now=NOW + DAY, memory_id=m).residues}
    assert found == {("gc_llm_cache", "id"), ("gc_review_items", "id")}
