"""restore against the application's later writes: the application always wins. A row comes
back only while everything the worker wrote on it is still in place; a record the worker
created is taken off the read path only while the application has not made it its own."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from gc_worker import engine as gc_engine
from gc_worker import erasure, restore
from gc_worker.cli import main
from gc_worker.verify_erasure import verify
from tests.conftest import TEST_DIM
from tests.fake_model import FakeModel
from tests.store import NOW, add, days_ago, execute, get, run, status
from tests.test_compaction import E0


def slot_pair(engine) -> tuple[UUID, UUID]:
    """An older and a newer fact in one slot: contradiction obsoletes the older one and closes
    its valid_until at the newer one's start (one day ago)."""
    old = add(engine, "u1", "Lives in Paris", slot="profile.city", created_at=days_ago(10))
    new = add(engine, "u1", "Lives in Berlin", slot="profile.city", created_at=days_ago(1))
    return old, new


class TestStillInPlace:
    def test_a_closed_valid_until_goes_back_to_the_prior_one(self, engine, settings):
        """Undoing a contradiction reopens the validity the run closed."""
        old, _ = slot_pair(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert get(engine, old)["valid_until"] == days_ago(1)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        row = get(engine, old)
        assert result.restored == [old]
        assert (row["status"], row["valid_until"], row["superseded_by"]) == ("active", None, None)

    def test_a_valid_until_the_application_corrected_since_is_kept(self, engine, settings):
        """After the run closed valid_until, the application corrected it (the user moved out
        earlier): the row is not restorable and the application's value stays (restore used to
        write the pre-run value over it)."""
        old, _ = slot_pair(engine)
        report = run(engine, settings, jobs=["contradiction"])
        correction = days_ago(5)
        execute(engine, "UPDATE memories SET valid_until = :v WHERE id = :id", v=correction, id=old)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        row = get(engine, old)
        assert result.restored == [] and result.not_restorable == [old]
        assert (row["status"], row["valid_until"]) == ("obsolete", correction)

    def test_a_valid_until_the_application_set_on_a_deleted_row_is_kept(self, engine, settings):
        """A soft delete does not touch valid_until; one the application set afterwards is its
        own write, so the row stays as the application left it."""
        m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        execute(engine, "UPDATE memories SET valid_until = :v WHERE id = :id", v=days_ago(2), id=m)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        row = get(engine, m)
        assert result.not_restorable == [m]
        assert (row["status"], row["valid_until"]) == ("deleted", days_ago(2))

    def test_a_superseded_by_the_application_rewrote_is_kept(self, engine, settings):
        """The application pointed the obsolete row at another record after the run: its
        pointer stays and the row is not restorable."""
        old, _ = slot_pair(engine)
        other = add(engine, "u1", "Lives in Munich")
        report = run(engine, settings, jobs=["contradiction"])
        execute(engine, "UPDATE memories SET superseded_by = :o WHERE id = :id", o=other, id=old)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        assert result.not_restorable == [old]
        assert (status(engine, old), get(engine, old)["superseded_by"]) == ("obsolete", other)

    def test_an_untouched_row_next_to_a_changed_one_is_restored(self, engine, settings):
        """The check is per row: the run's other rows still come back."""
        changed = add(engine, "u1", "first", expires_at=days_ago(1))
        untouched = add(engine, "u1", "second", expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        execute(engine, "UPDATE memories SET valid_until = :v WHERE id = :id", v=NOW, id=changed)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
        assert result.restored == [untouched] and result.not_restorable == [changed]
        assert (status(engine, untouched), status(engine, changed)) == ("active", "deleted")


def test_a_row_the_user_deleted_after_the_run_stays_deleted(engine, settings):
    """The application deletes a memory the worker had already soft-deleted (the user empties
    it from a "recently removed" list: status stays deleted, deleted_at is stamped): restore
    --run brought it back and cleared the application's deleted_at (a review reproduced it)."""
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    report = run(engine, settings, jobs=["ttl_expiry"])
    user_deleted_at = NOW + timedelta(hours=2)
    execute(engine, "UPDATE memories SET status = 'deleted', deleted_at = :t WHERE id = :id",
            t=user_deleted_at, id=m)  # fmt: skip
    result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=3))
    row = get(engine, m)
    assert (row["status"], row["deleted_at"]) == ("deleted", user_deleted_at)
    assert result.not_restorable == [m]


