"""The one executor: carries out a batch's actions inside the caller's transaction.

1. Lock every row the actions name and compare its version (xmin; for merges, contradiction
   obsoletes, importance scores and erasures its content version:
   gc_worker.actions.CONTENT_VERSIONED) with the one recorded when the action was planned. A
   row that is gone or changed has *drifted*: its action — and every action of the same group
   — is skipped and reported, never applied. A row an application transaction holds right now
   is skipped too (``SKIP LOCKED``), never waited for, so the worker cannot deadlock with the
   request path; it is planned again next run. An action whose decision rested on other rows
   (``broken_premises``) drifts if those changed.
2. Apply the rest with set-based statements, each checked against the count it was given
   (a mismatch raises, and the caller's transaction rolls back whole).
3. Return what was applied with each row's prior state, for the audit and for restore.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection

from gc_worker.actions import CONTENT_VERSIONED, ERASURE_REASONS, TARGET_STATUS, Action, Kind
from gc_worker.errors import RunFailed
from gc_worker.queries import q

# The columns a row's prior state records (the lock_rows query builds them as JSON).
PRIOR_FIELDS = (
    "status",
    "status_reason",
    "status_changed_at",
    "superseded_by",
    "deleted_at",
    "valid_until",
    "importance",
    "importance_assessed_at",
)


@dataclass
class Outcome:
    applied: list[Action] = field(default_factory=list)
    drifted: list[Action] = field(default_factory=list)
    prior: dict[UUID, str] = field(default_factory=dict)  # each locked row's prior state, JSON


def execute(
    conn: Connection, actions: Sequence[Action], *, now: datetime, run_id: UUID | None = None
) -> Outcome:
    """Apply ``actions`` (in plan order) in ``conn``'s transaction; see the module docstring."""
    versions, prior = lock_rows(conn, actions)
    broken = broken_premises(conn, actions, versions)
    splices: list[tuple[UUID, UUID]] = []
    drifted = _hold_purges(conn, actions, versions, broken, splices)
    outcome = Outcome(prior=prior)
    for action in actions:
        (outcome.drifted if id(action) in drifted else outcome.applied).append(action)
    _apply(conn, outcome.applied, now=now, splices=splices)
    _queue_reviews(conn, [a for a in outcome.applied if a.action is Kind.REVIEW], run_id)
    return outcome


@dataclass
class Versions:
    """Each locked row's versions at apply: ``xmin``, and its content version where an action
    on it or resting on it is content-versioned (gc_worker.actions.CONTENT_VERSIONED)."""

    xmin: dict[UUID, int] = field(default_factory=dict)
    content: dict[UUID, int] = field(default_factory=dict)

    def add(self, rows: Sequence[Any]) -> None:
        for row in rows:
            self.xmin[row.id] = row.row_version
            if row.content_version is not None:
                self.content[row.id] = row.content_version

    def copy(self) -> Versions:
        return Versions(dict(self.xmin), dict(self.content))

    def of(self, action: Action, memory_id: UUID) -> int | None:
        """``memory_id``'s current version as ``action`` recorded it; None: gone or held."""
        return (self.content if action.content_versioned else self.xmin).get(memory_id)


def lock_rows(conn: Connection, actions: Sequence[Action]) -> tuple[Versions, dict[UUID, str]]:
    # (the rows are locked in the statement's ORDER BY id, whatever the list's order)
    ids = list({a.memory_id for a in actions if a.row_version is not None})
    versions = Versions()
    if not ids:
        return versions, {}
    # content versions of the rows content-versioned actions change or rest on (their premises
    # are mostly rows the batch changes too: the newer fact of one pair, the loser of another)
    content_ids = list(
        {i for a in actions if a.content_versioned for i in (a.memory_id, *_premises(a))}
    )
    rows = conn.execute(q("lock_rows"), {"ids": ids, "content_ids": content_ids}).all()
    versions.add(rows)
    # the prior state is JSON text built by PostgreSQL (PRIOR_FIELDS, timestamps in ISO 8601),
    # passed to the audit as is: no parsing and re-serialising of 100,000s of small documents
    return versions, {row.id: row.prior for row in rows}


