"""A run's error in the header of the Markdown and HTML reports is shortened like the other long
fields (a failed run's error can be kilobytes: five batches' errors, an older run's whole
exception text); the JSON report keeps it whole."""

from __future__ import annotations

import copy
import html
import json
import re
from typing import Any

import pytest

from gc_worker import render
from gc_worker.render_text import ERROR_CHARS
from tests.test_render import report

__all__ = ["report"]  # the fixture, imported for this module's tests


def _failed(report: dict[str, Any], error: str) -> dict[str, Any]:
    failed = copy.deepcopy(report)
    failed.update(mode="apply", status="failed", error=error)
    return failed


def _md_error(md: str) -> str:
    """The header's error as shown (Markdown escapes resolved)."""
    [line] = [ln for ln in md.splitlines() if ln.startswith("- **Error:** ")]
    return re.sub(r"\\(.)", r"\1", line.removeprefix("- **Error:** "))


def _html_error(page: str) -> str:
    """The header's error as shown."""
    [value] = re.findall(r"<dt>Error</dt><dd>(.*?)</dd>", page)
    return html.unescape(value)


STATEMENT = (
    "UndefinedColumn: column x does not exist; statement: INSERT INTO gc_actions "
    + " ".join(
        ["(run_id, batch_no, job, action, memory_id, user_id, reason, details) VALUES …"] * 80
    )
)


class TestTheHeaderError:
    def test_a_long_error_is_cut_and_says_so(self, report) -> None:
        """An error of over 6,000 characters (a statement quoted whole): the header shows its
        first ERROR_CHARS characters, "…" and its length; Markdown and HTML alike."""
        failed = _failed(report, STATEMENT)
        md, page = render.render(failed, "md"), render.render(failed, "html")
        for shown in (_md_error(md), _html_error(page)):
            assert shown.startswith(STATEMENT[: ERROR_CHARS - 1] + "…")
            assert len(shown) < ERROR_CHARS + 100, len(shown)
            assert f"{len(STATEMENT):,} characters" in shown

    def test_the_json_report_keeps_it_whole(self, report) -> None:
        """The JSON form is the record: the error whole."""
        assert json.loads(render.render(_failed(report, STATEMENT), "json"))["error"] == STATEMENT

    @pytest.mark.parametrize(("size", "cut"), [(ERROR_CHARS, False), (ERROR_CHARS + 1, True)])
    def test_an_error_at_the_limit_is_whole_one_over_is_cut(self, report, size, cut) -> None:
        """ERROR_CHARS characters are shown whole; one more and it is cut."""
        error = "e" * size
        shown = _html_error(render.render(_failed(report, error), "html"))
        assert (shown == error) is not cut
        assert ("…" in shown) is cut

    def test_a_cut_splits_no_character_as_shown(self, report) -> None:
        """Cut where a character as shown ends: an accent stays with its letter."""
        error = "x" * (ERROR_CHARS - 2) + "e\u0301" * 10
        shown = _html_error(render.render(_failed(report, error), "html"))
        assert not shown.split("…")[0].endswith("e")
