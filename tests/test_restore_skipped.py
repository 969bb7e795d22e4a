"""A restore names each change it could not undo, and why, in its own run's report. It used to
give only a count ("3 not restorable"), so an operator could not tell which rows stayed
retired, or whether the application or an erasure held them."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest

from gc_worker import erasure, restore
from gc_worker.cli import main
from gc_worker.commands import SHOWN_KEPT
from gc_worker.db import transaction
from gc_worker.render import render_markdown
from gc_worker.render_html import render_html
from gc_worker.report import build_report
from tests.store import NOW, add, days_ago, execute, run, status
from tests.test_restore_guards import merged

LATER = NOW + timedelta(hours=1)


def skipped(engine, restore_run: UUID) -> dict[str, tuple[str, str]]:
    """The restore run's drifted entries: memory id -> (reason, what the restore undid)."""
    with engine.connect() as conn:
        report = build_report(conn, restore_run)
    return {d["memory_id"]: (d["reason"], d["details"]["undid"]) for d in report["drifted"]}


def expired(engine, user: str, text: str) -> UUID:
    return add(engine, user, text, expires_at=days_ago(1))


def test_each_skipped_row_is_named_with_its_reason(engine, settings):
    """Four rows one run retired: one the application edited, one it moved to another user,
    one it deleted, one whose user asked to be forgotten (another user's, so the request does
    not hold the others). A fifth row comes back. Each of the four is named with its reason."""
    edited = expired(engine, "u1", "Is in Rome this week")
    moved = expired(engine, "u1", "Is in Oslo this week")
    deleted = expired(engine, "u1", "Is in Lima this week")
    back = expired(engine, "u1", "Is in Pune this week")
    held = expired(engine, "u2", "Is in Kyiv this week")
    report = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "UPDATE memories SET status = 'active' WHERE id = :id", id=edited)
    execute(engine, "UPDATE memories SET user_id = 'u3' WHERE id = :id", id=moved)
    execute(engine, "DELETE FROM memories WHERE id = :id", id=deleted)
    with transaction(engine) as conn:
        erasure.file_request(conn, user_id="u2")
    result = restore.restore_run(engine, UUID(report["run_id"]), now=LATER)
    assert result.restored == [back] and status(engine, back) == "active"
    assert skipped(engine, result.run_id) == {
        str(edited): ("changed_since", "soft_delete"),
        str(moved): ("moved_to_another_user", "soft_delete"),
        str(deleted): ("no_longer_stored", "soft_delete"),
        str(held): ("erasure_pending", "soft_delete"),
    }
    assert set(result.not_restorable) == {edited, moved, deleted, held}


def test_members_of_a_kept_merge_say_the_merge_is_kept(engine, settings):
    """The application edited the merged record: the record is changed, and its members,
    untouched themselves, stay merged into it (the merge is kept whole)."""
    members, record, run_id = merged(engine, settings)
    execute(engine, "UPDATE memories SET confidence = 0.2 WHERE id = :id", id=record)
    result = restore.restore_run(engine, UUID(run_id), now=LATER)
    assert skipped(engine, result.run_id) == {
        str(record): ("changed_since", "create_merged"),
        **{str(m): ("merge_kept", "merge") for m in members},
    }
    with engine.connect() as conn:
        text = render_markdown(build_report(conn, result.run_id))
    assert "merge_kept" in text and "Nothing restored" in text
    assert "restore of create_merged" in text
    with engine.connect() as conn:
        page = render_html(build_report(conn, result.run_id))
    assert "<h2>Not restorable <small>" in page and "merge_kept" in page


@pytest.mark.parametrize("kept", [SHOWN_KEPT, SHOWN_KEPT + 1])
def test_the_command_lists_at_most_twenty_kept_changes(engine, settings, cli_env, capsys, kept):
    """20 kept changes are all listed; the 21st is counted, and the report has it."""
    rows = [expired(engine, "u1", f"Is in town {i} this week") for i in range(kept)]
    report = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "UPDATE memories SET status = 'active' WHERE id = ANY(:ids)", ids=rows)
    assert main(["restore", "--run", report["run_id"]]) == 0
    out = capsys.readouterr().out
    assert out.count("  changed_since  (its soft_delete kept)") == SHOWN_KEPT
    assert ("1 more and why" in out) == (kept > SHOWN_KEPT)


def test_the_command_lists_what_it_skipped(engine, settings, cli_env, capsys):
    edited = expired(engine, "u1", "Is in Rome this week")
    report = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "UPDATE memories SET status = 'active' WHERE id = :id", id=edited)
    assert main(["restore", "--run", report["run_id"]]) == 0
    out = capsys.readouterr().out
    assert "0 restored, 1 not restorable" in out
    assert f"{edited}  changed_since" in out and "memory-gc report" in out