def broken_premises(conn: Connection, actions: Sequence[Action], versions: Versions) -> set[int]:
    """ids() of actions whose decision rested on other rows that changed since planning:

    - ``details.depends_on`` ({id: version}): rows the action was decided against, e.g. the
      newer fact a contradiction closes the older one for (versioned as the action's own
      row: a content-versioned action's premise is a content version). Gone, changed, or held
      by an application transaction right now (``SKIP LOCKED``: never waited for) — the
      premise is broken. They are share-locked to the end of the batch, so it cannot break
      after the check;
    - ``details.user_active`` (user_cap): the user's active rows when the evictions were
      chosen; fewer now (the application deleted some) and evicting as planned would take the
      user below the cap;
    - a link made since planning that a merge rests on (``_merges_on_declared_rows``);
    - a planned action an erasure scrubbed since (``details.scrubbed``): it named an erased
      memory or a forgotten user, and its details were cut to ids and codes, premises with
      them (an obsolete for a newer fact since erased would otherwise apply unchecked).
    """
    # a copy: a row lock_rows skipped (the application holds it) stays drifted for its own
    # action even when lock_dependencies can share-lock it as another action's premise
    known = versions.copy()
    needed = {dep for a in actions for dep in _premises(a) if known.of(a, dep) is None}
    if needed:
        known.add(conn.execute(q("lock_dependencies"), {"ids": list(needed)}).all())
    capped = sorted({a.user_id for a in actions if "user_active" in a.details})
    active: dict[str, int] = {}
    if capped:
        active = {r.user_id: r.active for r in conn.execute(q("active_counts"), {"users": capped})}
    return (
        {
            id(a)
            for a in actions
            if any(known.of(a, dep) != v for dep, v in _premises(a).items())
            or active.get(a.user_id, 0) < a.details.get("user_active", 0)
        }
        | {id(a) for a in actions if a.details.get("scrubbed")}
        | _merges_on_declared_rows(conn, actions)
        | _about_changed_rows(conn, actions)
        | _dismissed_since(conn, actions)
    )


def _dismissed_since(conn: Connection, actions: Sequence[Action]) -> set[int]:
    """ids() of model merges, verdicts and importance scores a person dismissed after planning
    (a restore of the same decision made meanwhile by another run, a `resolve --dismiss`):
    planning leaves dismissed sets apart, and a restore puts the rows' status fields (or
    scores) back exactly, so no version would drift them."""
    merges = [a for a in actions if (a.job, a.action) == ("compaction", Kind.MERGE)]
    verdicts = [
        a for a in actions
        if (a.job, a.action) == ("contradiction", Kind.OBSOLETE)
        and a.details.get("basis") == "similar" and a.details.get("superseded_by")
    ]  # fmt: skip
    scores = [a for a in actions if (a.job, a.action) == ("importance", Kind.SET_IMPORTANCE)]
    if not merges and not verdicts and not scores:
        return set()
    params = {"ids": [a.memory_id for a in [*merges, *verdicts, *scores]],
              "users": sorted({a.user_id for a in [*merges, *verdicts, *scores]})}  # fmt: skip
    dismissed: dict[str, list[set[str]]] = {"compaction": [], "contradiction": []}
    unscored: set[tuple[str, str]] = set()  # (user, memory) a restored score keeps unscored
    for row in conn.execute(q("dismissed_among"), params):
        if row.kind == "importance":
            unscored |= {(row.user_id, str(m)) for m in row.memory_ids}
        else:
            dismissed[row.kind].append({str(m) for m in row.memory_ids})
    groups: dict[Any, set[str]] = {}
    for a in merges:
        groups.setdefault(a.group, set()).add(str(a.memory_id))
    apart = {
        g for g, ids in groups.items() if any(len(ids & s) >= 2 for s in dismissed["compaction"])
    }
    return {id(a) for a in merges if a.group in apart} | {
        id(a)
        for a in verdicts
        if any({str(a.memory_id), str(a.details["superseded_by"])} <= s
               for s in dismissed["contradiction"])
    } | {id(a) for a in scores if (a.user_id, str(a.memory_id)) in unscored}  # fmt: skip


