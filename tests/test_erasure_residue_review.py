"""Forget-me residues an adversarial review found (ninth session): a requested memory purged
before the erasure job saw it, a purged intermediate record breaking the lineage chain, and a
stale plan queueing a review about a forgotten user again. Each test failed before its fix."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID, uuid4

import pytest
import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker import erasure
from gc_worker.actions import Action, Kind
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, city_pair, days_ago, get, run, status
from tests.test_erasure_helpers import apply_actions, merge, requests, tombstones

DAY = timedelta(days=1)
LATER = NOW + 400 * DAY  # past [hard_delete] history_retention_days (365)


def merged_fact(engine: sa.Engine) -> tuple[UUID, UUID]:
    """A and B merged into M (A, B merged: purged after the history retention); M in use."""
    a = add(engine, "u1", "Allergic to penicillin since 2019")
    b = add(engine, "u1", "Has a penicillin allergy")
    add(engine, "u1", "Likes jazz")
    m = merge(engine, "u1", [a, b], "Allergic to penicillin (since 2019)", [1.0] + [0.0] * 7)
    with engine.begin() as conn:  # in use: no other job retires the active rows
        conn.execute(
            sa.text(
                "UPDATE memories SET last_accessed_at = :t, importance = 5"
                " WHERE user_id = 'u1' AND status = 'active'"
            ),
            {"t": LATER - DAY},
        )
    return a, m


def erased(engine: sa.Engine, memory_id: UUID) -> bool:
    row = get(engine, memory_id)
    return row is not None and (row["status"], row["status_reason"]) == ("deleted", "erasure")


@pytest.mark.parametrize("how", ["stale_plan", "hard_delete_only_run"])
def test_a_requested_memory_is_not_purged_before_the_erasure_job_erases_it(engine, settings, how):
    """forget A, then a purge by hard_delete reaches A first — a plan made before the request
    (plan_then_apply), or a run without the erasure job. The purge took A's lineage (M <- A)
    with it: the next run completed the request with nothing erased, no tombstone, M — A's
    fact — active, and verify-erasure clean. The purge now waits for the erasure."""
    a, m = merged_fact(engine)
    plan = run(engine, settings, dry_run=True, now=LATER) if how == "stale_plan" else None
    assert plan is None or any(
        x["action"] == "hard_delete" and x["memory_id"] == str(a) for x in plan["actions"]
    )
    erasure.forget(engine, settings, now=LATER, memory_id=a)
    if plan is not None:
        applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    else:
        applied = UUID(run(engine, settings, now=LATER, jobs=["hard_delete"])["run_id"])
    with engine.connect() as conn:
        drifted = conn.execute(
            sa.text(
                "SELECT memory_id FROM gc_actions WHERE run_id = :r AND outcome = 'drifted'"
                " AND action = 'hard_delete'"
            ),
            {"r": applied},
        ).scalars()
        assert a in set(drifted)  # held, reported as drifted
    assert status(engine, a) == "merged"
    run(engine, settings, now=LATER)  # the next full run: the erasure job
    (done,) = requests(engine)
    assert done["status"] == "completed"
    assert erased(engine, a) and erased(engine, m)
    assert {t["memory_id"] for t in tombstones(engine)} >= {a, m}
    run(engine, settings, now=LATER + 2 * DAY)  # [erasure] retention_days later: purged
    assert get(engine, a) is None and get(engine, m) is None
    assert verify(engine, now=LATER + 2 * DAY, memory_id=a).residues == []


def test_a_requested_memory_the_application_deleted_is_followed_through_the_audit(engine, settings):
    """forget A, then the application deletes A itself: its lineage (M <- A) cascaded away,
    and the next run completed the request with nothing erased while M — A's fact — stayed
    active and verify-erasure was clean. The records the worker made from A are in its audit
    (create_merged details.sources): they are erased as derived from A."""
    a, m = merged_fact(engine)
    erasure.forget(engine, settings, now=LATER, memory_id=a)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": a})
    report = run(engine, settings, now=LATER)
    (done,) = requests(engine)
    assert done["status"] == "completed" and done["result"]["erased"] == 1
    assert erased(engine, m)
    (action,) = [x for x in report["actions"] if x["memory_id"] == str(m)]
    assert action["details"]["derived_from"] == [str(a)]
    run(engine, settings, now=LATER + 2 * DAY)
    assert get(engine, m) is None
    assert verify(engine, now=LATER + 2 * DAY, memory_id=a).residues == []


def forget_deleted_then_run_holding(
    engine: sa.Engine, settings, *, forgotten: UUID, held: UUID
) -> None:
    """forget ``forgotten``, the application deletes it, then a run while the application
    holds ``held`` (FOR UPDATE: skipped by the worker, never waited for)."""
    erasure.forget(engine, settings, now=LATER, memory_id=forgotten)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": forgotten})
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT 1 FROM memories WHERE id = :h FOR UPDATE"), {"h": held})
        run(engine, settings, now=LATER)
        holder.rollback()


def test_the_request_stays_pending_while_a_record_found_in_the_audit_is_not_erased(
    engine, settings
):
    """The request's completion follows the audit too: a record made from the deleted memory
    that the application holds during the run (skipped, never waited for) keeps it pending."""
    a, m = merged_fact(engine)
    forget_deleted_then_run_holding(engine, settings, forgotten=a, held=m)
    assert requests(engine)[0]["status"] == "pending" and status(engine, m) == "active"
    run(engine, settings, now=LATER)
    assert requests(engine)[0]["status"] == "completed" and erased(engine, m)


def test_a_requested_record_the_application_deleted_takes_its_sources_through_the_audit(
    engine, settings
):
    """forget M (a merged record), then the application deletes M: the request completed with
    A and B — which state M's fact — still stored (merged); with M stored they are erased with
    it (source_of). The audit's create_merged row of M names them. While the application holds
    one of them, the request stays pending."""
    a, m = merged_fact(engine)
    (b,) = [
        r.id
        for r in sa_rows(engine, "SELECT id FROM memories WHERE superseded_by = :m", m=m)
        if r.id != a
    ]
    forget_deleted_then_run_holding(engine, settings, forgotten=m, held=b)
    assert requests(engine)[0]["status"] == "pending" and erased(engine, a)
    report = run(engine, settings, now=LATER)
    assert requests(engine)[0]["status"] == "completed" and erased(engine, b)
    (action,) = [x for x in report["actions"] if x["memory_id"] == str(b)]
    assert action["details"]["source_of"] == [str(m)]


def sa_rows(engine: sa.Engine, sql: str, **params: object) -> list:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).all()


def test_an_unrelated_request_for_a_deleted_memory_erases_nothing(engine, settings):
    """A requested memory the worker never merged, deleted by the application: nothing else
    to erase; the request completes and another user's record is untouched."""
    gone = add(engine, "u1", "A passing remark")
    kept = add(engine, "u1", "Likes jazz")
    erasure.forget(engine, settings, now=NOW, memory_id=gone)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": gone})
    run(engine, settings)
    (done,) = requests(engine)
    assert done["status"] == "completed" and done["result"]["erased"] == 0
    assert status(engine, kept) == "active"


