"""Render a run report (DESIGN.md §5, report_version 1) as JSON, Markdown or one HTML page.

Pure functions from the report dict to text: no database, no clock, no I/O. Markdown and HTML
tell people the same things — the header (and, for a dry run, the command that applies it),
totals per action, one row per job, the busiest users (top 50), reasons with counts, a sample of
rows per job and action (10 each), the deferred groups (first 20) and the LLM usage.

Every string that comes from the store (content, user ids, reasons, details) is hostile input:
HTML escapes all of it; Markdown escapes ``|``, newlines, angle brackets, the punctuation of
links and markup, and bare URLs' ``://`` and ``www.`` (autolinks); JSON escapes every control
and bidi character (``_UNPRINTABLE``).

Optional report keys, rendered when present and ignored when absent: ``plan_run_id``,
``status``, ``applied_by``, ``per_user`` (else derived from ``actions``), ``jobs.*.drifted``,
``jobs.*.refreshed``, ``actions[].details.content`` and the deferred actions'
``details.memory_ids``.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import PurePath
from typing import Any

from gc_worker.config import ahead_of_clock

Report = Mapping[str, Any]
Rows = list[list[Any]]

FORMATS = ("json", "md", "html")
SAMPLE_ROWS = 10
TOP_USERS = 50
DEFERRED_GROUPS = 20
PREVIEW_CHARS = 120
NOTHING_TO_DO = "Nothing to do — no memory needed a change."
NOTHING_RESTORED = "Nothing restored — {n:,} change(s) could not be undone (not restorable, below)."
ALL_DRIFTED = (
    "Nothing applied — {n:,} planned change(s) skipped: the application changed those rows "
    "since they were planned (drifted, below)."
)
DRIFTED_HEADERS = ["memory", "user", "job", "action", "reason", "content"]
SAMPLE_HEADERS = ["memory", "user", "reason", "content", "details"]

_SUFFIXES = {".json": "json", ".md": "md", ".markdown": "md", ".html": "html", ".htm": "html"}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_LIST_KEYS = ("content", "memory_ids")  # details shown in their own columns
# What must not reach a person's terminal or viewer from the store: control characters (ESC
# sequences drive a terminal; NUL, BEL; DEL and the C1 set, \x9b being a one-byte CSI) and the
# bidi controls that reorder what is shown (marks, embeddings, overrides, isolates).
_NOT_C0 = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNPRINTABLE = re.compile(rf"[\x00-\x1f{_NOT_C0}]")
# Those json.dumps leaves raw (it escapes the C0 controls only; its own newlines are layout).
_RAW_IN_JSON = re.compile(rf"[{_NOT_C0}]")
# Markdown punctuation a store text could use to make links, images or markup of its own.
_MD_PUNCTUATION = re.compile(r"([\\`*_\[\]()!#~&])")
# What GitHub-flavoured Markdown links by itself (extended autolinks): "scheme://…" and "www.…".
# A backslash before that ':' or '.' (an escape of ASCII punctuation, shown as the character)
# leaves text that is neither. Any scheme: other viewers link more of them than GFM.
_MD_AUTOLINK = re.compile(r"(?i):(?=//)|(?<![a-z0-9])www\.")


class Stored(str):
    """A text from the store (memory content, a user id, a detail value): shown, never
    interpreted — Markdown escapes its punctuation too."""


def printable(text: str) -> str:
    """``text`` on one line, whitespace collapsed, control and bidi characters shown as �."""
    return _UNPRINTABLE.sub("\ufffd", " ".join(text.split()))


# -- entry points ---------------------------------------------------------------------------


def render(report: Report, fmt: str) -> str:
    """Render ``report`` in ``fmt`` (one of FORMATS)."""
    from gc_worker.render_html import render_html  # it builds on this module's helpers

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
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


# -- the facts both human formats show ------------------------------------------------------


def _actions(report: Report) -> list[Mapping[str, Any]]:
    return list(report.get("actions") or [])


def _is_dry_run(report: Report) -> bool:
    return report.get("mode") == "dry_run"


def _header_rows(report: Report) -> list[tuple[str, Any]]:
    scope = report.get("scope") or {}
    optional = [("Plan run", "plan_run_id"), ("Status", "status"), ("Applied by", "applied_by")]
    return [
        ("Run", report.get("run_id")),
        ("Mode", report.get("mode")),
        *((label, report[key]) for label, key in optional if report.get(key) is not None),
        ("Now", report.get("now")),
        ("Duration", _duration(report)),
        ("Users", Stored(_limited(scope.get("users"), 10)) if scope.get("users") else "all"),
        ("Jobs", ", ".join(scope.get("jobs") or []) or "—"),
        *([("Score pass", _score_pass(report["score_pass"]))] if report.get("score_pass") else []),
    ]


def _score_pass(score_pass: Mapping[str, Any]) -> str:
    """A run's score pass (gc_worker.score_pass), e.g. "done, 466,541 scores refreshed"."""
    state = score_pass.get("state")
    note = {"stopped": " (stopped early: the rest is the next run's)", "due": " (not finished)"}
    return f"{state}, {score_pass.get('refreshed', 0):,} scores refreshed{note.get(state, '')}"