def _about_changed_rows(conn: Connection, actions: Sequence[Action]) -> set[int]:
    """ids() of reviews and deferred groups (which change no row, so no version drifts them)
    naming a row that is gone, erased since planning (purged or not) or now another user's: a
    stale plan applied after a "forget me" would otherwise queue the erased ids for review
    again, and a question about two users' rows must never be asked (its resolution would
    obsolete one user's memory in favour of another's). And reviews a stale plan would ask
    again: a row it names is no longer active (a person resolved the question, `--keep`), or
    the same set has an open review or one a person dismissed — what planning leaves alone
    (contradiction_blocked_pairs)."""
    named = {
        id(a): (a.user_id, ({UUID(str(m)) for m in a.details.get("memory_ids", ())}
                            | {a.memory_id}) - {None})
        for a in actions
        if a.action in (Kind.REVIEW, Kind.DEFERRED)
    }  # fmt: skip
    ids = set().union(*(rows for _, rows in named.values())) if named else set()
    if not ids:
        return set()
    params = {"ids": list(ids), "erasure_reasons": list(ERASURE_REASONS)}
    state = {row.id: row for row in conn.execute(q("named_rows_state"), params)}
    reviews = {id(a) for a in actions if a.action is Kind.REVIEW}
    users = sorted({user for key, (user, _) in named.items() if key in reviews})
    blocked = conn.execute(q("contradiction_blocked_pairs"), {"users": users}) if users else ()
    asked = {(row.user_id, frozenset(row.memory_ids)) for row in blocked}
    return {
        key
        for key, (user, rows) in named.items()
        if any(state[m].erased or state[m].user_id != user for m in rows)
        or (
            key in reviews
            and ((user, frozenset(rows)) in asked or any(state[m].status != "active" for m in rows))
        )
    }


def _hold_purges(
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
    the edges of the purges that apply). A held purge can hold back its group: repeated until
    nothing changes."""
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
    now, and ``splices`` is set to those edges, for ``_purge``."""
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


def _merges_on_declared_rows(conn: Connection, actions: Sequence[Action]) -> set[int]:
    """ids() of merges resting on a link — which no row version covers — made since planning:
    a member some active or obsolete row of the user now declares it supersedes. Compaction
    leaves declared rows out, because the merged record (a new id) would not be shadowed by the
    declaration: the stale fact would be current again beside its correction. (Erasure purges
    rest on lineage: _hold_purges.)"""
    members = [a for a in actions if (a.job, a.action) == ("compaction", Kind.MERGE)]
    if not members:
        return set()
    params = {"ids": [a.memory_id for a in members],
              "users": sorted({a.user_id for a in members})}  # fmt: skip
    declared = set(conn.execute(q("declared_superseded"), params).scalars())
    return {id(a) for a in members if a.memory_id in declared}


def _premises(action: Action) -> dict[UUID, int]:
    """``details.depends_on`` ({id: version}) with the ids as UUIDs."""
    return {UUID(str(k)): v for k, v in action.details.get("depends_on", {}).items()}


def drifted_actions(
    actions: Sequence[Action], versions: Versions, broken: set[int] = frozenset()
) -> set[int]:
    """ids() of actions whose row changed since planning, or whose premise ``broken``
    (broken_premises), widened to their whole group and to the actions that rest on a drifted
    group (``details.depends_on_group``: one way, the group does not drift with them)."""
    bad = set(broken) | {
        id(a)
        for a in actions
        if a.row_version is not None and versions.of(a, a.memory_id) != a.row_version
    }
    while True:
        groups = {a.group for a in actions if id(a) in bad and a.group is not None}
        more = {
            id(a)
            for a in actions
            if a.group in groups or a.details.get("depends_on_group") in groups
        }
        if more <= bad:
            return bad
        bad |= more


