"""What "forget me" reaches, and what it must never reach: cases a review reproduced (each
failed before its fix)."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from gc_worker import erasure
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, execute, get, run, status
from tests.test_erasure_helpers import merge, requests

DAY = timedelta(days=1)
LATER = NOW + 400 * DAY


def in_use(engine: sa.Engine, user: str = "u1") -> None:
    """Keep the user's active rows in use so no other job retires them."""
    execute(
        engine,
        "UPDATE memories SET last_accessed_at = :t, importance = 5"
        " WHERE user_id = :u AND status = 'active'",
        t=LATER - DAY,
        u=user,
    )


def test_a_misfiled_memory_request_of_a_user_with_rows_completes_and_scrubs_another_user(
    engine, settings
):
    """An application files forget-memory X under the wrong user id (u2, who has rows of her
    own; X belongs to u1). With no rows, such a request is left pending for the operator
    (test_erasure.py); with rows, the run completes it at once -- nothing erased, X active --
    and the completion's scrub (keyed by X's id, over every user of the batch and of the
    cache / review tables) deletes u1's cached decisions and review items and strips u1's
    audit rows: an erasure action touching another user's rows."""
    from tests.test_erasure_helpers import cache_decision, count, review

    x = add(engine, "u1", "Takes insulin at 8am")
    y = add(engine, "u1", "Takes insulin with breakfast")
    add(engine, "u2", "Keeps bees")
    in_use(engine, "u1")
    in_use(engine, "u2")
    cache_decision(engine, "u1", [x, y], {"merged_text": "Takes insulin at 8am with breakfast"})
    review(engine, "u1", [x, y], ["Takes insulin at 8am", "Takes insulin with breakfast"])
    execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                    " VALUES ('memory', 'u2', :x)", x=x)  # fmt: skip
    run(engine, settings, now=NOW + DAY)
    state = {
        "request": execute(engine, "SELECT status FROM gc_erasure_requests").scalar(),
        "x": status(engine, x),
        "u1 cache": count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u1'"),
        "u1 reviews": count(engine, "SELECT count(*) FROM gc_review_items WHERE user_id = 'u1'"),
        "u1 audit scrubbed": count(
            engine, "SELECT count(*) FROM gc_actions WHERE user_id = 'u1' AND details ? 'scrubbed'"
        ),
    }
    assert state == {
        "request": "pending",
        "x": "active",
        "u1 cache": 1,
        "u1 reviews": 1,
        "u1 audit scrubbed": 0,
    }


def test_a_request_completes_while_a_record_derived_from_a_same_content_twin_is_active(
    engine, settings
):
    """forget A. A' (same normalised text, another row) is erased with it (same_content_as),
    and so must be M, the record merged from A' (derived_from A'). While the application
    holds M during the run (skipped, never waited for) M's erasure drifts -- but the request's
    completion (erasure_complete_requests) follows lineage from A only, not from its twins, so
    the request completes. From then on nothing plans M's erasure again (no pending request, no
    tombstone matches M's text): M -- A's fact -- stays active for good, and A' can never be
    purged (its derived record is not erased)."""
    a = add(engine, "u1", "Allergic to penicillin")
    twin = add(engine, "u1", "allergic to penicillin.")
    b = add(engine, "u1", "Has a penicillin allergy")
    add(engine, "u1", "Likes jazz")
    m = merge(engine, "u1", [twin, b], "Allergic to penicillin", [1.0] + [0.0] * 7)
    execute(
        engine, "UPDATE memories SET content = 'Penicillin allergy (merged)' WHERE id = :m", m=m
    )  # (a merged wording: no tombstone of A matches M's text)
    in_use(engine)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=a)
    with engine.connect() as app:
        app.execute(sa.text("SELECT 1 FROM memories WHERE id = :m FOR UPDATE"), {"m": m})
        run(engine, settings, now=NOW + DAY)
        app.rollback()
    for day in (2, 5, 9):  # later runs, past the erasure retention
        run(engine, settings, now=NOW + day * DAY)
    (req,) = requests(engine)
    m_row = get(engine, m)
    assert m_row is None or m_row["status"] == "deleted", (
        f"request {req['status']} while M, derived from A's twin, is {m_row['status']}: "
        f"{m_row['content']!r}"
    )
    # the next run erased M; past the retention the twin, M and A are purged, the request done
    assert req["status"] == "completed"
    assert [get(engine, x) for x in (a, twin, m)] == [None, None, None]
    assert verify(engine, now=NOW + 9 * DAY, memory_id=a).residues == []


