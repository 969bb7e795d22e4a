"""The review queue: decisions the worker leaves to a person (``gc_review_items``).

The contradiction job queues an item instead of acting when the would-be winner is less trusted
than the loser, the loser is pinned, or the LLM was unsure. ``list_reviews`` reads the queue;
``resolve_review`` closes one item with one of three decisions:

- ``keep=M``: M stays; every other member of the item becomes obsolete (superseded_by M);
- ``obsolete=M``: M becomes obsolete (superseded_by the other member, if there is one: refused
  when that member is no longer active, as ``keep`` of it is);
- ``dismiss=True``: nothing changes, and the contradiction job leaves that set alone from now on.

``keep`` and ``obsolete`` are refused (UsageError, nothing changed) for a member past its
``expires_at`` or ``valid_until``, and when the row kept changes while the change is applied.

``lift_dismissal`` takes a dismissal back — a person's ``--dismiss``, or one a restore recorded
(a model merge, verdict or importance score undone): the item stays, resolved, with decision
``lifted`` (the earlier decision and the instant kept in the resolution), and the jobs may
decide about its set again from the next run.

A change is made like any other worker change: a run (mode ``apply``, trigger ``review``, job
``review``) whose ``obsolete`` actions go through the executor and the audit in one
transaction with the item's closing, so ``memory-gc restore --run RUN_ID`` undoes it. An
obsoleted row older than the one kept gets reason ``review_superseded`` and its ``valid_until``
closed at the kept row's start (it was true until then); a newer one, or one written with it
(a ``no_newer`` item), gets ``review_rejected`` and keeps its window (it never held, so the read
rule never shows it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy.engine import Connection, Engine

from gc_worker import audit
from gc_worker.actions import Action, Kind
from gc_worker.config import check_clock
from gc_worker.db import transaction
from gc_worker.errors import NotFoundError, UsageError
from gc_worker.execute import execute
from gc_worker.queries import q
from jobs.contradiction_rules import close_at, timing

JOB = "review"
STATUSES = ("open", "resolved")


@dataclass(frozen=True)
class ReviewItem:
    id: int
    run_id: UUID | None
    user_id: str
    kind: str
    memory_ids: list[UUID]
    reason: str
    details: dict[str, Any]
    status: str
    resolution: dict[str, Any] | None
    created_at: datetime
    resolved_at: datetime | None


@dataclass
class Resolution:
    review_id: int
    decision: str
    run_id: UUID | None = None
    obsoleted: list[UUID] = field(default_factory=list)


def list_reviews(
    conn: Connection, *, user_id: str | None = None, status: str | None = "open", limit: int = 100
) -> list[ReviewItem]:
    """Review items, newest first; ``status=None`` lists every status."""
    if status is not None and status not in STATUSES:
        raise UsageError(f"review status {status!r} is not one of: {', '.join(STATUSES)}, all")
    params = {"user_id": user_id, "status": status, "limit": limit}
    return [ReviewItem(**row) for row in conn.execute(q("review_list"), params).mappings()]


def members(conn: Connection, memory_ids: list[UUID]) -> dict[UUID, Any]:
    """The memory rows an item names (rows purged since are missing)."""
    return {row.id: row for row in conn.execute(q("review_members"), {"ids": memory_ids})}


def resolve_review(
    engine: Engine,
    review_id: int,
    *,
    keep: UUID | None = None,
    obsolete: UUID | None = None,
    dismiss: bool = False,
    now: datetime | None = None,
) -> Resolution:
    """Close one open review item with a decision (see the module docstring)."""
    if sum((keep is not None, obsolete is not None, dismiss)) != 1:
        raise UsageError("resolve a review with exactly one of --keep, --obsolete or --dismiss")
    now = now or datetime.now(UTC)
    # it would stamp the obsoleted row: retention counts from it
    check_clock(now, f"the resolution's `now` ({now.isoformat()})")
    with transaction(engine) as conn:
        item = _open_item(conn, review_id)
        rows = members(conn, item["memory_ids"])
        if dismiss:
            return _close(conn, item, Resolution(review_id, "dismiss"), now)
        chosen = keep if keep is not None else obsolete
        if chosen not in item["memory_ids"]:
            raise UsageError(f"memory {chosen} is not part of review {review_id}")
        moved = sorted(str(m) for m, row in rows.items() if row.user_id != item["user_id"])
        if moved:  # a resolution would obsolete one user's memory in favour of another's
            raise UsageError(
                f"memory {', '.join(moved)} of review {review_id} now belongs to another user "
                f"than {item['user_id']!r}; close the item with --dismiss"
            )
        winner, losers = _sides(rows, item["memory_ids"], keep=keep, obsolete=obsolete, now=now)
        actions = [_obsolete(rows[loser], winner, review_id) for loser in losers]
        resolution = Resolution(review_id, "keep" if keep is not None else "obsolete")
        resolution.run_id = _apply(conn, item["user_id"], actions, now)
        resolution.obsoleted = list(losers)
        return _close(conn, item, resolution, now, memory_id=chosen)


def lift_dismissal(engine: Engine, review_id: int, *, now: datetime | None = None) -> ReviewItem:
    """Take back the dismissal ``review_id`` records; UsageError for an item that is not one."""
    now = now or datetime.now(UTC)
    check_clock(now, f"the lift's `now` ({now.isoformat()})")
    with transaction(engine) as conn:
        item = conn.execute(q("review_lock"), {"id": review_id}).mappings().first()
        if item is None:
            raise NotFoundError(f"no review item {review_id}; `memory-gc reviews list` shows them")
        decision = (item["resolution"] or {}).get("decision")
        if item["status"] == "open":
            raise UsageError(f"review {review_id} is open, not dismissed: resolve it instead")
        if decision != "dismiss":
            run_id = (item["resolution"] or {}).get("run_id")
            undo = f"; to undo its change: `memory-gc restore --run {run_id}`" if run_id else ""
            raise UsageError(
                f"review {review_id} was resolved with {decision or 'no decision'}, not "
                f"dismissed: there is no dismissal to lift{undo}"
            )
        row = conn.execute(q("review_lift"), {"id": review_id, "now": now}).mappings().one()
        return ReviewItem(**row)


def _open_item(conn: Connection, review_id: int) -> dict[str, Any]:
    item = conn.execute(q("review_lock"), {"id": review_id}).mappings().first()
    if item is None:
        raise NotFoundError(f"no review item {review_id}; `memory-gc reviews list` shows them")
    if item["status"] != "open":
        done = item["resolution"] or {}
        run_id = done.get("run_id")
        undo = f"; to undo it: `memory-gc restore --run {run_id}`" if run_id else ""
        raise UsageError(
            f"review {review_id} is already {item['status']} "
            f"({done.get('decision', 'no decision recorded')}){undo}"
        )
    return dict(item)


def _sides(
    rows: dict[UUID, Any],
    memory_ids: list[UUID],
    *,
    keep: UUID | None,
    obsolete: UUID | None,
    now: datetime,
) -> tuple[Any, list[UUID]]:
    """(the row that stays or None, ids to obsolete), refusing rows that cannot change."""
    if keep is not None:
        losers = [m for m in memory_ids if m != keep]
        winner = rows.get(keep)
        if winner is None or winner.status != "active":
            raise UsageError(f"memory {keep} to keep is no longer active; use --dismiss")
    else:
        losers = [obsolete]  # type: ignore[list-item]
        others = [m for m in memory_ids if m != obsolete]
        winner = rows.get(others[0]) if len(others) == 1 else None
        # M would be superseded by a row that no longer holds: its window closed at a dead
        # row's start, the slot left with no current value — the same refusal as --keep
        if len(others) == 1 and (winner is None or winner.status != "active"):
            raise UsageError(
                f"memory {others[0]} that would supersede {obsolete} is no longer active; "
                "use --dismiss"
            )
    for memory_id in losers:
        _check_changeable(rows.get(memory_id), memory_id)
    for row in [winner, *(rows[m] for m in losers)]:
        if row is not None:
            _check_current(row, now)
    return winner, losers


def _check_changeable(row: Any, memory_id: UUID) -> None:
    if row is None:
        raise UsageError(f"memory {memory_id} no longer exists; close the item with --dismiss")
    if row.status != "active":
        raise UsageError(
            f"memory {memory_id} is no longer active (status {row.status}); "
            "close the item with --dismiss"
        )
    if row.pinned:
        raise UsageError(f"memory {memory_id} is pinned; unpin it first, then resolve again")


def _check_current(row: Any, now: datetime) -> None:
    """Refuse a row past its TTL or validity (still ``active`` until ttl_expiry or
    contradiction run): the read rule no longer shows it, so it cannot stand for its slot, and
    obsoleting it would keep as history what its TTL deletes (the jobs leave it alone too)."""
    for column in ("expires_at", "valid_until"):
        end = getattr(row, column)
        if end is not None and end <= now:
            raise UsageError(
                f"memory {row.id} is no longer current (its {column} {end.isoformat()} has "
                "passed); close the item with --dismiss"
            )


def _obsolete(loser: Any, winner: Any, review_id: int) -> Action:
    # by time only: of two rows written together neither replaced the other (no_newer)
    superseded = winner is not None and timing(loser) < timing(winner)
    end = close_at(loser, winner) if superseded else None
    return Action(
        job=JOB,
        action=Kind.OBSOLETE,
        user_id=loser.user_id,
        reason="review_superseded" if superseded else "review_rejected",
        memory_id=loser.id,
        row_version=loser.row_version,
        details={
            "review_id": review_id,
            "superseded_by": str(winner.id) if winner is not None else None,
            "close_valid_until": end.isoformat() if end is not None else None,
            # the row kept, share-locked and checked at apply (gc_worker.execute): one retired
            # since it was read drifts the resolution instead of superseding the loser
            **({"depends_on": {str(winner.id): winner.row_version}} if winner is not None else {}),
        },
        preview=loser.preview,
    )


def _apply(conn: Connection, user_id: str, actions: list[Action], now: datetime) -> UUID:
    """A run of mode apply, trigger review: execute and audit the actions."""
    run_id = uuid4()
    conn.execute(
        q("insert_run"),
        {"id": run_id, "mode": "apply", "trigger": "review", "now": now, "users": [user_id],
         "jobs": [JOB], "settings": "{}", "plan_run_id": None},
    )  # fmt: skip
    outcome = execute(conn, actions, now=now, run_id=run_id)
    if outcome.drifted:
        raise UsageError("a memory of the review changed while resolving it; try again")
    audit.record_outcome(conn, run_id, 0, outcome)
    conn.execute(q("review_run_complete"), {"run_id": run_id})
    return run_id


def _close(
    conn: Connection,
    item: dict[str, Any],
    resolution: Resolution,
    now: datetime,
    memory_id: UUID | None = None,
) -> Resolution:
    value = {
        "decision": resolution.decision,
        "memory_id": str(memory_id) if memory_id is not None else None,
        "obsoleted": [str(m) for m in resolution.obsoleted],
        "run_id": str(resolution.run_id) if resolution.run_id is not None else None,
    }
    params = {"id": item["id"], "resolution": json.dumps(value), "now": now}
    conn.execute(q("review_close"), params)
    return resolution
