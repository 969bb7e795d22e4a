"""Erasure requests and what an applied erasure does besides changing status (jobs.erasure).

- ``file_request``: record a forget-user / forget-memory request (validated: a user or memory
  neither the store nor the worker's tables know raises NotFoundError and changes nothing; a
  memory the application deleted is asked about for the user the worker's audit names; a
  pending request for the same target is returned as is, ``purge_now`` is only ever raised).
- ``finish_batch`` (the job's ``after_apply``, in the batch's transaction, never on a dry run):
  reactivate the rows erased derived records had absorbed, write tombstones (ids and content
  hashes), scrub the worker's tables of the erased memories, complete the requests whose targets
  are all erased.
- ``scrub`` (gc_worker.erasure_scrub): audit and plans (``gc_actions``: content preview gone,
  details cut to ids and codes, prior to status fields), cached LLM decisions and review items
  naming an erased memory.
- ``forget``: file a request and, with ``purge_now``, carry it out at once as one run (mode apply,
  trigger ``erasure``) whose single batch soft-deletes, purges and scrubs in one transaction.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.engine import Connection, Engine

from gc_worker.actions import ERASURE_REASONS, Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.config import Settings, check_clock
from gc_worker.db import transaction
from gc_worker.erasure_scrub import KEEP_DETAILS, audited_reach, scrub
from gc_worker.errors import NotFoundError, RunFailed, UsageError
from gc_worker.queries import q
from gc_worker.run_record import load_run

log = structlog.get_logger("memory_gc")

JOB = "erasure"

EMPTY_RESULT = {"erased": 0, "reactivated": 0, "purged": 0}


@dataclass(frozen=True)
class FiledRequest:
    id: UUID
    kind: str
    user_id: str
    memory_id: UUID | None
    status: str
    purge_now: bool
    requested_at: datetime
    created: bool  # False: a pending request for the same target already existed


# ---------------------------------------------------------------------------------------------
# Filing requests
# ---------------------------------------------------------------------------------------------


def file_request(
    conn: Connection,
    *,
    user_id: str | None = None,
    memory_id: UUID | None = None,
    purge_now: bool = False,
    requested_by: str = "cli",
) -> FiledRequest:
    """File a request to forget a user (``user_id``) or one memory (``memory_id``)."""
    if (user_id is None) == (memory_id is None):
        raise UsageError("an erasure request names either a user or a memory")
    # after the restores under way: one would bring back a row this request names
    conn.execute(q("erasure_wait_for_restores"))
    if memory_id is not None:
        owner = conn.execute(q("erasure_memory_owner"), {"memory_id": memory_id}).first()
        if owner is None:
            return _forget_gone_memory(conn, memory_id, purge_now, requested_by)
        kind, user_id = "memory", owner.user_id
    else:
        known = conn.execute(q("known_users"), {"users": [user_id]}).first()
        if known is None:
            # a batch of this user may still be planning (asking the model) from rows read
            # before the application deleted them: wait for it, so that what it writes is
            # scrubbed too, then look again
            conn.execute(q("lock_user_xact"), {"user_id": user_id})
            known = conn.execute(q("known_users"), {"users": [user_id]}).first()
        traces = {"user_id": user_id, "keep_details": list(KEEP_DETAILS)}
        if known is None and conn.execute(q("erasure_user_traces"), traces).scalar():
            return _forget_traces(conn, "user", user_id, None, purge_now, requested_by)
        if known is None:
            return _already_erased(
                conn, user_id, None,
                f"no memories for user {user_id!r}; check the id (nothing was changed)",
            )  # fmt: skip
        kind = "user"
    params = {"kind": kind, "user_id": user_id, "memory_id": memory_id,
              "purge_now": purge_now, "requested_by": requested_by}  # fmt: skip
    row = conn.execute(q("erasure_file_request"), params).mappings().one()
    return FiledRequest(**row)


def _forget_gone_memory(
    conn: Connection, memory_id: UUID, purge_now: bool, requested_by: str
) -> FiledRequest:
    """A memory no longer in the store. If a completed request erased it, asking again is
    answered with that request. If the application deleted it itself, the worker's audit may
    still hold its text, and a record the worker made from it may still be active. The audit
    names its user: the request is filed for that user and carried out like any other (the
    batch finds what was made from it in the audit). If that user has no memory rows left, no
    batch would visit them: the worker's tables are scrubbed of the memory and the request is
    completed here, at once. A memory the worker never saw raises NotFoundError."""
    user_id = conn.execute(q("erasure_audited_owner"), {"memory_id": memory_id}).scalar()
    done = conn.execute(q("erasure_completed_for"), {"user_id": None, "memory_id": memory_id})
    row = done.mappings().first()
    # a completed request answers only for the user the audit names: one the application
    # misfiled under another user completed without touching the owner's rows
    if row is not None and user_id in (None, row["user_id"]):
        # what a completion before the rows of a moved memory were scrubbed under every user
        # left (verify-erasure names it): asking again takes it out
        made = audited_reach(conn, [(memory_id, row["user_id"])])
        scrub(conn, [memory_id, *made], users=[row["user_id"]])
        return FiledRequest(**row, created=False)
    if user_id is None:
        raise NotFoundError(f"no memory with id {memory_id}; nothing was changed")
    conn.execute(q("lock_user_xact"), {"user_id": user_id})  # as for forget-user, below
    if conn.execute(q("known_users"), {"users": [user_id]}).first() is None:
        return _forget_traces(conn, "memory", user_id, memory_id, purge_now, requested_by)
    params = {"kind": "memory", "user_id": user_id, "memory_id": memory_id,
              "purge_now": purge_now, "requested_by": requested_by}  # fmt: skip
    return FiledRequest(**conn.execute(q("erasure_file_request"), params).mappings().one())


def _forget_traces(
    conn: Connection,
    kind: str,
    user_id: str,
    memory_id: UUID | None,
    purge_now: bool,
    requested_by: str,
) -> FiledRequest:
    """A user with no memory rows left (the application deleted them) whom the worker's tables
    still know (audit previews, plans, cached decisions, reviews): no run would ever visit them,
    so the request (for the user, or one of their memories) is filed, the tables scrubbed and
    the request completed here, at once."""
    params = {"kind": kind, "user_id": user_id, "memory_id": memory_id,
              "purge_now": purge_now, "requested_by": requested_by}  # fmt: skip
    filed = conn.execute(q("erasure_file_request"), params).mappings().one()
    done = _scrub_and_complete(conn, filed, now=datetime.now(UTC), run_id=None)
    return FiledRequest(**done, created=True)


def _scrub_and_complete(
    conn: Connection, request: Any, *, now: datetime, run_id: UUID | None
) -> dict[str, Any]:
    """Complete a pending request of a user with no memory rows: there is nothing to
    soft-delete, only what the worker's tables keep (about the user, or about the memory)."""
    if request["kind"] == "user":
        scrub(conn, [], users=[request["user_id"]], whole_users=[request["user_id"]])
    else:
        made = audited_reach(conn, [(request["memory_id"], request["user_id"])])
        scrub(conn, [request["memory_id"], *made], users=[request["user_id"]])
        # what it reached that another request erased before is its too (verify-erasure)
        link = {"id": request["id"], "user_id": request["user_id"],
                "ids": [request["memory_id"], *made]}  # fmt: skip
        conn.execute(q("erasure_link_tombstones"), link)
    params = {"id": request["id"], "now": now, "run_id": run_id,
              "empty_result": json.dumps(EMPTY_RESULT)}  # fmt: skip
    done = conn.execute(q("erasure_complete_at_once"), params).mappings().one()
    log.info("erasure.traces_scrubbed", user_id=request["user_id"], request_id=str(request["id"]))
    return dict(done)


