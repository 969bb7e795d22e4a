"""Pruning the worker's own history: old runs' audit, batches and model spend.

Every applied run writes a ``gc_actions`` row per action (the row's prior state, a preview),
every plan its planned actions, plus ``gc_run_batches`` and ``gc_run_llm_spend`` rows. ``prune``
deletes the history of runs that ended more than ``[history] retention_days`` ago, in
transactions of at most ``chunk_rows`` rows each (a few thousand), each waiting at most two
seconds for a row lock (``LOCK_TIMEOUT_MS``): a run another transaction holds is left for
the next prune (``busy_runs``). A plan and the run that applied it go together.

Options (``Settings.history``):

- ``enabled`` (true): false never prunes (the daemon skips it, the command refuses).
- ``retention_days`` (400): at least the longest of ``hard_delete.retention_days``,
  ``hard_delete.history_retention_days`` and ``erasure.retention_days`` plus the plan age
  limit (``run.max_plan_age_hours``), checked when the settings load.

Never pruned: a run still ``running``; a run a pending erasure request, an open sweep request
or an open review item names (the whole run stays); the gc_runs row a completed erasure request
or any review item names; erasure requests, tombstones, review items and the LLM cache (which
names memories, not runs). Of a pruned run, the audit rows still needed stay with its gc_runs
row (sql/history.sql ``history_prune_actions``): the link from a source to a record the worker
made while any of them is stored or named (erasure follows it once lineage is gone), a
retirement of a row still stored (the read rule reads its prior validity), a change still
restorable, and the latest restorable change of a stored row. Before a run's first rows go,
its report figures (totals, job counters, LLM usage, failed batches) are kept on its gc_runs
row (gc_worker.report ``recorded_figures``), so that its report says it was pruned and still
shows the whole run's figures.

Emits ``gc.history.pruned`` (runs, actions, batches, spend, kept_actions, kept_runs,
busy_runs, dry_run), ``gc.history.busy`` per run left, ``gc.history.skipped`` when another
process is pruning. ``memory-gc prune-history [--dry-run] [--now ISO]`` and the daemon (after
its nightly run) call it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy import Connection
from sqlalchemy.engine import Engine

from gc_worker import report
from gc_worker.config import Settings
from gc_worker.db import translated_errors
from gc_worker.errors import WriteConflict
from gc_worker.queries import q

log = structlog.get_logger("memory_gc")

CHUNK_ROWS = 5000  # rows per transaction: a lock held by a prune is held for one slice
LOCK_TIMEOUT_MS = 2000  # a prune's wait for a row lock: it leaves the run rather than wait
_FIRST = {"batch_no": -(2**31), "seq": -(2**31), "id": -(2**63)}


@dataclass
class PruneResult:
    """What a prune deleted (or, ``dry_run``, would delete) and kept."""

    dry_run: bool
    cutoff: datetime
    runs: int = 0  # gc_runs rows
    actions: int = 0  # gc_actions rows
    batches: int = 0  # gc_run_batches rows
    spend: int = 0  # gc_run_llm_spend rows
    kept_actions: int = 0  # audit rows of old runs still needed
    kept_runs: int = 0  # old runs whose gc_runs row stays (rows kept, or named)
    busy_runs: list[UUID] = field(default_factory=list)  # locked by another transaction: left
    skipped: bool = False  # another process was pruning


class _Busy(Exception):
    """Another transaction holds the run (or a row its deletion would change)."""


def prune(
    engine: Engine,
    settings: Settings,
    *,
    now: datetime,
    dry_run: bool = False,
    chunk_rows: int = CHUNK_ROWS,
    should_stop: Callable[[], bool] = lambda: False,
) -> PruneResult:
    """Delete (or count, ``dry_run``) the history of runs that ended before ``now`` minus
    ``history.retention_days``, keeping what is still needed; one process at a time."""
    cutoff = now - timedelta(days=settings.history.retention_days)
    result = PruneResult(dry_run=dry_run, cutoff=cutoff)
    with translated_errors(), engine.connect() as conn:
        got = conn.execute(q("history_try_lock")).scalar()
        conn.commit()
        if not got:
            result.skipped = True
            log.info("gc.history.skipped", reason="another process is pruning")
            return result
        try:
            _prune_runs(conn, result, chunk_rows, should_stop)
        finally:
            conn.rollback()
            conn.execute(q("history_unlock"))
            conn.commit()
    log.info("gc.history.pruned", runs=result.runs, actions=result.actions,
             batches=result.batches, spend=result.spend, kept_actions=result.kept_actions,
             kept_runs=result.kept_runs, busy_runs=len(result.busy_runs),
             dry_run=dry_run)  # fmt: skip
    return result


def _prune_runs(
    conn: Connection, result: PruneResult, limit: int, should_stop: Callable[[], bool]
) -> None:
    runs = conn.execute(q("history_runs"), {"cutoff": result.cutoff}).all()
    conn.commit()
    emptied: dict[UUID, Any] = {}
    for run in runs:
        if should_stop():
            return
        try:
            kept = _prune_run(conn, run.id, result, limit)
        except _Busy:
            result.busy_runs.append(run.id)
            log.info("gc.history.busy", run_id=str(run.id))
            continue
        if kept or run.held:
            result.kept_runs += 1
        else:
            emptied[run.id] = run
    _drop_run_rows(conn, runs, emptied, result)


def _prune_run(conn: Connection, run_id: UUID, result: PruneResult, limit: int) -> int:
    """The run's audit, batches and spend, slice by slice; how many audit rows stayed."""
    apply = not result.dry_run
    if apply:
        _record_figures(conn, run_id)
    after, kept = dict(_FIRST), 0
    while True:
        row = _slice(conn, run_id, "history_prune_actions",
                     {**after, "limit": limit, "apply": apply}, apply)  # fmt: skip
        result.actions += row.prunable
        kept += row.kept
        if row.scanned < limit:
            break
        after = {"batch_no": row.batch_no, "seq": row.seq, "id": row.id}
    result.kept_actions += kept
    last = -(2**31)
    while True:
        row = _slice(conn, run_id, "history_prune_batches",
                     {"after": last, "limit": limit, "apply": apply}, apply)  # fmt: skip
        result.batches += row.scanned
        if row.scanned < limit:
            break
        last = row.last
    result.spend += _slice(conn, run_id, "history_prune_spend", {"apply": apply}, apply).found
    return kept