def _duration(report: Report) -> str:
    try:
        seconds = (
            datetime.fromisoformat(report["finished_at"])
            - datetime.fromisoformat(report["started_at"])
        ).total_seconds()
    except (KeyError, TypeError, ValueError):
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def _total_rows(report: Report) -> Rows:
    by_action = (report.get("totals") or {}).get("by_action") or {}
    return [[action, n] for action, n in by_action.items() if n]


def _total_actions(report: Report) -> int:
    return int((report.get("totals") or {}).get("actions") or 0)


def _job_table(report: Report) -> tuple[list[str], Rows]:
    jobs: Mapping[str, Mapping[str, Any]] = report.get("jobs") or {}
    extra = [key for key in ("drifted", "refreshed") if any(key in j for j in jobs.values())]
    headers = ["job", "actions", "by action", "skipped", "errors", "LLM calls", *extra]
    rows = [
        [
            name,
            j.get("actions", 0),
            _counts_text(j.get("by_action")),
            j.get("skipped", 0),
            j.get("errors", 0),
            j.get("llm_calls", 0),
            *(j.get(key) for key in extra),
        ]
        for name, j in jobs.items()
    ]
    return headers, rows


def _per_user(report: Report) -> Mapping[str, Mapping[str, Any]]:
    if report.get("per_user") is not None:
        return report["per_user"]
    counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for action in _actions(report):
        counts[action.get("user_id")][action.get("action")] += 1
    return {user: {"actions": c.total(), "by_action": dict(c)} for user, c in counts.items()}


def _user_rows(report: Report) -> tuple[Rows, int]:
    stats = _per_user(report).items()
    ranked = sorted(stats, key=lambda kv: (-kv[1].get("actions", 0), str(kv[0])))
    rows = [
        [_stored(user), s.get("actions", 0), _counts_text(s.get("by_action"))] for user, s in ranked
    ]
    return rows[:TOP_USERS], max(0, len(rows) - TOP_USERS)


def _reason_rows(report: Report) -> Rows:
    keys = ((a.get("job"), a.get("action"), a.get("reason")) for a in _actions(report))
    return [[*key, n] for key, n in Counter(keys).most_common()]


def _samples(report: Report) -> dict[str, list[tuple[str, int, Rows]]]:
    """Per job: (action kind, how many in all, the first SAMPLE_ROWS rows)."""
    groups: defaultdict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for action in _actions(report):
        if action.get("action") != "deferred":
            groups[(action.get("job"), action.get("action"))].append(action)
    by_job: defaultdict[str, list[tuple[str, int, Rows]]] = defaultdict(list)
    for (job, kind), members in groups.items():
        by_job[job].append((kind, len(members), [_sample_row(a) for a in members[:SAMPLE_ROWS]]))
    return dict(by_job)


def _sample_row(action: Mapping[str, Any]) -> list[Any]:
    details = action.get("details") or {}
    return [
        _short_id(action.get("memory_id")),
        _stored(action.get("user_id")),
        action.get("reason"),
        _preview(details.get("content")),
        _details_text(details),
    ]


