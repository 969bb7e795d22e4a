"""Defects a review of the ninth session's late changes reproduced (each failed before its fix):
a server error that comes back on every connection left the nightly run resumed for ever; a
request whose deleted record's audited source has lineage stayed pending; and (a check that
held) two purged roots give one spliced edge. (A resumed run's batches counted twice:
tests/test_schedule_recovery.py.)"""

from __future__ import annotations

from contextlib import closing, suppress
from datetime import timedelta

import pytest
import sqlalchemy as sa

from gc_worker import erasure
from gc_worker.daemon import Daemon
from gc_worker.errors import DatabaseUnavailable
from tests.store import NOW, add, get, run
from tests.test_erasure_helpers import merge, requests
from tests.test_schedule import SLOT, runs, seed


def test_a_server_error_that_comes_back_fails_the_run_instead_of_resuming_it_for_ever(
    engine, settings
):
    """An application trigger that raises an OperationalError-class SQLSTATE (55000, here a
    currval() never set in the session) for one user's updates: the nightly run used to end
    failed; now it is left running and every upkeep resumes it, fails the same way, again."""
    seed(engine, users=2)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE app_seq"))
        conn.execute(
            sa.text("""
            CREATE FUNCTION app_touch() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM currval('app_seq'); RETURN NEW; END $$""")
        )
        conn.execute(
            sa.text("""
            CREATE TRIGGER app_touch BEFORE UPDATE ON memories FOR EACH ROW
            WHEN (OLD.user_id = 'user-001') EXECUTE FUNCTION app_touch()""")
        )
    daemon = Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=1))
    with closing(daemon):
        with pytest.raises(DatabaseUnavailable, match="currval"):
            daemon.nightly()
        for _ in range(3):  # three upkeeps
            with suppress(DatabaseUnavailable):
                daemon.resume_orphans()
        failed = daemon.metrics.runs.labels("nightly", "apply", "failed")._value.get()
    (r,) = runs(engine)
    assert (r["status"], r["error"], failed) == ("failed", r["error"], 1), (
        f"run left {r['status']!r} (error={r['error']!r}) after 4 attempts; "
        f"runs_total{{failed}}={failed}"
    )


LATER = NOW + timedelta(days=400)


@pytest.mark.parametrize("app_deletes_m", [False, True])
def test_a_deleted_record_whose_audited_source_has_lineage_completes(
    engine, settings, app_deletes_m
):
    """S: an application-made summary of C (application lineage S <- C). The worker merges S
    and B into M. forget M, the application deletes M: planning follows M's audit down to S, B
    only, completion follows lineage on from S to C: C is never erased and the request stays
    pending for ever. (With M stored, both go M -> S -> C and it completes.)"""
    c = add(engine, "u1", "Allergic to penicillin since 2019")
    s = add(engine, "u1", "Summary: has a drug allergy", memory_type="summary")
    b = add(engine, "u1", "Takes antihistamines in spring")
    add(engine, "u1", "Likes jazz")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO memory_lineage VALUES (:s, :c)"), {"s": s, "c": c})
    m = merge(engine, "u1", [s, b], "Drug allergy; antihistamines", [1.0] + [0.0] * 7)
    erasure.forget(engine, settings, now=LATER, memory_id=m)
    if app_deletes_m:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM memories WHERE id = :id"), {"id": m})
    for _ in range(3):
        run(engine, settings, now=LATER, jobs=["erasure"])
    (req,) = requests(engine)
    row_c = get(engine, c)
    assert req["status"] == "completed", (
        f"request {req['status']}; C is {row_c['status']}/{row_c['status_reason']}"
    )


def test_two_purged_roots_give_one_edge_twice(engine, settings):
    """D <- R1 <- X and D <- R2 <- X, R1 and R2 purged in one batch: (D, X) comes twice
    (DISTINCT root, derived, source); one edge only: zip of one pair."""
    from tests.test_erasure_residue_review import lineage

    old = dict(
        status="deleted",
        deleted_at=NOW - timedelta(days=60),
        status_changed_at=NOW - timedelta(days=60),
    )
    x = add(engine, "u1", "Allergic to penicillin", status="merged", status_changed_at=NOW)
    r1 = add(engine, "u1", "Penicillin allergy (1)", **old)
    r2 = add(engine, "u1", "Penicillin allergy (2)", **old)
    d = add(engine, "u1", "Allergic to penicillin; likes jazz")
    with engine.begin() as conn:
        link = sa.text("INSERT INTO memory_lineage (derived_id, source_id) VALUES (:d, :s)")
        conn.execute(
            link, [{"d": r1, "s": x}, {"d": r2, "s": x}, {"d": d, "s": r1}, {"d": d, "s": r2}]
        )
    run(engine, settings, jobs=["hard_delete"])
    assert get(engine, r1) is None and get(engine, r2) is None
    assert lineage(engine) == {(d, x)}
