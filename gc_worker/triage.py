"""Which users each job has work for, from one pass over ``memories`` at the start of a run.

Finding out that a user has nothing due costs as much as finding what is due: a batch reads its
users' rows once per job, and a user's rows are spread over the whole table. A run that has
little to do (the second run of a night, a store that is kept clean) would pay that for every
user. So a run first asks one grouped, parallel, sequential scan which users each job will find
work for; the jobs that can answer (a module attribute ``WORK`` naming an aggregate in
``sql/triage.sql``, and/or ``PICK``, below; ``work_params(settings, now)`` for the binds, which
the SQL names ``:<job>__<bind>``) are then planned, and their scores refreshed, only for those
users — plus, when planning, any user whose importance an earlier job of the batch re-assessed
(planning writes no row, so that is the only way a row can become a candidate after the scan:
retired rows and created records only remove work), and when refreshing after apply, any user an
applied action touched (an erasure re-activating rows, a new importance). When every job of the
run can answer, users with no work at all get no batch.

The jobs whose candidates are a plain row predicate (``PICK``: decay, usage_prune) go one step
further: the same scan collects their candidate ids per user, and a batch reads those rows by
id (``<query>_picked``) instead of every active row of its users, plus the rows re-assessed
earlier in the batch (planning writes nothing else a candidates query could see).

The scan sees the store as of the run's start. A row the application changes afterwards is
caught at apply time as drifted, as always; a user who *gains* work after the scan is served by
the next run. ``run.skip_idle_users = false`` turns the scan off (every job reads every user).
tests/test_properties.py checks, over generated stores and policies, that a run with the scan
plans exactly what a run without it plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

import jobs
from gc_worker.config import Settings
from gc_worker.queries import q

Work = dict[str, set[str]]  # job name → users it has work for


@dataclass
class Scan:
    """What the run-start scan found: per answering job the users it has work for, and for the
    jobs that can also pick their rows (``PICK``), those rows' ids per user."""

    users: Work = field(default_factory=dict)
    ids: dict[str, dict[str, list[str]]] = field(default_factory=dict)


def answering(job_names: Sequence[str]) -> list[str]:
    """The jobs of ``job_names`` that the scan can answer for."""
    return [n for n in job_names if _has(n, "WORK") or _has(n, "PICK")]


def _has(job: str, attribute: str) -> bool:
    return bool(getattr(jobs.REGISTRY[job], attribute, None))


def scan(
    conn: Connection, users: Sequence[str], job_names: Sequence[str], settings: Settings,
    now: datetime, *, every_user: bool = False,
) -> Scan | None:  # fmt: skip
    """Per answering job, the users of ``users`` it has work for (and picked row ids); None when
    nothing is scanned (the scan is switched off, or no job of the run can answer).

    ``every_user``: ``users`` is every user of the store (a run over all of them), so the scan
    reads every row without testing its user against the list (~15 % of the scan at 1M rows /
    10k users); a user whose first memory was written since ``users`` was read may then be in
    the answer, and is ignored: batches are made of ``users`` only."""
    names = answering(job_names)
    if not settings.run.skip_idle_users or not names or not users:
        return None
    picking = [n for n in names if _has(n, "PICK")]
    judging = [n for n in names if _has(n, "WORK")]
    columns = [f'{q(jobs.REGISTRY[n].WORK).text} AS "{n}"' for n in judging]
    columns += [
        f'array_agg(id::text) FILTER (WHERE {q(jobs.REGISTRY[n].PICK).text}) AS "{n}__ids"'
        for n in picking
    ]
    params: dict[str, Any] = {"users": list(users), "now": now}
    for name in names:
        binds = jobs.REGISTRY[name].work_params(settings, now)
        params |= {f"{name}__{key}": value for key, value in binds.items()}
    where = "" if every_user else " WHERE user_id = ANY(:users)"
    statement = f"SELECT user_id, {', '.join(columns)} FROM memories{where} GROUP BY user_id"
    found = Scan({name: set() for name in names}, {name: {} for name in picking})
    conn.execute(q("scan_settings"))
    for row in conn.execute(sa.text(statement), params).mappings():
        for name in judging:
            if row[name]:
                found.users[name].add(row["user_id"])
        for name in picking:  # a user with candidate rows has work too
            if row[f"{name}__ids"]:
                found.users[name].add(row["user_id"])
                found.ids[name][row["user_id"]] = row[f"{name}__ids"]
    return found


def with_work(users: Sequence[str], job_names: Sequence[str], found: Scan | None) -> list[str]:
    """``users`` less those no job of the run has work for (all of them when a job of the run
    cannot answer: it reads every user)."""
    if found is None or len(found.users) < len(job_names):
        return list(users)
    busy = set().union(*found.users.values())
    return [u for u in users if u in busy]


def for_batch(found: Scan | None, users: Sequence[str]) -> dict[str, Any] | None:
    """What a batch of ``users`` stores in ``gc_run_batches.work``: ``{"users": {job: [user…]},
    "ids": {job: [memory id…]}}``."""
    if found is None:
        return None
    return {
        "users": {name: [u for u in users if u in them] for name, them in found.users.items()},
        "ids": {
            name: [i for u in users for i in per_user.get(u, ())]
            for name, per_user in found.ids.items()
        },
    }