def _record_figures(conn: Connection, run_id: UUID) -> None:
    """Before anything of the run goes, keep its report's figures on its gc_runs row (once):
    a report of what is left then shows the whole run's totals and says it was pruned."""
    with _short_transaction(conn, run_id, lock_run=True):
        if conn.execute(q("history_figures_recorded"), {"run_id": run_id}).scalar():
            return
        figures = json.dumps(report.recorded_figures(conn, run_id))
        conn.execute(q("history_record_figures"), {"run_id": run_id, "figures": figures})


def _slice(conn: Connection, run_id: UUID, name: str, params: dict[str, Any], apply: bool) -> Any:
    """One statement in its own short transaction; applying, with the run's row locked."""
    with _short_transaction(conn, run_id, lock_run=apply):
        return conn.execute(q(name), {"run_id": run_id, **params}).one()


@contextlib.contextmanager
def _short_transaction(conn: Connection, run_id: UUID, *, lock_run: bool) -> Iterator[None]:
    """A transaction of the prune's that waits at most LOCK_TIMEOUT_MS for a row lock (a run or
    sweep request row another transaction holds), holding the run's row if ``lock_run``: _Busy
    when another transaction holds what it needs (the run is left for the next prune)."""
    try:
        with translated_errors(), conn.begin():
            conn.execute(q("local_lock_timeout"), {"ms": LOCK_TIMEOUT_MS})
            if lock_run and conn.execute(q("history_lock_run"), {"run_id": run_id}).first() is None:
                raise _Busy
            yield
    except WriteConflict:
        raise _Busy from None


def _drop_run_rows(
    conn: Connection, runs: list[Any], emptied: dict[UUID, Any], result: PruneResult
) -> None:
    """The gc_runs rows with nothing left under them: a run that applied a plan before the
    plan (it names it). A dry run counts what would go."""
    if result.dry_run:
        applier_kept = {r.plan_run_id for r in runs if r.plan_run_id and r.id not in emptied}
        going = [r for r in emptied if r not in applier_kept]
        result.runs += len(going)
        result.kept_runs += len(emptied) - len(going)
        return
    for run in sorted(emptied.values(), key=lambda r: r.plan_run_id is None):
        try:
            with _short_transaction(conn, run.id, lock_run=False):
                if conn.execute(q("history_run_left"), {"run_id": run.id}).scalar():
                    result.kept_runs += 1
                    continue
                result.runs += len(conn.execute(q("history_delete_run"), {"run_id": run.id}).all())
        except _Busy:
            result.busy_runs.append(run.id)
            log.info("gc.history.busy", run_id=str(run.id))
