"""The run-start scan (gc_worker.triage): which users it finds work for, at every rule's exact
boundary, and what a run does with the answer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import jobs
from gc_worker import triage
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.queries import q
from tests.seeding import row, seed
from tests.store import NOW, run

SETTINGS = Settings.model_validate(
    {"embeddings": {"dim": 8}, "user_cap": {"max_memories": 3}, "run": {"batch_users": 2}}
)
US = timedelta(microseconds=1)
DAY = timedelta(days=1)


def boundary_rows() -> list[dict[str, Any]]:
    """For each rule, one user exactly at its boundary (due) and one a microsecond short."""
    usage, hard, erasure = SETTINGS.usage_prune, SETTINGS.hard_delete, SETTINGS.erasure
    unused = NOW - usage.unused_days * DAY
    grace = NOW - usage.grace_days * DAY
    deleted = NOW - hard.retention_days * DAY
    history = NOW - hard.history_retention_days * DAY
    erased = NOW - erasure.retention_days * DAY
    retired = {"status": "deleted", "status_reason": "ttl_expired"}
    rows = []
    for due, shift in (("due", timedelta(0)), ("short", US)):
        rows += [
            row(f"ttl-{due}", "r", expires_at=NOW + shift, importance=5),
            row(f"usage-{due}", "r", created_at=unused + shift, importance=1),
            row(f"grace-{due}", "r", created_at=grace + shift, last_accessed_at=unused - DAY,
                importance=1),
            row(f"deleted-{due}", "r", **retired, deleted_at=deleted + shift,
                status_changed_at=deleted + shift),
            row(f"history-{due}", "r", status="obsolete", status_reason="superseded",
                status_changed_at=history + shift),
            row(f"erased-{due}", "r", status="deleted", status_reason="erasure",
                deleted_at=erased + shift, status_changed_at=erased + shift),
        ]  # fmt: skip
    rows += [row("cap-due", f"r{i}", importance=5) for i in range(4)]
    rows += [row("cap-short", f"r{i}", importance=5) for i in range(2)]
    rows += [row("cap-short", "pinned", importance=5, pinned=True)]
    rows += [row("cap-short", "gone", importance=5, **retired, deleted_at=NOW)]
    rows += [row("pinned-due", f"r{i}", importance=5) for i in range(3)]
    rows += [row("pinned-due", "pinned", importance=5, pinned=True)]
    # retired long ago but pinned: kept (only an erased row is purged pinned or not)
    rows += [row("pinned-retired", "r", **retired, pinned=True, deleted_at=deleted - DAY,
                 status_changed_at=deleted - DAY)]  # fmt: skip
    rows += [row("pinned-erased", "r", status="deleted", status_reason="erasure", pinned=True,
                 deleted_at=erased, status_changed_at=erased)]  # fmt: skip
    return rows


def plans_something(conn: sa.Connection, job: str, user: str) -> bool:
    """Does ``job``, planned alone for ``user``, act on anything (or refresh a score)?"""
    ctx = BatchContext(conn=conn, users=[user], settings=SETTINGS, now=NOW, dry_run=True)
    module = jobs.REGISTRY[job]
    refresh = getattr(module, "refresh", None)
    return bool(module.plan(ctx)) or bool(refresh and refresh(ctx))


SCANNED = [n for n in jobs.ORDER if n in jobs.REGISTRY and triage.answering([n])]


def test_the_scanned_jobs_are_the_deterministic_ones():
    assert SCANNED == ["ttl_expiry", "decay", "usage_prune", "user_cap", "hard_delete"]


def test_a_scan_of_every_user_answers_as_the_scan_of_the_list(engine):
    """A run over every user scans without testing each row's user against the list."""
    rows = boundary_rows()
    seed(engine, rows)
    users = sorted({r["user_id"] for r in rows})
    with engine.connect() as conn:
        listed = triage.scan(conn, users, SCANNED, SETTINGS, NOW)
        every = triage.scan(conn, users, SCANNED, SETTINGS, NOW, every_user=True)
    assert listed is not None and every == listed
    assert any(listed.users.values()) and any(listed.ids.values())


def test_a_user_who_appears_during_the_start_of_a_run_gets_no_batch(engine, monkeypatch):
    """The store's users are listed, then scanned without the list: a user whose first
    memory commits in between is in the scan's answer but in no batch (the next run's)."""
    from gc_worker import engine as gc_engine

    seed(engine, [row("early", "r", expires_at=NOW - DAY)])
    listed = gc_engine._users

    def then_a_new_user(conn: Any, requested: Any) -> list[str]:
        users = listed(conn, requested)
        seed(engine, [row("late", "r", expires_at=NOW - DAY)])  # committed on its own
        return users

    monkeypatch.setattr(gc_engine, "_users", then_a_new_user)
    report = run(engine, SETTINGS, jobs=SCANNED)
    assert {a["user_id"] for a in report["actions"]} == {"early"}
    with engine.connect() as conn:
        batched = conn.execute(sa.text("SELECT unnest(users) FROM gc_run_batches")).scalars()
        assert set(batched) == {"early"}


@pytest.mark.parametrize("job", SCANNED)
def test_the_scan_finds_exactly_the_users_the_job_acts_on(engine, job):
    """At each rule's exact boundary (``<=``) the user is found; a microsecond short, not."""
    rows = boundary_rows()
    seed(engine, rows)
    users = sorted({r["user_id"] for r in rows})
    with engine.connect() as conn:
        found = triage.scan(conn, users, [job], SETTINGS, NOW)
        acting = {u for u in users if plans_something(conn, job, u)}
    assert found is not None and found.users[job] == acting
    expected = {
        "ttl_expiry": {"ttl-due"},
        "usage_prune": {"usage-due", "grace-due"},
        "user_cap": {"cap-due", "pinned-due"},
        "hard_delete": {"deleted-due", "history-due", "erased-due", "pinned-erased"},
    }
    if job in expected:
        assert acting == expected[job]
    else:  # every active unpinned row has no score yet
        assert acting == {r["user_id"] for r in rows if r["status"] == "active" and not r["pinned"]}