def test_a_user_request_holds_every_purge_of_the_users_rows(engine, settings):
    """The same for forget-user: a run without the erasure job purges none of the user's rows
    (their tombstones would lose the content), and another user's purges go on."""
    a, _ = merged_fact(engine)
    other = add(engine, "u2", "Old fact", status="deleted", deleted_at=NOW - 60 * DAY)
    erasure.forget(engine, settings, now=LATER, user_id="u1")
    run(engine, settings, now=LATER, jobs=["hard_delete"])
    assert get(engine, a) is not None and get(engine, other) is None


def test_a_purged_intermediate_record_keeps_the_chain_from_source_to_summary(engine, settings):
    """A, B --compaction--> M; M, X --user_cap summarize--> S (M deleted, over_cap_summarized).
    hard_delete purged M after 30 days, and its lineage (M <- A, S <- M) with it, while A
    (merged: a year of history) stayed: `forget A --purge-now` erased A alone, S — stating A's
    fact — stayed active, and verify-erasure was clean. A purge now links S <- A first."""
    a = add(engine, "u1", "Allergic to penicillin since 2019")
    b = add(engine, "u1", "Has a penicillin allergy")
    x = add(engine, "u1", "Likes jazz")
    m = merge(engine, "u1", [a, b], "Allergic to penicillin (since 2019)", [1.0] + [0.0] * 7)
    s = uuid4()
    record = {
        "content": "Allergic to penicillin since 2019; likes jazz", "embedding": [0.0] * 8,
        "memory_type": "summary", "source": "gc_merge", "importance": 5,
        "metadata": {"summary_depth": 1},
    }  # fmt: skip
    with engine.connect() as conn:
        xmin = dict(
            conn.execute(
                sa.text("SELECT id, xmin::text::bigint FROM memories WHERE id = ANY(:ids)"),
                {"ids": [m, x]},
            ).all()
        )
    group = f"summary:{s}"
    apply_actions(
        engine,
        [
            Action(job="user_cap", action=Kind.CREATE_MERGED, user_id="u1",
                   reason="over_cap_summarized", memory_id=s, group=group,
                   details={"record": record, "sources": [str(m), str(x)], "summary_depth": 1}),
            *[Action(job="user_cap", action=Kind.SOFT_DELETE, user_id="u1",
                     reason="over_cap_summarized", memory_id=i, row_version=xmin[i], group=group,
                     details={"superseded_by": str(s)}) for i in (m, x)],
        ],
    )  # fmt: skip
    purge_at = NOW + 31 * DAY
    with engine.begin() as conn:  # S is in use: nothing else retires it
        conn.execute(
            sa.text("UPDATE memories SET last_accessed_at = :t WHERE id = :s"),
            {"t": purge_at, "s": s},
        )
    run(engine, settings, now=purge_at, jobs=["hard_delete"])
    assert get(engine, m) is None and status(engine, a) == "merged"
    with engine.connect() as conn:
        lineage = set(conn.execute(sa.text("SELECT derived_id, source_id FROM memory_lineage")))
    assert (s, a) in lineage and (s, b) in lineage  # spliced through the purged M
    erasure.forget(engine, settings, now=purge_at, memory_id=a, purge_now=True)
    (done,) = requests(engine)
    assert done["status"] == "completed"
    assert erased(engine, s) or get(engine, s) is None
    assert verify(engine, now=purge_at, memory_id=a).residues == []


