"""Subcommand ``cancel``: stop a run for good, whoever works it (gc_worker.cancel).

``memory-gc cancel RUN_ID [--wait-seconds N]``
    closes a running run as failed ("cancelled by an operator") and waits (default 600 s) for
    the processes working it to finish the batch they are in; then nothing more of it is
    applied. Exit 0 once they have left, 1 if some still work when the wait is over (they stop
    after their batch), 2 for a run that is not running.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gc_worker.cli import Context, parse_uuid


def register(sub: Any) -> None:
    """Add this module's subcommand to the parser."""
    help_text = "stop a running run for good (whoever works it); then restore it if need be"
    parser = sub.add_parser("cancel", help=help_text, description=help_text)
    parser.set_defaults(handler=cmd_cancel)
    parser.add_argument("run_id")
    parser.add_argument(
        "--wait-seconds", type=_seconds, default=600.0, metavar="N",
        help="how long to wait for the processes working it (default 600)",
    )  # fmt: skip


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds <= 86_400:
        raise argparse.ArgumentTypeError(f"{value!r} is not between 0 and 86400 seconds")
    return seconds


def cmd_cancel(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker.cancel import cancel

    run_id = parse_uuid(args.run_id, "run id")  # bad input is refused before connecting
    result = cancel(
        ctx.engine(), run_id, wait_seconds=args.wait_seconds,
        on_wait=lambda: print("waiting for the processes working it to finish their batch…",
                              flush=True),
    )  # fmt: skip
    if result.mode == "apply":
        then = f"`memory-gc restore --run {run_id}` undoes what it applied"
        if result.plan_run_id is not None:
            then += f"; `memory-gc apply {result.plan_run_id}` would finish it instead"
    else:
        then = "it changed nothing (a dry run); its plan will not be applied"
    if not result.workers_done:
        print(f"run {run_id} cancelled, but processes still work it after {args.wait_seconds:g} "
              "s: they stop after their current batch (`memory-gc runs` shows it as failed); "
              f"restore once they have: {then}", file=sys.stderr)  # fmt: skip
        return 1
    print(f"run {run_id} cancelled; nothing more of it will be applied. {then}")
    return 0