def merged(engine, settings, user: str = "u1") -> tuple[list[UUID], UUID, str]:
    """Two exact duplicates of ``user`` merged by a compaction run: (members, merged record,
    run id)."""
    members = [
        add(engine, user, "Has a dog", embedding=E0, created_at=days_ago(3)) for _ in range(2)
    ]
    report = run(engine, settings, jobs=["compaction"], users=[user])
    record = next(a["memory_id"] for a in report["actions"] if a["action"] == "create_merged")
    return members, UUID(record), report["run_id"]


class TestCreatedRecords:
    def test_an_untouched_merge_is_undone_whole(self, engine, settings):
        """Members back, the merged record off the read path (status deleted, reason restored)."""
        members, record, run_id = merged(engine, settings)
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=1))
        assert set(result.restored) == {*members, record} and result.not_restorable == []
        assert [status(engine, m) for m in members] == ["active", "active"]
        assert (get(engine, record)["status"], get(engine, record)["status_reason"]) == (
            "deleted",
            "restored",
        )

    def test_a_record_the_user_edited_and_pinned_stays_and_so_does_the_merge(
        self, engine, settings
    ):
        """The application edited the merged record and pinned it: it is the user's now. It
        stays active, and its members stay merged into it (both active would repeat the
        fact); the whole merge is reported not restorable (restore used to retire the edited
        record and reactivate the members)."""
        members, record, run_id = merged(engine, settings)
        execute(
            engine,
            "UPDATE memories SET content = 'Has a dog named Rex', pinned = true, updated_at = :t"
            " WHERE id = :id",
            t=NOW + timedelta(days=20),
            id=record,
        )
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=21))
        assert result.restored == [] and set(result.not_restorable) == {*members, record}
        assert status(engine, record) == "active"
        assert [status(engine, m) for m in members] == ["merged", "merged"]

    @pytest.mark.parametrize(
        ("column", "edit"),
        [("importance", "importance = 5, importance_assessed_at = :t"),
         ("metadata", "metadata = jsonb_build_object('starred', true)"),
         ("expires_at", "expires_at = :t + interval '30 days'"),
         ("slot", "slot = 'pets'"),
         ("user_id", "user_id = 'u2'")],
    )  # fmt: skip
    def test_an_edit_of_another_column_keeps_the_record(self, engine, settings, column, edit):
        """Not only content: the application re-assessing the record's importance, starring
        it, giving it a TTL, a slot, or moving it to another user makes it the application's.
        restore used to compare status, pin, content and updated_at only, and retired the
        edited record (a review reproduced it)."""
        members, record, run_id = merged(engine, settings)
        execute(engine, f"UPDATE memories SET {edit} WHERE id = :id",
                t=NOW + timedelta(days=2), id=record)  # fmt: skip
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=3))
        assert status(engine, record) == "active", column
        assert [status(engine, m) for m in members] == ["merged", "merged"]
        assert set(result.not_restorable) == {*members, record}

    def test_the_workers_own_importance_score_is_no_edit(self, engine, settings):
        """An importance the worker's importance job wrote on the record since (the members
        were never assessed) does not hold the undo back."""
        from tests.fake_model import FakeModel, fake_port

        members, record, run_id = merged(engine, settings)
        execute(engine, "UPDATE memories SET importance_assessed_at = NULL WHERE id = :id",
                id=record)  # fmt: skip
        with fake_port(engine, settings, FakeModel("good", dim=TEST_DIM)) as llm:
            scored = run(engine, settings, jobs=["importance"], llm=llm)
        assert [a["memory_id"] for a in scored["actions"]] == [str(record)]
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=3))
        assert set(result.restored) == {*members, record}
        assert status(engine, record) == "deleted"

    def test_an_edit_without_updated_at_still_keeps_the_record(self, engine, settings):
        """A content change the application made without bumping updated_at counts too: the
        user's text is not retired, so hard_delete never purges it later."""
        _, record, run_id = merged(engine, settings)
        execute(engine, "UPDATE memories SET content = 'Has a dog named Rex' WHERE id = :id",
                id=record)  # fmt: skip
        restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=1))
        run(engine, settings, jobs=["hard_delete"], now=NOW + timedelta(days=32))
        assert get(engine, record)["content"] == "Has a dog named Rex"
        assert status(engine, record) == "active"

    def test_a_record_only_touched_in_updated_at_or_pin_is_kept(self, engine, settings):
        """updated_at moved (the application rewrote the record) or the record was pinned:
        either alone keeps it."""
        _, bumped, bumped_run = merged(engine, settings)
        execute(engine, "UPDATE memories SET updated_at = :t WHERE id = :id",
                t=NOW + timedelta(seconds=1), id=bumped)  # fmt: skip
        assert restore.restore_run(engine, UUID(bumped_run), now=NOW).restored == []
        _, pinned, pinned_run = merged(engine, settings, "u2")
        execute(engine, "UPDATE memories SET pinned = true WHERE id = :id", id=pinned)
        assert restore.restore_run(engine, UUID(pinned_run), now=NOW).restored == []
        assert (status(engine, bumped), status(engine, pinned)) == ("active", "active")

    def test_a_record_the_application_deleted_keeps_its_members_merged(self, engine, settings):
        """The user deleted the merged memory: bringing its members back would put the fact
        they deleted back on the read path."""
        members, record, run_id = merged(engine, settings)
        execute(engine, "UPDATE memories SET status = 'deleted', status_reason = 'user',"
                        " deleted_at = :t WHERE id = :id", t=NOW, id=record)  # fmt: skip
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=1))
        assert result.restored == []
        assert [status(engine, m) for m in members] == ["merged", "merged"]

    def test_a_member_gone_keeps_the_record_and_the_other_members_merged(self, engine, settings):
        """One member was deleted by the application since: the record holds the only copy of
        what it said, so it stays, and the other members stay merged into it instead of coming
        back next to it (the same fact twice)."""
        (gone, kept), record, run_id = merged(engine, settings)
        execute(engine, "DELETE FROM memories WHERE id = :id", id=gone)
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=1))
        assert result.restored == [] and set(result.not_restorable) == {gone, kept, record}
        assert (status(engine, record), status(engine, kept)) == ("active", "merged")

    def test_a_member_the_application_already_reactivated_counts_as_back(self, engine, settings):
        """A member the application put back itself is active like a restored one: the merge is
        undone, that member keeps the application's write."""
        (woken, other), record, run_id = merged(engine, settings)
        execute(engine, "UPDATE memories SET status = 'active', status_reason = 'app'"
                        " WHERE id = :id", id=woken)  # fmt: skip
        result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(days=1))
        assert set(result.restored) == {other, record} and result.not_restorable == [woken]
        assert get(engine, woken)["status_reason"] == "app"
        assert (status(engine, other), status(engine, record)) == ("active", "deleted")

    def test_restore_memory_of_an_edited_record_keeps_it(self, engine, settings):
        """restore --memory naming the edited record changes nothing either."""
        members, record, _ = merged(engine, settings)
        execute(engine, "UPDATE memories SET content = 'Has a dog named Rex' WHERE id = :id",
                id=record)  # fmt: skip
        result = restore.restore_memory(engine, record, now=NOW + timedelta(days=1))
        assert result.restored == [] and status(engine, record) == "active"
        assert [status(engine, m) for m in members] == ["merged", "merged"]

    def test_restoring_the_merge_run_first_keeps_the_merge(self, engine, settings):
        """A later run retired the merged record (its TTL ran out). Restoring the merge run
        first leaves the members merged, since the record is not active; restoring the later
        run then brings the record back: members merged into an active record, never the
        fact twice (the members used to come back, and then the record beside them)."""
        members = [
            add(engine, "u1", "Has a dog", embedding=E0, created_at=days_ago(3),
                expires_at=NOW + timedelta(days=1))
            for _ in range(2)
        ]  # fmt: skip
        merge_run = run(engine, settings, jobs=["compaction"])
        record = UUID(next(a["memory_id"] for a in merge_run["actions"] if a["memory_id"]
                           and a["action"] == "create_merged"))  # fmt: skip
        ttl_run = run(engine, settings, jobs=["ttl_expiry"], now=NOW + timedelta(days=2))
        assert status(engine, record) == "deleted"
        restore.restore_run(engine, UUID(merge_run["run_id"]), now=NOW + timedelta(days=3))
        restore.restore_run(engine, UUID(ttl_run["run_id"]), now=NOW + timedelta(days=3))
        assert status(engine, record) == "active"
        assert [status(engine, m) for m in members] == ["merged", "merged"]


