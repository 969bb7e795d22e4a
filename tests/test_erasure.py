"""Erasure: the pure planner, request filing, and the job in real runs (propagation along
lineage, reactivation, pinned override, tombstones, retention, dry run vs apply)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from uuid import UUID, uuid4

import pytest

from gc_worker import engine as gc_engine
from gc_worker import erasure, restore
from gc_worker.actions import Kind
from gc_worker.db import transaction
from gc_worker.errors import NotFoundError
from jobs.erasure import Request, hashes_of, plan_erasure
from jobs.similarity import content_hash
from tests.store import NOW, acted_on, add, execute, get, run, snapshot, status
from tests.test_erasure_helpers import count, merge, requests, tombstones

SECOND = timedelta(seconds=1)
DAY = timedelta(days=1)


def row(user="u1", content="likes tea", **kw):
    fields = {"id": uuid4(), "user_id": user, "row_version": 1, "status": "active",
              "status_reason": None, "superseded_by": None, "content": content, **kw}  # fmt: skip
    return SimpleNamespace(**fields)


def user_request(user="u1", purge_now=False):
    return Request(uuid4(), "user", user, None, purge_now)


def memory_request(memory, purge_now=False):
    return Request(uuid4(), "memory", memory.user_id, memory.id, purge_now)


def two_levels():
    """d2 summarises d1 (a merge of a and b) and c: (a, b, c, d1, d2, lineage)."""
    d1, d2 = row(content="d1"), row(content="d2")
    a = row(content="a", status="merged", superseded_by=d1.id)
    b = row(content="b", status="merged", superseded_by=d1.id)
    d1.status, d1.superseded_by = "deleted", d2.id
    c = row(content="c", status="deleted", status_reason="over_cap_summarized",
            superseded_by=d2.id)  # fmt: skip
    lineage = [(d1.id, a.id), (d1.id, b.id), (d2.id, d1.id), (d2.id, c.id)]
    return a, b, c, d1, d2, lineage


def by(actions, kind):
    return {a.memory_id: a for a in actions if a.action is kind}


def file(engine, **target):
    with transaction(engine) as conn:
        return erasure.file_request(conn, **target)


class TestPlanErasure:
    def test_user_request_takes_every_row_but_already_erased(self):
        """Every row of the user in any status (pinned too) is erased; erased rows are not."""
        expired = row(status="deleted", status_reason="ttl_expired")
        erased = row(status="deleted", status_reason="erasure")
        rows = [row(), row(status="merged"), expired, row(pinned=True), erased, row("u2")]
        actions = plan_erasure([user_request()], rows, [], [])
        assert set(by(actions, Kind.SOFT_DELETE)) == {r.id for r in rows[:4]}
        assert {a.reason for a in actions} == {"erasure"}
        assert all(a.preview is None for a in actions)

    def test_memory_request_takes_the_row_and_its_same_content_twin(self):
        """One memory, plus the user's rows with the same normalised content, nothing else."""
        target, twin, other = row(content="Likes tea."), row(content="likes  TEA"), row(content="x")
        foreign = row("u2", content="likes tea")
        actions = plan_erasure([memory_request(target)], [target, twin, other, foreign], [], [])
        deletes = by(actions, Kind.SOFT_DELETE)
        assert set(deletes) == {target.id, twin.id}
        assert deletes[twin.id].details["same_content_as"] == [str(target.id)]

    def test_memory_request_of_another_owner_takes_nothing(self):
        """A request whose user is not the memory's owner erases nothing."""
        target = row("u2")
        request = Request(uuid4(), "memory", "u1", target.id, False)
        assert plan_erasure([request], [target], [], []) == []

    def test_derived_record_goes_and_its_other_source_comes_back(self):
        """Erasing a merge member erases the merge and reactivates the other member (one group)."""
        merged = row(content="tea and coffee")
        a = row(content="tea", status="merged", superseded_by=merged.id)
        b = row(content="coffee", status="merged", superseded_by=merged.id)
        lineage = [(merged.id, a.id), (merged.id, b.id)]
        actions = plan_erasure([memory_request(a)], [a, b, merged], lineage, [])
        deletes, restores = by(actions, Kind.SOFT_DELETE), by(actions, Kind.RESTORE)
        assert set(deletes) == {a.id, merged.id} and set(restores) == {b.id}
        assert deletes[merged.id].details["derived_from"] == [str(a.id)]
        assert restores[b.id].reason == "erasure_reactivated"
        assert restores[b.id].group == deletes[merged.id].group is not None

    def test_propagation_is_transitive(self):
        """A summary of a merge of an erased row goes; rows absorbed at each level come back."""
        a, b, c, d1, d2, lineage = two_levels()
        actions = plan_erasure([memory_request(a)], [a, b, c, d1, d2], lineage, [])
        assert set(by(actions, Kind.SOFT_DELETE)) == {a.id, d1.id, d2.id}
        assert set(by(actions, Kind.RESTORE)) == {b.id, c.id}

    def test_forgetting_a_derived_record_takes_what_it_was_made_from(self):
        """A forgotten summary of a merge takes the merge and every row under it (they hold its
        facts): nothing comes back. A record derived from one of them goes too, and only then
        are its other sources reactivated."""
        a, b, c, d1, d2, lineage = two_levels()
        foreign = row("u2", content="f", status="merged", superseded_by=d1.id)
        lineage.append((d1.id, foreign.id))
        actions = plan_erasure([memory_request(d2)], [a, b, c, d1, d2, foreign], lineage, [])
        deletes = by(actions, Kind.SOFT_DELETE)
        assert set(deletes) == {d2.id, d1.id, a.id, b.id, c.id}  # never the other user's row
        assert by(actions, Kind.RESTORE) == {}
        assert deletes[a.id].details["source_of"] == [str(d1.id)]
        assert deletes[d1.id].details["source_of"] == [str(d2.id)]
        # the other way round: a source's request takes the record, which gives back the rest
        actions = plan_erasure([memory_request(d1)], [a, b, c, d1, d2], lineage, [])
        assert set(by(actions, Kind.SOFT_DELETE)) == {d1.id, a.id, b.id, d2.id}
        assert set(by(actions, Kind.RESTORE)) == {c.id}
        # lineage across users (nothing the worker writes) carries nothing across
        actions = plan_erasure([memory_request(foreign)], [a, b, c, d1, d2, foreign], lineage, [])
        assert {a.memory_id for a in actions} == {foreign.id}

    def test_no_reactivation_across_users(self):
        """A record absorbing another user's row (lineage the worker never writes) gives back
        only its own user's sources when it is erased."""
        merged = row(content="tea and coffee")
        a = row(content="tea", status="merged", superseded_by=merged.id)
        foreign = row("u2", content="coffee", status="merged", superseded_by=merged.id)
        lineage = [(merged.id, a.id), (merged.id, foreign.id)]
        actions = plan_erasure([memory_request(a)], [a, foreign, merged], lineage, [])
        assert set(by(actions, Kind.SOFT_DELETE)) == {a.id, merged.id}
        assert by(actions, Kind.RESTORE) == {}

    def test_sources_not_absorbed_by_the_record_stay(self):
        """A source already active, absorbed elsewhere, or erased itself is not reactivated."""
        merged, elsewhere = row(content="m"), row(content="e")
        a = row(content="a", status="merged", superseded_by=merged.id)
        active = row(content="act")
        moved = row(content="mv", status="merged", superseded_by=elsewhere.id)
        erased = row(content="er", status="deleted", status_reason="erasure",
                     superseded_by=merged.id)  # fmt: skip
        rows = [a, active, moved, erased, merged, elsewhere]
        lineage = [(merged.id, s.id) for s in (a, active, moved, erased)]
        actions = plan_erasure([memory_request(a)], rows, lineage, [])
        assert by(actions, Kind.RESTORE) == {}

    def test_tombstone_matches_by_id_and_by_content(self):
        """A row with an erased id or erased content returns as erasure_tombstone."""
        same_id = row(content="new text")
        same_text = row(content="  LIKES tea!! ")
        other = row(content="likes coffee")
        stones = [("u1", same_id.id, content_hash("u1", "old")),
                  ("u1", uuid4(), content_hash("u1", "likes tea"))]  # fmt: skip
        deletes = by(plan_erasure([], [same_id, same_text, other], [], stones), Kind.SOFT_DELETE)
        assert set(deletes) == {same_id.id, same_text.id}
        assert {d.reason for d in deletes.values()} == {"erasure_tombstone"}
        assert deletes[same_id.id].details["matched"] == "id"
        assert deletes[same_text.id].details["matched"] == "content"

    def test_tombstone_of_another_user_does_not_match(self):
        """Tombstones are per user: the same text of another user stays."""
        stones = [("u2", uuid4(), content_hash("u2", "likes tea"))]
        assert plan_erasure([], [row()], [], stones) == []

    def test_purge_now_purges_every_target_even_already_erased(self):
        """A purge_now request adds hard_delete for each target, erased earlier or not."""
        fresh, erased = row(), row(status="deleted", status_reason="erasure")
        actions = plan_erasure([user_request(purge_now=True)], [fresh, erased], [], [])
        assert set(by(actions, Kind.SOFT_DELETE)) == {fresh.id}
        purges = by(actions, Kind.HARD_DELETE)
        assert set(purges) == {fresh.id, erased.id}
        assert purges[fresh.id].reason == "erasure_purge_now"

    def test_details_carry_requests_and_hashes_not_content(self):
        """Each erasure names its requests and the tombstone hashes; no text of the memory."""
        target = row(content="x" * 250)
        request = memory_request(target)
        (action,) = plan_erasure([request], [target], [], [])
        whole, preview = hashes_of("u1", "x" * 250)
        assert action.details == {"request_ids": [str(request.id)], "content_hash": whole,
                                  "preview_hash": preview}  # fmt: skip
        assert whole != preview == content_hash("u1", "x" * 200)


