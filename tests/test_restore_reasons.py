"""What a restore says about each change of a merge it could not undo, per cause: a member the
worker purged, the record the worker purged, the record the application edited, the record a
later run folded into a newer merge. Each reason, recorded in the restore run and printed by
`memory-gc restore`, says what happened (a purged member's record used to read
`changed_since`, though nothing had changed it: the purge had scrubbed the record's text from
the audit, so it no longer matched "as the run made it")."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from gc_worker import erasure, restore
from gc_worker.cli import main
from gc_worker.config import Settings
from tests.store import NOW, add, days_ago, execute, run, status
from tests.test_compaction import E0
from tests.test_restore_guards import merged
from tests.test_restore_skipped import skipped

YEAR_ON = NOW + timedelta(days=366)  # past the 365-day history retention of merged rows
MONTH_ON = NOW + timedelta(days=31)  # past the 30-day retention of deleted rows


def purge(engine, settings, now) -> set[str]:
    report = run(engine, settings, jobs=["hard_delete"], now=now)
    return {a["memory_id"] for a in report["actions"] if a["action"] == "hard_delete"}


def test_a_purged_member_reads_purged_and_its_record_source_purged(
    engine, settings, cli_env, capsys
):
    """One member purged past retention (the other pinned, so kept): the purged one is
    `purged`, the record it was made from `source_purged`, the other member `merge_kept`."""
    (gone, kept), record, run_id = merged(engine, settings)
    execute(engine, "UPDATE memories SET pinned = true WHERE id = :id", id=kept)
    assert purge(engine, settings, YEAR_ON) == {str(gone)}
    assert main(["restore", "--run", run_id]) == 0
    out = capsys.readouterr().out
    result_run = out.split("memory-gc report ")[1].split("`")[0]
    assert skipped(engine, UUID(result_run)) == {
        str(gone): ("purged", "merge"),
        str(kept): ("merge_kept", "merge"),
        str(record): ("source_purged", "create_merged"),
    }
    assert f"{gone}  purged  (its merge kept)" in out
    assert f"{record}  source_purged  (its create_merged kept)" in out
    assert status(engine, record) == "active" and status(engine, kept) == "merged"


def test_a_purged_record_reads_purged_and_its_members_merge_kept(engine, settings):
    """The application deleted the merged record; the worker purged it 30 days on. The record
    is `purged` (not `no_longer_stored`, which is the application's own delete), its members,
    untouched, `merge_kept`."""
    members, record, run_id = merged(engine, settings)
    execute(
        engine,
        "UPDATE memories SET status = 'deleted', deleted_at = :at WHERE id = :id",
        id=record,
        at=NOW + timedelta(hours=1),
    )
    assert purge(engine, settings, MONTH_ON) == {str(record)}
    result = restore.restore_run(engine, UUID(run_id), now=MONTH_ON)
    assert skipped(engine, result.run_id) == {
        str(record): ("purged", "create_merged"),
        **{str(m): ("merge_kept", "merge") for m in members},
    }


def test_a_record_the_application_deleted_reads_no_longer_stored(engine, settings):
    _, record, run_id = merged(engine, settings)
    execute(engine, "DELETE FROM memories WHERE id = :id", id=record)
    result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(hours=1))
    assert skipped(engine, result.run_id)[str(record)] == ("no_longer_stored", "create_merged")


def test_a_record_the_application_edited_reads_changed_since(engine, settings):
    members, record, run_id = merged(engine, settings)
    execute(engine, "UPDATE memories SET content = 'Has two dogs' WHERE id = :id", id=record)
    result = restore.restore_run(engine, UUID(run_id), now=NOW + timedelta(hours=1))
    assert skipped(engine, result.run_id) == {
        str(record): ("changed_since", "create_merged"),
        **{str(m): ("merge_kept", "merge") for m in members},
    }


def deeper() -> Settings:
    return Settings.model_validate({"embeddings": {"dim": 8}, "compaction": {"max_merge_depth": 2}})


def test_a_record_a_later_run_folded_reads_later_run_and_names_it(engine, cli_env, capsys):
    """A later compaction merged the record into a newer one: the record reads `later_run`,
    its restore action names that run, and the command says to restore it first."""
    settings = deeper()
    members, record, run_id = merged(engine, settings)
    later_now = NOW + timedelta(days=4)
    add(engine, "u1", "Has a dog", embedding=E0, created_at=days_ago(3, later_now))
    later = run(engine, settings, jobs=["compaction"], now=later_now)
    assert status(engine, record) == "merged", "the later run did not fold the record"
    assert main(["restore", "--run", run_id]) == 0
    out = capsys.readouterr().out
    result_run = UUID(out.split("memory-gc report ")[1].split("`")[0])
    assert skipped(engine, result_run) == {
        str(record): ("later_run", "create_merged"),
        **{str(m): ("merge_kept", "merge") for m in members},
    }
    assert (
        f"{record}  later_run  (its create_merged kept; restore run {later['run_id']} first)" in out
    )
    assert main(["report", str(result_run), "--format", "md"]) == 0
    assert f"later_run: restore run {later['run_id']} first" in capsys.readouterr().out


def test_a_row_a_later_run_retired_then_the_application_changed_reads_changed_since(
    engine, settings
):
    """Just outside `later_run`: the later run's change is no longer what the row holds."""
    settings = deeper()
    _, record, run_id = merged(engine, settings)
    later_now = NOW + timedelta(days=4)
    add(engine, "u1", "Has a dog", embedding=E0, created_at=days_ago(3, later_now))
    run(engine, settings, jobs=["compaction"], now=later_now)
    execute(engine, "UPDATE memories SET status = 'active' WHERE id = :id", id=record)
    execute(engine, "UPDATE memories SET content = 'Had a dog' WHERE id = :id", id=record)
    result = restore.restore_run(engine, UUID(run_id), now=later_now + timedelta(hours=1))
    assert skipped(engine, result.run_id)[str(record)] == ("changed_since", "create_merged")


def test_a_row_erased_then_purged_by_the_shorter_deleted_window_reads_erased(engine):
    """[erasure] retention_days longer than [hard_delete] retention_days (a hold on erased
    rows): the erased row goes after the deleted rows' window (reason retention_deleted,
    details.status_reason erasure). A restore of the run that had soft-deleted it says
    `erased`, as for any erased row (it said `purged`, as if no request had erased it)."""
    settings = Settings.model_validate(
        {"embeddings": {"dim": 8}, "hard_delete": {"retention_days": 2},
         "erasure": {"retention_days": 5}}
    )  # fmt: skip
    m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
    ttl = run(engine, settings, jobs=["ttl_expiry"])
    erasure.forget(engine, settings, now=NOW + timedelta(hours=1), memory_id=m)
    run(engine, settings, jobs=["erasure"], now=NOW + timedelta(hours=1))
    assert purge(engine, settings, NOW + timedelta(days=3)) == {str(m)}
    result = restore.restore_run(engine, UUID(ttl["run_id"]), now=NOW + timedelta(days=3))
    assert skipped(engine, result.run_id) == {str(m): ("erased", "soft_delete")}
