"""Undo what a run (or the worker, for one memory) did, while the rows still exist.

Each undo is guarded: a row goes back to its prior state only if the worker's change is
still in place (same status, reason and change instant, and the valid_until and superseded_by
the action left). Rows the application changed since, and rows already purged, are reported as
not restorable and left alone. A record the run created (merge, summary) and its sources are
undone together or not at all: only while the record is as the run made it (active, unpinned,
same content and updated_at) and every source will be active again. The undo is itself a run
(mode ``restore``) whose ``restore`` actions say what came back.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy.engine import Connection, Engine

from gc_worker import audit
from gc_worker.actions import TARGET_STATUS, Action, Kind
from gc_worker.config import check_clock
from gc_worker.db import retrying, transaction
from gc_worker.errors import NotFoundError, UsageError
from gc_worker.queries import q
from gc_worker.run_record import load_run


@dataclass
class RestoreResult:
    run_id: UUID
    restored: list[UUID] = field(default_factory=list)
    not_restorable: list[UUID] = field(default_factory=list)
    # per change not undone: (memory, the action kept, why: _why_left), in not_restorable's order
    why_not: list[tuple[UUID, str, str]] = field(default_factory=list)
    # (memory, action) -> the later run whose change the row holds (why `later_run`): restore
    # that run first
    later_runs: dict[tuple[UUID, str], UUID] = field(default_factory=dict)
    purged: int = 0  # rows the restored run physically deleted: gone for good
    erased: int = 0  # rows it erased ("forget me"): never undone


# A restore waits for row locks (it is an operator's command, not a background job); when that
# ends in a deadlock with the application it is rolled back whole and tried again.
ATTEMPTS = 3


def restore_run(engine: Engine, run_id: UUID, *, now: datetime | None = None) -> RestoreResult:
    """Undo every restorable action of ``run_id``."""
    if now is not None:  # it stamps what it retires: retention counts from it
        check_clock(now, f"the restore's `now` ({now.isoformat()})")
    return retrying(ATTEMPTS, lambda: _restore_run(engine, run_id, now))


def _restore_run(engine: Engine, run_id: UUID, now: datetime | None) -> RestoreResult:
    with transaction(engine) as conn:
        run = load_run(conn, run_id)
        if run["mode"] == "dry_run" and run.get("applied_by") is not None:
            raise UsageError(
                f"run {run_id} is a dry run whose plan run {run['applied_by']} applied; restore "
                f"that run: memory-gc restore --run {run['applied_by']}"
            )
        if run["mode"] == "dry_run":
            raise UsageError(
                f"run {run_id} is a dry run: it changed nothing, so there is nothing to restore"
            )
        if run["mode"] == "restore":
            raise UsageError(
                f"run {run_id} is a restore run; it cannot itself be undone (run the jobs "
                "again to make their changes anew)"
            )
        if run["status"] == "running":  # its batches after this restore would stay applied
            raise UsageError(
                f"run {run_id} is still running (or stopped, to be taken up again): what it "
                f"applies after a restore would stay. Stop it for good first: `memory-gc cancel "
                f"{run_id}`, then restore it"
            )
        if run["status"] == "failed" and not _nobody_works(conn, run_id):
            raise UsageError(  # cancelled: the batch one is in commits after this restore
                f"run {run_id} was cancelled, but processes still work it: each finishes the "
                "batch it is in, which would stay applied. Restore it again once they have "
                "(a batch commits whole, then they stop)"
            )
        gone = conn.execute(q("run_unrestorable"), {"run_id": run_id}).one()
        result = _restore(conn, run_id, None, now=now, nothing_left_ok=not gone.restored_before)
        result.purged, result.erased = gone.purged, gone.erased
        return result


def _nobody_works(conn: Connection, run_id: UUID) -> bool:
    """Whether no process participates in the run (gc_worker.claims)."""
    if not conn.execute(q("try_run_exclusive"), {"run_id": run_id}).scalar():
        return False
    conn.execute(q("unlock_run_exclusive"), {"run_id": run_id})
    return True


def restore_memory(
    engine: Engine, memory_id: UUID, *, now: datetime | None = None
) -> RestoreResult:
    """Undo the worker's latest change to one memory (a whole merge or summary when it names
    the record or one of its members)."""
    if now is not None:  # it stamps what it retires: retention counts from it
        check_clock(now, f"the restore's `now` ({now.isoformat()})")
    return retrying(ATTEMPTS, lambda: _restore_memory(engine, memory_id, now))


def _restore_memory(engine: Engine, memory_id: UUID, now: datetime | None) -> RestoreResult:
    with transaction(engine) as conn:
        latest = conn.execute(q("latest_action_for_memory"), {"memory_id": memory_id}).first()
        if latest is None:
            raise NotFoundError(f"the worker has no restorable change to memory {memory_id}")
        ids = [memory_id]
        if latest.grp:  # a merge or a summary, named by its record or by any of its members:
            # undone whole (one member back next to the record would state the fact twice)
            members = conn.execute(q("group_members"), {"run_id": latest.run_id, "grp": latest.grp})
            ids = [row.memory_id for row in members]
        # that change only: a score the same run gave the row (its members) is another change,
        # and undoing it would file a dismissal of the model's score that no one asked for
        scored = latest.action == Kind.SET_IMPORTANCE
        return _restore(conn, latest.run_id, ids, now=now, scores=scored, changes=not scored)


def _restore(
    conn: Connection,
    run_id: UUID,
    memory_ids: Sequence[UUID] | None,
    *,
    now: datetime | None,
    nothing_left_ok: bool = True,
    scores: bool = True,
    changes: bool = True,
) -> RestoreResult:
    """Undo the run's restorable actions (of ``memory_ids``, if given): its importance
    ``scores`` and its other ``changes`` (status changes, created records), or one of them."""
    now = now or datetime.now(UTC)
    conn.execute(q("restore_hold_filing"))  # no erasure request is filed meanwhile
    params = {"run_id": run_id, "memory_ids": list(memory_ids) if memory_ids else None}
    rows = [
        r
        for r in conn.execute(q("restorable_actions"), params)
        if (scores if r.action == Kind.SET_IMPORTANCE else changes)
    ]
    if not rows and not nothing_left_ok:
        raise UsageError(f"run {run_id} was already restored; nothing of it is left to restore")
    retired = [r for r in rows if Kind(r.action) in TARGET_STATUS]
    in_place = _still_in_place(conn, retired)
    created = [r for r in rows if r.action == Kind.CREATE_MERGED]
    retire, unchanged = _created_to_retire(conn, created, in_place)
    kept = {_details(r).get("group") for r in created if r.memory_id not in retire} - {None}
    back = [r for r in retired if r.memory_id in in_place and _details(r).get("group") not in kept]
    scored = [r for r in rows if r.action == Kind.SET_IMPORTANCE]
    undone = (
        _actions_of(back, _restore_status(conn, back))
        | _actions_of(scored, _restore_importance(conn, scored))
        | _actions_of(created, _retire_created(conn, sorted(retire, key=str), now))
    )
    done = [r for r in rows if r.action_id in undone]
    left = [r for r in rows if r.action_id not in undone]
    conn.execute(q("mark_restored"), {"ids": [r.action_id for r in done]})
    why, later = _why_left(conn, run_id, left, in_place, unchanged)
    result = RestoreResult(run_id=_record_restore_run(conn, run_id, done, left, why, later, now))
    _record_dismissals(conn, result.run_id, run_id, done)
    result.restored = [r.memory_id for r in done]
    result.not_restorable = [r.memory_id for r in left]
    result.why_not = [(r.memory_id, r.action, why[r.action_id]) for r in left]
    result.later_runs = {(r.memory_id, r.action): later[r.action_id] for r in left
                         if r.action_id in later}  # fmt: skip
    return result


def _why_left(
    conn: Connection, run_id: UUID, left: list[Any], in_place: set[UUID], unchanged: set[UUID]
) -> tuple[dict[Any, str], dict[Any, UUID]]:
    """Per action a restore could not undo, why (the restore run's report names each;
    ``restore_left_state`` says what each reason means), and for those a later run's change
    holds (``later_run``) that run. A ``changed_since`` on a change still as the run made it
    (a retired row ``in_place``, a created record ``unchanged``) is refined: its merge is kept
    whole (``merge_kept``) because another row of it changed or is gone."""
    if not left:
        return {}, {}
    params = {
        "ids": [r.memory_id for r in left],
        "users": [r.user_id for r in left],
        "action_ids": [r.action_id for r in left],
        "actions": [r.action for r in left],
        "run_id": run_id,
    }
    state = {row.action_id: row for row in conn.execute(q("restore_left_state"), params)}

    def still_made(r: Any) -> bool:  # by the action's kind: a row can have two in one run
        if Kind(r.action) in TARGET_STATUS:
            return r.memory_id in in_place
        return r.action == Kind.CREATE_MERGED and r.memory_id in unchanged

    why = {
        r.action_id: "merge_kept"
        if state[r.action_id].why == "changed_since" and still_made(r)
        else state[r.action_id].why
        for r in left
    }
    later = {a: row.later_run for a, row in state.items() if why[a] == "later_run"}
    return why, later


# what a model decided: a near-duplicate merge, a contradiction judged on a similar pair
MODEL_MERGE, MODEL_VERDICT = "near_duplicates", "similar"


def _record_dismissals(conn: Connection, restore_run: UUID, undid: UUID, done: list[Any]) -> None:
    """A model's merge (its sources), contradiction verdict (the pair) or importance scores
    (the rows, one item per user) that a person undid are recorded as a dismissed review,
    which the jobs honour as they honour `resolve --dismiss`: the next run would otherwise
    make the same change again (the model's verdict is cached; a restored score leaves the row
    unassessed, so it is asked about again). A rule — exact duplicates, a slot, a declared
    `supersedes`, a TTL, decay, disuse, the cap — applies again: change the setting or the
    row first."""
    items = [
        {"user_id": r.user_id, "kind": "compaction",
         "memory_ids": [str(s) for s in _details(r).get("sources") or []]}
        for r in done
        if r.job == "compaction" and r.action == Kind.CREATE_MERGED and r.reason == MODEL_MERGE
    ] + [
        {"user_id": r.user_id, "kind": "contradiction",
         "memory_ids": [str(r.memory_id), str(_details(r)["superseded_by"])]}
        for r in done
        if r.job == "contradiction" and r.action == Kind.OBSOLETE
        and _details(r).get("basis") == MODEL_VERDICT and _details(r).get("superseded_by")
    ]  # fmt: skip
    items = [item for item in items if len(item["memory_ids"]) >= 2]
    scored: dict[str, list[str]] = defaultdict(list)
    for r in done:
        if r.job == "importance" and r.action == Kind.SET_IMPORTANCE:
            scored[r.user_id].append(str(r.memory_id))
    items += [{"user_id": user, "kind": "importance", "memory_ids": ids}
              for user, ids in scored.items()]  # fmt: skip
    if items:
        conn.execute(
            q("insert_restore_dismissals"),
            {"run_id": restore_run, "undid_run": str(undid), "items": json.dumps(items)},
        )


def _actions_of(rows: list[Any], memory_ids: set[UUID]) -> set[Any]:
    """The ids of the actions among ``rows`` whose memory a statement undid (by action, not by
    memory: one memory can have an undone and a kept action in the same run)."""
    return {r.action_id for r in rows if r.memory_id in memory_ids}


def _still_in_place(conn: Connection, rows: list[Any]) -> set[UUID]:
    """Rows on which everything the worker's action wrote is still there (and locked): status,
    reason, instant, and the valid_until / superseded_by it left. Any later write by the
    application — a corrected validity, a new pointer — wins: the row is not restorable."""
    if not rows:
        return set()
    params = {
        "ids": [r.memory_id for r in rows],
        "expect_status": [TARGET_STATUS[Kind(r.action)] for r in rows],
        "expect_reason": [r.reason for r in rows],
        "closed_valid_until": [_details(r).get("close_valid_until") for r in rows],
        "set_superseded": [_details(r).get("superseded_by") for r in rows],
        "priors": [json.dumps(r.prior) for r in rows],
        "users": [r.user_id for r in rows],
        "action_ids": [r.action_id for r in rows],
        "run_id": rows[0].run_id,
        "run_now": rows[0].run_now,
    }
    return set(conn.execute(q("restore_in_place"), params).scalars())


def _restore_status(conn: Connection, rows: list[Any]) -> set[UUID]:
    """Put rows ``_still_in_place`` found back to their prior status fields."""
    if not rows:
        return set()
    params = {
        "ids": [r.memory_id for r in rows],
        "closed_valid_until": [_details(r).get("close_valid_until") for r in rows],
        "priors": [json.dumps(r.prior) for r in rows],
    }
    return set(conn.execute(q("restore_status"), params).scalars())


def _details(row: Any) -> dict[str, Any]:
    return row.details if isinstance(row.details, dict) else {}


def _restore_importance(conn: Connection, rows: list[Any]) -> set[UUID]:
    if not rows:
        return set()
    params = {
        "ids": [r.memory_id for r in rows],
        "expect": [int(r.details["importance"]) for r in rows],
        "priors": [json.dumps(r.prior) for r in rows],
        "action_ids": [r.action_id for r in rows],
        "users": [r.user_id for r in rows],
        "run_id": rows[0].run_id,
        "run_now": rows[0].run_now,
    }
    return set(conn.execute(q("restore_importance"), params).scalars())


def _created_to_retire(
    conn: Connection, rows: list[Any], in_place: set[UUID]
) -> tuple[set[UUID], set[UUID]]:
    """The created records (merges, summaries) a restore takes off the read path, and those
    still as the run made them (the second set). Taken off: those still
    as the run made them (``created_unchanged``) whose every source is active again once the
    rows ``in_place`` are back. The others stay, and with them their group (the merged or
    folded sources stay retired into them): a record the application edited (its content,
    scope, slot, validity, TTL, metadata or importance), moved, pinned or deleted is the
    user's now, and one whose source was purged or changed since holds what
    that source said; bringing the rest back next to it would put the same facts on the read
    path twice."""
    if not rows:
        return set(), set()
    params = {
        "ids": [r.memory_id for r in rows],
        "users": [r.user_id for r in rows],
        "records": [json.dumps(_made(r)) for r in rows],
        "contents": [_made(r).get("content") for r in rows],
        "updated": [_instant(_made(r).get("updated_at")) or r.run_now for r in rows],
    }
    unchanged = set(conn.execute(q("created_unchanged"), params).scalars())
    sources = {r.memory_id: [UUID(str(s)) for s in _details(r).get("sources") or []] for r in rows}
    wanted = [s for ids in sources.values() for s in ids]
    active = set(conn.execute(q("active_among"), {"ids": wanted}).scalars()) if wanted else set()
    retire = {
        m
        for m, srcs in sources.items()
        if m in unchanged and srcs and all(s in active or s in in_place for s in srcs)
    }
    return retire, unchanged


def _made(row: Any) -> dict[str, Any]:
    """The columns a create_merged action gave its record (empty once scrubbed)."""
    record = _details(row).get("record")
    return record if isinstance(record, dict) else {}


def _instant(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _retire_created(conn: Connection, ids: list[UUID], now: datetime) -> set[UUID]:
    """Take the records ``_created_to_retire`` chose (locked) off the read path."""
    if not ids:
        return set()
    return set(conn.execute(q("retire_created"), {"ids": ids, "now": now}).scalars())


def _record_restore_run(
    conn: Connection,
    source_run: UUID,
    rows: list[Any],
    left: list[Any],
    why: dict[Any, str],
    later: dict[Any, UUID],
    now: datetime,
) -> UUID:
    """The restore as a run: an applied ``restore`` action per change undone, and a drifted
    one per change it could not undo, its reason saying why (``_why_left``; for ``later_run``,
    ``details.later_run`` names that run)."""
    run_id = uuid4()
    conn.execute(
        q("insert_run"),
        {"id": run_id, "mode": "restore", "trigger": "cli", "now": now, "users": None,
         "jobs": [], "settings": "{}", "plan_run_id": None},
    )  # fmt: skip
    actions = [
        Action(job=r.job, action=Kind.RESTORE, user_id=r.user_id, reason="restored",
               memory_id=r.memory_id, details={"undid": r.action, "run": str(source_run)})
        for r in rows
    ]  # fmt: skip
    audit.record(conn, run_id, 0, actions, outcome="applied")
    kept = [
        Action(job=r.job, action=Kind.RESTORE, user_id=r.user_id, reason=why[r.action_id],
               memory_id=r.memory_id, details={"undid": r.action, "run": str(source_run)}
               | ({"later_run": str(later[r.action_id])} if r.action_id in later else {}))
        for r in left
    ]  # fmt: skip
    audit.record(conn, run_id, 0, kept, outcome="drifted", seq_start=len(actions))
    conn.execute(q("complete_restore_run"), {"run_id": run_id})
    return run_id
