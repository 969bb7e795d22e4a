"""Text from the store makes no link in the Markdown report, also where GitHub-flavoured
Markdown links an address by itself (its extended email and protocol autolinks), and is shown
as written. The check reads the rendered string as GFM's autolinker does: cmark-gfm merges
adjacent text before it looks for e-mail addresses, so a backslash escape does not count."""

from __future__ import annotations

import copy
import html
import re
from typing import Any

import pytest

from gc_worker import render
from tests.test_render import report

__all__ = ["report"]  # the fixture, imported for this module's tests

# cmark-gfm's extended email autolink (also the address of a mailto: / xmpp: autolink): local
# part, one '@', a domain of ASCII letters, digits, '-' and '_' with at least one '.'
_GFM_EMAIL = re.compile(r"[A-Za-z0-9.+_-]+@[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)+")
ADDRESSES = (
    "bob@example.com",
    "mailto:carol@evil.example",
    "xmpp:dave@chat.evil.example",
    "erin@_mail.evil.example",  # '_' is escaped: GFM still sees it after the '@'
    "frank@.evil.example",
)


def gfm_text(md: str) -> str:
    """The text GFM's autolinker sees: backslash escapes and entities resolved."""
    return html.unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", md))


def shown(md: str) -> str:
    """What a person sees (no invisible characters)."""
    return gfm_text(md).replace("\u2060", "")


def _with_store_text(report: dict[str, Any], text: str) -> dict[str, Any]:
    """The report with ``text`` as a memory's content, a detail value, a user id and the
    run's error."""
    changed = copy.deepcopy(report)
    first = changed["actions"][0]
    first["details"] = {"content": text, "note": text}
    first["user_id"] = text
    changed.update(status="failed", error=f"batch 0: {text}")
    return changed


class TestAddressesAreNotLinked:
    @pytest.mark.parametrize("address", ADDRESSES)
    def test_an_address_in_store_text_is_shown_but_not_linked(self, report, address) -> None:
        """A memory's e-mail or chat address (bare, mailto:, xmpp:) in a preview, a detail, a
        user id and the error line: shown as written, never an autolink (GitHub linked each)."""
        md = render.render(_with_store_text(report, f"write to {address} now"), "md")
        assert not _GFM_EMAIL.search(gfm_text(md)), _GFM_EMAIL.findall(gfm_text(md))
        # the preview, the detail, the user (per user and in the sample), the error
        assert shown(md).count(f"write to {address} now") == 5

    def test_a_mention_is_not_a_mention(self, report) -> None:
        """``@name`` (a GitHub mention where the report is pasted into an issue) is broken up
        the same way, and shown as written."""
        md = render.render(_with_store_text(report, "ping @octocat"), "md")
        assert not re.search(r"@[A-Za-z0-9]", gfm_text(md))
        assert "ping @octocat" in shown(md)

    @pytest.mark.parametrize("text", ["meet @ 5pm", "a@", "no address here", "x @ y.z"])
    def test_other_text_is_unchanged(self, report, text: str) -> None:
        """Text with no address after an '@' gets no invisible character."""
        md = render.render(_with_store_text(report, text), "md")
        assert "\u2060" not in md
