"""Resolving a review acts on the rows as they are at resolution, not as they were queued.

Found by a review: a member whose TTL passed or whose validity ended (still `active` until
ttl_expiry / contradiction run) was kept, or obsoleted, like a current row — the other fact
closed in favour of a row the read rule no longer shows (the slot left with no current value),
or an expired row turned into a year-long history row instead of a TTL deletion. And the row a
resolution keeps was read without a lock: retired meanwhile by another transaction, the loser
was still obsoleted in favour of it.
"""

from __future__ import annotations

import json

import pytest

from gc_worker import reviews
from gc_worker.cli import main
from gc_worker.errors import UsageError
from gc_worker.read_rule import current_memories
from gc_worker.reviews import list_reviews, resolve_review
from tests.store import NOW, days_ago, execute, snapshot
from tests.test_reviews import queue, seed_conflict


def still_open(engine, review_id: int) -> bool:
    with engine.connect() as conn:
        return [item.id for item in list_reviews(conn)] == [review_id]


class TestNoLongerCurrentMembers:
    @pytest.mark.parametrize("column", ["expires_at", "valid_until"])
    def test_a_winner_past_its_end_is_refused(self, engine, settings, column):
        """--obsolete of the user's statement in favour of an inference whose TTL (or
        validity) ended is refused: the user would be left with no diet at all."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        execute(engine, f"UPDATE memories SET {column} = :t WHERE id = :id",
                t=days_ago(0.5), id=inferred)  # fmt: skip
        before = snapshot(engine)
        with pytest.raises(UsageError, match=f"{inferred} .*no longer current.*--dismiss"):
            resolve_review(engine, review_id, obsolete=said, now=NOW)
        with pytest.raises(UsageError, match=f"{inferred} .*no longer current"):
            resolve_review(engine, review_id, keep=inferred, now=NOW)
        assert snapshot(engine) == before and still_open(engine, review_id)
        assert [m["id"] for m in current_memories(engine, "u1", None, NOW)] == [said]

    def test_an_expired_loser_is_left_to_ttl_expiry(self, engine, settings, cli_env, capsys):
        """--keep of one side whose other side expired is refused (exit 2): obsoleting the
        expired row would keep it as history for a year instead of deleting it by its TTL."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        execute(engine, "UPDATE memories SET expires_at = :t WHERE id = :id",
                t=days_ago(0.5), id=inferred)  # fmt: skip
        before = snapshot(engine)
        assert main(["reviews", "resolve", str(review_id), "--keep", str(said)]) == 2
        assert "no longer current" in capsys.readouterr().err
        assert snapshot(engine) == before and still_open(engine, review_id)

    def test_a_future_end_is_still_current(self, engine, settings):
        """Just inside: a winner expiring after the resolution's instant is kept as before."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        execute(engine, "UPDATE memories SET expires_at = :t WHERE id = :id",
                t=days_ago(-0.5), id=inferred)  # fmt: skip
        assert resolve_review(engine, review_id, obsolete=said, now=NOW).obsoleted == [said]


class TestConcurrentChange:
    @pytest.mark.parametrize("decision", ["keep", "obsolete"])
    def test_a_winner_retired_while_resolving_is_not_superseding(
        self, engine, settings, monkeypatch, decision
    ):
        """Another transaction deletes the row to keep after the resolution read it: the
        resolution is refused (nothing changed, the item still open), not applied in favour
        of a deleted row."""
        said, inferred = seed_conflict(engine)
        review_id = queue(engine, settings)
        read = reviews.members

        def read_then_retire(conn, memory_ids):
            rows = read(conn, memory_ids)
            execute(engine, "UPDATE memories SET status = 'deleted', deleted_at = :t "
                    "WHERE id = :id", t=NOW, id=inferred)  # fmt: skip
            return rows

        monkeypatch.setattr(reviews, "members", read_then_retire)
        choice = {"keep": inferred} if decision == "keep" else {"obsolete": said}
        before = {**snapshot(engine)}
        with pytest.raises(UsageError, match="changed while resolving"):
            resolve_review(engine, review_id, now=NOW, **choice)
        after = snapshot(engine)
        assert after[said] == before[said] and still_open(engine, review_id)


class TestListingStaysWithinTheUser:
    def test_a_member_moved_to_another_user_shows_no_text(self, engine, settings, cli_env, capsys):
        """`reviews list` of u1's item shows a member the application moved to u2 as `moved`,
        without u2's text (in the terminal listing and in --json)."""
        _, inferred = seed_conflict(engine)
        queue(engine, settings)
        execute(engine, "UPDATE memories SET user_id = 'u2', content = 'u2 private note' "
                "WHERE id = :id", id=inferred)  # fmt: skip
        assert main(["reviews", "list", "--user", "u1"]) == 0
        out = capsys.readouterr().out
        assert "u2 private note" not in out and f"{inferred}  [moved]" in out
        assert "Diet: vegetarian" in out
        assert main(["reviews", "list", "--json"]) == 0
        [item] = json.loads(capsys.readouterr().out)
        assert item["memories"][1] == {"id": str(inferred), "status": "moved", "preview": None}
        assert item["memories"][0]["preview"] == "Diet: vegetarian"
