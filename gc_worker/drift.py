"""Drift: which of a batch's actions may no longer be applied as planned (gc_worker.execute).

- ``lock_rows``: lock every row the actions name (``FOR UPDATE SKIP LOCKED``: a row an
  application transaction holds is skipped, never waited for) and read its versions — ``xmin``,
  and for content-versioned actions (gc_worker.actions.CONTENT_VERSIONED) its content version —
  with its prior state (gc_worker.execute.PRIOR_FIELDS, as JSON text) for the audit.
- ``broken_premises``: the actions whose decision rested on other rows, counts or links that
  changed since planning (``details.depends_on``, ``details.user_active``, a new
  ``supersedes`` declaration, an erasure's scrub, a person's dismissal, a review's rows).
- ``drifted_actions``: the actions whose own row is gone, held or changed, or whose premise
  broke, widened to their whole group and to the actions resting on a drifted group
  (``details.depends_on_group``, one way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy.engine import Connection

from gc_worker.actions import ERASURE_REASONS, Action, Kind
from gc_worker.queries import q


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


def _merges_on_declared_rows(conn: Connection, actions: Sequence[Action]) -> set[int]:
    """ids() of merges resting on a link — which no row version covers — made since planning:
    a member some active or obsolete row of the user now declares it supersedes. Compaction
    leaves declared rows out, because the merged record (a new id) would not be shadowed by the
    declaration: the stale fact would be current again beside its correction. (Erasure purges
    rest on lineage: gc_worker.purge_holds.)"""
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
