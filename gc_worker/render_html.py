"""The run report as one self-contained HTML page (gc_worker.render_facts: the facts it shows;
gc_worker.render: the other formats). Every value from the store is escaped; markup built here
is marked ``_Html``."""

from __future__ import annotations

import html
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
from gc_worker.render_text import _more_note, _text


class _Html(str):
    """Markup built in this module: inserted as is, where any other value is escaped."""


def _e(value: Any) -> str:
    return value if isinstance(value, _Html) else html.escape(_text(value))


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page (inline CSS, no scripts, no assets)."""
    body = [
        f"<h1>memory-gc report <code>{_e(report.get('run_id'))}</code></h1>",
        _h_banner(report),
        _h_meta(report),
        "<h2>Totals</h2>",
        _h_totals(report),
        "<h2>Jobs</h2>",
        _h_jobs(report),
    ]
    if _actions(report):
        body += _h_details(report)
    drifted, more_drifted = _drifted_rows(report)
    if drifted:
        title, subtitle = drifted_heading(report)
        body += [
            f"<h2>{_e(title)} <small>{_e(subtitle)}</small></h2>",
            _h_table(DRIFTED_HEADERS, drifted),
            _h_note(_more_note(more_drifted, "drifted")),
        ]
    body += ["<h2>LLM usage</h2>", _h_cards(_llm_rows(report))]
    return _PAGE.format(
        title=_e(f"memory-gc report {_text(report.get('run_id'))}"),
        css=_CSS,
        body="\n".join(part for part in body if part),
    )


def _h_banner(report: Report) -> str:
    kind, headline, rest = banner(report)
    # `command` spans become <code>; everything else is escaped text
    parts = rest.split("`")
    body = "".join(
        _e_spaced(p) if i % 2 == 0 else f"<code>{_e(p)}</code>" for i, p in enumerate(parts)
    )
    return f'<p class="banner {kind}"><strong>{_e(headline)}</strong> {body}</p>'


def _e_spaced(text: str) -> str:
    """``_e(text)`` keeping a space at either edge: `printable` strips them, and the words
    beside a code span would run into it."""
    core = _e(text)
    lead = " " if text[:1].isspace() else ""
    return lead + core + (" " if core and text[-1:].isspace() else "")


def _h_meta(report: Report) -> str:
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in _header_rows(report))
    return f'<dl class="meta">{items}</dl>'


def _h_cards(rows: Rows, lead: tuple[str, int] | None = None) -> str:
    cards = [lead] if lead else []
    cards += [(label, n) for label, n in rows]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><span class="n">{_e(n)}</span>'
            f'<span class="l">{_e(label)}</span></div>'
            for label, n in cards
        )
        + "</div>"
    )


def _h_totals(report: Report) -> str:
    if not _total_actions(report):
        return f'<p class="empty">{_e(_empty_totals(report))}</p>'
    return _h_cards(_total_rows(report), lead=("actions in all", _total_actions(report)))


def _h_jobs(report: Report) -> str:
    headers, rows = _job_table(report)
    peak = max((row[1] for row in rows), default=0) or 1
    bars = [
        _Html(f'<div class="bar"><span style="width:{100 * row[1] / peak:.1f}%"></span></div>')
        for row in rows
    ]
    return _h_table([*headers, "share"], [[*row, bar] for row, bar in zip(rows, bars, strict=True)])


def _h_details(report: Report) -> list[str]:
    users, more_users = _user_rows(report)
    deferred, more_deferred = _deferred_rows(report)
    parts = [
        "<h2>Per user</h2>",
        _h_table(["user", "actions", "by action"], users),
        _h_note(_more_note(more_users, "users")),
        "<h2>Reasons</h2>",
        _h_table(["job", "action", "reason", "count"], _reason_rows(report)),
        "<h2>Samples</h2>",
        *(_h_job_samples(job, g) for job, g in _samples(report).items()),
    ]
    if deferred:
        parts += [
            "<h2>Deferred groups</h2>",
            _h_table(["job", "user", "reason", "memories"], deferred),
            _h_note(_more_note(more_deferred, "groups")),
        ]
    return parts


def _h_job_samples(job: str, groups: list[tuple[str, int, Rows]]) -> str:
    total = sum(n for _, n, _ in groups)
    inner = "".join(
        f"<h3>{_e(kind)} <small>{len(rows)} of {total_kind:,}</small></h3>"
        + _h_table(SAMPLE_HEADERS, rows)
        for kind, total_kind, rows in groups
    )
    summary = f"<summary>{_e(job)} <small>{total:,} actions</small></summary>"
    return f"<details>{summary}{inner}</details>"


def _h_note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>' if text else ""


def _h_table(headers: Sequence[str], rows: Rows) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_h_cell(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _h_cell(value: Any) -> str:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return f'<td class="num">{_e(value)}</td>' if numeric else f"<td>{_e(value)}</td>"


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
<main>
{body}
</main>
</body>
</html>
"""

_CSS = """
:root { --ink: #1f2328; --muted: #656d76; --line: #d0d7de; --zebra: #f6f8fa;
  --accent: #0969da; --warn-bg: #fff8c5; --warn-line: #d4a72c; --ok-bg: #dafbe1;
  --ok-line: #4ac26b; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff; line-height: 1.5;
  font: 15px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Helvetica, Arial, sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 1.6rem; margin: 0 0 12px; }
h2 { font-size: 1.2rem; margin: 32px 0 10px; padding-bottom: 4px;
  border-bottom: 1px solid var(--line); }
h3 { font-size: 1rem; margin: 16px 0 6px; }
small { color: var(--muted); font-weight: normal; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  background: var(--zebra); padding: 1px 5px; border-radius: 4px; }
.banner { padding: 10px 14px; border-radius: 6px; border: 1px solid; margin: 12px 0; }
.banner.dry { background: var(--warn-bg); border-color: var(--warn-line); }
.banner.applied { background: var(--ok-bg); border-color: var(--ok-line); }
.banner.incomplete { background: #fdecea; border-color: #e0a39b; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
.meta dt { color: var(--muted); }
.meta dd { margin: 0; overflow-wrap: anywhere; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px;
  min-width: 130px; display: flex; flex-direction: column; }
.card .n { font-size: 1.5rem; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .l { color: var(--muted); font-size: 0.85rem; }
.card:first-child { border-color: var(--accent); }
.empty { font-size: 1.1rem; color: var(--muted); padding: 12px 0; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 10px; font-size: 0.9rem; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line);
  vertical-align: top; overflow-wrap: anywhere; }
th { background: var(--zebra); font-weight: 600; }
tbody tr:nth-child(even) { background: var(--zebra); }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.bar { background: #eaeef2; border-radius: 3px; height: 10px; min-width: 120px; }
.bar span { display: block; height: 100%; background: var(--accent); border-radius: 3px; }
details { border: 1px solid var(--line); border-radius: 6px; padding: 6px 12px; margin: 8px 0; }
summary { cursor: pointer; font-weight: 600; }
.note { color: var(--muted); margin: 4px 0; }
"""