def test_restore_memory_of_one_member_undoes_the_whole_merge(engine, settings):
    """restore --memory naming one member of a merge undoes the merge whole: both members back,
    the record retired (it used to bring back that member alone, next to the record stating
    the same fact)."""
    members = [
        add(engine, "u1", "Has a dog", embedding=E0, created_at=days_ago(3)) for _ in range(2)
    ]
    report = run(engine, settings, jobs=["compaction"])
    record = UUID(next(a["memory_id"] for a in report["actions"] if a["action"] == "create_merged"))
    restore.restore_memory(engine, members[0], now=NOW + timedelta(days=1))
    assert [status(engine, m) for m in [*members, record]] == ["active", "active", "deleted"]


NEAR = ["Likes hiking very much", "Likes hiking", "Likes hiking a lot"]


def model_merged(engine, settings, make_llm, texts=NEAR[:2]) -> tuple[list[UUID], str, Any]:
    """Near duplicates of u1 merged by the model (reason near_duplicates): (members, run id,
    the port)."""
    llm = make_llm(FakeModel("good"))
    members = [add(engine, "u1", t, embedding=E0, created_at=days_ago(3)) for t in texts]
    report = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm)
    assert {a["reason"] for a in report["actions"]} == {"near_duplicates"}, report["actions"]
    return members, report["run_id"], llm


