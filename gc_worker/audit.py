"""The worker's record of what it planned and did (``gc_actions``), written in the batch's
transaction, so a memory change and its audit row commit or roll back together."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gc_worker.actions import Action, Kind
from gc_worker.execute import Outcome
from gc_worker.queries import q
from gc_worker.tables import gc_run_batches


def batches_insert() -> sa.Insert:
    return sa.insert(gc_run_batches)


def record(
    conn: Connection,
    run_id: UUID,
    batch_no: int,
    actions: Sequence[Action],
    *,
    outcome: str,
    prior: dict[UUID, str] | dict[UUID, dict[str, Any]] | None = None,
    seq_start: int = 0,
) -> None:
    """Write one ``gc_actions`` row per action with COPY (one round trip for any number).

    ``prior`` values are JSON text (execute.lock_rows) or dicts; an action without one stores
    JSON ``null``.
    """
    if not actions:
        return
    prior = prior or {}
    driver = conn.connection.driver_connection
    try:
        with driver.cursor() as cursor, cursor.copy(COPY_ACTIONS) as copy:
            for seq, action in enumerate(actions, start=seq_start):
                copy.write_row(
                    _copy_row(run_id, batch_no, seq, action, outcome, prior.get(action.memory_id))
                )
    except psycopg.Error as exc:  # the driver's own statement: raised as SQLAlchemy's are, so
        # a conflict (a lock_timeout on the run's row, its foreign key) is retried and a lost
        # connection stops the run (db.translated_errors) instead of failing the batch
        lost = conn.dialect.is_disconnect(exc, driver, None)
        raise sa.exc.DBAPIError.instance(
            COPY_ACTIONS, None, exc, psycopg.Error, hide_parameters=True,
            connection_invalidated=lost, dialect=conn.dialect,
        ) from exc  # fmt: skip


COPY_ACTIONS = (
    "COPY gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id, reason, details,"
    " row_version, outcome, prior, content_preview) FROM STDIN"
)


def _copy_row(
    run_id: UUID, batch_no: int, seq: int, action: Action, outcome: str, prior: Any
) -> tuple[Any, ...]:
    details = dict(action.details)
    if action.group is not None:
        details["group"] = action.group
    return (
        run_id, batch_no, seq, action.job, action.action.value, action.memory_id,
        action.user_id, action.reason, json.dumps(details), action.row_version, outcome,
        prior if isinstance(prior, str) else json.dumps(prior), action.preview,
    )  # fmt: skip


def record_outcome(conn: Connection, run_id: UUID, batch_no: int, outcome: Outcome) -> None:
    record(conn, run_id, batch_no, outcome.applied, outcome="applied", prior=outcome.prior)
    record(
        conn, run_id, batch_no, outcome.drifted, outcome="drifted",
        prior=outcome.prior, seq_start=len(outcome.applied),
    )  # fmt: skip


def load_planned(conn: Connection, run_id: UUID, batch_no: int) -> list[Action]:
    rows = conn.execute(q("planned_actions"), {"run_id": run_id, "batch_no": batch_no})
    return [action_from_row(row) for row in rows]


def action_from_row(row: Any) -> Action:
    details = dict(row.details)
    group = details.pop("group", None)
    return Action(
        job=row.job,
        action=Kind(row.action),
        user_id=row.user_id,
        reason=row.reason,
        memory_id=row.memory_id,
        row_version=row.row_version,
        details=details,
        preview=row.content_preview,
        group=group,
    )


def actions_of(rows: Iterable[Any]) -> list[Action]:
    return [action_from_row(row) for row in rows]
