"""Render a run report (DESIGN.md §5, report_version 1) as JSON, Markdown or one HTML page.

Pure functions from the report dict to text: no database, no clock, no I/O. Markdown and HTML
tell people the same things — the header (and, for a dry run, the command that applies it),
totals per action, one row per job, the busiest users (top 50), reasons with counts, a sample of
rows per job and action (10 each), the deferred groups (first 20) and the LLM usage.

Every string that comes from the store (content, user ids, reasons, details) is hostile input:
HTML escapes all of it; Markdown escapes ``|``, newlines, angle brackets, the punctuation of
links and markup, and bare URLs' ``://`` and ``www.`` (autolinks), and puts a word joiner after
the '@' of an address or mention; JSON escapes every control and bidi character
(gc_worker.render_text).

This module is the entry point and the JSON. The facts Markdown and HTML show are
gc_worker.render_facts', the banner at their top gc_worker.render_banner's, the text of each
value gc_worker.render_text's; gc_worker.render_markdown and gc_worker.render_html lay them out.

Optional report keys, rendered when present and ignored when absent: ``plan_run_id``,
``status``, ``applied_by``, ``per_user`` (else derived from ``actions``), ``jobs.*.drifted``,
``jobs.*.refreshed``, ``actions[].details.content`` and the deferred actions'
``details.memory_ids``.
"""

from __future__ import annotations

import json
from pathlib import PurePath

from gc_worker.render_facts import Report
from gc_worker.render_html import render_html
from gc_worker.render_markdown import render_markdown
from gc_worker.render_text import RAW_IN_JSON

FORMATS = ("json", "md", "html")

_SUFFIXES = {".json": "json", ".md": "md", ".markdown": "md", ".html": "html", ".htm": "html"}


def render(report: Report, fmt: str) -> str:
    """Render ``report`` in ``fmt`` (one of FORMATS)."""
    renderers = {"json": render_json, "md": render_markdown, "html": render_html}
    if fmt not in renderers:
        raise ValueError(f"unknown report format {fmt!r}; valid formats: {', '.join(FORMATS)}")
    return renderers[fmt](report)


def format_for_path(path: str | PurePath) -> str:
    """The report format a file path asks for, from its suffix."""
    fmt = _SUFFIXES.get(PurePath(path).suffix.lower())
    if fmt is None:
        raise ValueError("report path must end in .json, .md or .html")
    return fmt


def render_json(report: Report) -> str:
    """The report as indented JSON, keys in their given order, non-ASCII kept — except the
    unprintable characters json.dumps leaves raw (DEL, C1, bidi controls): the JSON goes to
    terminals too (`memory-gc report RUN`). They can only stand inside JSON strings, so their
    \\uXXXX escapes keep the JSON valid and its value the same."""
    text = json.dumps(report, indent=2, sort_keys=False, ensure_ascii=False, default=str)
    return RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