def _drifted_rows(report: Report) -> tuple[Rows, int]:
    """Planned changes skipped because the application changed their rows since."""
    drifted = report.get("drifted") or []
    rows = [
        [
            _short_id(a.get("memory_id")),
            _stored(a.get("user_id")),
            a.get("job"),
            _drifted_action(a),
            a.get("reason"),
            _preview((a.get("details") or {}).get("content")),
        ]
        for a in drifted[:DEFERRED_GROUPS]
    ]
    return rows, max(0, len(drifted) - DEFERRED_GROUPS)


def _drifted_action(action: dict[str, Any]) -> Any:
    """The action of a drifted row; a restore's names the change it kept."""
    undid = (action.get("details") or {}).get("undid")
    return f"{action.get('action')} of {undid}" if undid else action.get("action")


def _empty_totals(report: Report) -> str:
    """What the totals say when nothing was applied (or planned)."""
    drifted = len(report.get("drifted") or [])
    if drifted and _is_restore(report):
        return NOTHING_RESTORED.format(n=drifted)
    return ALL_DRIFTED.format(n=drifted) if drifted else NOTHING_TO_DO


def _is_restore(report: Report) -> bool:
    return report.get("kind") == "restore" or report.get("mode") == "restore"  # older reports


def drifted_heading(report: Report) -> tuple[str, str]:
    """The drifted section's title and subtitle: a restore's are the changes it kept."""
    if _is_restore(report):
        return "Not restorable", "kept: the reason says why"
    return "Drifted", "skipped: changed since the plan"


def _deferred_rows(report: Report) -> tuple[Rows, int]:
    groups = [a for a in _actions(report) if a.get("action") == "deferred"]
    rows = [
        [
            a.get("job"),
            _stored(a.get("user_id")),
            a.get("reason"),
            _id_list((a.get("details") or {}).get("memory_ids") or []),
        ]
        for a in groups[:DEFERRED_GROUPS]
    ]
    return rows, max(0, len(groups) - DEFERRED_GROUPS)


def _llm_rows(report: Report) -> Rows:
    return [[key.replace("_", " "), n] for key, n in (report.get("llm") or {}).items()]


# -- small text helpers ---------------------------------------------------------------------


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return printable(str(value))


def _stored(value: Any) -> Stored | None:
    return None if value is None else Stored(value)


def _counts_text(counts: Mapping[str, int] | None) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in (counts or {}).items() if n) or "—"


def _short_id(value: Any) -> str:
    text = _text(value)
    return text[:8] if _UUID.match(text) else text