class TestFileRequest:
    def test_unknown_user_or_memory_changes_nothing(self, engine):
        """An unknown user or memory id raises NotFoundError and files nothing."""
        add(engine, "u1")
        with pytest.raises(NotFoundError, match="no memories for user 'ghost'"):
            file(engine, user_id="ghost")
        with pytest.raises(NotFoundError, match="no memory with id"):
            file(engine, memory_id=uuid4())
        assert requests(engine) == []

    def test_second_request_for_a_pending_target_is_the_same(self, engine):
        """Filing twice returns the pending request; purge_now can only be raised."""
        m = add(engine, "u1")
        first = file(engine, user_id="u1")
        again = file(engine, user_id="u1", purge_now=True)
        assert first.created and not again.created and again.id == first.id and again.purge_now
        assert file(engine, user_id="u1").purge_now
        by_memory = file(engine, memory_id=m)
        assert by_memory.kind == "memory" and by_memory.user_id == "u1"
        assert file(engine, memory_id=m).id == by_memory.id
        assert len(requests(engine)) == 2

    def test_application_can_file_by_insert(self, engine, settings):
        """A row inserted by the application is carried out by the next run like any other."""
        m = add(engine, "u1", "an app-filed memory")
        execute(
            engine,
            "INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
            " SELECT 'memory', user_id, id FROM memories WHERE id = :id",
            id=m,
        )
        run(engine, settings, jobs=["erasure"])
        assert get(engine, m)["status_reason"] == "erasure"
        assert requests(engine)[0]["status"] == "completed"


