"""One batch of a run, start to end: claimed with its users (gc_worker.claims), planned — before
its transaction, with none open, when a job may ask the model (``asks_model``) — then applied
(or stored, in a dry run) and marked done in one short transaction, whose drift check covers
every edit made while the model answered (gc_worker.execute; for content-versioned actions a
read's access stamp is no edit). ``process_next_batch`` does the next pending batch
nobody else holds; gc_worker.run_workers walks a run with it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.engine import Connection, Engine

import jobs
from gc_worker import audit
from gc_worker.actions import Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.claims import WORKER_ID, claimed
from gc_worker.config import Settings
from gc_worker.db import describe_error, stored_error, transaction, translated_errors
from gc_worker.errors import DatabaseUnavailable, PlanAbandoned
from gc_worker.execute import execute
from gc_worker.queries import q

log = structlog.get_logger("memory_gc")

BATCH_LOCK_TIMEOUT_MS = 60_000  # the batch transaction's wait for its batch row
# The batches this thread committed, until the caller takes them (``take_committed``; the
# daemon does, in the on_batch callback this thread makes next): a daemon's own batches, which
# gc_run_batches.worker (the process's WORKER_ID) cannot tell apart from another daemon's of
# the same process.
_committed = threading.local()


def take_committed(run_id: UUID) -> list[int]:
    """The numbers of the batches of ``run_id`` this thread committed since the last call."""
    mine: list[tuple[UUID, int]] = getattr(_committed, "batches", [])
    _committed.batches = []
    return [batch_no for run, batch_no in mine if run == run_id]


def process_next_batch(
    engine: Engine, run: dict[str, Any], settings: Settings, llm: Any,
    should_stop: Callable[[], bool] | None = None,
) -> bool:  # fmt: skip
    with claimed(engine, run["id"], should_stop) as claim:
        if claim is None:
            return False
        batch_no = claim.batch.batch_no
        structlog.contextvars.bind_contextvars(
            batch_no=batch_no, user_id=claim.batch.users[0] if len(claim.batch.users) == 1 else None
        )
        llm_before = llm.usage(this_thread=True) if llm is not None else {}
        summary = None
        try:
            early: tuple[BatchContext, list[Action]] | None = None
            if asks_model(run, settings, llm):
                # the model can take minutes to answer: plan first, with no transaction open
                # (each read is its own; the claim and the users' locks are held by the claiming
                # session), then apply in a short transaction that checks every row's version.
                # Driver errors as in a transaction: a conflict is retried, a lost connection
                # stops the run, a statement refused for this batch fails the batch
                with translated_errors():
                    claim.conn.execute(q("custom_plans_session"))
                    ctx = _context(
                        claim.conn, claim.batch, run, settings, llm, in_transaction=False
                    )
                    ctx.should_stop = should_stop
                    early = ctx, _plan(ctx, run, batch_no)
            summary = _commit_batch(engine, run, batch_no, settings, llm, llm_before, early)
        except PlanAbandoned:
            log.info("gc.batch_abandoned", batch_no=batch_no, reason="stop requested")
            return False
        except DatabaseUnavailable:
            raise  # the database is gone (or kept conflicting): the run stops here
        except Exception as exc:  # this batch's users only: it rolled back; the run goes on
            try:
                _fail_batch(claim, run, batch_no, exc)
            except Exception as failed:  # the claiming session itself is gone
                raise DatabaseUnavailable(
                    f"a batch failed ({describe_error(exc)}) and could not be marked failed: "
                    f"{describe_error(failed)}"
                ) from None
            return True
        finally:
            if summary is None and llm is not None:  # nothing written; its model calls were paid
                claim.note_unapplied_llm(run["id"], _spent(llm, llm_before))
    if summary is not None:
        log.info("gc.batch_committed", batch_no=batch_no, users=len(claim.batch.users), **summary)
        mine = [b for b in getattr(_committed, "batches", []) if b[0] == run["id"]]  # (bounded:
        _committed.batches = [*mine, (run["id"], batch_no)]  # a caller may never take them)
    return True


def _scrub_erased_meanwhile(
    conn: Connection, actions: Sequence[Action], unchanged: set[UUID]
) -> None:
    """A batch read its rows before it recorded what it did about them — minutes before, when
    it was planned before its transaction (it waited on the model), or moments before, in its
    transaction (reads take no lock): one may have been erased and purged meanwhile — moved to
    another user by the application, whose `forget --purge-now` waited only for that user's
    batches. What this batch just recorded about it (a preview, a merged text, a deferred
    group, a cached decision) is scrubbed in the same transaction, as the erasure would have.
    (A row the application merely deleted is not: a `forget-user` waiting for this batch then
    still finds what the batch wrote, and files and completes its request.) ``unchanged``: rows
    this transaction locked and found at the version the plan read (applied): not erased since,
    so not looked up again — an apply then looks up only what drifted or was not locked, where
    looking up every row cost a night of 1M memories 2 s (docs/benchmarks.md)."""
    from gc_worker import erasure_scrub  # (it imports modules this one does)

    named = {a.memory_id for a in actions if a.memory_id is not None}
    for action in actions:
        for key in ("memory_ids", "sources"):
            named.update(UUID(str(i)) for i in action.details.get(key) or ())
    # not this batch's own records, purges (scrubbed as purges) or erasures (finish_batch)
    named -= {
        a.memory_id for a in actions
        if a.action in (Kind.CREATE_MERGED, Kind.HARD_DELETE) or a.job == "erasure"
    }  # fmt: skip
    named -= unchanged
    erased = erasure_scrub.erased_ids(conn, sorted(named, key=str))
    if erased:
        erasure_scrub.scrub(conn, erased, users=[])
        log.info("gc.batch_scrubbed_erased", memories=len(erased))


def _fail_batch(claim: Any, run: dict[str, Any], batch_no: int, exc: Exception) -> None:
    """Record a batch whose transaction rolled back (a job raised: a bug, a row it cannot
    handle) as failed, so that one bad user does not stop every user after it, every night."""
    error = stored_error(exc)
    params = {"run_id": run["id"], "batch_no": batch_no, "error": error, "worker": WORKER_ID}
    claim.conn.execute(q("fail_batch"), params)
    log.error("gc.batch_failed", batch_no=batch_no, error=error)


def _commit_batch(
    engine: Engine, run: dict[str, Any], batch_no: int, settings: Settings, llm: Any,
    llm_before: dict[str, int], early: tuple[BatchContext, list[Action]] | None,
) -> dict[str, int] | None:  # fmt: skip
    """The claimed batch's transaction: plan (unless ``early`` holds the plan made before it),
    apply or store, mark done; None if the batch was finished meanwhile."""
    with transaction(engine) as conn:
        # it waits for no row lock but possibly its batch row's (lock_batch): bounded
        conn.execute(q("local_lock_timeout"), {"ms": BATCH_LOCK_TIMEOUT_MS})
        batch = conn.execute(q("lock_batch"), {"run_id": run["id"], "batch_no": batch_no}).first()
        if batch is None:
            return None  # finished meanwhile by a worker whose claim was lost
        # psycopg prepares a statement executed 5 times, and PostgreSQL then switches to a
        # generic plan, in which `= ANY($1)` cannot hash its array: `NOT (id = ANY(:taken))`
        # over thousands of ids became a linear search per row from the 10th batch on.
        conn.execute(q("custom_plans"))
        if early is None:
            ctx = _context(conn, batch, run, settings, llm, in_transaction=True)
            actions = _plan(ctx, run, batch_no)
        else:
            ctx, actions = early
            ctx.conn, ctx.in_transaction = conn, True
        summary, unchanged = _run_batch(ctx, run, batch_no, actions)
        _scrub_erased_meanwhile(conn, actions, unchanged)
        stats: dict[str, Any] = {k: v.as_dict() for k, v in ctx.stats.items()}
        if llm is not None:
            stats["_llm"] = _spent(llm, llm_before)
        conn.execute(
            q("finish_batch"),
            {"run_id": run["id"], "batch_no": batch_no, "worker": WORKER_ID,
             "stats": json.dumps(stats)},
        )  # fmt: skip
    return summary


def asks_model(run: dict[str, Any], settings: Settings, llm: Any) -> bool:
    """Whether planning this run's batches may call the model (then it is done before the batch
    transaction): a port, a fresh plan (an apply of a stored plan asks nothing), and a job that
    asks (a job module's ``asks_model(settings)``)."""
    return (
        llm is not None
        and run["plan_run_id"] is None
        and any(
            getattr(jobs.REGISTRY[name], "asks_model", lambda _: False)(settings)
            for name in run["jobs"]
        )
    )


def _context(
    conn: Connection, batch: Any, run: dict[str, Any], settings: Settings, llm: Any,
    *, in_transaction: bool,
) -> BatchContext:  # fmt: skip
    work = batch.work or {}
    return BatchContext(
        conn=conn, users=list(batch.users), settings=settings, now=run["now"],
        dry_run=run["mode"] == "dry_run", llm=llm, in_transaction=in_transaction,
        work={job: set(users) for job, users in work.get("users", {}).items()},
        picked={job: set(ids) for job, ids in work.get("ids", {}).items()},
    )  # fmt: skip


def _plan(ctx: BatchContext, run: dict[str, Any], batch_no: int) -> list[Action]:
    """The batch's actions: its stored plan (an apply of a dry run) or a fresh one."""
    if run["plan_run_id"] is not None:
        return audit.load_planned(ctx.conn, run["plan_run_id"], batch_no)
    return plan_batch(ctx, run["jobs"])


def _run_batch(
    ctx: BatchContext, run: dict[str, Any], batch_no: int, actions: list[Action]
) -> tuple[dict[str, int], set[UUID]]:
    """Record (a dry run) or apply the batch's actions; its counts, and the rows the executor
    locked and found unchanged since the plan read them."""
    unchanged: set[UUID] = set()
    if ctx.dry_run:
        audit.record(ctx.conn, run["id"], batch_no, actions, outcome="planned")
        applied, drifted = actions, []
    else:
        outcome = execute(ctx.conn, actions, now=ctx.now, run_id=run["id"])
        audit.record_outcome(ctx.conn, run["id"], batch_no, outcome)
        applied, drifted = outcome.applied, outcome.drifted
        unchanged = {  # (an xmin moves with any update, an erasure's too)
            a.memory_id for a in applied if a.row_version is not None and not a.content_versioned
        }
        unchanged -= {a.memory_id for a in drifted}  # (another action on the row drifted)
        for action in drifted:
            ctx.job_stats(action.job).drifted += 1
        _after_apply(ctx, run, applied)
    # a run with a score pass (gc_worker.score_pass) refreshes decay's scores after its batches
    refreshed_later = {"decay"} if run["score_pass"] is not None and not ctx.dry_run else set()
    _refresh(
        ctx, [j for j in run["jobs"] if j not in refreshed_later], {a.user_id for a in applied}
    )
    return {"actions": len(applied), "drifted": len(drifted)}, unchanged


def plan_batch(ctx: BatchContext, job_names: Sequence[str]) -> list[Action]:
    """Plan every job of the run for this batch, in order, each seeing the ones before it."""
    planned: list[Action] = []
    for name in job_names:
        stats = ctx.job_stats(name)
        # planning writes no row: all a later job's candidates query can see of the jobs
        # before it is what the batch holds in memory, and only re-assessed importance can
        # make a row a candidate (taken rows and created records only ever remove work)
        reassessed = {a.user_id for a in planned if a.action is Kind.SET_IMPORTANCE}
        users = ctx.users_for(name, reassessed)
        if not users:
            continue
        structlog.contextvars.bind_contextvars(job=name)
        calls_before = _llm_calls(ctx)
        with ctx.only(users):
            planned += ctx.record(jobs.REGISTRY[name].plan(ctx))
        stats.llm_calls += _llm_calls(ctx) - calls_before
    structlog.contextvars.unbind_contextvars("job")
    return planned


def _spent(llm: Any, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in llm.usage(this_thread=True).items()}


def _llm_calls(ctx: BatchContext) -> int:
    return ctx.llm.usage(this_thread=True)["calls"] if ctx.llm is not None else 0


def _after_apply(ctx: BatchContext, run: dict[str, Any], applied: list[Action]) -> None:
    """A job's optional ``after_apply(ctx, applied, run_id=…)``: on apply only, in the batch's
    transaction, with every applied action of the batch (erasure: tombstones, requests)."""
    for name in run["jobs"]:
        hook = getattr(jobs.REGISTRY[name], "after_apply", None)
        if hook is not None:
            hook(ctx, applied, run_id=run["id"])


def _refresh(ctx: BatchContext, job_names: Sequence[str], acted_on: set[str]) -> None:
    for name in job_names:
        refresh = getattr(jobs.REGISTRY[name], "refresh", None)
        users = ctx.users_for(name, acted_on)
        if refresh is not None and users:
            with ctx.only(users):
                ctx.job_stats(name).refreshed += refresh(ctx)
