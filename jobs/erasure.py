"""erasure: carry out "forget me" requests, propagate them along lineage, keep them forgotten.

Options (``[erasure]``):
    enabled = true        run the job at all (it runs first in every run)
    retention_days = 1    erased rows are purged this soon by hard_delete (pinned or not)

Reads the batch's pending ``gc_erasure_requests`` and ``gc_erasure_tombstones``; emits
- ``soft_delete`` reason ``erasure`` for every memory a request targets (a user's rows, or one
  row), in any status except already erased, pinned or not; for every record a requested memory
  was made from, if it is a merged record or a summary (``memory_lineage`` downward,
  transitively: details.source_of); for every record derived from one (``memory_lineage``
  upward, transitively: details.derived_from); and for every other row of the user with the
  same normalised content (details.same_content_as);
- ``soft_delete`` reason ``erasure_tombstone`` for a row that matches a tombstone (same user and
  id, or same normalised content hash): a stale writer brought an erased memory back;
- ``restore`` reason ``erasure_reactivated`` for each non-erased source an erased derived record
  had absorbed (``superseded_by`` = that record): it becomes active again, in the same group;
- ``hard_delete`` reason ``erasure_purge_now`` for every target of a ``purge_now`` request.
Erasure actions carry no content preview; their details hold the request ids and the content
hashes the tombstones are written from. Everything else happens on apply, in the batch's
transaction (``after_apply``, gc_worker.erasure): reactivations, tombstones, scrubbing of the
worker's tables, and completion of the requests whose targets are all erased.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from gc_worker import erasure as store
from gc_worker.actions import ERASURE_REASONS, Action, Kind
from gc_worker.batch import BatchContext
from gc_worker.queries import q
from jobs.similarity import content_hash

NAME = "erasure"
PREVIEW_CHARS = 200  # what the jobs' candidate queries preview: left(content, 200)


@dataclass(frozen=True)
class Request:
    id: UUID
    kind: str  # "user" | "memory"
    user_id: str
    memory_id: UUID | None
    purge_now: bool


@dataclass
class _Target:
    reason: str
    requests: set[UUID] = field(default_factory=set)
    details: dict[str, Any] = field(default_factory=dict)


def hashes_of(user_id: str, content: str) -> tuple[str, str]:
    """The tombstone hashes of a content: whole, and its first PREVIEW_CHARS characters."""
    return content_hash(user_id, content), content_hash(user_id, content[:PREVIEW_CHARS])


def is_erased(row: Any) -> bool:
    return row.status == "deleted" and row.status_reason in ERASURE_REASONS


def plan_erasure(
    requests: Sequence[Request],
    rows: Sequence[Any],
    lineage: Iterable[tuple[UUID, UUID]],
    tombstones: Iterable[tuple[str, UUID, str]],
    audited: Sequence[tuple[UUID, UUID]] = (),
    audited_sources: Sequence[tuple[UUID, UUID]] = (),
) -> list[Action]:
    """Actions for the pending requests and tombstones of the rows' users.

    ``rows``: every memory of those users (id, user_id, row_version, status, status_reason,
    superseded_by, content); ``lineage``: (derived_id, source_id) edges among them;
    ``tombstones``: (user_id, memory_id, content_hash); ``audited``: (requested memory no
    longer stored, record the worker made from it), and ``audited_sources``: (requested record
    no longer stored, row the worker made it from), from its audit.
    """
    by_id = {row.id: row for row in rows}
    derived: dict[UUID, set[UUID]] = defaultdict(set)
    sources: dict[UUID, set[UUID]] = defaultdict(set)
    for derived_id, source_id in lineage:
        derived[source_id].add(derived_id)
        sources[derived_id].add(source_id)
    digests = {row.id: content_hash(row.user_id, row.content) for row in rows}
    targets = _requested(requests, rows, by_id)
    _take_audited(targets, requests, audited, by_id, "derived_from")
    _take_audited(targets, requests, audited_sources, by_id, "source_of")
    _take_sources(targets, requests, sources, by_id, [s for _, s in audited_sources])
    _match_tombstones(targets, rows, digests, tombstones)
    _propagate(targets, rows, digests, derived)
    while twins := _twins_with_sources(targets, requests, sources, by_id, audited_sources):
        _walk_sources(targets, twins, sources, by_id)
        _propagate(targets, rows, digests, derived)
    purge_now = {r.id for r in requests if r.purge_now}
    return _actions(targets, by_id, sources, purge_now)


def _requested(
    requests: Sequence[Request], rows: Sequence[Any], by_id: Mapping[UUID, Any]
) -> dict[UUID, _Target]:
    targets: dict[UUID, _Target] = {}
    for request in requests:
        if request.kind == "user":
            ids = [row.id for row in rows if row.user_id == request.user_id]
        else:
            row = by_id.get(request.memory_id)
            ids = [row.id] if row is not None and row.user_id == request.user_id else []
        for memory_id in ids:
            targets.setdefault(memory_id, _Target("erasure")).requests.add(request.id)
    return targets


def _take_audited(
    targets: dict[UUID, _Target],
    requests: Sequence[Request],
    audited: Iterable[tuple[UUID, UUID]],
    by_id: Mapping[UUID, Any],
    key: str,
) -> None:
    """A record the application deleted itself took its lineage with it — the requested memory,
    or a record between it and what was made of it (A, B merged into M, M summarised into S, M
    deleted): the records the worker made from the requested memory (``key`` derived_from),
    and the rows it made it from if the worker made it (source_of), found in the audit through
    such records, are erased with it (and what was derived from them follows through lineage,
    in ``_propagate``)."""
    asked: dict[UUID, list[Request]] = defaultdict(list)
    for request in requests:
        if request.kind == "memory":
            asked[request.memory_id].append(request)
    for target_id, derived_id in audited:
        row = by_id.get(derived_id)
        for request in asked.get(target_id, ()):
            if row is not None and row.user_id == request.user_id:  # never across users
                _add(targets, derived_id, _Target("erasure", {request.id}), key, target_id)


def _take_sources(
    targets: dict[UUID, _Target],
    requests: Sequence[Request],
    sources: Mapping[UUID, set[UUID]],
    by_id: Mapping[UUID, Any],
    audited: Sequence[UUID] = (),
) -> None:
    """A forgotten merged record or summary takes the records it was made from (transitively):
    they hold the same facts, and bringing them back would undo the request. Only downward
    from a requested memory: a derived record erased because one of its sources was is the
    other way round (its other sources come back)."""
    frontier = [r.memory_id for r in requests if r.kind == "memory" and r.memory_id in targets]
    # and from the sources the audit names for a requested record the application deleted
    frontier += [s for s in dict.fromkeys(audited) if s in targets and s not in frontier]
    _walk_sources(targets, frontier, sources, by_id)


def _twins_with_sources(
    targets: Mapping[UUID, _Target],
    requests: Sequence[Request],
    sources: Mapping[UUID, set[UUID]],
    by_id: Mapping[UUID, Any],
    audited_sources: Sequence[tuple[UUID, UUID]],
) -> list[UUID]:
    """Rows erased as the same text as a memory erased downward (a requested memory, or one it
    was made from) whose own sources are not all taken yet: a merged record's exact twin holds
    the same facts, and its sources would otherwise come back (_reactivations) in their own
    words — the forgotten fact on the read path again."""
    down = {r.memory_id for r in requests if r.kind == "memory"} | {s for _, s in audited_sources}
    down |= {m for m, t in targets.items() if "source_of" in t.details}
    return [
        m
        for m, t in targets.items()
        if m not in down
        and any(s not in targets and s in by_id and by_id[s].user_id == by_id[m].user_id
                for s in sources.get(m, ()))
        and any(UUID(v) in down for v in t.details.get("same_content_as", ()))
    ]  # fmt: skip


def _walk_sources(
    targets: dict[UUID, _Target],
    frontier: list[UUID],
    sources: Mapping[UUID, set[UUID]],
    by_id: Mapping[UUID, Any],
) -> None:
    """Take the records ``frontier``'s rows were made from, transitively (same user only)."""
    while frontier:
        added: list[UUID] = []
        for memory_id in frontier:
            owner = by_id[memory_id].user_id
            for source_id in sorted(sources.get(memory_id, ()), key=str):
                source = by_id.get(source_id)
                if source is not None and source.user_id == owner:  # never across users
                    added += _add(targets, source_id, targets[memory_id], "source_of", memory_id)
        frontier = added


