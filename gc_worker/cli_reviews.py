"""Subcommands: ``memory-gc reviews list`` and ``memory-gc reviews resolve`` (gc_worker.reviews).

    memory-gc reviews list [--user ID] [--status open|resolved|all] [--limit N] [--json]
    memory-gc reviews resolve ID (--keep MEMORY_ID | --obsolete MEMORY_ID | --dismiss) [--now T]
    memory-gc reviews lift ID [--now T]

Resolving prints the run that made the change; `memory-gc restore --run RUN_ID` undoes it.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from gc_worker import reviews
from gc_worker.cli import Context, not_ahead, parse_now, parse_uuid, positive_int, user_id_arg
from gc_worker.errors import UsageError
from gc_worker.render_text import printable, printable_id


def register(sub: Any) -> None:
    """Add this module's subcommands to the parser."""
    parser = sub.add_parser(
        "reviews",
        help="the review queue: conflicts the worker left to a person",
        description="List and resolve review items (conflicts the worker did not decide alone).",
    )
    commands = parser.add_subparsers(dest="reviews_command", required=True)
    listing = commands.add_parser("list", help="list review items, newest first")
    listing.add_argument("--user", metavar="ID", type=user_id_arg, help="only this user's items")
    listing.add_argument("--status", choices=("open", "resolved", "all"), default="open")
    listing.add_argument("--limit", type=positive_int, default=100)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=cmd_list)
    resolve = commands.add_parser("resolve", help="close one item with a decision")
    resolve.add_argument("review_id", metavar="ID")
    decision = resolve.add_mutually_exclusive_group(required=True)
    decision.add_argument("--keep", metavar="MEMORY_ID", help="keep this one, obsolete the rest")
    decision.add_argument("--obsolete", metavar="MEMORY_ID", help="obsolete this one")
    decision.add_argument("--dismiss", action="store_true", help="change nothing, stop asking")
    resolve.add_argument("--now", help="the instant recorded for the change (ISO 8601)")
    resolve.set_defaults(handler=cmd_resolve)
    lift = commands.add_parser(
        "lift", help="take back a dismissal: the jobs may decide about its set again"
    )
    lift.add_argument("review_id", metavar="ID")
    lift.add_argument("--now", help="the instant recorded for the lift (ISO 8601)")
    lift.set_defaults(handler=cmd_lift)


def cmd_list(args: argparse.Namespace, ctx: Context) -> int:
    status = None if args.status == "all" else args.status
    with ctx.engine().connect() as conn:
        items = reviews.list_reviews(conn, user_id=args.user, status=status, limit=args.limit)
        rows = reviews.members(conn, [m for item in items for m in item.memory_ids])
    if args.json:
        print(json.dumps([_as_json(item, rows) for item in items], indent=2))
        return 0
    if not items:
        print(f"no {args.status} review items" if status else "no review items")
    for item in items:
        print(_describe(item, rows))
    return 0


def cmd_resolve(args: argparse.Namespace, ctx: Context) -> int:
    review_id = _review_id(args.review_id)  # bad input is refused before connecting
    keep = parse_uuid(args.keep, "--keep memory id") if args.keep else None
    obsolete = parse_uuid(args.obsolete, "--obsolete memory id") if args.obsolete else None
    now = _stamp(args.now)
    result = reviews.resolve_review(
        ctx.engine(), review_id, keep=keep, obsolete=obsolete, dismiss=args.dismiss, now=now
    )
    if result.run_id is None:
        print(f"review {result.review_id} dismissed; nothing changed")
    else:
        obsoleted = ", ".join(str(m) for m in result.obsoleted)
        print(f"review {result.review_id} resolved ({result.decision}): obsolete {obsoleted}; "
              f"run {result.run_id} (undo: memory-gc restore --run {result.run_id})")  # fmt: skip
    return 0


def cmd_lift(args: argparse.Namespace, ctx: Context) -> int:
    review_id = _review_id(args.review_id)  # bad input is refused before connecting
    now = _stamp(args.now)
    item = reviews.lift_dismissal(ctx.engine(), review_id, now=now)
    members = ", ".join(str(m) for m in item.memory_ids)
    user = printable_id(item.user_id)
    print(f"review {item.id} ({printable(item.kind)}, user {user}): dismissal lifted; "
          f"the next run may decide about {members} again")  # fmt: skip
    return 0


def _stamp(value: str | None) -> datetime | None:
    """--now of a decision: it stamps the change and judges the members' validity at that
    instant, so it may not run ahead of this machine's clock (as `run`'s may not)."""
    if value is None:
        return None
    now = parse_now(value)
    not_ahead(now, f"--now {value!r}", "Leave --now out to record this machine's time.",
              why="the decision would be stamped, and validity judged, in the future")  # fmt: skip
    return now


def _review_id(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(
            f"review id {value!r} is not a number; see `memory-gc reviews list`"
        ) from None


def _describe(item: reviews.ReviewItem, rows: dict[Any, Any]) -> str:
    """The item for a terminal: a store text can neither add lines (a forged member id an
    operator might pass to --keep) nor send control or bidi characters (render_text.printable)."""
    head = (
        f"#{item.id}  {item.status}  user={printable_id(item.user_id)}  {printable(item.kind)}  "
        f"reason={printable(item.reason)}  {item.created_at:%Y-%m-%d %H:%M}"
    )
    if item.resolution:
        head += f"  resolution={printable(str(item.resolution.get('decision')))}"
    lines = [head]
    for memory_id in item.memory_ids:
        state, text = _member(item, rows.get(memory_id))
        lines.append(f"    {memory_id}  [{state}]  {printable(text or '')}")
    return "\n".join(lines)


def _as_json(item: reviews.ReviewItem, rows: dict[Any, Any]) -> dict[str, Any]:
    return {
        "id": item.id,
        "user_id": item.user_id,
        "kind": item.kind,
        "reason": item.reason,
        "status": item.status,
        "created_at": item.created_at.isoformat(),
        "resolved_at": item.resolved_at.isoformat() if item.resolved_at else None,
        "details": item.details,
        "resolution": item.resolution,
        "memories": [
            dict(
                zip(("id", "status", "preview"), (str(m), *_member(item, rows.get(m))), strict=True)
            )
            for m in item.memory_ids
        ],
    }


def _member(item: reviews.ReviewItem, row: Any) -> tuple[str, str | None]:
    """(state, preview) of a member as listed: a row purged since, or one the application moved
    to another user (its text is that user's, not the item's user's), shows no text."""
    if row is None:
        return "purged", None
    if row.user_id != item.user_id:
        return "moved", None
    return row.status, row.preview
