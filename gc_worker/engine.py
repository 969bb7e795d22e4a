"""Runs: walk users in batches, plan the jobs in order, persist the plan, apply it.

A run is a row in ``gc_runs`` and its user batches in ``gc_run_batches``; a scan at its start
(gc_worker.triage) decides which users each job reads and which rows. A worker claims a batch
and its users with advisory locks on a session of its own (gc_worker.claims), held until the batch
commits, so any number of workers can share a run, each batch is done exactly once, and a batch
whose worker dies is released to the next worker (failed after MAX_LOST_CLAIMS deaths). A batch
(gc_worker.batch_run) is planned and applied in one transaction; when a job may call the model
(``asks_model``) the plan is made just before that transaction, with none open, so a slow model
never holds one. Then, in the transaction:

- dry run: the actions are stored as ``planned``; no memory changes;
- apply (a plain run, or ``apply RUN_ID`` of a stored plan): the executor locks and
  version-checks the rows, applies what did not drift, and the audit rows are written in the
  same transaction.

A run over every user with more than one batch refreshes decay scores after its batches, in one
pass over the table started by the process that closed the run (gc_worker.score_pass).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import structlog
from pydantic import ValidationError
from sqlalchemy.engine import Connection, Engine

import jobs
from gc_worker import audit, claims, erasure, score_pass, triage
from gc_worker.batch_run import process_next_batch
from gc_worker.claims import participating
from gc_worker.config import Settings, check_clock
from gc_worker.db import describe_error, retrying, transaction, translated_errors
from gc_worker.errors import (
    DatabaseUnavailable,
    NotFoundError,
    RunFailed,
    UsageError,
    WriteConflict,
)
from gc_worker.queries import q

log = structlog.get_logger("memory_gc")
# A batch rolled back by a write conflict (deadlock, serialization failure) is claimed and
# planned again from scratch; the worker itself waits on no row lock, so this is a backstop.
BATCH_ATTEMPTS = 3
NIGHTLY_TRIGGER = "nightly"  # the daemon's runs (gc_worker.scheduler) …
APPLY_TRIGGER = "nightly_apply"  # … and its applies of nightly plans (plan_then_apply)
# Runs a daemon's upkeep takes up again when they are left running with nobody working them
# (gc_worker.daemon): losing the database leaves them so, instead of failing them.
RESUMED_TRIGGERS = (NIGHTLY_TRIGGER, APPLY_TRIGGER)


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
    engine: Engine, settings: Settings, request: RunRequest, *, slot: str | None = None
) -> UUID:
    """Record the run and its user batches; nothing is planned yet.

    ``slot`` (unique, e.g. a nightly fire time) makes a second start of the same slot fail with
    IntegrityError, so replicas firing together create one run (gc_worker.scheduler).
    """
    run_id = uuid4()
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


def start_apply(
    engine: Engine,
    plan_run_id: UUID,
    *,
    trigger: str = "cli",
    participate: Callable[[UUID], None] | None = None,
    max_age_hours: float | None = None,
) -> UUID:
    """Record an apply run of a completed dry run (refused if it was already applied, or if
    it finished more than ``max_age_hours`` ago — default: the plan's run.max_plan_age_hours).

    If an earlier apply of the same plan stopped with batches still pending (the process was
    killed, the database lost) and nobody is working it, that apply run is taken up again
    instead: its committed batches stay, its pending ones are applied, as if it had never
    stopped. One that ended failed with nothing pending (failed batches) is refused: failed
    batches are left to a new plan.

    ``participate(run_id)``, if given, is called before the new (or resumed) run is committed
    and must make this process a participant of it (``applying``): no other process can then
    take the run up as stopped in the moment before this one starts working it.
    """
    with transaction(engine) as conn:
        conn.execute(q("lock_run_row"), {"run_id": plan_run_id})  # one starter at a time
        plan = load_run(conn, plan_run_id)
        check_plan_age(conn, plan, max_age_hours)
        if plan["mode"] == "dry_run" and plan["applied_by"] is not None:
            return _resume_apply(conn, plan, participate)
        _check_plan(conn, plan)
        run_id = uuid4()
        if participate is not None:
            participate(run_id)
        row = {
            "id": run_id, "mode": "apply", "trigger": trigger, "now": plan["now"],
            "users": plan["users"], "jobs": plan["jobs"], "plan_run_id": plan_run_id,
            "settings": json.dumps(plan["settings"]),
        }  # fmt: skip
        conn.execute(q("insert_run"), row)
        if (
            conn.execute(
                q("claim_plan"), {"plan_run_id": plan_run_id, "apply_run_id": run_id}
            ).first()
            is None
        ):
            raise UsageError(f"run {plan_run_id} is already being applied; see `memory-gc report`")
        conn.execute(q("copy_batches"), {"run_id": run_id, "plan_run_id": plan_run_id})
        enabled = settings_of(plan).run.score_pass
        conn.execute(q("set_score_pass"), {"run_id": run_id, "enabled": enabled})
    return run_id


def check_plan_age(conn: Connection, plan: dict[str, Any], max_age_hours: float | None) -> None:
    """Refuse a plan older than the limit (the server's clock against its finish)."""
    if plan["mode"] != "dry_run" or plan["finished_at"] is None:
        return
    limit = max_age_hours or settings_of(plan).plan_age_limit_hours
    age = conn.execute(q("plan_age_hours"), {"run_id": plan["id"]}).scalar()
    age = None if age is None else float(age)
    if age is not None and age > limit:
        raise UsageError(
            f"run {plan['id']} is a plan made {age:.0f} hours ago, older than "
            f"run.max_plan_age_hours = {limit:g}: applied now, its changes would carry the "
            "plan's instant (retention would count from then) and the store has moved on. "
            "Make a new plan (`memory-gc run --dry-run`), or raise the limit for this apply "
            f"(MEMORY_GC_RUN__MAX_PLAN_AGE_HOURS={age + 1:.0f})"
        )


@contextlib.contextmanager
def applying(
    engine: Engine, plan_run_id: UUID, *, trigger: str = "cli", max_age_hours: float | None = None
) -> Iterator[UUID]:
    """``start_apply``, participating in the apply run (new or taken up) from before it is
    committed until the block ends: a second apply of the plan started meanwhile is refused as
    being applied right now, instead of taking the run up as stopped."""
    with contextlib.ExitStack() as held:

        def participate(run_id: UUID) -> None:
            held.enter_context(participating(engine, run_id))

        yield start_apply(
            engine, plan_run_id, trigger=trigger, participate=participate,
            max_age_hours=max_age_hours,
        )  # fmt: skip


def _resume_apply(
    conn: Connection, plan: dict[str, Any], participate: Callable[[UUID], None] | None
) -> UUID:
    apply_id = plan["applied_by"]
    apply = load_run(conn, apply_id)
    status = apply["status"]
    if status not in ("running", "failed"):
        raise UsageError(f"run {plan['id']} was already applied by run {apply_id}")
    if status == "failed" and not _pending(conn, apply_id):
        raise UsageError(
            f"run {plan['id']} was applied by run {apply_id}, which ended failed: "
            f"{apply['error']}. The failed batches' users were left as they were; make a new "
            "plan for them (`memory-gc run --dry-run`)"
        )
    if not conn.execute(q("try_run_exclusive"), {"run_id": apply_id}).scalar():
        raise UsageError(
            f"run {plan['id']} is being applied by run {apply_id} right now; see `memory-gc report`"
        )
    conn.execute(q("unlock_run_exclusive"), {"run_id": apply_id})
    if participate is not None:  # before the commit: the plan's row lock keeps others waiting
        participate(apply_id)
    conn.execute(q("resume_run"), {"run_id": apply_id})
    log.info("gc.apply_resumed", run_id=str(apply_id), plan_run_id=str(plan["id"]), was=status)
    return apply_id


def _check_plan(conn: Connection, plan: dict[str, Any]) -> None:
    """A completed dry run can be applied; so can one that failed only because some of its
    batches failed (none pending: the others were planned, and are applied)."""
    if plan["mode"] != "dry_run":
        raise UsageError(f"run {plan['id']} is not a dry run; only a dry run's plan can be applied")
    if plan["status"] == "failed" and not _pending(conn, plan["id"]):
        return
    if plan["status"] == "running":  # or stopped: a dry run nobody works is left running
        raise UsageError(
            f"run {plan['id']} has not completed (it is running, or was stopped: `memory-gc "
            "runs` shows which); only a completed plan can be applied"
        )
    if plan["status"] != "completed":
        raise UsageError(
            f"run {plan['id']} is {plan['status']}; only a completed plan can be applied"
        )


def _pending(conn: Connection, run_id: UUID) -> int:
    return conn.execute(q("pending_batch_count"), {"run_id": run_id}).scalar_one()


def load_run(conn: Connection, run_id: UUID) -> dict[str, Any]:
    row = conn.execute(q("get_run"), {"run_id": run_id}).mappings().first()
    if row is None:
        raise NotFoundError(f"no run with id {run_id}; `memory-gc runs` lists recent runs")
    return dict(row)


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
    if llm is not None:  # the budget is the run's: a resumed run has what is left of it, and
        from gc_worker.llm_store import RunSpend  # replicas working it together share it
        from gc_worker.report import llm_totals

        shared = RunSpend(
            engine, run_id, settings.llm.max_calls_per_run, settings.llm.max_tokens_per_run
        )
        with translated_errors():
            with engine.connect() as conn:
                spent = llm_totals(conn, run_id)
            calls, tokens = shared.open(
                spent["calls"], spent["input_tokens"] + spent["output_tokens"]
            )
        llm.begin_run(spent_calls=calls, spent_tokens=tokens, shared=shared)
    workers = settings.run.workers if workers is None else workers
    helpers = _helpers_wanted(engine, run_id, workers)
    # set when the caller is interrupted (Ctrl-C, SIGTERM) while a helper completes the run: the
    # run is reported as completed, but its score pass is not started
    interrupted = threading.Event()

    def stop_pass() -> bool:
        return interrupted.is_set() or bool(should_stop and should_stop())

    try:
        if helpers == 0:
            with participating(engine, run_id) if participate else contextlib.nullcontext():
                closed = _work_run(engine, run_id, settings, llm, on_batch, should_stop)
        else:
            closed = _work_parallel(
                engine, run_id, settings, llm, on_batch, should_stop, helpers=helpers,
                participate=participate, interrupted=interrupted,
            )  # fmt: skip
    except RunFailed:  # closed with failed batches: the others' scores are refreshed all the same
        _score_pass(engine, run_id, settings, workers, stop_pass)
        raise
    if closed:
        _score_pass(engine, run_id, settings, workers, stop_pass)
    return closed


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


def _helpers_wanted(engine: Engine, run_id: UUID, workers: int) -> int:
    """Helper threads worth starting: one fewer than the workers, no more than the batches
    left besides the caller's first (a one-user sweep starts none)."""
    if workers <= 1:
        return 0
    with translated_errors(), engine.connect() as conn:
        pending = _pending(conn, run_id)
    return max(0, min(workers, pending) - 1)


def _work_parallel(
    engine: Engine,
    run_id: UUID,
    settings: Settings,
    llm: Any,
    on_batch: Callable[[int], None] | None,
    should_stop: Callable[[], bool] | None,
    *,
    helpers: int,
    participate: bool,
    interrupted: threading.Event | None = None,
) -> bool:
    """The caller and ``helpers`` threads work the run side by side. Each helper participates
    on a session of its own, so one that loses the database leaves the run to the others (as a
    replica would). The caller's interrupt (Ctrl-C, SIGTERM) stops the helpers after their
    current batch. Outcome: completed if any of them closed the run, even if the caller was
    interrupted meanwhile; otherwise an interrupt; RunFailed if one closed it failed; otherwise
    the first error; otherwise False (stopped). ``interrupted`` is set when the caller was."""
    stop = interrupted if interrupted is not None else threading.Event()
    reported = threading.Lock()

    def stopping() -> bool:
        return stop.is_set() or bool(should_stop and should_stop())

    def batch_done(n: int) -> None:
        if on_batch is not None:
            with reported:  # a progress bar, the daemon's metrics: one caller at a time
                on_batch(n)

    outcomes: list[bool | BaseException] = []
    # a helper says it is done with an Event, not only by ending: an interrupted Thread.join()
    # marks a thread that still runs as stopped, and the next join() would not wait for it
    started: list[tuple[threading.Thread, threading.Event]] = []

    def helper(done: threading.Event) -> None:
        outcome: bool | BaseException = False
        try:
            with participating(engine, run_id):
                outcome = _work_run(engine, run_id, settings, llm, batch_done, stopping)
        except BaseException as exc:  # handed to the caller's thread, raised there
            outcome = exc
        finally:
            outcomes.append(outcome)
            done.set()

    def start_helpers() -> None:
        for i in range(helpers):
            done = threading.Event()
            thread = threading.Thread(  # with the caller's log context (a sweep's user_id)
                target=contextvars.copy_context().run, args=(helper, done), daemon=True,
                name=f"memory-gc-run-{i + 1}",
            )  # fmt: skip
            thread.start()
            started.append((thread, done))

    def wait_for_helpers() -> None:
        for _, done in started:
            done.wait()
        for thread, _ in started:  # past their work: at once
            thread.join()

    try:  # the caller participates first: a helper failing at once is then not alone
        with participating(engine, run_id) if participate else contextlib.nullcontext():
            start_helpers()
            mine: bool | BaseException = _work_run(
                engine, run_id, settings, llm, batch_done, stopping
            )
    except BaseException as exc:
        mine = exc
    if isinstance(mine, BaseException) and not isinstance(mine, Exception):
        stop.set()  # interrupted: the helpers finish their batch and stop
    interrupted: list[BaseException] = []
    try:
        wait_for_helpers()
    except BaseException as exc:  # interrupted while waiting for them: the same
        stop.set()
        wait_for_helpers()
        interrupted.append(exc)
    everyone = [mine, *outcomes, *interrupted]
    failures = [o for o in everyone if isinstance(o, Exception) and not isinstance(o, RunFailed)]
    if failures and not any(o is True for o in everyone) and not stopping():
        # a participant failed while another still took part (if only waiting for the helpers,
        # its batches done) and left the run to it; nobody took its batch up. Failed now unless
        # another process works the run. (Stopped or interrupted: left resumable, as a replica
        # would leave it.)
        with contextlib.suppress(Exception):  # the database may be the trouble; say the first
            with engine.connect() as conn:
                trigger = load_run(conn, run_id)["trigger"]
            _fail(engine, run_id, failures[0], trigger=trigger)
    return _outcome(everyone)


def _outcome(outcomes: list[bool | BaseException]) -> bool:
    # a helper's last batch completed the run while the caller was interrupted: the run is
    # done, and the caller (the CLI) reports it as done rather than as interrupted
    if any(o is True for o in outcomes):
        return True
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if not errors:
        return False  # stopped
    interrupt = next((e for e in errors if not isinstance(e, Exception)), None)  # Ctrl-C, SIGTERM
    closed_failed = next((e for e in errors if isinstance(e, RunFailed)), None)
    raise interrupt or closed_failed or errors[0]


def _work_run(
    engine: Engine,
    run_id: UUID,
    settings: Settings,
    llm: Any,
    on_batch: Callable[[int], None] | None,
    should_stop: Callable[[], bool] | None,
) -> bool:
    with engine.connect() as conn:
        run = load_run(conn, run_id)
    caller_context = structlog.contextvars.get_contextvars()  # e.g. a sweep's own user_id
    structlog.contextvars.bind_contextvars(run_id=str(run_id), dry_run=run["mode"] == "dry_run")
    try:
        while not (should_stop and should_stop()):
            if not retrying(
                BATCH_ATTEMPTS, lambda: process_next_batch(engine, run, settings, llm, should_stop)
            ):  # no batch left to claim (or one given up at a stop)
                if not (should_stop and should_stop()):  # the requests no batch visits
                    structlog.contextvars.unbind_contextvars("batch_no")
                    erasure.complete_rowless(engine, run)
                break
            if on_batch:
                on_batch(1)
    except Exception as exc:  # logged without the batch's context (its user, job, batch_no)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**{**caller_context, "run_id": str(run_id)})
        _fail(engine, run_id, exc, trigger=run["trigger"])
        raise
    finally:
        # batch_no / user_id / job are bound per batch; a failed batch must not leak them either,
        # and what the caller had bound (a sweep's user_id) is its again
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(**caller_context)
    with transaction(engine) as conn:
        closed = conn.execute(q("complete_run"), {"run_id": run_id}).first()
    if closed is not None and closed.status == "failed":
        with engine.connect() as conn:
            error = load_run(conn, run_id)["error"]
        log.error("gc.run_failed", run_id=str(run_id), error=error)
        raise RunFailed(f"run {run_id}: {error}; see `memory-gc report {run_id}`")
    if closed is not None:
        log.info("gc.run_completed", run_id=str(run_id))
    return closed is not None


def _fail(engine: Engine, run_id: UUID, exc: Exception, *, trigger: str) -> None:
    """Mark the run failed — unless another process still takes part in it (another replica of
    the same nightly run): this one's database trouble must not stop the others — or it is a
    daemon's run that lost the database (a restart, a failover; not a conflict that kept
    coming back, nor an error the server answered with, which would come back again, every
    upkeep, for ever): left running, with nobody working it, so that the next upkeep of any
    daemon takes it up where it stopped, as after a daemon's death. (A failed nightly run is
    not run again: a blip at 03:00 would cost the night.)"""
    lost = (
        isinstance(exc, DatabaseUnavailable)
        and not isinstance(exc, WriteConflict)
        and exc.connection_lost
    )
    if lost and trigger in RESUMED_TRIGGERS:
        log.error("gc.run_left_resumable", run_id=str(run_id), error=describe_error(exc))
        return
    with transaction(engine) as conn:
        own = claims.own_participation_pids(run_id)
        failed = conn.execute(
            q("fail_run_if_alone"),
            {"run_id": run_id, "error": describe_error(exc), "own_pids": own},
        ).first()
    if failed is None:
        log.error("gc.run_left_to_others", run_id=str(run_id), error=describe_error(exc))
        return
    log.error("gc.run_failed", run_id=str(run_id), error=describe_error(exc))


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


def settings_of(run: dict[str, Any]) -> Settings:
    """The settings a run was planned with (an apply uses its plan's). Settings this version
    refuses (stored by one that accepted them) are a usage error naming the key, not a crash."""
    try:
        return Settings.model_validate(run["settings"])
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise UsageError(
            f"run {run.get('id')} was made with settings this version of memory-gc refuses "
            f"({key}: {first['msg']}); make a new plan (`memory-gc run --dry-run`)"
        ) from None


def run_once(
    engine: Engine,
    settings: Settings,
    request: RunRequest,
    *,
    llm: Any = None,
    on_batch: Callable[[int], None] | None = None,
) -> UUID:
    """Start a run and work it to completion in this process."""
    run_id = start_run(engine, settings, request)
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
