"""The facts a rendered report shows, the same in Markdown and HTML (gc_worker.render_markdown,
gc_worker.render_html): the header rows, totals per action, one row per job, the busiest users
(top TOP_USERS), reasons with counts, a sample of rows per job and action (SAMPLE_ROWS each),
the drifted changes and the deferred groups (first DEFERRED_GROUPS each) and the LLM usage —
as rows of values for a table, from the report dict alone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gc_worker.render_text import (
    Stored,
    _counts_text,
    _details_text,
    _id_list,
    _limited,
    _more_note,
    _preview,
    _short_id,
    _user,
    display_id,
    error_text,
)

Report = Mapping[str, Any]
Rows = list[list[Any]]

SAMPLE_ROWS = 10
TOP_USERS = 50
DEFERRED_GROUPS = 20
NOTHING_TO_DO = "Nothing to do — no memory needed a change."
NOTHING_RESTORED = "Nothing restored — {n:,} change(s) could not be undone (not restorable, below)."
ALL_DRIFTED = (
    "Nothing applied — {n:,} planned change(s) skipped: the application changed those rows "
    "since they were planned (drifted, below)."
)
DRIFTED_HEADERS = ["memory", "user", "job", "action", "reason", "content"]
SAMPLE_HEADERS = ["memory", "user", "reason", "content", "details"]


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
        ("Users", Stored(_limited(map(display_id, scope["users"]), 10)) if scope.get("users")
         else "all"),
        ("Jobs", ", ".join(scope.get("jobs") or []) or "—"),
        *([("Score pass", _score_pass(report["score_pass"]))] if report.get("score_pass") else []),
        *([("History", _pruned(report["history_pruned"]))] if report.get("history_pruned") else []),
        *([("Error", error_text(report["error"]))] if report.get("error") else []),
        *([("Failed batches", _failed(report["failed_batches"]))] if report.get("failed_batches")
          else []),
    ]  # fmt: skip


def _failed(batches: list[Mapping[str, Any]]) -> Stored:
    """The failed batches and the users each left as they were (the JSON's failed_batches),
    e.g. "batch 1 (1 users: user-1)"."""
    shown = [
        f"batch {b.get('batch_no')} ({len(b.get('users') or ())} users: "
        f"{_limited(map(display_id, b.get('users') or ()), 10)})"
        for b in batches[:DEFERRED_GROUPS]
    ]
    more = _more_note(max(0, len(batches) - DEFERRED_GROUPS), "batches")
    return Stored("; ".join([*shown, *([more] if more else [])]))


def _pruned(pruned: Mapping[str, Any]) -> str:
    """What `prune-history` left of the run (gc_worker.report ``history_pruned``)."""
    listed = pruned.get("actions_listed") or 0
    if pruned.get("actions_recorded") is None:
        return (
            f"pruned: only the {listed:,} audit row(s) still needed are left; the totals, job "
            "counters, per-user counts and LLM usage shown cover those only, not the whole run"
        )
    return (
        f"pruned {pruned.get('pruned_at') or ''}: {listed:,} of {pruned['actions_recorded']:,} "
        "actions still listed (the rest of the audit is gone); totals, job counters and LLM "
        "usage are the whole run's, as recorded; per-user counts, reasons, samples and drifted "
        "rows cover the listed ones only"
    ).replace("pruned :", "pruned:")


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
        [_user(user), s.get("actions", 0), _counts_text(s.get("by_action"))] for user, s in ranked
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
        _user(action.get("user_id")),
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
            _user(a.get("user_id")),
            a.get("job"),
            _drifted_action(a),
            _drifted_reason(a),
            _preview((a.get("details") or {}).get("content")),
        ]
        for a in drifted[:DEFERRED_GROUPS]
    ]
    return rows, max(0, drifted_total(report) - DEFERRED_GROUPS)


def drifted_total(report: Report) -> int:
    """How many rows drifted: ``drifted_count`` where ``drifted`` is a sample (a report built
    without actions, gc_worker.report), else the listed ones."""
    return report.get("drifted_count", len(report.get("drifted") or []))


def _drifted_action(action: dict[str, Any]) -> Any:
    """The action of a drifted row; a restore's names the change it kept."""
    undid = (action.get("details") or {}).get("undid")
    return f"{action.get('action')} of {undid}" if undid else action.get("action")


def _drifted_reason(action: dict[str, Any]) -> Any:
    """The reason; a restore's ``later_run`` names the run to restore first."""
    later = (action.get("details") or {}).get("later_run")
    reason = action.get("reason")
    return f"{reason}: restore run {later} first" if later else reason


def _empty_totals(report: Report) -> str:
    """What the totals say when nothing was applied (or planned)."""
    drifted = drifted_total(report)
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
            _user(a.get("user_id")),
            a.get("reason"),
            _id_list((a.get("details") or {}).get("memory_ids") or []),
        ]
        for a in groups[:DEFERRED_GROUPS]
    ]
    return rows, max(0, len(groups) - DEFERRED_GROUPS)


def _llm_rows(report: Report) -> Rows:
    return [[key.replace("_", " "), n] for key, n in (report.get("llm") or {}).items()]
