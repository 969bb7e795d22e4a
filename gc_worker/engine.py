"""Runs: walk users in batches, plan the jobs in order, persist the plan, apply it.

A run is a row in ``gc_runs`` (gc_worker.run_record) and its user batches in
``gc_run_batches``; a scan at its start (gc_worker.triage) decides which users each job reads
and which rows. A worker claims a batch and its users with advisory locks on a session of its
own (gc_worker.claims), held until the batch commits, so any number of workers can share a run,
each batch is done exactly once, and a batch whose worker dies is released to the next worker
(failed after MAX_LOST_CLAIMS deaths); this process's workers are the caller's thread and
helper threads (gc_worker.run_workers). A batch (gc_worker.batch_run) is planned and applied in
one transaction; when a job may call the model (``asks_model``) the plan is made just before
that transaction, with none open, so a slow model never holds one. Then, in the transaction:

- dry run: the actions are stored as ``planned``; no memory changes;
- apply (a plain run, or ``apply RUN_ID`` of a stored plan, started by gc_worker.apply_start):
  the executor locks and version-checks the rows, applies what did not drift, and the audit
  rows are written in the same transaction.

A run over every user with more than one batch refreshes decay scores after its batches, in one
pass over the table started by the process that closed the run (gc_worker.score_pass).

This module starts a run (``start_run``), works one (``process_run``), and does both in one call
(``run_once``, ``apply_plan``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import structlog
from sqlalchemy.engine import Connection, Engine

import jobs
from gc_worker import audit, run_workers, score_pass, triage
from gc_worker.apply_start import applying
from gc_worker.claims import participating
from gc_worker.config import Settings, check_clock
from gc_worker.db import describe_error, transaction, translated_errors
from gc_worker.errors import NotFoundError, RunFailed, UsageError
from gc_worker.queries import q
from gc_worker.run_record import load_run, settings_of

log = structlog.get_logger("memory_gc")


@dataclass(frozen=True)
class RunRequest:
    mode: str  # "dry_run" | "apply"
    now: datetime
    users: tuple[str, ...] | None = None
    jobs: tuple[str, ...] = ()
    trigger: str = "cli"

    def __post_init__(self) -> None:
        if self.now.tzinfo is None:
            raise UsageError("the run's `now` must be timezone-aware, e.g. 2026-01-31T03:00:00Z")
        check_clock(self.now, f"the run's `now` ({self.now.isoformat()})")
        if self.users is not None:  # `--user u1 --user u1`: one user, named once in the report
            object.__setattr__(self, "users", tuple(dict.fromkeys(self.users)))


def resolve_jobs(requested: Sequence[str], settings: Settings) -> tuple[str, ...]:
    """Requested job names (or every enabled one), validated, in run order."""
    available = jobs.available()
    for name in requested:
        if name not in jobs.ORDER:
            raise UsageError(f"unknown job {name!r}; jobs are: {', '.join(jobs.ORDER)}")
        if name not in available:
            raise UsageError(f"job {name!r} is not available in this build")
    if requested:
        for name in requested:
            if not getattr(settings, name).enabled:  # asked for by name: run it, but say so
                log.warning("gc.disabled_job_requested", job=name, hint=f"[{name}] enabled = false")
        return tuple(n for n in available if n in requested)
    return tuple(n for n in available if getattr(settings, n).enabled)


def start_run(
    engine: Engine, settings: Settings, request: RunRequest, *, slot: str | None = None,
    participate: Callable[[UUID], None] | None = None,
) -> UUID:  # fmt: skip
    """Record the run and its user batches; nothing is planned yet.

    ``slot`` (unique, e.g. a nightly fire time) makes a second start of the same slot fail with
    IntegrityError, so replicas firing together create one run (gc_worker.scheduler).
    ``participate(run_id)``, if given, is called before the run is committed and must make the
    caller a participant of it (``started``).
    """
    run_id = uuid4()
    if participate is not None:
        participate(run_id)
    with transaction(engine) as conn:
        everyone = _users(conn, request.users)
        found = triage.scan(
            conn, everyone, request.jobs, settings, request.now,
            every_user=request.users is None,
        )  # fmt: skip
        users = triage.with_work(everyone, request.jobs, found)
        conn.execute(q("insert_run"), _run_row(run_id, settings, request))
        if slot is not None:
            conn.execute(q("set_run_slot"), {"run_id": run_id, "slot": slot})
        size = settings.run.batch_users
        batches = [users[i : i + size] for i in range(0, len(users), size)]
        _insert_batches(conn, run_id, batches, found)
        conn.execute(q("set_score_pass"), {"run_id": run_id, "enabled": settings.run.score_pass})
    log.info(
        "gc.run_started", run_id=str(run_id), mode=request.mode, users=len(users),
        users_without_work=len(everyone) - len(users),
    )  # fmt: skip
    return run_id


@contextlib.contextmanager
def started(engine: Engine, settings: Settings, request: RunRequest) -> Iterator[UUID]:
    """``start_run``, participating in the run from before it is committed until the block
    ends. A run nothing resumes is closed as stopped once it is a lease old with nobody taking
    part (scheduler.close_stopped_runs), and the lease counts from its row's insert, at the
    start of the transaction that records its batches: one whose batches took long to record
    was already that old when it committed, and an upkeep before its process took part closed
    it."""
    with contextlib.ExitStack() as held:

        def participate(run_id: UUID) -> None:
            held.enter_context(participating(engine, run_id))

        yield start_run(engine, settings, request, participate=participate)


def _users(conn: Connection, requested: tuple[str, ...] | None) -> list[str]:
    if requested is None:
        return list(conn.execute(q("run_users")).scalars())
    known = set(conn.execute(q("known_users"), {"users": list(requested)}).scalars())
    unknown = [u for u in requested if u not in known]
    if unknown:
        raise NotFoundError(
            f"no memories for user(s) {', '.join(map(repr, unknown))}; check the id"
        )
    return sorted(set(requested))


def _run_row(run_id: UUID, settings: Settings, request: RunRequest) -> dict[str, Any]:
    return {
        "id": run_id,
        "mode": request.mode,
        "trigger": request.trigger,
        "now": request.now,
        "users": list(request.users) if request.users is not None else None,
        "jobs": list(request.jobs),
        "settings": settings.model_dump_json(),
        "plan_run_id": None,
    }


def _insert_batches(
    conn: Connection, run_id: UUID, batches: list[list[str]], found: triage.Scan | None
) -> None:
    if batches:
        conn.execute(
            audit.batches_insert(),
            [{"run_id": run_id, "batch_no": i, "users": users, "state": "pending", "stats": {},
              "work": triage.for_batch(found, users)}
             for i, users in enumerate(batches)],
        )  # fmt: skip


def process_run(
    engine: Engine,
    run_id: UUID,
    settings: Settings,
    *,
    llm: Any = None,
    on_batch: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    participate: bool = True,
    workers: int | None = None,
) -> bool:
    """Work through the run's pending batches; True when this call completed the run
    (RunFailed when it closed it as failed: some batches failed, the others were done).

    Up to ``workers`` batches are worked at once (this process's ``run.workers``; default:
    ``settings``'): the calling thread and helper threads, each a participant of its own, as
    replicas sharing a run are (gc_worker.claims). The model
    budget is the run's, shared. ``should_stop`` is asked between batches (SIGTERM: finish the
    current batch, then return), and between users while a batch is planned before its
    transaction (the batch is given up: nothing of it is written yet, and waiting for the model
    could take minutes). ``participate=False``: the caller already holds the run's
    participation lock (the daemon); helper threads take their own.
    """
    if llm is not None:
        _open_model_budget(engine, run_id, settings, llm)
    # set when the caller is interrupted (Ctrl-C, SIGTERM) while a helper completes the run: the
    # run is reported as completed, but its score pass is not started
    interrupted = threading.Event()
    workers = settings.run.workers if workers is None else workers

    def stop_pass() -> bool:
        return interrupted.is_set() or bool(should_stop and should_stop())

    try:
        closed = run_workers.work_batches(
            engine, run_id, settings, llm, on_batch, should_stop, workers=workers,
            participate=participate, interrupted=interrupted,
        )  # fmt: skip
    except RunFailed:  # closed with failed batches: the others' scores are refreshed all the same
        _score_pass(engine, run_id, settings, workers, stop_pass)
        raise
    if closed:
        _score_pass(engine, run_id, settings, workers, stop_pass)
    return closed


def _open_model_budget(engine: Engine, run_id: UUID, settings: Settings, llm: Any) -> None:
    """The model budget is the run's: a resumed run has what is left of it, and replicas (and
    this process's helper threads) working it together share it."""
    from gc_worker.llm_store import RunSpend
    from gc_worker.report import llm_totals

    shared = RunSpend(
        engine, run_id, settings.llm.max_calls_per_run, settings.llm.max_tokens_per_run
    )
    with translated_errors():
        with engine.connect() as conn:
            spent = llm_totals(conn, run_id)
        calls, tokens = shared.open(spent["calls"], spent["input_tokens"] + spent["output_tokens"])
    llm.begin_run(spent_calls=calls, spent_tokens=tokens, shared=shared)


