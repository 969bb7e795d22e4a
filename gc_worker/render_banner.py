"""The banner at the top of a rendered report: what kind of run it is, its headline, and what to
do next — a command that works for the run's mode and status (`memory-gc apply RUN` for a plan
that can be applied, `restore --run RUN` for what can be undone), or why there is none.
"""

from __future__ import annotations

from datetime import datetime

from gc_worker.config import ahead_of_clock
from gc_worker.render_facts import Report, _is_dry_run, _is_restore, _total_actions
from gc_worker.render_text import _text
from gc_worker.run_record import CANCELLED

Banner = tuple[str, str, str]  # (kind: "dry" | "applied" | "incomplete", headline, next)


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


def banner(report: Report) -> Banner:
    """(kind, headline, what to do next) for the top of a rendered report. The command it
    suggests is one that works for this run's mode and status."""
    status = report.get("status")
    if _is_dry_run(report):
        return _dry_run_banner(report)
    if _is_restore(report):
        return "applied", "Restore run.", "It put back what is listed; it cannot itself be undone."
    if report.get("trigger") == "erasure":
        return _erasure_banner(report)
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
        return _incomplete_banner(report)
    return _applied_banner(report)


def _dry_run_banner(report: Report) -> Banner:
    """A plan's: who applied it, or whether it can be applied (and how), or why not."""
    run_id, status = _text(report.get("run_id")), report.get("status")
    nothing = "Dry run — nothing was changed."
    if report.get("applied_by"):
        return "dry", nothing, f"Its plan was applied by run {report.get('applied_by')}."
    if status == "rejected":
        return "dry", "Dry run — rejected.", "Its plan will never be applied."
    if report.get("error") == CANCELLED:  # `apply` refuses it, even with nothing pending
        return "dry", "Dry run — cancelled.", "An operator cancelled it: its plan is never applied."
    only_batches_failed = (
        status == "failed" and bool(report.get("failed_batches")) and not _pending(report)
    )
    if (status == "completed" or only_batches_failed) and (too_old := _too_old(report)):
        return "dry", nothing, f"{too_old} Make a new plan: `memory-gc run --dry-run`"
    if report.get("held") and (status == "completed" or only_batches_failed):
        # schedule.hold_above_share: the daemon leaves it to a person (its text has the commands)
        return "dry", "Dry run — held for a person.", (
            f"The daemon does not apply it: it {_text(report['held'])}"
        )  # fmt: skip
    if only_batches_failed:
        return "dry", f"Dry run — {len(report['failed_batches'])} batch(es) failed.", (
            "The other users' plan can be applied (the failed batches' users are left as "
            f"they are): `memory-gc apply {run_id}`"
        )  # fmt: skip
    if status != "completed":
        return "dry", f"Dry run — {status}, not complete.", "Its plan cannot be applied."
    if report.get("trigger") == "demo":  # its own database: `apply` would not find it
        return "dry", nothing, "To apply it in the demo's database, run `memory-gc demo --apply`"
    if (ahead := _ahead(report)) is not None:
        return "dry", nothing, (
            f"Its plan is for {ahead}, more than a day ahead of this clock: `memory-gc apply` "
            "refuses it until a day before then. To act at that date, plan again then "
            "(`memory-gc run --dry-run`)."
        )  # fmt: skip
    return "dry", nothing, f"To apply exactly this plan, run `memory-gc apply {run_id}`"


def _erasure_banner(report: Report) -> Banner:
    status = report.get("status")
    if status == "completed":
        return "applied", "Erasure run.", "What it erased is never undone."
    pending = "What it erased stays erased; the request stays pending and the next run finishes it."
    return "incomplete", f"Erasure run — {status}.", pending


def _incomplete_banner(report: Report) -> Banner:
    """A run that stopped or failed: what it applied stays; how to undo it (a stopped one, left
    running: cancelled first, or `restore` refuses it), how to finish it (an apply of a plan:
    `apply PLAN`, unless the plan is too old by now), which batches failed (their errors are
    store text, shown escaped in the header, never here as banner text)."""
    run_id, status = _text(report.get("run_id")), report.get("status")
    plan = report.get("plan_run_id")
    finish = f"; `memory-gc apply {plan}` finishes it" if plan and _pending(report) else ""
    if finish and (too_old := _too_old(report)):
        finish = f". {too_old} A new plan (`memory-gc run --dry-run`) does the rest"
    restore = f"`memory-gc restore --run {run_id}`"
    if status == "stopped":
        restore = f"`memory-gc cancel {run_id}`, then {restore},"
    undo = (
        f"{restore} undoes it{finish}."
        if report.get("restorable", 1)
        else f"nothing of it is left to undo{finish}."
    )
    failed = report.get("failed_batches") or []
    users = sum(len(b.get("users", ())) for b in failed)
    given_up = (
        f" {len(failed)} batch(es) failed ({users} users left as they were, taken again by "
        "the next run): the error is shown below."
        if failed
        else ""
    )
    return (
        "incomplete",
        f"Not complete — {status}.",
        f"What it applied so far is listed and stays; {undo}{given_up}",
    )


def _applied_banner(report: Report) -> Banner:
    """A completed run: how to undo it, or that nothing of it can be (any more)."""
    run_id = _text(report.get("run_id"))
    if not report.get("restorable", 1):  # (reports without the field: assume there is)
        undone = report.get("restored")
        return (
            "applied",
            "Applied, then restored." if undone else "Applied.",
            "A restore undid what it could; nothing of it is left to undo."
            if undone
            else _nothing_to_undo(report),
        )
    return (
        "applied",
        "Applied.",
        f"To undo while the rows still exist: `memory-gc restore --run {run_id}`",
    )


def _nothing_to_undo(report: Report) -> str:
    """Why a completed run has nothing left to undo: it changed nothing, its history was
    pruned (the audit a restore reads is gone), or what it did is never undone."""
    if not _total_actions(report):  # nothing to do, or every row drifted
        return "It changed nothing, so there is nothing to undo."
    if report.get("history_pruned"):
        return (
            "Its history was pruned (prune-history): the audit a restore would read is gone, "
            "so nothing of it is left to undo."
        )
    return "Nothing it did can be undone (purges and erasures are not)."