def judged_pair(engine, settings, make_llm) -> tuple[UUID, UUID, str, Any]:
    """A similar pair the model judged contradictory (no slot, no declaration): (older,
    newer, run id, the port)."""
    llm = make_llm(FakeModel("good"))  # its verdict: (14 + 16) % 3 == 0 → contradicts
    old = add(engine, "u1", "Lives in Paris", embedding=E0, created_at=days_ago(10))
    new = add(engine, "u1", "Lives in Berlin.", embedding=E0, created_at=days_ago(1))
    report = run(engine, settings, jobs=["contradiction"], users=["u1"], llm=llm)
    assert [a["action"] for a in report["actions"]] == ["obsolete"], report["actions"]
    return old, new, report["run_id"], llm


def later(days: float) -> Any:
    return NOW + timedelta(days=days)


class TestARestoreIsNotUndoneByTheNextRun:
    """A restore of a model's merge or verdict is a person overruling the model: the next run
    made the same change again (the verdict is cached), so an undo lasted until the next
    night. The restore now records it as a dismissed review (`memory-gc reviews`), which the
    jobs honour as they honour `resolve --dismiss`. A rule applies again."""

    def test_restored_model_merge_is_not_made_again(self, engine, settings, make_llm):
        members, run_id, llm = model_merged(engine, settings, make_llm)
        restore.restore_run(engine, UUID(run_id), now=later(0.05))
        again = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm, now=later(1))
        assert again["actions"] == [] and [status(engine, m) for m in members] == ["active"] * 2
        veto = execute(engine, "SELECT kind, reason, status, resolution ->> 'decision' AS d,"
                               " memory_ids FROM gc_review_items").one()  # fmt: skip
        assert (veto.kind, veto.reason, veto.status, veto.d) == (
            "compaction", "restored", "resolved", "dismiss")  # fmt: skip
        assert sorted(veto.memory_ids) == sorted(members)

    def test_a_lifted_dismissal_lets_the_model_merge_again(
        self, engine, settings, make_llm, cli_env, capsys
    ):
        """`reviews lift ID` takes the restore's dismissal back (it used to take SQL): the
        next run merges the pair again; the item stays, resolved, decision `lifted`."""
        members, run_id, llm = model_merged(engine, settings, make_llm)
        restore.restore_run(engine, UUID(run_id), now=later(0.05))
        veto = execute(engine, "SELECT id FROM gc_review_items").scalar_one()
        assert main(["reviews", "lift", str(veto), "--now", later(0.1).isoformat()]) == 0
        assert "dismissal lifted" in capsys.readouterr().out
        again = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm, now=later(1))
        assert {a["memory_id"] for a in again["actions"] if a["action"] == "merge"} == {
            str(m) for m in members}  # fmt: skip
        lifted = execute(engine, "SELECT status, resolution FROM gc_review_items").one()
        assert lifted.status == "resolved" and lifted.resolution["decision"] == "lifted"
        assert lifted.resolution["lifted"]["decision"] == "dismiss"
        assert main(["reviews", "lift", str(veto)]) == 2  # lifted already: nothing to lift
        assert "not dismissed" in capsys.readouterr().err

    def test_a_new_copy_still_merges_with_one_of_them(self, engine, settings, make_llm):
        """Only the undone set is kept apart: a later copy merges with one of its members."""
        members, run_id, llm = model_merged(engine, settings, make_llm)
        restore.restore_run(engine, UUID(run_id), now=later(0.05))
        newer = add(engine, "u1", NEAR[2], embedding=E0, created_at=days_ago(1))
        again = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm, now=later(1))
        merged_now = {a["memory_id"] for a in again["actions"] if a["action"] == "merge"}
        assert len(merged_now) == 2 and str(newer) in merged_now
        assert sum(status(engine, m) == "active" for m in members) == 1

    def test_restored_model_verdict_is_not_acted_on_again(self, engine, settings, make_llm):
        old, new, run_id, llm = judged_pair(engine, settings, make_llm)
        restore.restore_run(engine, UUID(run_id), now=later(0.05))
        again = run(engine, settings, jobs=["contradiction"], users=["u1"], llm=llm, now=later(1))
        assert again["actions"] == []
        assert (status(engine, old), status(engine, new)) == ("active", "active")

    def test_a_rule_applies_again(self, engine, settings):
        """Exact duplicates, a slot: the rules act again at the next run (change the row or the
        setting first); nothing is recorded for them."""
        _, _, merge_run = merged(engine, settings)
        slot_pair(engine)
        slot_run = run(engine, settings, jobs=["contradiction"], users=["u1"])["run_id"]
        for run_id in (merge_run, slot_run):
            restore.restore_run(engine, UUID(run_id), now=later(0.05))
        again = run(engine, settings, jobs=["compaction", "contradiction"], users=["u1"],
                    now=later(1))  # fmt: skip
        assert {a["reason"] for a in again["actions"]} >= {"exact_duplicates", "slot_replaced"}
        assert execute(engine, "SELECT count(*) FROM gc_review_items").scalar() == 0