def _score_pass(
    engine: Engine, run_id: UUID, settings: Settings, workers: int,
    should_stop: Callable[[], bool],
) -> None:  # fmt: skip
    """The score pass of a run this call closed, if it has one (gc_worker.score_pass). It
    never fails the run, whose actions are all applied: a database error ends it (logged), and
    the scores it did not reach are the next run's."""
    try:
        with translated_errors(), engine.connect() as conn:
            run = load_run(conn, run_id)
        if run["score_pass"] == "due":
            score_pass.refresh_scores(
                engine, run, settings, workers=workers, should_stop=should_stop
            )
    except Exception as exc:
        log.error("gc.score_pass_stopped", run_id=str(run_id), error=describe_error(exc))


def run_once(
    engine: Engine,
    settings: Settings,
    request: RunRequest,
    *,
    llm: Any = None,
    on_batch: Callable[[int], None] | None = None,
) -> UUID:
    """Start a run and work it to completion in this process."""
    with started(engine, settings, request) as run_id:
        process_run(engine, run_id, settings, llm=llm, on_batch=on_batch)
    return run_id


def apply_plan(
    engine: Engine,
    plan_run_id: UUID,
    *,
    llm: Any = None,
    on_batch: Callable[[int], None] | None = None,
    workers: int | None = None,
    trigger: str = "cli",
) -> UUID:
    """Apply a stored dry-run plan exactly, with the settings it was planned with (but
    ``workers`` batches at once, default the plan's run.workers), as a run of ``trigger``."""
    with applying(engine, plan_run_id, trigger=trigger) as run_id:
        with engine.connect() as conn:
            settings = settings_of(load_run(conn, run_id))
        process_run(engine, run_id, settings, llm=llm, on_batch=on_batch, workers=workers)
    return run_id