def complete_rowless(engine: Engine, run: dict[str, Any]) -> int:
    """At the end of an applying run with the erasure job: complete the pending requests of
    users who have no memory rows (the application filed the request with an INSERT, or deleted
    the rows after filing it). No batch visits such a user, so without this they would stay
    pending for ever, and what the worker kept about the user with them. Each user waits for
    any batch still holding them (as ``forget-user`` does). A run no longer running (cancelled:
    nothing more of it is applied) leaves them pending for the next run. Returns how many were
    completed."""
    if run["mode"] != "apply" or JOB not in run["jobs"]:
        return 0
    with engine.connect() as conn:
        users = list(conn.execute(q("erasure_rowless_users"), {"users": run["users"]}).scalars())
    completed = 0
    for user_id in users:
        with transaction(engine) as conn:
            conn.execute(q("lock_user_xact"), {"user_id": user_id})
            # `cancel` waits for this process to leave the run: a cancel committed before this
            # check stops it, one after it returns once this user is done (as for a batch)
            if load_run(conn, run["id"])["status"] != "running":
                log.info("erasure.rowless_left_pending", run_id=str(run["id"]))
                break
            pending = conn.execute(q("erasure_rowless_requests"), {"user_id": user_id}).mappings()
            for request in pending.all():
                _scrub_and_complete(conn, request, now=run["now"], run_id=run["id"])
                completed += 1
    return completed


def _already_erased(
    conn: Connection, user_id: str | None, memory_id: UUID | None, not_found: str
) -> FiledRequest:
    """The completed request that already erased (and purged) a target no longer in the store:
    asking again is answered with it. NotFoundError(``not_found``) if there is none."""
    params = {"user_id": user_id, "memory_id": memory_id}
    row = conn.execute(q("erasure_completed_for"), params).mappings().first()
    if row is None:
        raise NotFoundError(not_found)
    return FiledRequest(**row, created=False)


def get_request(conn: Connection, request_id: UUID) -> dict[str, Any]:
    row = conn.execute(q("erasure_get_request"), {"id": request_id}).mappings().first()
    if row is None:
        raise NotFoundError(f"no erasure request with id {request_id}")
    return dict(row)


