"""Subcommand ``prune-history``: the worker's own history past ``[history] retention_days``.

``memory-gc prune-history [--dry-run] [--now ISO]``
    deletes the audit, batches and model spend of runs that ended more than
    ``history.retention_days`` ago (gc_worker.history), keeping what is still needed, and
    prints what it deleted (``--dry-run``: what it would delete; nothing changes). ``--now``
    fixes the clock the retention counts back from (never more than a day ahead of this
    machine's). Refused (exit 2) while ``[history] enabled = false``.
"""

from __future__ import annotations

import argparse
from typing import Any

from gc_worker.cli import Context, not_ahead, parse_now
from gc_worker.errors import UsageError


def register(sub: Any) -> None:
    """Add this module's subcommand to the parser."""
    help_text = "delete the worker's own history older than [history] retention_days"
    parser = sub.add_parser("prune-history", help=help_text, description=help_text)
    parser.set_defaults(handler=cmd_prune_history)
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be deleted; delete nothing")  # fmt: skip
    parser.add_argument("--now", help="fix the clock (ISO 8601 with timezone)")


def cmd_prune_history(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker import history

    now = parse_now(args.now)
    not_ahead(now, f"--now {args.now!r}", "Leave --now out to count from this machine's clock.")
    if not ctx.settings.history.enabled:
        raise UsageError(
            "history pruning is off ([history] enabled = false); set it to true "
            "(or MEMORY_GC_HISTORY__ENABLED=true) to prune"
        )
    result = history.prune(ctx.engine(), ctx.settings, now=now, dry_run=args.dry_run)
    if result.skipped:
        print("another process is pruning the history now; nothing done")
        return 0
    verb = "would delete" if result.dry_run else "deleted"
    print(
        f"history of runs that ended before {result.cutoff.isoformat()}: {verb} "
        f"{result.runs} runs, {result.actions} audit rows, {result.batches} batch rows, "
        f"{result.spend} model spend rows; kept {result.kept_actions} audit rows still needed "
        f"(of {result.kept_runs} runs)"
    )
    if result.busy_runs:
        print(f"{len(result.busy_runs)} runs were locked by another transaction and are left "
              "for the next prune: " + ", ".join(str(r) for r in result.busy_runs))  # fmt: skip
    return 0