@pytest.mark.parametrize(
    ("job", "query"), [("decay", "decay_candidates"), ("usage_prune", "usage_prune_candidates")]
)
def test_the_rows_picked_are_exactly_the_candidates(engine, job, query):
    """The ids the scan picks per user are the rows the job's own candidates query returns
    (which the batch then reads by id instead of reading every active row)."""
    rows = [
        *boundary_rows(),
        row("decay-due", "old", created_at=NOW - 400 * DAY, importance=1),
        row("decay-due", "young", created_at=NOW - DAY, importance=1),
        row("decay-due", "important", created_at=NOW - 400 * DAY, importance=5),
    ]
    seed(engine, rows)
    users = sorted({r["user_id"] for r in rows})
    with engine.connect() as conn:
        found = triage.scan(conn, users, [job], SETTINGS, NOW)
        ctx = BatchContext(conn=conn, users=users, settings=SETTINGS, now=NOW, dry_run=True)
        module = jobs.REGISTRY[job]
        params = (module.refresh_params(ctx) if job == "decay"
                  else ctx.params(**module.rule_params(SETTINGS.usage_prune, NOW)))  # fmt: skip
        candidates = {(r.user_id, str(r.id)) for r in conn.execute(q(query), params)}
    assert found is not None and candidates
    assert {(u, i) for u, ids in found.ids[job].items() for i in ids} == candidates


def test_users_without_work_get_no_batch(engine):
    """Only users some job has work for are batched; with the scan off, every user is."""
    seed(engine, [row("busy", "r", expires_at=NOW - DAY), row("idle", "r", importance=5)])
    run(engine, SETTINGS, jobs=["ttl_expiry"])
    run(engine, SETTINGS, jobs=["ttl_expiry"])
    off = Settings.model_validate(
        SETTINGS.model_dump() | {"run": SETTINGS.run.model_dump() | {"skip_idle_users": False}}
    )
    run(engine, off, jobs=["ttl_expiry"])
    with engine.connect() as conn:
        batched = conn.execute(
            sa.text(
                "SELECT array_agg(u ORDER BY u) FROM gc_runs r"
                " LEFT JOIN gc_run_batches b ON b.run_id = r.id"
                " LEFT JOIN LATERAL unnest(b.users) u ON true"
                " GROUP BY r.id, r.started_at ORDER BY r.started_at"
            )
        ).scalars()
        assert list(batched) == [["busy"], [None], ["busy", "idle"]]


def test_a_job_that_cannot_answer_keeps_every_user_batched(engine):
    """compaction has no scan: every user is batched, but ttl_expiry still reads only its own."""
    seed(engine, [row("busy", "r", expires_at=NOW - DAY), row("idle", "r", importance=5)])
    with engine.connect() as conn:
        work = triage.scan(conn, ["busy", "idle"], ["ttl_expiry", "compaction"], SETTINGS, NOW)
    assert work is not None and work.users == {"ttl_expiry": {"busy"}} and work.ids == {}
    assert triage.with_work(["busy", "idle"], ["ttl_expiry", "compaction"], work) == [
        "busy",
        "idle",
    ]
    assert triage.for_batch(work, ["busy", "idle"]) == {
        "users": {"ttl_expiry": ["busy"]},
        "ids": {},
    }


def test_a_pinned_erased_row_past_the_deleted_window_is_found(engine):
    """hard_delete purges an erased row, pinned or not, once either window is over: here the
    deleted rows' 30 days, before an erasure window set longer (60). Found by a review: the
    scan required `NOT pinned` on that branch, so the user got no batch, every night."""
    settings = Settings.model_validate(
        {"embeddings": {"dim": 8}, "erasure": {"retention_days": 60},
         "hard_delete": {"retention_days": 30}}
    )  # fmt: skip
    gone = NOW - 40 * DAY
    seed(engine, [row("u1", "r", status="deleted", status_reason="erasure", pinned=True,
                      deleted_at=gone, status_changed_at=gone)])  # fmt: skip
    with engine.connect() as conn:
        found = triage.scan(conn, ["u1"], ["hard_delete"], settings, NOW)
    assert found is not None and found.users["hard_delete"] == {"u1"}
    report = run(engine, settings, jobs=["hard_delete"])
    assert [(a["action"], a["reason"]) for a in report["actions"]] == [
        ("hard_delete", "retention_deleted")
    ]


@pytest.mark.parametrize(("shift", "found"), [(timedelta(0), True), (US, False)])
def test_a_pinned_erased_row_at_the_deleted_cutoff(engine, shift, found):
    """At the deleted rows' cutoff exactly the pinned erased row is due; a microsecond short,
    not (its erasure window, 60 days, is further off)."""
    settings = Settings.model_validate(
        {"embeddings": {"dim": 8}, "erasure": {"retention_days": 60},
         "hard_delete": {"retention_days": 30}}
    )  # fmt: skip
    gone = NOW - 30 * DAY + shift
    seed(engine, [row("u1", "r", status="deleted", status_reason="erasure", pinned=True,
                      deleted_at=gone, status_changed_at=gone)])  # fmt: skip
    with engine.connect() as conn:
        scan = triage.scan(conn, ["u1"], ["hard_delete"], settings, NOW)
    assert scan is not None and (scan.users["hard_delete"] == {"u1"}) is found