class TestDismissalsAndErasure:
    """Found by a review of the dismissals: a restore after a forget-memory wrote the erased id
    back into gc_review_items (verify-erasure: residue), and forgetting one member of an
    undone three-way merge dropped the whole set, so the other two merged again."""

    @pytest.mark.parametrize("purge_now", [False, True])
    def test_a_set_naming_an_erased_memory_is_not_recorded(
        self, engine, settings, make_llm, purge_now
    ):
        old, new, run_id, _ = judged_pair(engine, settings, make_llm)
        erasure.forget(engine, settings, now=later(0.01), memory_id=new, purge_now=purge_now)
        if not purge_now:
            run(engine, settings, jobs=["erasure"], users=["u1"], now=later(0.02))
        restore.restore_run(engine, UUID(run_id), now=later(0.05))
        assert status(engine, old) == "active"
        assert execute(engine, "SELECT count(*) FROM gc_review_items").scalar() == 0
        if purge_now:  # else the erased row itself stays until its retention ends
            check = verify(engine, now=later(0.1), memory_id=new)
            assert check.clean, [r.describe() for r in check.residues]

    def test_forgetting_one_member_keeps_the_others_apart(self, engine, settings, make_llm):
        (a, b, c), run_id, llm = model_merged(engine, settings, make_llm, NEAR)
        restore.restore_run(engine, UUID(run_id), now=later(0.05))
        erasure.forget(engine, settings, now=later(0.5), memory_id=a, purge_now=True)
        again = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm, now=later(1))
        assert again["actions"] == [] and (status(engine, b), status(engine, c)) == (
            "active", "active")  # fmt: skip
        assert sorted(execute(engine, "SELECT memory_ids FROM gc_review_items").scalar()) == sorted(
            [b, c])  # fmt: skip
        check = verify(engine, now=later(1.1), memory_id=a)
        assert check.clean, [r.describe() for r in check.residues]


def test_a_plan_made_before_the_restore_does_not_redo_it(engine, settings, make_llm):
    """A dry run planned the model's merge; an on-demand run applied it meanwhile, and it was
    restored: applying the older plan merged the rows again (restore puts their status fields
    back exactly, so no version drifted). The dismissal now drifts the whole group. Found by a
    review."""
    llm = make_llm(FakeModel("good"))
    a, b = [add(engine, "u1", t, embedding=E0, created_at=days_ago(3)) for t in NEAR[:2]]
    plan = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm, dry_run=True)
    applied = run(engine, settings, jobs=["compaction"], users=["u1"], llm=llm, now=later(0.01))
    restore.restore_run(engine, UUID(applied["run_id"]), now=later(0.02))
    gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    assert (status(engine, a), status(engine, b)) == ("active", "active")


def test_a_plan_made_before_the_restore_does_not_redo_a_verdict(engine, settings, make_llm):
    llm = make_llm(FakeModel("good"))
    old = add(engine, "u1", "Lives in Paris", embedding=E0, created_at=days_ago(10))
    add(engine, "u1", "Lives in Berlin.", embedding=E0, created_at=days_ago(1))
    plan = run(engine, settings, jobs=["contradiction"], users=["u1"], llm=llm, dry_run=True)
    applied = run(engine, settings, jobs=["contradiction"], users=["u1"], llm=llm, now=later(0.01))
    restore.restore_run(engine, UUID(applied["run_id"]), now=later(0.02))
    gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    assert status(engine, old) == "active"