def _match_tombstones(
    targets: dict[UUID, _Target],
    rows: Sequence[Any],
    digests: Mapping[UUID, str],
    tombstones: Iterable[tuple[str, UUID, str]],
) -> None:
    ids, hashes = set(), set()
    for user_id, memory_id, digest in tombstones:
        ids.add((user_id, memory_id))
        hashes.add((user_id, digest))
    if not ids:
        return
    for row in rows:
        if row.id in targets or is_erased(row):
            continue
        if (row.user_id, row.id) in ids:
            targets[row.id] = _Target("erasure_tombstone", details={"matched": "id"})
        elif (row.user_id, digests[row.id]) in hashes:
            targets[row.id] = _Target("erasure_tombstone", details={"matched": "content"})


def _propagate(
    targets: dict[UUID, _Target],
    rows: Sequence[Any],
    digests: Mapping[UUID, str],
    derived: Mapping[UUID, set[UUID]],
) -> None:
    """Add derived records and same-content rows of every target, until nothing changes."""
    users = {row.id: row.user_id for row in rows}
    hashes: dict[tuple[str, str], UUID] = {}
    frontier = list(targets)
    while frontier:
        added: list[UUID] = []
        for memory_id in frontier:
            cause = targets[memory_id]
            hashes.setdefault((users[memory_id], digests[memory_id]), memory_id)
            for derived_id in sorted(derived.get(memory_id, ()), key=str):
                if users.get(derived_id) == users[memory_id]:  # never across users
                    added += _add(targets, derived_id, cause, "derived_from", memory_id)
        for row in rows:
            twin = hashes.get((row.user_id, digests[row.id]))
            if twin is not None and twin != row.id:
                added += _add(targets, row.id, targets[twin], "same_content_as", twin)
        frontier = added


