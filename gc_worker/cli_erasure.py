"""Subcommands for "forget me": ``forget-user``, ``forget``, ``verify-erasure`` (docs/erasure.md).

Exit codes: 0 done, 2 unknown user / memory / request (nothing changed), 1 a purge-now that
could not finish (the request stays pending for the next run) or residues found.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from gc_worker.cli import Context, not_ahead, parse_now, parse_uuid, user_id_arg
from gc_worker.render_text import printable, printable_id


def register(sub: Any) -> None:
    """Add this module's subcommands to the parser."""
    user = sub.add_parser(
        "forget-user", help="erase every memory of a user", description=cmd_forget_user.__doc__
    )
    user.add_argument("user_id", type=user_id_arg)
    _common(user, cmd_forget_user)
    memory = sub.add_parser(
        "forget", help="erase one memory (with what it was made from and what was derived from it)",
        description=cmd_forget.__doc__,
    )  # fmt: skip
    memory.add_argument("memory_id")
    _common(memory, cmd_forget)
    check = sub.add_parser(
        "verify-erasure", help="prove an erasure left nothing behind",
        description=cmd_verify.__doc__,
    )  # fmt: skip
    target = check.add_mutually_exclusive_group(required=True)
    target.add_argument("user_id", nargs="?", type=user_id_arg)
    target.add_argument("--memory", dest="memory_id", metavar="ID")
    check.add_argument(
        "--all-tables", action="store_true", help="scan every table of the schema, not only gc_*"
    )
    check.add_argument("--now", help="the instant recorded as verified_at (ISO 8601)")
    check.set_defaults(handler=cmd_verify)


def _common(parser: argparse.ArgumentParser, handler: Any) -> None:
    parser.add_argument(
        "--purge-now", action="store_true",
        help="erase, physically delete and scrub at once instead of on the next run",
    )  # fmt: skip
    parser.add_argument("--now", help="fix the clock (ISO 8601 with timezone)")
    parser.set_defaults(handler=handler)


def cmd_forget_user(args: argparse.Namespace, ctx: Context) -> int:
    """File a request to erase every memory of USER_ID (the next run carries it out)."""
    return _forget(ctx, args, user_id=args.user_id)


def cmd_forget(args: argparse.Namespace, ctx: Context) -> int:
    """File a request to erase one memory, the records it was made from (a merged record, a
    summary) and every record derived from it."""
    return _forget(ctx, args, memory_id=parse_uuid(args.memory_id, "memory id"))


def _forget(ctx: Context, args: argparse.Namespace, **target: Any) -> int:
    from gc_worker import erasure

    now = parse_now(args.now)  # bad input is refused before connecting
    if args.purge_now:  # its run stamps the erasures of every pending request of the user
        not_ahead(now, f"--now {args.now!r}", "Leave --now out to erase at this machine's time.")
    engine = ctx.engine()
    request, run_id = erasure.forget(
        engine, ctx.settings, now=now, purge_now=args.purge_now, **target
    )
    # a user id from the store (`forget MEMORY_ID` files it for the memory's user) is shown,
    # never obeyed: no terminal escape, no line break (render_text.printable)
    user = printable_id(request.user_id)  # shortened if long; _verify_arg keeps it whole
    what = f"user {user}" if request.kind == "user" else f"memory {request.memory_id}"
    if request.status == "completed" and request.created:  # no rows left: traces scrubbed
        gone = "no memories left" if request.kind == "user" else "no memories of its user left"
        print(
            f"erasure request {request.id} for {what}: {gone}; what the worker kept about "
            f"them was removed at once. `memory-gc verify-erasure {_verify_arg(request)}` "
            "checks for residues"
        )
        return 0
    if request.status == "completed":
        asked = printable(str(target.get("user_id") or target.get("memory_id")))
        print(
            f"{asked} was already erased by request {request.id} ({what}); nothing is left to "
            f"erase. `memory-gc verify-erasure {_verify_arg(request)}` checks for residues"
        )
        return 0
    state = "filed" if request.created else "already pending (same request)"
    print(f"erasure request {request.id} for {what}: {state}")
    if run_id is None:
        # the request's user (a memory request's is the memory's), and the erasure job alone:
        # a run of every job would retire the user's expired and unused rows too
        user_arg = shlex.quote(printable(request.user_id))
        print(f"the next run erases it; `memory-gc run --user {user_arg} --job erasure` does it "
              "now, --purge-now at once")  # fmt: skip
        return 0
    with engine.connect() as conn:
        done = erasure.get_request(conn, request.id)
    if done["status"] != "completed":
        print(f"run {run_id} could not erase everything (rows changed meanwhile); "
              "the request stays pending for the next run")  # fmt: skip
        return 1
    result = done["result"]
    print(f"run {run_id}: erased {result.get('erased', 0)}, purged {result.get('purged', 0)}, "
          f"reactivated {result.get('reactivated', 0)}; "
          f"`memory-gc verify-erasure {_verify_arg(request)}` checks for residues")  # fmt: skip
    return 0


def _verify_arg(request: Any) -> str:
    return printable(request.user_id) if request.kind == "user" else f"--memory {request.memory_id}"


def cmd_verify(args: argparse.Namespace, ctx: Context) -> int:
    """Scan the store and every worker table for the erased ids and content."""
    from gc_worker.verify_erasure import verify

    memory_id = parse_uuid(args.memory_id, "memory id") if args.memory_id else None
    now = parse_now(args.now)  # bad input is refused before connecting
    not_ahead(now, f"--now {args.now!r}", "Leave --now out to record this machine's time.",
              why="it would be recorded as verified_at, an instant not reached yet")  # fmt: skip
    result = verify(
        ctx.engine(), now=now, user_id=args.user_id, memory_id=memory_id,
        all_tables=args.all_tables,
    )  # fmt: skip
    for residue in result.residues:  # (`--all-tables`: an application's table, column, id)
        print(f"residue: {printable(residue.describe())}")
    print(f"verify-erasure {printable(result.target)}: {len(result.residues)} residues "
          f"({result.tables} tables, {result.columns} columns scanned)")  # fmt: skip
    return 0 if result.clean else 1