def test_a_stale_plan_does_not_queue_a_review_about_a_forgotten_user(engine, settings):
    """A plan made before forget-user holds a contradiction `review` (no row version: it never
    drifted). Applied after the erasure was complete and verified, it queued a review item
    naming the erased ids, and verify-erasure was no longer clean."""
    add(engine, "u1", "Lives in Paris", slot="profile.city", created_at=days_ago(10),
        observed_at=days_ago(10))  # fmt: skip
    add(engine, "u1", "Lives in Berlin", slot="profile.city", source="model_inference",
        created_at=days_ago(1), observed_at=days_ago(1))  # fmt: skip
    add(engine, "u2", "Keeps bees")
    plan = run(engine, settings, dry_run=True)
    assert "review" in {a["action"] for a in plan["actions"]}
    erasure.forget(engine, settings, now=NOW, user_id="u1", purge_now=True)
    assert verify(engine, now=NOW, user_id="u1").residues == []
    applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    with engine.connect() as conn:
        items = conn.execute(
            sa.text("SELECT count(*) FROM gc_review_items WHERE user_id = 'u1'")
        ).scalar_one()
        drifted = conn.execute(
            sa.text(
                "SELECT count(*) FROM gc_actions WHERE run_id = :r AND action = 'review'"
                " AND outcome = 'drifted'"
            ),
            {"r": applied},
        ).scalar_one()
    assert items == 0 and drifted == 1
    assert verify(engine, now=NOW, user_id="u1").residues == []