def _add(
    targets: dict[UUID, _Target], memory_id: UUID, cause: _Target, key: str, via: UUID
) -> list[UUID]:
    target = targets.get(memory_id)
    if target is None:
        targets[memory_id] = _Target(cause.reason, set(cause.requests), {key: [str(via)]})
        return [memory_id]
    if key in target.details and str(via) not in target.details[key]:
        target.details[key].append(str(via))
    new_requests = cause.requests - target.requests
    target.requests |= new_requests
    return [memory_id] if new_requests else []


def _actions(
    targets: Mapping[UUID, _Target],
    by_id: Mapping[UUID, Any],
    sources: Mapping[UUID, set[UUID]],
    purge_now: set[UUID],
) -> list[Action]:
    deletes, restores, purges = [], [], []
    for memory_id in sorted(targets, key=lambda m: (by_id[m].user_id, str(m))):
        row, target = by_id[memory_id], targets[memory_id]
        group = f"{NAME}:{memory_id}" if sources.get(memory_id) else None
        if not is_erased(row):
            deletes.append(_soft_delete(row, target, group))
            restores += _reactivations(row, targets, by_id, sources, group)
        if target.requests & purge_now:
            purges.append(_purge(row, target, group))
    return deletes + restores + purges


def _request_ids(target: _Target) -> list[str]:
    return sorted(map(str, target.requests))


def _soft_delete(row: Any, target: _Target, group: str | None) -> Action:
    whole, preview = hashes_of(row.user_id, row.content)
    details = {
        "request_ids": _request_ids(target),
        **target.details,
        "content_hash": whole,
        "preview_hash": preview,
    }
    return Action(
        job=NAME, action=Kind.SOFT_DELETE, user_id=row.user_id, reason=target.reason,
        memory_id=row.id, row_version=row.row_version, details=details, group=group,
    )  # fmt: skip


def _reactivations(
    record: Any,
    targets: Mapping[UUID, _Target],
    by_id: Mapping[UUID, Any],
    sources: Mapping[UUID, set[UUID]],
    group: str | None,
) -> list[Action]:
    """Sources the erased ``record`` had absorbed, which are not erased themselves."""
    actions = []
    for source_id in sorted(sources.get(record.id, ()), key=str):
        source = by_id.get(source_id)
        if (
            source is None
            or source.user_id != record.user_id  # never across users
            or source_id in targets
            or is_erased(source)
            or source.status == "active"
            or source.superseded_by != record.id
        ):
            continue
        actions.append(
            Action(
                job=NAME, action=Kind.RESTORE, user_id=source.user_id,
                reason="erasure_reactivated", memory_id=source.id,
                row_version=source.row_version, group=group,
                details={"reactivated_from": str(record.id),
                         "request_ids": _request_ids(targets[record.id])},
            )
        )  # fmt: skip
    return actions


def _purge(row: Any, target: _Target, group: str | None) -> Action:
    return Action(
        job=NAME, action=Kind.HARD_DELETE, user_id=row.user_id, reason="erasure_purge_now",
        memory_id=row.id, row_version=row.row_version, group=group,
        details={"status": "deleted", "status_reason": "erasure",
                 "request_ids": _request_ids(target)},
    )  # fmt: skip


def plan(ctx: BatchContext) -> list[Action]:
    scope = list(ctx.conn.execute(q("erasure_scope"), ctx.params()).scalars())
    if not scope:
        return []
    params = ctx.params(scope=scope)
    requests = [Request(**row._mapping) for row in ctx.conn.execute(q("erasure_requests"), params)]
    rows = ctx.conn.execute(q("erasure_rows"), params).all()
    lineage = [tuple(edge) for edge in ctx.conn.execute(q("erasure_lineage"), params)]
    tombstones = [tuple(t) for t in ctx.conn.execute(q("erasure_tombstones"), params)]
    # a record the application deleted (the requested memory, or one between it and a summary
    # made of its merge) took its lineage with it; the audit still names what was made of what
    asked = [r for r in requests if r.kind == "memory"]
    audited: list[tuple[UUID, UUID]] = []
    audited_sources: list[tuple[UUID, UUID]] = []
    if asked:
        found = {"targets": [r.memory_id for r in asked], "owners": [r.user_id for r in asked]}
        audited = [tuple(e) for e in ctx.conn.execute(q("erasure_audited_derived"), found)]
        audited_sources = [tuple(e) for e in ctx.conn.execute(q("erasure_audited_sources"), found)]
    actions = plan_erasure(requests, rows, lineage, tombstones, audited, audited_sources)
    # reactivated rows are out of play for the later jobs of this batch (they change on apply)
    ctx.taken.update(a.memory_id for a in actions if a.action is Kind.RESTORE)
    return actions


def after_apply(ctx: BatchContext, applied: Sequence[Action], *, run_id: UUID) -> None:
    """On apply only: reactivate, write tombstones, scrub, complete the finished requests."""
    store.finish_batch(ctx, applied, run_id=run_id)