class TestErasureRun:
    def test_run_erases_pinned_rows_and_completes_the_request(self, engine, settings):
        """forget-user soft-deletes every row (pinned too) and completes with counts."""
        ids = [add(engine, "u1", "plain"), add(engine, "u1", "core", pinned=True)]
        keep = add(engine, "u2", "other user")
        request = file(engine, user_id="u1")
        report = run(engine, settings)
        assert acted_on(report, "soft_delete") >= {str(i) for i in ids}
        assert {get(engine, i)["status_reason"] for i in ids} == {"erasure"}
        assert status(engine, keep) == "active"
        (done,) = requests(engine)
        assert done["id"] == request.id and done["status"] == "completed"
        assert done["completed_at"] == NOW and done["result"]["erased"] == 2
        assert {t["memory_id"] for t in tombstones(engine)} == set(ids)

    def test_dry_run_plans_but_completes_nothing(self, engine, settings):
        """A dry run lists the erasure, changes no row, writes no tombstone, completes nothing."""
        m = add(engine, "u1")
        file(engine, user_id="u1")
        before = snapshot(engine)
        plan = run(engine, settings, dry_run=True)
        assert acted_on(plan, "soft_delete") == {str(m)}
        assert snapshot(engine) == before
        assert requests(engine)[0]["status"] == "pending" and tombstones(engine) == []
        gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        assert requests(engine)[0]["status"] == "completed" and len(tombstones(engine)) == 1

    def test_merge_member_erased_merge_gone_other_member_active(self, engine, settings):
        """Erasing one member of a merge erases the merged record and reactivates the other."""
        a = add(engine, "u1", "Drinks green tea")
        b = add(engine, "u1", "Drinks tea every morning")
        merged = merge(engine, "u1", [a, b], "Drinks green tea every morning", [1.0] + [0.0] * 7)
        file(engine, memory_id=a)
        report = run(engine, settings)
        assert acted_on(report, "restore") == {str(b)}
        assert get(engine, merged)["status_reason"] == "erasure"
        b_row = get(engine, b)
        assert b_row["status"] == "active" and b_row["superseded_by"] is None
        assert b_row["status_reason"] == "erasure_reactivated"
        run(engine, settings, now=NOW + DAY)
        assert get(engine, a) is None and get(engine, merged) is None
        assert status(engine, b) == "active"
        assert count(engine, "SELECT count(*) FROM memory_lineage") == 0

    def test_forgetting_a_merged_record_does_not_bring_its_members_back(self, engine, settings):
        """forget MERGED erases the merged record and the members it absorbed (they state the
        same facts): nothing of it is on the read path again, and the request completes."""
        a = add(engine, "u1", "Keeps a parrot")
        b = add(engine, "u1", "The parrot is named Quokkaberry")
        merged = merge(engine, "u1", [a, b], "Keeps a parrot named Quokkaberry", [1.0] + [0.0] * 7)
        other = add(engine, "u1", "Lives in Lisbon")
        file(engine, memory_id=merged)
        report = run(engine, settings)
        assert acted_on(report, "soft_delete") == {str(a), str(b), str(merged)}
        assert acted_on(report, "restore") == set()
        assert {get(engine, m)["status_reason"] for m in (a, b, merged)} == {"erasure"}
        assert requests(engine)[0]["status"] == "completed"
        visible = execute(engine, "SELECT id FROM active_memories WHERE user_id = 'u1'")
        assert visible.scalars().all() == [other]

    def test_the_request_waits_for_a_source_that_drifted(self, engine, settings):
        """forget MERGED completes only once the members it was made from are erased too: a
        member the application changed between plan and apply keeps the request pending, and
        the next run erases it and completes."""
        a = add(engine, "u1", "Keeps a parrot")
        b = add(engine, "u1", "The parrot is named Quokkaberry")
        merged = merge(engine, "u1", [a, b], "Keeps a parrot named Quokkaberry", [1.0] + [0.0] * 7)
        file(engine, memory_id=merged)
        plan = run(engine, settings, dry_run=True)
        execute(engine, "UPDATE memories SET metadata = jsonb_build_object('turn', 7)"
                " WHERE id = :b", b=b)  # fmt: skip
        gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        assert get(engine, merged)["status_reason"] == "erasure" and status(engine, b) == "merged"
        assert requests(engine)[0]["status"] == "pending"
        run(engine, settings)
        assert get(engine, b)["status_reason"] == "erasure"
        assert requests(engine)[0]["status"] == "completed"

    def test_lineage_to_another_user_does_not_hold_the_request(self, engine, settings):
        """A record of another user derived from a forgotten user's row (lineage the worker
        never writes) is neither erased nor waited for: the request completes."""
        a = add(engine, "u1", "Keeps a parrot")
        foreign = add(engine, "u2", "Summary mentioning a parrot")
        execute(engine, "INSERT INTO memory_lineage (derived_id, source_id) VALUES (:d, :s)",
                d=foreign, s=a)  # fmt: skip
        file(engine, user_id="u1")
        run(engine, settings)
        assert get(engine, a)["status_reason"] == "erasure" and status(engine, foreign) == "active"
        assert requests(engine)[0]["status"] == "completed"

    def test_purge_waits_for_erasure_retention(self, engine, settings):
        """Erased rows are purged at exactly retention_days, not a second before."""
        m = add(engine, "u1", pinned=True)
        file(engine, user_id="u1")
        run(engine, settings)
        run(engine, settings, now=NOW + DAY - SECOND)
        assert status(engine, m) == "deleted"
        report = run(engine, settings, now=NOW + DAY)
        assert acted_on(report, "hard_delete") == {str(m)} and get(engine, m) is None

    def test_stale_reinsert_is_removed_by_the_next_run(self, engine, settings):
        """After erasure and purge, a re-insert (same id, or same text) is removed again."""
        m = add(engine, "u1", "Allergic to peanuts")
        keep = add(engine, "u1", "Likes hiking")
        file(engine, memory_id=m)
        run(engine, settings)
        run(engine, settings, now=NOW + DAY)
        same_id = add(engine, "u1", "Allergic to peanuts", id=m)
        same_text = add(engine, "u1", "allergic to peanuts.")
        new = add(engine, "u1", "Allergic to shellfish")
        report = run(engine, settings, now=NOW + 2 * DAY)
        assert acted_on(report, "soft_delete") == {str(same_id), str(same_text)}
        assert {get(engine, i)["status_reason"] for i in (same_id, same_text)} == {
            "erasure_tombstone"
        }
        assert status(engine, keep) == status(engine, new) == "active"

    def test_erasing_a_member_scrubs_the_deferred_group_preview(self, engine, settings):
        """A deferred group (offline near-duplicates) previews one member's text in an audit
        row with no memory_id; erasing either member removes that preview."""
        a = add(engine, "u1", "secret: owes Bob 500", embedding=[1.0] + [0.0] * 7)
        add(engine, "u1", "secret: owes Bob 50", embedding=[0.999, 0.04] + [0.0] * 6)
        [deferred] = run(engine, settings, jobs=["compaction"])["actions"]
        assert deferred["memory_id"] is None and "secret" in deferred["details"]["content"]
        file(engine, memory_id=a)
        run(engine, settings, jobs=["erasure"])
        assert (
            count(engine, "SELECT count(*) FROM gc_actions WHERE content_preview LIKE '%secret%'")
            == 0
        )

    def test_erasure_is_not_restorable(self, engine, settings):
        """restore --run of an erasure run brings nothing back, and counts what it erased."""
        m = add(engine, "u1")
        file(engine, user_id="u1")
        report = run(engine, settings, jobs=["erasure"])
        result = restore.restore_run(engine, UUID(report["run_id"]))
        assert result.restored == [] and status(engine, m) == "deleted"
        assert (result.erased, result.purged) == (1, 0)

    def test_restore_counts_rows_gone_for_good_once(self, engine, settings):
        """What a restore reports as gone for good counts rows, not actions: a purge-now
        erasure (soft delete + purge of each row) is N purged, not N purged + N erased; a
        member brought back by reactivation is not counted as erased."""
        rows = [add(engine, "u1", "first"), add(engine, "u1", "second")]
        file(engine, user_id="u1", purge_now=True)
        purge_run = run(engine, settings, jobs=["erasure"])
        result = restore.restore_run(engine, UUID(purge_run["run_id"]))
        assert (result.erased, result.purged) == (0, 2)
        assert all(get(engine, r) is None for r in rows)
        a = add(engine, "u2", "Drinks green tea")
        b = add(engine, "u2", "Drinks tea every morning")
        merge(engine, "u2", [a, b], "Drinks green tea every morning", [1.0] + [0.0] * 7)
        file(engine, memory_id=a)
        member_run = run(engine, settings, jobs=["erasure"])
        result = restore.restore_run(engine, UUID(member_run["run_id"]))
        assert (result.erased, result.purged) == (2, 0)  # a and the merge; b came back

    def test_no_request_no_tombstone_no_action(self, engine, settings):
        """Without requests or tombstones the job plans nothing."""
        add(engine, "u1")
        assert run(engine, settings, jobs=["erasure"])["actions"] == []


def test_a_misfiled_memory_request_is_not_completed_while_the_memory_exists(engine, settings):
    """A request naming a memory under a user id with no rows (an account alias: a misfiled
    request) is left pending for the operator, not completed as "no rows left" while the
    memory stays on the read path."""
    kept = add(engine, "u1", "Takes insulin at 8am")
    execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                    " VALUES ('memory', 'u1-alias', :m)", m=kept)  # fmt: skip
    run(engine, settings)
    assert execute(engine, "SELECT status FROM gc_erasure_requests").scalar() == "pending"
    assert status(engine, kept) == "active"
