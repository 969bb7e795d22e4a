"""Build a run's report (DESIGN.md section 5, ``report_version`` 1) from what was recorded.

The report is derived from ``gc_runs``, ``gc_run_batches`` and ``gc_actions`` only, so it can
be rendered again at any time (``memory-gc report RUN_ID``) and says exactly what was stored.
Rendering to Markdown / HTML lives in gc_worker.render.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection

from gc_worker import render
from gc_worker.queries import q
from gc_worker.render_facts import DEFERRED_GROUPS, drifted_total
from gc_worker.run_record import load_run

REPORT_VERSION = 1
STREAM = {"stream_results": True, "yield_per": 2000}
LISTED = ("planned", "applied", "restored")
LLM_KEYS = ("calls", "input_tokens", "output_tokens", "cache_hits")
DRIFTED_SAMPLE = DEFERRED_GROUPS  # drifted rows kept without actions: as many as are rendered


def build_report(
    conn: Connection, run_id: UUID, *, actions: bool = True,
    plan_age_limit_hours: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The run's report; ``actions=False`` leaves the ``actions`` list empty (counts stay exact)
    and ``drifted`` the first DRIFTED_SAMPLE drifted rows, adding ``drifted_count`` (all of them),
    for callers that only need the totals, so memory does not grow with the number of actions.
    ``plan_age_limit_hours`` (the caller's run.max_plan_age_hours) adds a plan's age against it
    (``plan_age``), so that the report does not suggest an `apply` that would be refused."""
    run = load_run(conn, run_id)
    job_rows = _job_counters(conn, run)
    listed: list[dict[str, Any]] = []
    drifted: list[dict[str, Any]] = []
    users: dict[str, Counter] = defaultdict(Counter)
    by_action: Counter[str] = Counter()
    # streamed (server-side cursor): a run with 100,000s of actions is never held twice
    rows = conn.execute(q("run_actions"), {"run_id": run_id}, execution_options=STREAM)
    restorable = restored = drifted_count = 0
    for row in rows:
        if row.outcome == "drifted":
            drifted_count += 1
            if actions or len(drifted) < DRIFTED_SAMPLE:
                drifted.append(_action_entry(row))
            if run["mode"] == "restore":  # no batch stats: its kept changes count here
                _count_kept(row, job_rows)
            continue
        restorable += _restorable(row)
        restored += row.outcome == "restored"
        _count(row, job_rows)
        users[row.user_id][row.action] += 1
        by_action[row.action] += 1
        if actions:
            listed.append(_action_entry(row))
    report = {
        "report_version": REPORT_VERSION,
        "run_id": str(run["id"]),
        # report_version 1 knows two modes: a restore run applies changes ("kind" says which)
        "mode": "apply" if run["mode"] == "restore" else run["mode"],
        "kind": "restore" if run["mode"] == "restore" else "gc",
        "trigger": run["trigger"],
        "status": _shown_status(conn, run),
        "error": run["error"],
        "failed_batches": _failed_batches(conn, run),
        "pending_batches": conn.execute(q("pending_batch_count"), {"run_id": run["id"]}).scalar(),
        "now": _iso(run["now"]),
        "started_at": _iso(run["started_at"]),
        "finished_at": _iso(run["finished_at"]),
        "plan_run_id": _str(run["plan_run_id"]),
        "applied_by": _str(run["applied_by"]),
        "held": run.get("held"),  # why the daemon leaves this plan to a person (plan_then_apply)
        "scope": {"users": run["users"], "jobs": list(run["jobs"]) or sorted(job_rows)},
        "totals": {"actions": by_action.total(), "by_action": dict(sorted(by_action.items()))},
        "jobs": job_rows,
        "per_user": _per_user(users),
        "actions": listed,
        "drifted": drifted,
        "llm": llm_totals(conn, run["id"]),
        # a run over every user refreshes decay scores after its batches (gc_worker.score_pass):
        # due (not finished yet), done, or stopped early (the rest is the next run's)
        "score_pass": (
            {"state": run["score_pass"], "refreshed": run["scores_refreshed"] or 0}
            if run.get("score_pass")
            else None
        ),
        "plan_age": _plan_age(conn, run, plan_age_limit_hours),
        # what `restore --run` would still undo, and what a restore already undid
        "restorable": restorable,
        "restored": restored,
        "history_pruned": None,
    }
    if not actions:  # a sample in "drifted": the count (the full report's JSON shape is kept)
        report["drifted_count"] = drifted_count
    return _pruned(conn, run, report)


