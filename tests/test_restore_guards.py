"""Restore keeps what is not its to undo: a row moved to another user, a created record the
application edited in any column, a row a pending erasure request names; and it names the apply
run when given the id of a plan that was applied."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest

from gc_worker import erasure, restore
from gc_worker.db import transaction
from tests.store import NOW, add, days_ago, execute, run, status
from tests.test_compaction import E0


def merged(engine, settings, user: str = "u1") -> tuple[list[UUID], UUID, str]:
    members = [
        add(engine, user, "Has a dog", embedding=E0, created_at=days_ago(3)) for _ in range(2)
    ]
    report = run(engine, settings, jobs=["compaction"], users=[user])
    record = next(a["memory_id"] for a in report["actions"] if a["action"] == "create_merged")
    return members, UUID(record), report["run_id"]


@pytest.mark.parametrize(
    ("column", "edit"),
    [("confidence", "confidence = 0.2"),
     ("memory_type", "memory_type = 'procedural'"),
     ("supersedes", "supersedes = ARRAY[gen_random_uuid()]"),
     ("source", "source = 'explicit_user_statement'")],
)  # fmt: skip
def test_an_application_edit_of_the_merged_record_keeps_it(engine, settings, column, edit):
    members, record, run_id = merged(engine, settings)
    execute(engine, f"UPDATE memories SET {edit} WHERE id = :id", id=record)
    result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=3))
    assert status(engine, record) == "active", f"{column}: the application's edit was retired"
    assert [status(engine, m) for m in members] == ["merged", "merged"]
    assert set(result.not_restorable) == {*members, record}


def test_a_retired_row_moved_to_another_user_is_not_brought_back(engine, settings):
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    report = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "UPDATE memories SET user_id = 'u2' WHERE id = :id", id=m)
    result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
    assert (status(engine, m), result.not_restorable) == ("deleted", [m]), (
        "u1's run reactivated a row that is now u2's"
    )


def test_a_retired_row_moved_back_to_its_user_is_restored(engine, settings):
    """Just inside: moved away and back, the row is its user's again and restorable."""
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    report = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "UPDATE memories SET user_id = 'u2' WHERE id = :id", id=m)
    execute(engine, "UPDATE memories SET user_id = 'u1' WHERE id = :id", id=m)
    result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
    assert (status(engine, m), result.not_restorable) == ("active", [])


def test_restore_does_not_reexpose_a_user_with_a_pending_forget_request(engine, settings):
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    report = run(engine, settings, jobs=["ttl_expiry"])
    with transaction(engine) as conn:
        erasure.file_request(conn, user_id="u1")
    restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
    assert status(engine, m) == "deleted", (
        "restore put a memory of a user who asked to be forgotten back on the read path"
    )


def test_restoring_an_applied_plan_by_its_id_names_the_apply_run(engine, settings):
    from gc_worker import engine as gc_engine
    from gc_worker.errors import UsageError

    add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    plan = run(engine, settings, jobs=["ttl_expiry"], dry_run=True)
    applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    with pytest.raises(UsageError) as err:
        restore.restore_run(engine, UUID(plan["run_id"]))
    assert str(applied) in str(err.value), str(err.value)


def test_a_pending_request_for_another_memory_of_the_user_does_not_hold_a_restore(engine, settings):
    """Just inside: a pending request naming one memory holds that memory only; the user's
    other retired rows are restored."""
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    other = add(engine, "u1", "Likes jazz")
    report = run(engine, settings, jobs=["ttl_expiry"])
    with transaction(engine) as conn:
        erasure.file_request(conn, memory_id=other)
    result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
    assert (status(engine, m), result.not_restorable) == ("active", [])


def test_restoring_a_run_does_not_undo_a_later_run_with_the_same_clock(engine, settings):
    """Two runs with the same `--now` retire the same row the same way (the application put it
    back in between). The row looked in place for the first run's restore — same status,
    reason and instant — which then undid the second run's change with the first's prior
    fields, leaving the second run's action behind as if still applied. Only the second run's
    restore undoes it: it puts back what the application had written."""
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    first = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "UPDATE memories SET status = 'active', status_reason = 'app_reopened',"
                    " deleted_at = NULL WHERE id = :id", id=m)  # fmt: skip
    second = run(engine, settings, jobs=["ttl_expiry"])
    assert second["totals"]["by_action"] == {"soft_delete": 1}
    kept = restore.restore_run(engine, UUID(first["run_id"]), now=NOW + timedelta(hours=1))
    assert (kept.restored, kept.why_not) == ([], [(m, "soft_delete", "later_run")])
    assert kept.later_runs == {(m, "soft_delete"): UUID(second["run_id"])}
    assert status(engine, m) == "deleted"
    back = restore.restore_run(engine, UUID(second["run_id"]), now=NOW + timedelta(hours=2))
    assert back.restored == [m]
    row = execute(engine, "SELECT status, status_reason FROM memories WHERE id = :id", id=m).one()
    assert tuple(row) == ("active", "app_reopened")


def test_a_later_same_clock_run_on_another_row_does_not_hold_a_restore(engine, settings):
    """Just inside: the later run's change must name the same row. A second run with the same
    `--now` that retired another row leaves the first run restorable."""
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    first = run(engine, settings, jobs=["ttl_expiry"])
    other = add(engine, "u1", "Is in Oslo this week", expires_at=days_ago(1))
    second = run(engine, settings, jobs=["ttl_expiry"])
    assert [a["memory_id"] for a in second["actions"]] == [str(other)]
    back = restore.restore_run(engine, UUID(first["run_id"]), now=NOW + timedelta(hours=1))
    assert (back.restored, status(engine, m), status(engine, other)) == ([m], "active", "deleted")


def test_a_merged_record_the_application_declared_superseded_keeps_its_merge(engine, settings):
    """Two "Has a dog" rows merged into M; the application then wrote "No longer has a dog"
    with supersedes = [M]. Found by a review: restoring the merge retired M and brought both
    members back, undeclared, so the stale fact was current again beside its correction. A
    record some row of the user declares it supersedes is the application's now: kept."""
    members, record, run_id = merged(engine, settings)
    add(engine, "u1", "No longer has a dog", supersedes=[record],
        created_at=NOW + timedelta(hours=1))  # fmt: skip
    at = NOW + timedelta(days=2)
    current = "SELECT content FROM memory_gc_current('u1', NULL, :at, NULL)"
    assert execute(engine, current, at=at).scalars().all() == ["No longer has a dog"]
    kept = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=1))
    assert kept.restored == [] and status(engine, record) == "active"
    assert {status(engine, m) for m in members} == {"merged"}
    assert execute(engine, current, at=at).scalars().all() == ["No longer has a dog"]


def test_a_merged_record_with_a_pending_forget_keeps_its_sources_merged(engine, settings):
    """`forget M` is filed (pending) for a merged record; restoring the merge run retired M and
    brought its sources back — what the user asked to forget, on the read path until the
    erasure run took them too. Found by a review. The merge is kept; the erasure takes them."""
    from datetime import timedelta

    members, record, run_id = merged(engine, settings)
    erasure.forget(engine, settings, now=NOW + timedelta(hours=1), memory_id=record)
    kept = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(hours=2))
    assert kept.restored == [] and {status(engine, m) for m in members} == {"merged"}
    assert dict((m, why) for m, _, why in kept.why_not)[record] == "erasure_pending"
    run(engine, settings, jobs=["erasure"], now=NOW + timedelta(hours=3))
    assert {status(engine, m) for m in [*members, record]} == {"deleted"}
