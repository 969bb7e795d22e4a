"""The review queue: what the contradiction job queues, and resolving it (API and CLI)."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import pytest

from gc_worker import restore
from gc_worker.cli import main
from gc_worker.errors import NotFoundError, UsageError
from gc_worker.read_rule import current_memories
from gc_worker.report import build_report
from gc_worker.reviews import list_reviews, resolve_review
from tests.store import NOW, add, days_ago, execute, get, run, snapshot, status


def seed_conflict(engine) -> tuple[UUID, UUID]:
    """A user statement and a newer model inference for one slot, queued for review."""
    said = add(engine, "u1", "Diet: vegetarian", slot="diet", created_at=days_ago(90))
    inferred = add(engine, "u1", "Diet: vegan", slot="diet", created_at=days_ago(1),
                   source="model_inference")  # fmt: skip
    return said, inferred


def queue(engine, settings) -> int:
    run(engine, settings, jobs=["contradiction"])
    with engine.connect() as conn:
        [item] = list_reviews(conn)
    return item.id


def report_of(engine, run_id):
    with engine.connect() as conn:
        return build_report(conn, run_id)


class TestList:
    def test_queued_item_is_listed_with_its_pair(self, engine, settings):
        """The contradiction job's review shows up open, naming [older, newer]."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        with engine.connect() as conn:
            [item] = list_reviews(conn, user_id="u1")
            assert list_reviews(conn, user_id="u2") == []
            assert list_reviews(conn, status="resolved") == []
        assert (item.id, item.kind, item.reason) == (review_id, "contradiction", "lower_trust")
        assert item.memory_ids == [said, inferred] and item.status == "open"

    def test_unknown_status_is_a_usage_error(self, engine):
        """Only open, resolved (or None for all) are statuses."""
        with engine.connect() as conn, pytest.raises(UsageError, match="status"):
            list_reviews(conn, status="pending")


