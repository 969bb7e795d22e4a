"""Which users each job has work for, from one pass over ``memories`` at the start of a run.

Finding out that a user has nothing due costs as much as finding what is due: a batch reads its
users' rows once per job, and a user's rows are spread over the whole table. A run that has
little to do (the second run of a night, a store that is kept clean) would pay that for every
user. So a run first asks one grouped, parallel, sequential scan which users each job will find
work for; the jobs that can answer (a module attribute ``WORK`` naming an aggregate in
``sql/triage.sql``, and ``work_params(settings, now)`` for its binds) are then planned, and
their scores refreshed, only for those users — plus any user an earlier job of the same batch
acted on (an erasure that re-activates rows, an importance re-assessment, a merge), because
that can give a later job work the scan could not see. When every job of the run can answer,
users with no work at all get no batch.

The scan sees the store as of the run's start. A row the application changes afterwards is
caught at apply time as drifted, as always; a user who *gains* work after the scan is served by
the next run. ``run.skip_idle_users = false`` turns the scan off (every job reads every user).
tests/test_properties.py checks, over generated stores and policies, that a run with the scan
plans exactly what a run without it plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

import jobs
from gc_worker.config import Settings
from gc_worker.queries import q

Work = dict[str, set[str]]  # job name → users it has work for


def answering(job_names: Sequence[str]) -> list[str]:
    """The jobs of ``job_names`` that the scan can answer for."""
    return [n for n in job_names if getattr(jobs.REGISTRY[n], "WORK", None)]


def scan(
    conn: Connection, users: Sequence[str], job_names: Sequence[str], settings: Settings,
    now: datetime,
) -> Work | None:  # fmt: skip
    """Per answering job, the users of ``users`` it has work for; None when nothing is scanned
    (the scan is switched off, or no job of the run can answer)."""
    names = answering(job_names)
    if not settings.run.skip_idle_users or not names or not users:
        return None
    columns = ", ".join(f'{q(jobs.REGISTRY[n].WORK).text} AS "{n}"' for n in names)
    params: dict[str, Any] = {"users": list(users), "now": now}
    for name in names:
        params |= jobs.REGISTRY[name].work_params(settings, now)
    statement = (
        f"SELECT user_id, {columns} FROM memories WHERE user_id = ANY(:users) GROUP BY user_id"
    )
    work: Work = {name: set() for name in names}
    for row in conn.execute(sa.text(statement), params).mappings():
        for name in names:
            if row[name]:
                work[name].add(row["user_id"])
    return work


def with_work(users: Sequence[str], job_names: Sequence[str], work: Work | None) -> list[str]:
    """``users`` less those no job of the run has work for (all of them when a job of the run
    cannot answer: it reads every user)."""
    if work is None or len(work) < len(job_names):
        return list(users)
    busy = set().union(*work.values())
    return [u for u in users if u in busy]


def for_batch(work: Work | None, users: Sequence[str]) -> dict[str, list[str]] | None:
    """What a batch of ``users`` stores in ``gc_run_batches.work``."""
    if work is None:
        return None
    return {name: [u for u in users if u in found] for name, found in work.items()}
