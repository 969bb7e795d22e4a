"""Purges held back while what they rest on does not apply (gc_worker.execute).

A purge's ON DELETE CASCADE drops the row's lineage; ``hold_purges`` returns the batch's
drifted actions (gc_worker.drift) widened by the purges that must wait: an erased row's while
a record derived from it is still live, an erasure purge while another action of its requests
drifts, another job's purge of a row a pending erasure request names, and any purge whose
lineage splice or cascade would wait on a row the application holds (the worker waits on no
application lock).
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from sqlalchemy.engine import Connection

from gc_worker.actions import ERASURE_REASONS, Action, Kind
from gc_worker.drift import Versions, drifted_actions
from gc_worker.queries import q


def hold_purges(
    conn: Connection, actions: Sequence[Action], versions: Versions, broken: set[int],
    splices: list[tuple[UUID, UUID]],
) -> set[int]:  # fmt: skip
    """The drifted actions (drifted_actions), with erasure purges held back while what they
    rest on does not apply. A purge's ON DELETE CASCADE drops the row's lineage, which is how a
    request's completion reaches the records derived from it and the records a requested memory
    was made from: purged while one of those is not erased, the request would complete with
    that text still stored (and verify-erasure would find the store clean). So a purge of an
    erased row — by erasure (--purge-now) or by hard_delete after the retention — drifts while
    a record derived from it (same user) is neither erased nor erased by an action of this
    batch that applies, and an erasure purge drifts while another erasure action of its
    requests drifts; a purge by another job drifts while a pending request names its row (the
    erasure job has not erased it yet), and any purge drifts while a row the lineage it must
    splice first would name is held by the application (``_unspliceable``; ``splices`` gets
    the edges of the purges that apply, for gc_worker.execute's purge). A held purge can hold
    back its group: repeated until nothing changes."""
    broken = broken | _purges_of_pending_targets(conn, actions)
    drifted = drifted_actions(actions, versions, broken)
    while True:
        held = _purges_with_live_derived(conn, actions, drifted)
        held |= _unspliceable(conn, actions, drifted, splices)
        held |= _lineage_held(conn, actions, drifted)
        open_requests = {
            r
            for a in actions
            if id(a) in drifted and a.job == "erasure"
            for r in a.details.get("request_ids", ())
        }
        held |= {
            id(a)
            for a in actions
            if a.job == "erasure" and a.action is Kind.HARD_DELETE
            and open_requests & set(a.details.get("request_ids", ()))
        }  # fmt: skip
        if held <= drifted:
            return drifted
        broken = broken | held
        drifted = drifted_actions(actions, versions, broken)


def _unspliceable(
    conn: Connection, actions: Sequence[Action], drifted: set[int],
    splices: list[tuple[UUID, UUID]],
) -> set[int]:  # fmt: skip
    """ids() of the purges (not drifted) whose lineage splice (sql/execute.sql splice_edges)
    names a row the application holds: the new lineage's foreign keys would wait on it (the
    worker waits on no application lock). The rows of the others' edges are key-share locked
    now, and ``splices`` is set to those edges, for the purge (gc_worker.execute)."""
    purges = {
        a.memory_id: id(a)
        for a in actions
        if a.action is Kind.HARD_DELETE and id(a) not in drifted and a.memory_id is not None
    }
    edges = conn.execute(q("splice_edges"), {"ids": list(purges)}).all() if purges else []
    ends = list({row_id for e in edges for row_id in (e.derived_id, e.source_id)})
    locked = set(conn.execute(q("lock_splice_ends"), {"ids": ends}).scalars()) if ends else set()
    held = {purges[e.root] for e in edges if not {e.derived_id, e.source_id} <= locked}
    splices[:] = [(e.derived_id, e.source_id) for e in edges if purges[e.root] not in held]
    return held


def _lineage_held(conn: Connection, actions: Sequence[Action], drifted: set[int]) -> set[int]:
    """ids() of the purges (not drifted) a lineage row of which the application holds (its own
    delete of a record cascading over it): the purge's ON DELETE CASCADE would wait on it, and
    the application's next delete could deadlock with the worker. The others' rows are locked
    now."""
    purges = {
        a.memory_id: id(a)
        for a in actions
        if a.action is Kind.HARD_DELETE and id(a) not in drifted and a.memory_id is not None
    }
    if not purges:
        return set()
    params = {"ids": list(purges)}
    edges = set(map(tuple, conn.execute(q("purge_lineage"), params).all()))
    if not edges:
        return set()
    edges -= set(map(tuple, conn.execute(q("lock_purge_lineage"), params).all()))
    return {purges[end] for edge in edges for end in edge if end in purges}


def _purges_of_pending_targets(conn: Connection, actions: Sequence[Action]) -> set[int]:
    """ids() of purges by another job than erasure of rows a pending erasure request names
    (sql/execute.sql purge_of_pending_targets): held until the erasure job has erased them."""
    purges = {
        a.memory_id: id(a)
        for a in actions
        if a.action is Kind.HARD_DELETE and a.job != "erasure" and a.memory_id is not None
    }
    if not purges:
        return set()
    named = conn.execute(q("purge_of_pending_targets"), {"ids": list(purges)}).scalars()
    return {purges[memory_id] for memory_id in named}


def _purges_with_live_derived(
    conn: Connection, actions: Sequence[Action], drifted: set[int]
) -> set[int]:
    purges = [
        a
        for a in actions
        if a.action is Kind.HARD_DELETE and id(a) not in drifted
        and (a.job == "erasure" or a.details.get("status_reason") in ERASURE_REASONS)
    ]  # fmt: skip
    if not purges:
        return set()
    erasing = [
        a.memory_id
        for a in actions
        if a.job == "erasure" and a.action is Kind.SOFT_DELETE and id(a) not in drifted
    ]
    params = {"ids": [a.memory_id for a in purges], "erasing": erasing,
              "erasure_reasons": list(ERASURE_REASONS)}  # fmt: skip
    live = set(conn.execute(q("purge_with_live_derived"), params).scalars())
    return {id(a) for a in purges if a.memory_id in live}