@pytest.mark.parametrize("purge_now", [False, True])
def test_a_stale_plan_does_not_retire_a_fact_in_favour_of_an_erased_one(
    engine, settings, purge_now
):
    """A plan obsoletes "Lives in Paris" for the newer "Lives in Berlin" (details.depends_on:
    Berlin's version). The user then asks to forget Berlin. Found by a review: the scrub cut
    the planned row's details to ids and codes, `depends_on` with them, so applying the plan
    retired Paris, superseded by the erased (or purged) row, and the user had no city left. A
    planned action the scrub reached now drifts."""
    paris, berlin = city_pair(engine)
    plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
    assert [(a["action"], a["memory_id"]) for a in plan["actions"]] == [("obsolete", str(paris))]
    erasure.forget(engine, settings, now=NOW, memory_id=berlin, purge_now=purge_now)
    if not purge_now:
        run(engine, settings, jobs=["erasure"])
        assert erased(engine, berlin)
    applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    row = get(engine, paris)
    assert (row["status"], row["superseded_by"]) == ("active", None)
    with engine.connect() as conn:
        outcome = conn.execute(
            sa.text("SELECT outcome FROM gc_actions WHERE run_id = :r AND memory_id = :m"),
            {"r": applied, "m": paris},
        )
        assert outcome.scalar_one() == "drifted"


def chain(engine: sa.Engine, *, middle_user: str = "u1") -> tuple[UUID, UUID, UUID]:
    """Y (merged, kept a year) <- P (deleted 60 days ago: hard_delete purges it) <- D (active)."""
    y = add(engine, "u1", "Allergic to penicillin", status="merged", status_changed_at=NOW)
    p = add(engine, middle_user, "Penicillin allergy (merged)", status="deleted",
            deleted_at=NOW - 60 * DAY, status_changed_at=NOW - 60 * DAY)  # fmt: skip
    d = add(engine, "u1", "Allergic to penicillin; likes jazz")
    with engine.begin() as conn:
        link = sa.text("INSERT INTO memory_lineage (derived_id, source_id) VALUES (:d, :s)")
        conn.execute(link, [{"d": p, "s": y}, {"d": d, "s": p}])
    return y, p, d


def lineage(engine: sa.Engine) -> set[tuple[UUID, UUID]]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT derived_id, source_id FROM memory_lineage")))


def test_a_splice_never_waits_on_the_application(engine, settings):
    """The new lineage's foreign keys key-share its rows: with the application holding the
    derived record FOR UPDATE, the purge waited for it (and could deadlock the application).
    Now the purge is held (drifted) and done by the next run."""
    import threading

    y, p, d = chain(engine)
    with engine.connect() as app:
        app.execute(sa.text("SELECT 1 FROM memories WHERE id = :d FOR UPDATE"), {"d": d})
        done: list[dict] = []
        worker = threading.Thread(
            target=lambda: done.append(run(engine, settings, jobs=["hard_delete"]))
        )
        worker.start()
        worker.join(30)
        waited = worker.is_alive()
        app.rollback()
    worker.join()
    assert not waited, "the purge waited on the application's lock"
    assert [x["memory_id"] for x in done[0]["drifted"]] == [str(p)]
    run(engine, settings, jobs=["hard_delete"])
    assert get(engine, p) is None and lineage(engine) == {(d, y)}


def test_a_splice_stays_within_the_user_and_makes_no_self_edge(engine, settings):
    """Lineage the application wrote across users, or in a cycle, is not carried on: D(u1) <-
    P(u2) <- Y(u1) gives no D <- Y, and D <- P <- D no D <- D (an adopted table's CHECK would
    fail every batch)."""
    _, p, _ = chain(engine, middle_user="u2")
    run(engine, settings, jobs=["hard_delete"])
    assert get(engine, p) is None and lineage(engine) == set()
    _, p2, d2 = chain(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO memory_lineage VALUES (:p, :d)"), {"p": p2, "d": d2})
    run(engine, settings, jobs=["hard_delete"])
    assert get(engine, p2) is None and (d2, d2) not in lineage(engine)