def _apply(
    conn: Connection, actions: list[Action], *, now: datetime,
    splices: Sequence[tuple[UUID, UUID]] = (),
) -> None:  # fmt: skip
    by_kind: dict[Kind, list[Action]] = {}
    for action in actions:
        by_kind.setdefault(action.action, []).append(action)
    _create_records(conn, by_kind.get(Kind.CREATE_MERGED, []), now=now)
    _set_importance(conn, by_kind.get(Kind.SET_IMPORTANCE, []), now=now)
    statuses = [a for kind in TARGET_STATUS for a in by_kind.get(kind, [])]
    _set_status(conn, statuses, now=now)
    _purge(conn, by_kind.get(Kind.HARD_DELETE, []), splices)


def _checked(conn: Connection, name: str, params: dict[str, Any], expected: int) -> None:
    touched = len(conn.execute(q(name), params).all())
    if touched != expected:
        raise RunFailed(
            f"{name} touched {touched} rows where {expected} were planned and locked; "
            "the batch was rolled back"
        )


def _set_status(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    params = {
        "now": now,
        "ids": [a.memory_id for a in actions],
        "statuses": [TARGET_STATUS[a.action] for a in actions],
        "reasons": [a.reason for a in actions],
        "superseded": [_uuid_or_none(a.details.get("superseded_by")) for a in actions],
        "valid_until": [a.details.get("close_valid_until") for a in actions],
        "erasure_reasons": list(ERASURE_REASONS),
    }
    _checked(conn, "apply_status", params, len(actions))


def _set_importance(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    params = {
        "now": now,
        "ids": [a.memory_id for a in actions],
        "importance": [int(a.details["importance"]) for a in actions],
    }
    _checked(conn, "apply_importance", params, len(actions))


def _create_records(conn: Connection, actions: list[Action], *, now: datetime) -> None:
    if not actions:
        return
    records = [dict(a.details["record"], id=str(a.memory_id), user_id=a.user_id) for a in actions]
    _checked(conn, "insert_records", {"records": json.dumps(records), "now": now}, len(actions))
    derived = [a.memory_id for a in actions for _ in a.details["sources"]]
    sources = [UUID(str(s)) for a in actions for s in a.details["sources"]]
    conn.execute(q("insert_lineage"), {"derived": derived, "sources": sources})
    # a read of a member since planning does not drift a merge (content version): the record
    # takes its members' access bookkeeping as it is now, not as planned
    merged = [a.memory_id for a in actions if (a.job, Kind.MERGE) in CONTENT_VERSIONED]
    if merged:
        conn.execute(q("merged_access"), {"ids": merged})


def _purge(
    conn: Connection, actions: list[Action], splices: Sequence[tuple[UUID, UUID]] = ()
) -> None:
    """Delete the rows, then every copy of their content the worker keeps: their own audit and
    plan rows, deferred groups' previews, records merged or summarised from them in plans and
    audit (cut to ids and codes, as an erasure scrubs), cached model decisions about them."""
    if not actions:
        return
    from gc_worker.erasure_scrub import KEEP_DETAILS  # (it imports this module)

    ids = [a.memory_id for a in actions]
    id_texts = [str(i) for i in ids]
    if splices:  # their rows are key-share locked (_unspliceable): the inserts wait on nothing
        derived, sources = zip(*splices, strict=True)
        conn.execute(q("insert_lineage"), {"derived": list(derived), "sources": list(sources)})
    _checked(conn, "purge_rows", {"ids": ids}, len(ids))
    conn.execute(q("scrub_audit"), {"ids": ids, "id_texts": id_texts})
    params = {"id_texts": id_texts, "keep_details": list(KEEP_DETAILS)}
    conn.execute(q("scrub_created_from_purged"), params)
    conn.execute(q("drop_llm_cache_of_purged"), {"ids": ids})


def _queue_reviews(conn: Connection, actions: list[Action], run_id: UUID | None) -> None:
    if not actions:
        return
    items = [
        {
            "user_id": a.user_id,
            "kind": a.details.get("kind", a.job),
            "memory_ids": [str(m) for m in a.details.get("memory_ids", [a.memory_id])],
            "reason": a.reason,
            "details": dict(a.details),
        }
        for a in actions
    ]
    _checked(conn, "insert_reviews", {"run_id": run_id, "items": json.dumps(items)}, len(items))


def _uuid_or_none(value: Any) -> UUID | None:
    return None if value is None else UUID(str(value))