def test_intermediate_record_deleted_by_the_application_hides_the_summary(engine, settings):
    """A, B merged into M; M, C summarised into S (lineage S <- M <- A). The application then
    deletes M itself (e.g. its own cleanup of inactive rows): ON DELETE CASCADE drops S <- M and
    M <- A. forget A completes with S -- which states A's fact -- still active, its audit row
    keeping the summary text, and verify-erasure reports clean. The worker's audit still names
    the chain (create_merged S sources [M, C], create_merged M sources [A, B])."""
    a = add(engine, "u1", "Allergic to penicillin since 2019")
    b = add(engine, "u1", "Has a penicillin allergy")
    c = add(engine, "u1", "Takes antihistamines in spring")
    add(engine, "u1", "Likes jazz")
    m = merge(engine, "u1", [a, b], "Allergic to penicillin (since 2019)", [1.0] + [0.0] * 7)
    s = merge(
        engine,
        "u1",
        [m, c],
        "Penicillin allergy since 2019; antihistamines in spring",
        [0.0, 1.0] + [0.0] * 6,
    )
    in_use(engine)
    execute(engine, "DELETE FROM memories WHERE id = :m", m=m)  # the application's own delete

    erasure.forget(engine, settings, now=NOW + DAY, memory_id=a)
    run(engine, settings, now=NOW + DAY)
    run(engine, settings, now=NOW + 3 * DAY)  # past [erasure] retention_days: A is purged
    (req,) = requests(engine)
    assert req["status"] == "completed" and get(engine, a) is None
    assert verify(engine, now=NOW + 3 * DAY, memory_id=a).residues == []  # "clean"
    s_row = get(engine, s)
    audit_text = execute(
        engine,
        "SELECT details -> 'record' ->> 'content' FROM gc_actions"
        " WHERE memory_id = :s AND action = 'create_merged'",
        s=s,
    ).scalar()
    assert s_row is None or (s_row["status"], s_row["status_reason"]) == ("deleted", "erasure"), (
        f"request completed and verified clean, yet summary S (made from A's merge) is "
        f"{s_row['status']}: {s_row['content']!r}"
    )
    assert audit_text is None  # erased with A, then purged: its text scrubbed from the audit


def test_forgetting_a_summary_reaches_rows_behind_a_record_the_application_deleted(
    engine, settings
):
    """Downward, the same: forget S (made of M and C; M of A and B, M deleted by the
    application) erases what S states — C through lineage, A and B through the audit."""
    a = add(engine, "u1", "Allergic to penicillin since 2019")
    b = add(engine, "u1", "Has a penicillin allergy")
    c = add(engine, "u1", "Takes antihistamines in spring")
    keep = add(engine, "u1", "Likes jazz")
    m = merge(engine, "u1", [a, b], "Allergic to penicillin (since 2019)", [1.0] + [0.0] * 7)
    s = merge(engine, "u1", [m, c], "Penicillin allergy since 2019; antihistamines in spring",
              [0.0, 1.0] + [0.0] * 6)  # fmt: skip
    in_use(engine)
    execute(engine, "DELETE FROM memories WHERE id = :m", m=m)  # the application's own delete

    erasure.forget(engine, settings, now=NOW + DAY, memory_id=s)
    run(engine, settings, now=NOW + DAY)
    erased = [(get(engine, x)["status"], get(engine, x)["status_reason"]) for x in (a, b, c, s)]
    assert erased == [("deleted", "erasure")] * 4
    assert status(engine, keep) == "active"
    (req,) = requests(engine)
    assert req["status"] == "completed"


def test_the_audit_preview_of_a_deleted_twin_keeps_the_erased_text_for_good(engine, settings):
    """B states A's text word for word. The worker retired B (TTL) and audited it with a
    preview; the application then deleted B itself (its own cleanup of retired rows). forget A
    completes, but the scrub reaches audit rows only by erased id, so B's audit row keeps A's
    exact text. verify-erasure finds it (content hash), yet no run or command ever removes it:
    the request can never verify clean."""
    a = add(engine, "u1", "Allergic to penicillin")
    b = add(engine, "u1", "Allergic to penicillin", expires_at=NOW - DAY)
    add(engine, "u1", "Likes jazz")
    in_use(engine)
    run(engine, settings, now=NOW, jobs=["ttl_expiry"])
    assert status(engine, b) == "deleted"
    execute(engine, "DELETE FROM memories WHERE id = :b", b=b)  # the application's cleanup

    erasure.forget(engine, settings, now=NOW + DAY, memory_id=a)
    for day in (1, 3, 5):
        run(engine, settings, now=NOW + day * DAY)
    (req,) = requests(engine)
    assert req["status"] == "completed" and get(engine, a) is None
    kept = (
        execute(engine, "SELECT content_preview FROM gc_actions WHERE content_preview IS NOT NULL")
        .scalars()
        .all()
    )
    residues = [r.describe() for r in verify(engine, now=NOW + 5 * DAY, memory_id=a).residues]
    assert (kept, residues) == ([], [])


def test_the_cached_merge_text_of_a_deleted_twin_is_dropped(engine, settings, make_llm):
    """One table further than the audit preview: B states A's text word for word and was
    merged (with C) by the model, whose answer — that very text — is cached under [B, C]. The
    application deletes B. After forget A the cached decision, which names neither A nor the
    merged record, held A's text for good and verify-erasure never passed (a review found it)."""
    from tests.test_compaction import E0, at_similarity
    from tests.test_llm_guards import Model, merging_to

    text = "Allergic to penicillin"
    b = add(engine, "u1", text, created_at=NOW - 9 * DAY, embedding=E0)
    add(engine, "u1", "Is allergic to penicillin", created_at=NOW - 2 * DAY,
        embedding=at_similarity(0.95))  # fmt: skip
    report = run(engine, settings, jobs=["compaction"], llm=make_llm(Model(merging_to(text))))
    assert [x["action"] for x in report["actions"]].count("create_merged") == 1
    execute(engine, "DELETE FROM memories WHERE id = :b", b=b)  # the application's cleanup
    a = add(engine, "u1", text)
    add(engine, "u1", "Likes jazz")
    in_use(engine)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=a)
    for day in (1, 3, 5):
        run(engine, settings, now=NOW + day * DAY)
    (req,) = requests(engine)
    assert req["status"] == "completed" and get(engine, a) is None
    assert verify(engine, now=NOW + 5 * DAY, memory_id=a).residues == []