class TestResolve:
    def test_keep_the_older_rejects_the_newer(self, engine, settings):
        """Keeping the user statement obsoletes the inference as rejected, window untouched."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        result = resolve_review(engine, review_id, keep=said, now=NOW)
        row = get(engine, inferred)
        assert (row["status"], row["status_reason"]) == ("obsolete", "review_rejected")
        assert row["superseded_by"] == said and row["valid_until"] is None
        assert result.obsoleted == [inferred] and status(engine, said) == "active"
        assert [m["content"] for m in current_memories(engine, "u1", None, NOW)] == [
            "Diet: vegetarian"
        ]
        report = report_of(engine, result.run_id)
        assert report["mode"] == "apply" and report["totals"]["by_action"] == {"obsolete": 1}

    def test_obsolete_the_older_supersedes_it(self, engine, settings):
        """Obsoleting the older closes its window at the newer's start; the newer is current."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        resolve_review(engine, review_id, obsolete=said, now=NOW)
        row = get(engine, said)
        assert (row["status_reason"], row["superseded_by"]) == ("review_superseded", inferred)
        assert row["valid_until"] == days_ago(1)
        assert [m["content"] for m in current_memories(engine, "u1", None, NOW)] == ["Diet: vegan"]
        assert [m["content"] for m in current_memories(engine, "u1", None, days_ago(2))] == [
            "Diet: vegetarian"
        ]

    @pytest.mark.parametrize("obsoleted", [0, 1])
    def test_obsoleting_one_of_two_facts_written_together_rejects_it(
        self, engine, settings, obsoleted
    ):
        """With no newer fact (a no_newer review) the one obsoleted is rejected, its window
        untouched, whichever id is higher: it is not "superseded" at its own start."""
        pair = [add(engine, "u1", text, slot="tz", created_at=days_ago(2))
                for text in ("Timezone: CET", "Timezone: EST")]  # fmt: skip
        review_id = queue(engine, settings)
        resolve_review(engine, review_id, obsolete=pair[obsoleted], now=NOW)
        row = get(engine, pair[obsoleted])
        assert (row["status_reason"], row["valid_until"]) == ("review_rejected", None)

    def test_a_resolution_is_restorable(self, engine, settings):
        """restore --run of the resolution run puts the memory back."""
        said, _ = seed_conflict(engine)
        before = snapshot(engine)
        result = resolve_review(engine, queue(engine, settings), keep=said, now=NOW)
        restore.restore_run(engine, result.run_id)
        assert snapshot(engine) == before

    def test_dismiss_changes_nothing_and_is_not_asked_again(self, engine, settings):
        """A dismissed pair stays as it is and the job queues no new review for it."""
        seed_conflict(engine)
        review_id = queue(engine, settings)
        before = snapshot(engine)
        result = resolve_review(engine, review_id, dismiss=True, now=NOW)
        assert result.run_id is None and snapshot(engine) == before
        assert run(engine, settings, jobs=["contradiction"])["totals"]["actions"] == 0
        count = execute(engine, "SELECT count(*) FROM gc_review_items").scalar()
        assert count == 1

    def test_refusals(self, engine, settings):
        """Unknown item, foreign memory, no decision and a second resolution are refused."""
        said, _ = seed_conflict(engine)
        review_id = queue(engine, settings)
        with pytest.raises(NotFoundError):
            resolve_review(engine, review_id + 100, keep=said)
        with pytest.raises(UsageError, match="not part of review"):
            resolve_review(engine, review_id, keep=uuid4())
        with pytest.raises(UsageError, match="exactly one"):
            resolve_review(engine, review_id)
        resolve_review(engine, review_id, keep=said)
        with pytest.raises(UsageError, match="already resolved"):
            resolve_review(engine, review_id, keep=said)

    def test_pinned_or_retired_members_are_not_changed(self, engine, settings):
        """A pinned loser is refused; a member retired since must be dismissed instead."""
        pinned = add(engine, "u1", "Timezone: CET", slot="tz", created_at=days_ago(50),
                     pinned=True)  # fmt: skip
        add(engine, "u1", "Timezone: EST", slot="tz", created_at=days_ago(1))
        review_id = queue(engine, settings)
        with pytest.raises(UsageError, match="pinned"):
            resolve_review(engine, review_id, obsolete=pinned)
        execute(engine, "UPDATE memories SET status = 'deleted' WHERE id = :id", id=pinned)
        with pytest.raises(UsageError, match="no longer active"):
            resolve_review(engine, review_id, obsolete=pinned)
        assert resolve_review(engine, review_id, dismiss=True).decision == "dismiss"

    @pytest.mark.parametrize("retired", ["deleted", "obsolete"])
    def test_obsolete_in_favour_of_a_retired_member_is_refused(
        self, engine, settings, cli_env, capsys, retired
    ):
        """--obsolete M whose other member was retired since is refused like --keep of it
        (exit 2, nothing changed, --dismiss suggested): it used to close M's window at the dead
        row's start, leaving the slot with no current value."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        execute(engine, "UPDATE memories SET status = :s WHERE id = :id", s=retired, id=inferred)
        before = snapshot(engine)
        with pytest.raises(UsageError, match=f"{inferred} that would supersede .* no longer act"):
            resolve_review(engine, review_id, obsolete=said, now=NOW)
        assert main(["reviews", "resolve", str(review_id), "--obsolete", str(said)]) == 2
        assert "use --dismiss" in capsys.readouterr().err
        assert snapshot(engine) == before and status(engine, said) == "active"
        with engine.connect() as conn:
            assert [item.id for item in list_reviews(conn)] == [review_id]  # still open


class TestNoReviewSpansTwoUsers:
    """A row a review names that moves to another user (the application changes its user_id)
    must never be obsoleted in favour of the first user's memory (a review a reviewer
    reproduced: resolving it did exactly that)."""

    @pytest.mark.parametrize("decision", ["keep", "obsolete"])
    def test_resolving_a_review_whose_row_moved_is_refused(self, engine, settings, decision):
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        execute(engine, "UPDATE memories SET user_id = 'u2' WHERE id = :id", id=inferred)
        before = snapshot(engine)
        choice = {"keep": said} if decision == "keep" else {"obsolete": inferred}
        with pytest.raises(UsageError, match=r"now belongs to another user.*--dismiss"):
            resolve_review(engine, review_id, now=NOW, **choice)
        assert snapshot(engine) == before
        assert resolve_review(engine, review_id, dismiss=True, now=NOW).decision == "dismiss"

    def test_a_planned_review_whose_row_moved_is_not_queued_at_apply(self, engine, settings):
        from gc_worker import engine as gc_engine

        said, inferred = seed_conflict(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        assert [a["action"] for a in plan["actions"]] == ["review"]
        execute(engine, "UPDATE memories SET user_id = 'u2' WHERE id = :id", id=inferred)
        applied = report_of(engine, gc_engine.apply_plan(engine, UUID(plan["run_id"])))
        with engine.connect() as conn:
            assert list_reviews(conn) == []
        assert applied["totals"]["actions"] == 0
        assert applied["jobs"]["contradiction"]["drifted"] == 1
        assert status(engine, said) == status(engine, inferred) == "active"

    def test_a_planned_review_of_rows_the_application_deleted_is_not_queued(self, engine, settings):
        """The application deleted the user's rows (and "forget me" then completed at once,
        with nothing left to erase): the stale plan's question about them is moot."""
        from gc_worker import engine as gc_engine
        from gc_worker import erasure
        from gc_worker.verify_erasure import verify

        seed_conflict(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        execute(engine, "DELETE FROM memories WHERE user_id = 'u1'")
        filed, _ = erasure.forget(engine, settings, now=NOW, user_id="u1")
        assert filed.status == "completed"
        gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        with engine.connect() as conn:
            assert list_reviews(conn) == []
        assert verify(engine, now=NOW, user_id="u1").residues == []


class TestCommandLine:
    def test_list_and_resolve(self, engine, settings, cli_env, capsys):
        """`reviews list` shows the item and its memories; `reviews resolve --keep` applies."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        assert main(["reviews", "list"]) == 0
        out = capsys.readouterr().out
        assert f"#{review_id}" in out and str(inferred) in out and "Diet: vegan" in out
        assert main(["reviews", "list", "--json", "--status", "all"]) == 0
        [item] = json.loads(capsys.readouterr().out)
        assert [m["id"] for m in item["memories"]] == [str(said), str(inferred)]
        assert main(["reviews", "resolve", str(review_id), "--keep", str(said)]) == 0
        assert "memory-gc restore --run" in capsys.readouterr().out
        assert status(engine, inferred) == "obsolete"
        assert main(["reviews", "list"]) == 0
        assert "no open review items" in capsys.readouterr().out

    def test_lift_takes_back_a_persons_dismissal(self, engine, settings, cli_env, capsys):
        """A dismissed contradiction item stops blocking its pair once lifted: the next run
        queues the pair for review again. An open item, or one resolved with a change, has no
        dismissal to lift (exit 2, naming what to do instead)."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        assert main(["reviews", "lift", str(review_id)]) == 2
        assert "is open, not dismissed" in capsys.readouterr().err
        assert main(["reviews", "resolve", str(review_id), "--dismiss"]) == 0
        run(engine, settings, jobs=["contradiction"])
        with engine.connect() as conn:
            assert list_reviews(conn) == []  # dismissed: left alone
        assert main(["reviews", "lift", str(review_id)]) == 0
        run(engine, settings, jobs=["contradiction"])
        with engine.connect() as conn:
            [again] = list_reviews(conn)
        assert again.id != review_id and again.memory_ids == [said, inferred]
        assert main(["reviews", "resolve", str(again.id), "--keep", str(said)]) == 0
        capsys.readouterr()
        assert main(["reviews", "lift", str(again.id)]) == 2
        assert "resolved with keep, not dismissed" in capsys.readouterr().err
        assert main(["reviews", "lift", "999"]) == 2

    def test_bad_usage_exits_2(self, engine, cli_env, capsys):
        """A non-numeric id, a missing decision or an unknown item is exit code 2."""
        assert main(["reviews", "resolve", "abc", "--dismiss"]) == 2
        assert main(["reviews", "resolve", "1"]) == 2
        assert main(["reviews", "resolve", "999", "--dismiss"]) == 2
        assert "no review item 999" in capsys.readouterr().err