def _preview(content: Any) -> str:
    if content is None:
        return "—"
    text = " ".join(str(content).split())
    return Stored(text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…")


def _details_text(details: Mapping[str, Any]) -> str:
    shown = [f"{k}={_clipped(_short_id(v))}" for k, v in details.items() if k not in _LIST_KEYS]
    return Stored(", ".join(shown)) if shown else "—"


def _clipped(text: str) -> str:
    """A detail value cut to the preview length (a merged record holds a whole memory text)."""
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _id_list(ids: Sequence[Any]) -> str:
    return f"{len(ids)}: " + _limited([_short_id(i) for i in ids], 8)


def _limited(items: Iterable[Any], limit: int) -> str:
    items = [str(i) for i in items]
    more = f" … and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _more_note(more: int, what: str) -> str:
    return f"… and {more:,} more {what}" if more else ""


# -- Markdown -------------------------------------------------------------------------------


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
        text = _MD_PUNCTUATION.sub(r"\\\1", text)
        text = _MD_AUTOLINK.sub(lambda m: f"{m.group()[:-1]}\\{m.group()[-1]}", text)
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _pending(report: Report) -> bool:
    """Whether batches of the run are still pending (reports without the field: assume so)."""
    return report.get("pending_batches", 1) != 0


def _too_old(report: Report) -> str:
    """Why `apply` would refuse the report's plan for its age, or "" (reports built without
    a limit, or a plan young enough)."""
    age = report.get("plan_age") or {}
    if not age or age["hours"] <= age["limit_hours"]:
        return ""
    return (
        f"Its plan is {age['hours']:.0f} hours old, older than run.max_plan_age_hours = "
        f"{age['limit_hours']:g}: `memory-gc apply` refuses it."
    )


def _ahead(report: Report) -> str | None:
    """The report's `now` when `apply` would refuse it as ahead of the clock (cli.not_ahead)."""
    try:
        now = datetime.fromisoformat(str(report.get("now")))
    except ValueError:
        return None
    return now.isoformat() if now.tzinfo is not None and ahead_of_clock(now) else None


def banner(report: Report) -> tuple[str, str, str]:
    """(kind, headline, what to do next) for the top of a rendered report. The command it
    suggests is one that works for this run's mode and status."""
    run_id, status = _text(report.get("run_id")), report.get("status")
    plan, applied_by = report.get("plan_run_id"), report.get("applied_by")
    if _is_dry_run(report):
        nothing = "Dry run — nothing was changed."
        if applied_by:
            return "dry", nothing, f"Its plan was applied by run {applied_by}."
        if status == "rejected":
            return "dry", "Dry run — rejected.", "Its plan will never be applied."
        appliable = status == "completed" or (
            status == "failed" and report.get("failed_batches") and not _pending(report)
        )
        if appliable and (too_old := _too_old(report)):
            return "dry", nothing, f"{too_old} Make a new plan: `memory-gc run --dry-run`"
        if status == "failed" and report.get("failed_batches") and not _pending(report):
            return "dry", f"Dry run — {len(report['failed_batches'])} batch(es) failed.", (
                "The other users' plan can be applied (the failed batches' users are left as "
                f"they are): `memory-gc apply {run_id}`"
            )  # fmt: skip
        if status != "completed":
            return "dry", f"Dry run — {status}, not complete.", "Its plan cannot be applied."
        if report.get("trigger") == "demo":  # its own database: `apply` would not find it
            return (
                "dry",
                nothing,
                "To apply it in the demo's database, run `memory-gc demo --apply`",
            )
        if (ahead := _ahead(report)) is not None:
            return "dry", nothing, (
                f"Its plan is for {ahead}, more than a day ahead of this clock: `memory-gc apply` "
                "refuses it until a day before then. To act at that date, plan again then "
                "(`memory-gc run --dry-run`)."
            )  # fmt: skip
        return "dry", nothing, f"To apply exactly this plan, run `memory-gc apply {run_id}`"
    if _is_restore(report):
        return "applied", "Restore run.", "It put back what is listed; it cannot itself be undone."
    if report.get("trigger") == "erasure":
        if status == "completed":
            return "applied", "Erasure run.", "What it erased is never undone."
        pending = (
            "What it erased stays erased; the request stays pending and the next run finishes it."
        )
        return "incomplete", f"Erasure run — {status}.", pending
    if report.get("trigger") == "demo":  # its own database: `restore --run` would not find it
        return (
            "applied" if status == "completed" else "incomplete",
            "Applied." if status == "completed" else f"Not complete — {status}.",
            "This run is in the demo's own database, which the other commands do not reach; "
            "to seed it afresh, run `memory-gc demo`",
        )
    if status == "running":
        return "incomplete", "Running.", "A process is working this run; render it again later."
    if status != "completed":
        finish = f"; `memory-gc apply {plan}` finishes it" if plan and _pending(report) else ""
        if finish and (too_old := _too_old(report)):
            finish = f". {too_old} A new plan (`memory-gc run --dry-run`) does the rest"
        undo = (
            f"`memory-gc restore --run {run_id}` undoes it{finish}."
            if report.get("restorable", 1)
            else f"nothing of it is left to undo{finish}."
        )
        failed = report.get("failed_batches") or []
        users = sum(len(b.get("users", ())) for b in failed)
        given_up = (
            f" {len(failed)} batch(es) failed ({users} users left as they were, taken again by "
            f"the next run): {_text(report.get('error'))}."
            if failed
            else ""
        )
        return (
            "incomplete",
            f"Not complete — {status}.",
            f"What it applied so far is listed and stays; {undo}{given_up}",
        )
    if not report.get("restorable", 1):  # (reports without the field: assume there is)
        undone = report.get("restored")
        return (
            "applied",
            "Applied, then restored." if undone else "Applied.",
            "A restore undid what it could; nothing of it is left to undo."
            if undone
            else "Nothing it did can be undone (purges and erasures are not).",
        )
    return (
        "applied",
        "Applied.",
        f"To undo while the rows still exist: `memory-gc restore --run {run_id}`",
    )


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
