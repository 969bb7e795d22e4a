"""The report as a Markdown document for people (gc_worker.render_facts: what it shows). A
value from the store (``Stored``) has its Markdown punctuation and bare URLs escaped and a word
joiner after each '@' of an address, so it cannot make links, images, mentions or markup of its
own; every value has ``|`` and angle brackets
escaped, so it stays in its table cell and makes no HTML.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gc_worker.render_banner import banner
from gc_worker.render_facts import (
    DRIFTED_HEADERS,
    SAMPLE_HEADERS,
    Report,
    Rows,
    _actions,
    _deferred_rows,
    _drifted_rows,
    _empty_totals,
    _header_rows,
    _job_table,
    _llm_rows,
    _reason_rows,
    _samples,
    _total_actions,
    _total_rows,
    _user_rows,
    drifted_heading,
)
from gc_worker.render_text import Stored, _more_note, _text

# Markdown punctuation a store text could use to make links, images or markup of its own.
_MD_PUNCTUATION = re.compile(r"([\\`*_\[\]()!#~&])")
# What GitHub-flavoured Markdown links by itself (extended autolinks): "scheme://…" and "www.…".
# A backslash before that ':' or '.' (an escape of ASCII punctuation, shown as the character)
# leaves text that is neither. Any scheme: other viewers link more of them than GFM.
_MD_AUTOLINK = re.compile(r"(?i):(?=//)|(?<![a-z0-9])www\.")
# GFM also links an e-mail address (bare, or after mailto: / xmpp:) — and GitHub makes "@name"
# a mention — but it finds addresses in text whose escapes it already resolved (cmark-gfm
# merges adjacent text first): an escape does not stop it. An invisible word joiner after the
# '@' does (an address's domain must follow it at once); a viewer shows the text as it was.
_MD_ADDRESS = re.compile(r"@(?=[\w.-])")
WORD_JOINER = "\u2060"


def render_markdown(report: Report) -> str:
    """The report as a Markdown document for people."""
    blocks = [
        f"# memory-gc report {_md(report.get('run_id'))}",
        _md_banner(report),
        "\n".join(f"- **{label}:** {_md(value)}" for label, value in _header_rows(report)),
    ]
    blocks += ["## Totals", _md_totals(report), "## Jobs", _md_table(*_job_table(report))]
    if _actions(report):
        blocks += _md_details(report)
    drifted, more_drifted = _drifted_rows(report)
    if drifted:
        title, subtitle = drifted_heading(report)
        blocks += [
            f"## {title} ({subtitle})",
            _md_table(DRIFTED_HEADERS, drifted),
            _more_note(more_drifted, "drifted"),
        ]
    blocks += ["## LLM usage", _md_table(["metric", "count"], _llm_rows(report))]
    return "\n\n".join(block for block in blocks if block) + "\n"


def _md(value: Any) -> str:
    text = _text(value)  # one line, nothing a terminal would act on
    if isinstance(value, Stored):  # no links, images or markup from the store
        text = _MD_ADDRESS.sub("@" + WORD_JOINER, text)  # before '_' after it is escaped
        text = _MD_PUNCTUATION.sub(r"\\\1", text)
        text = _MD_AUTOLINK.sub(lambda m: f"{m.group()[:-1]}\\{m.group()[-1]}", text)
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _md_banner(report: Report) -> str:
    _, headline, rest = banner(report)
    return f"> **{_md(headline)}** {_md(rest)}"


def _md_totals(report: Report) -> str:
    if not _total_actions(report):
        return _md(_empty_totals(report))
    return f"**{_total_actions(report):,} actions**\n\n" + _md_table(
        ["action", "count"], _total_rows(report)
    )


def _md_details(report: Report) -> list[str]:
    users, more_users = _user_rows(report)
    blocks = [
        "## Per user",
        _md_table(["user", "actions", "by action"], users),
        _more_note(more_users, "users"),
        "## Reasons",
        _md_table(["job", "action", "reason", "count"], _reason_rows(report)),
        "## Samples",
    ]
    for job, groups in _samples(report).items():
        for kind, total, rows in groups:
            blocks += [
                f"### {_md(job)} — {_md(kind)} ({len(rows)} of {total:,})",
                _md_table(SAMPLE_HEADERS, rows),
            ]
    deferred, more_deferred = _deferred_rows(report)
    if deferred:
        blocks += [
            "## Deferred groups",
            _md_table(["job", "user", "reason", "memories"], deferred),
            _more_note(more_deferred, "groups"),
        ]
    return blocks


def _md_table(headers: Sequence[str], rows: Rows) -> str:
    lines = [
        "| " + " | ".join(_md(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(_md(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
