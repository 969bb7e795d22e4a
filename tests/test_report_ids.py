"""Long user ids in what people read: rendered reports and CLI lines show a long id shortened
(its start, "…" and a hash), never cut inside a character; the JSON and the store keep it whole."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any

import pytest

from gc_worker import render
from gc_worker.cli import main
from gc_worker.render_text import display_id
from tests.store import NOW, add, days_ago

NOW_ARG = NOW.isoformat()
LONG = "tenant-42/" + "user.with.a.very.long.identifier." * 9  # 307 characters
MEMORY = "00000001-aaaa-4bbb-8ccc-dddddddddddd"
# accented letters written as letter + combining acute, and family emoji joined by ZWJs
COMBINING = "e\u0301" * 23 + "\U0001f469\u200d\U0001f469\u200d\U0001f467" * 20
FLAGS = "x" + "\U0001f1eb\U0001f1f7" * 40  # regional-indicator pairs (French flags)


def _digest(user_id: str) -> str:
    return hashlib.sha256(user_id.encode()).hexdigest()[:8]


def _action(user: str, action: str = "soft_delete", **details: Any) -> dict[str, Any]:
    return {"job": "ttl_expiry", "action": action, "memory_id": MEMORY, "user_id": user,
            "reason": "ttl_expired", "details": details}  # fmt: skip


def _report(user: str) -> dict[str, Any]:
    """A completed apply in which ``user`` appears everywhere a user id can."""
    return {
        "report_version": 1, "run_id": "r1", "mode": "apply", "kind": "gc", "status": "failed",
        "now": NOW_ARG, "started_at": NOW_ARG, "finished_at": NOW_ARG,
        "scope": {"users": [user], "jobs": ["ttl_expiry"]},
        "totals": {"actions": 2, "by_action": {"soft_delete": 1, "deferred": 1}},
        "jobs": {"ttl_expiry": {"actions": 2, "by_action": {"soft_delete": 1}}},
        "actions": [_action(user, content="c"), _action(user, "deferred", memory_ids=[MEMORY])],
        "drifted": [_action(user, content="d")],
        "failed_batches": [{"batch_no": 1, "users": [user], "error": "boom"}],
        "llm": {"calls": 0},
    }  # fmt: skip


class TestDisplayId:
    def test_short_ids_are_shown_whole(self) -> None:
        """An id up to 60 characters (an email, a UUID) is shown as it is."""
        assert display_id("alice@example.com") == "alice@example.com"
        assert display_id("a" * 60) == "a" * 60

    def test_a_long_id_is_its_start_and_a_hash(self) -> None:
        """A 307-character id is shown as its first 48 characters, "…" and 8 hex digits of
        its SHA-256: two ids with the same start are told apart."""
        shown = display_id(LONG)
        assert shown == f"{LONG[:48]}…{_digest(LONG)}"
        assert display_id(LONG + "x") != shown

    def test_a_short_id_cannot_pose_as_a_long_ids_display(self) -> None:
        """An id that is literally another id's shortened form (57 characters, so short enough
        to be shown whole) would look the same as that user: an id holding "…" is always shown
        as its start and its own hash."""
        forged = display_id(LONG)
        assert len(forged) <= 60
        assert display_id(forged) != display_id(LONG)
        assert display_id(forged).endswith(_digest(forged))
        assert display_id("ann…") == f"ann……{_digest('ann…')}"

    @pytest.mark.parametrize("user", [COMBINING, FLAGS], ids=["combining-zwj", "flags"])
    def test_never_cuts_inside_a_character(self, user: str) -> None:
        """The cut falls between what is shown as characters: not before a combining mark,
        not beside a zero-width joiner, not between a flag's two regional indicators."""
        head = display_id(user).rsplit("…", 1)[0]
        assert user.startswith(head) and 40 <= len(head) <= 48, (len(head), head)
        rest = user[len(head) :]
        assert not unicodedata.combining(rest[0]) and rest[0] != "\u200d"
        assert not head.endswith("\u200d")
        if user is FLAGS:
            assert len(head) % 2 == 1  # "x" and whole pairs only
        head.encode("utf-8")  # valid text: nothing half of anything


class TestRenderedReports:
    @pytest.mark.parametrize("fmt", ["md", "html"])
    def test_every_place_shows_the_long_id_shortened(self, fmt: str) -> None:
        """Scope, per-user table, samples, deferred groups, drifted rows and failed batches
        printed a 300-character id whole (tables unreadable); each shows it shortened."""
        text = render.render(_report(LONG), fmt)
        assert LONG[:49] not in text  # never whole, nor longer than the shown start
        assert text.count(_digest(LONG)) >= 6, text.count(_digest(LONG))

    def test_json_keeps_the_id_whole(self) -> None:
        """The JSON is the record: the id stays exact there."""
        report = json.loads(render.render(_report(LONG), "json"))
        assert report["actions"][0]["user_id"] == LONG
        assert report["failed_batches"][0]["users"] == [LONG]

    @pytest.mark.parametrize("fmt", ["md", "html"])
    def test_a_short_id_is_unchanged(self, fmt: str) -> None:
        """An ordinary id shows whole, with no hash."""
        text = render.render(_report("carol"), fmt)
        assert "carol" in text and _digest("carol") not in text


class TestCliLines:
    def test_reviews_list_shortens_a_long_user_id(self, engine, cli_env, capsys) -> None:
        """`reviews list` printed the whole 300-character id in each item's head line."""
        add(engine, LONG, "Diet: vegetarian", slot="diet", created_at=days_ago(90))
        add(engine, LONG, "Diet: vegan", slot="diet", created_at=days_ago(1),
            source="model_inference")  # fmt: skip
        assert main(["run", "--job", "contradiction", "--now", NOW_ARG]) == 0
        capsys.readouterr()
        assert main(["reviews", "list"]) == 0
        out = capsys.readouterr().out
        assert f"user={display_id(LONG)} " in out and LONG not in out, out

    def test_request_sweep_shortens_a_long_user_id(self, engine, cli_env, capsys) -> None:
        """`request-sweep USER` echoed the whole id."""
        add(engine, LONG, "a fact")
        assert main(["request-sweep", LONG]) == 0
        out = capsys.readouterr().out
        assert f"for user {display_id(LONG)};" in out and LONG not in out, out