FIGURES = ("totals", "jobs", "llm", "failed_batches")


def recorded_figures(conn: Connection, run_id: UUID) -> dict[str, Any]:
    """What gc_worker.history keeps of a run before pruning it: the figures of its report that
    its batches and audit rows carry (totals, job counters, LLM usage, failed batches, drifted
    count)."""
    full = build_report(conn, run_id, actions=False)
    figures = {**{key: full[key] for key in FIGURES}, "drifted": drifted_total(full)}
    # a failed batch's error may name a memory: kept here, no erasure's scrub would reach it
    # (the run's own error stays in gc_runs.error, which the scrub does reach)
    figures["failed_batches"] = [{**b, "error": None} for b in figures["failed_batches"]]
    return figures


def _pruned(conn: Connection, run: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """A run `prune-history` took rows of says so (``history_pruned``): its figures as recorded
    before the prune, and how many of its actions are still listed; one pruned by a version
    that recorded nothing (no batch rows left, audit rows left) says its figures are partial."""
    listed = report["totals"]["actions"]
    recorded = run.get("pruned_figures")
    if recorded:
        report.update({key: recorded[key] for key in FIGURES if key in recorded})
        if not run["jobs"]:  # a restore run's scope: the jobs its (recorded) actions were of
            report["scope"]["jobs"] = sorted(report["jobs"])
        report["history_pruned"] = {
            "pruned_at": recorded.get("pruned_at"),
            "actions_recorded": report["totals"]["actions"],
            "actions_listed": listed,
        }
    elif (
        run["mode"] != "restore"
        and run["status"] != "running"
        and (listed or report["drifted"])
        and not conn.execute(q("run_batch_count"), {"run_id": run["id"]}).scalar()
    ):
        report["history_pruned"] = {
            "pruned_at": None, "actions_recorded": None, "actions_listed": listed
        }  # fmt: skip
    return report


# what `restore --run` undoes (sql/restore.sql restorable_actions): never an erasure
RESTORABLE_ACTIONS = frozenset({"soft_delete", "obsolete", "merge", "create_merged",
                                "set_importance"})  # fmt: skip


def _restorable(row: Any) -> bool:
    return (
        row.outcome == "applied"
        and row.action in RESTORABLE_ACTIONS
        and not str(row.reason).startswith("erasure")
    )


def _plan_age(
    conn: Connection, run: dict[str, Any], limit_hours: float | None
) -> dict[str, float] | None:
    """The age (server clock) of the plan `apply` would be given — a finished, unapplied dry
    run, or the plan of an apply that did not complete — and the limit `apply` holds it to."""
    if limit_hours is None:
        return None
    if run["mode"] == "dry_run" and run["finished_at"] is not None and not run["applied_by"]:
        plan = run["id"]
    elif run["mode"] == "apply" and run["plan_run_id"] and run["status"] != "completed":
        plan = run["plan_run_id"]
    else:
        return None
    age = conn.execute(q("plan_age_hours"), {"run_id": plan}).scalar()
    if age is None:
        return None
    return {"hours": round(float(age), 2), "limit_hours": limit_hours}


def _failed_batches(conn: Connection, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Batches given up (their users were left as they were; the next run takes them)."""
    rows = conn.execute(q("run_failed_batches"), {"run_id": run["id"]})
    return [{"batch_no": r.batch_no, "users": list(r.users), "error": r.error} for r in rows]


def _shown_status(conn: Connection, run: dict[str, Any]) -> str:
    """The status `memory-gc runs` shows: a 'running' run nobody works was stopped."""
    shown = conn.execute(q("recent_runs"), {"run_id": run["id"], "limit": 1}).first()
    return shown.status if shown is not None else run["status"]


def _job_row() -> dict[str, Any]:
    """A job's counters as DESIGN.md section 5 lists them, and this worker's extras."""
    return {"actions": 0, "by_action": {}, "skipped": 0, "errors": 0, "llm_calls": 0,
            "refreshed": 0, "drifted": 0}  # fmt: skip


def _job_counters(conn: Connection, run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = {job: _job_row() for job in run["jobs"]}
    for (stats,) in conn.execute(q("run_batch_stats"), {"run_id": run["id"]}):
        for job, counters in stats.items():
            if job.startswith("_"):
                continue
            row = rows.setdefault(job, _job_row())
            for key, value in counters.items():
                row[key] = row.get(key, 0) + value
    if run.get("scores_refreshed") and "decay" in rows:  # its score pass (gc_worker.score_pass)
        rows["decay"]["refreshed"] = rows["decay"].get("refreshed", 0) + run["scores_refreshed"]
    for row in rows.values():
        row["skipped"] = row.get("skipped", 0) + row.get("drifted", 0)
    return rows


def _count(action: Any, job_rows: dict[str, dict[str, Any]]) -> None:
    row = job_rows.setdefault(action.job, _job_row())
    row["actions"] += 1
    row["by_action"][action.action] = row["by_action"].get(action.action, 0) + 1


def _count_kept(action: Any, job_rows: dict[str, dict[str, Any]]) -> None:
    """A change a restore kept (the reason says why): skipped, as an apply's drifted row is."""
    row = job_rows.setdefault(action.job, _job_row())
    row["drifted"] += 1
    row["skipped"] += 1


def _action_entry(row: Any) -> dict[str, Any]:
    details = dict(row.details)
    if row.content_preview is not None:
        details["content"] = row.content_preview
    return {  # repeated names are interned: one string object per job / action / user / reason
        "job": sys.intern(row.job),
        "action": sys.intern(row.action),
        "memory_id": _str(row.memory_id),
        "user_id": sys.intern(row.user_id),
        "reason": sys.intern(row.reason),
        "details": details,
    }


def _per_user(users: dict[str, Counter]) -> dict[str, dict[str, Any]]:
    return {
        user: {"actions": sum(c.values()), "by_action": dict(sorted(c.items()))}
        for user, c in sorted(users.items())
    }


def llm_totals(conn: Connection, run_id: UUID) -> dict[str, int]:
    """What the run's batches spent on the model: what they applied, and what attempts that
    wrote nothing (a stop, a failure, a batch another worker finished) paid for all the same."""
    totals = Counter({key: 0 for key in LLM_KEYS})
    for applied, unapplied in conn.execute(q("run_llm_usage"), {"run_id": run_id}):
        for usage in [applied or {}, *(unapplied or [])]:
            totals.update(usage)
    return dict(totals)


def write_report(report: dict[str, Any], path: Path, fmt: str | None = None) -> Path:
    """Render ``report`` to ``path`` in ``fmt`` (default: from the path's suffix)."""
    fmt = fmt or render.format_for_path(path)
    write_whole(path, render.render(report, fmt))
    return path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a full disk, a quota): into a temporary
    file beside it, then renamed over it; a report already there stays until then. The new
    file keeps the old one's permissions, or gets the usual ones (0666 less the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, stat.S_IMODE(path.stat().st_mode) if path.exists() else _file_mode())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _file_mode() -> int:
    umask = os.umask(0o022)  # read it (the only way), then put it back
    os.umask(umask)
    return 0o666 & ~umask


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