def forget(
    engine: Engine,
    settings: Settings,
    *,
    now: datetime,
    user_id: str | None = None,
    memory_id: UUID | None = None,
    purge_now: bool = False,
) -> tuple[FiledRequest, UUID | None]:
    """File the request; with ``purge_now`` also carry it out now. Returns (request, run id)."""
    from gc_worker import engine as gc_engine

    # before the request is filed: a refused command files nothing
    check_clock(now, f"the erasure's `now` ({now.isoformat()})")
    with transaction(engine) as conn:
        request = file_request(conn, user_id=user_id, memory_id=memory_id, purge_now=purge_now)
    if not purge_now or request.status == "completed":
        return request, None
    run = gc_engine.RunRequest(
        mode="apply", now=now, users=(request.user_id,), jobs=(JOB,), trigger="erasure"
    )
    return request, gc_engine.run_once(engine, settings, run)


# ---------------------------------------------------------------------------------------------
# After an applied batch
# ---------------------------------------------------------------------------------------------


def finish_batch(ctx: BatchContext, applied: Sequence[Action], *, run_id: UUID) -> list[UUID]:
    """Everything an applied erasure does besides statuses; returns the completed request ids."""
    mine = [a for a in applied if a.job == JOB]
    _reactivate(ctx.conn, [a for a in mine if a.action is Kind.RESTORE], now=ctx.now)
    _write_tombstones(ctx.conn, [a for a in mine if a.action is Kind.SOFT_DELETE])
    erased = {a.memory_id for a in applied if _erases(a)}
    completed = _complete(ctx, mine, run_id)
    asked = [(row.memory_id, row.user_id) for row in completed if row.memory_id is not None]
    erased |= {memory_id for memory_id, _ in asked} | set(audited_reach(ctx.conn, asked))
    forgotten = sorted({row.user_id for row in completed if row.kind == "user"})
    deletes = [a for a in mine if a.action is Kind.SOFT_DELETE]
    hashes = {a.details[key] for a in deletes for key in ("content_hash", "preview_hash")}
    scrub(
        ctx.conn, sorted(erased, key=str), users=ctx.users, whole_users=forgotten,
        hashes=sorted(hashes), hash_owners=sorted({a.user_id for a in deletes}),
    )  # fmt: skip
    if completed:
        log.info("erasure.requests_completed", requests=len(completed), erased=len(erased))
    return [row.id for row in completed]


def _erases(action: Action) -> bool:
    """Soft deletes by this job, and purges of erased rows by any job (hard_delete included)."""
    if action.memory_id is None:
        return False
    if action.job == JOB and action.action in (Kind.SOFT_DELETE, Kind.HARD_DELETE):
        return True
    return (
        action.action is Kind.HARD_DELETE and action.details.get("status_reason") in ERASURE_REASONS
    )


def _reactivate(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    ids = [a.memory_id for a in actions]
    touched = conn.execute(q("erasure_reactivate"), {"ids": ids, "now": now}).all()
    if len(touched) != len(ids):
        raise RunFailed(
            f"erasure_reactivate touched {len(touched)} rows where {len(ids)} were planned "
            "and locked; the batch was rolled back"
        )


def _write_tombstones(conn: Connection, deletes: list[Action]) -> None:
    if not deletes:
        return
    requests = [a.details.get("request_ids") or [None] for a in deletes]
    params = {
        "owners": [a.user_id for a in deletes],
        "ids": [a.memory_id for a in deletes],
        "hashes": [a.details["content_hash"] for a in deletes],
        "previews": [a.details["preview_hash"] for a in deletes],
        "requests": [ids[0] for ids in requests],
        "reasons": [a.reason for a in deletes],
        "request_lists": ["{" + ",".join(i for i in ids if i) + "}" for ids in requests],
    }
    conn.execute(q("erasure_insert_tombstones"), params)


def _complete(ctx: BatchContext, mine: list[Action], run_id: UUID) -> list[Any]:
    params = {
        "users": ctx.users,
        "now": ctx.now,
        "run_id": run_id,
        "erasure_reasons": list(ERASURE_REASONS),
        "results": json.dumps(request_results(mine)),
        "empty_result": json.dumps(EMPTY_RESULT),
    }
    return ctx.conn.execute(q("erasure_complete_requests"), params).all()


def request_results(actions: Sequence[Action]) -> dict[str, dict[str, int]]:
    """Per request id: how many rows this batch erased, reactivated and purged for it."""
    key = {Kind.SOFT_DELETE: "erased", Kind.RESTORE: "reactivated", Kind.HARD_DELETE: "purged"}
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for action in actions:
        for request_id in action.details.get("request_ids", ()):
            counts[request_id][key[action.action]] += 1
    return {rid: {**EMPTY_RESULT, **c} for rid, c in counts.items()}
