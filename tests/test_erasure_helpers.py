"""Building blocks for the erasure tests: merges, reviews and audit rows made through the real
executor, and a scan of every text column of the whole database."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import sqlalchemy as sa

from gc_worker import audit
from gc_worker.actions import Action, Kind
from gc_worker.db import transaction
from gc_worker.execute import execute
from gc_worker.queries import q
from tests.store import NOW


def version(engine: sa.Engine, memory_id: UUID) -> int:
    """The row's content version: what compaction's merges record (gc_worker.actions)."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT memory_gc_content_version(m) FROM memories m WHERE id = :id"),
            {"id": memory_id},
        ).scalar_one()


def apply_actions(engine: sa.Engine, actions: Sequence[Action], now: datetime = NOW) -> UUID:
    """Execute actions as an audited apply run (what the engine does for one batch)."""
    run_id = uuid4()
    with transaction(engine) as conn:
        row = {
            "id": run_id,
            "mode": "apply",
            "trigger": "test",
            "now": now,
            "users": None,
            "jobs": sorted({a.job for a in actions}),
            "settings": "{}",
            "plan_run_id": None,
        }
        conn.execute(q("insert_run"), row)  # fmt: skip
        outcome = execute(conn, actions, now=now, run_id=run_id)
        assert not outcome.drifted
        audit.record_outcome(conn, run_id, 0, outcome)
        conn.execute(q("complete_restore_run"), {"run_id": run_id})
    return run_id


def merge(
    engine: sa.Engine, user: str, members: Sequence[UUID], content: str, embedding: list[float]
) -> UUID:
    """A merged record built from ``members`` by CREATE_MERGED + MERGE actions."""
    merged = uuid4()
    record = {
        "content": content,
        "embedding": embedding,
        "memory_type": "semantic",
        "source": "gc_merge",
        "importance": 3,
        "metadata": {"merged_from": len(members)},
    }
    actions = [
        Action(
            job="compaction",
            action=Kind.CREATE_MERGED,
            user_id=user,
            reason="near_duplicate",
            memory_id=merged,
            group="g",
            details={"record": record, "sources": [str(m) for m in members]},
            preview=content[:200],
        )
    ]
    actions += [Action(job="compaction", action=Kind.MERGE, user_id=user, reason="near_duplicate",
                       memory_id=m, row_version=version(engine, m), group="g",
                       details={"superseded_by": str(merged), "into": str(merged),
                                "rationale": f"folded into: {content}"})
                for m in members]  # fmt: skip
    apply_actions(engine, actions)
    return merged


def review(engine: sa.Engine, user: str, memory_ids: Sequence[UUID], texts: Sequence[str]) -> None:
    """A review item naming ``memory_ids`` whose details quote their texts."""
    action = Action(
        job="contradiction", action=Kind.REVIEW, user_id=user, reason="lower_trust_newer",
        memory_id=memory_ids[0],
        details={"kind": "contradiction", "memory_ids": [str(m) for m in memory_ids],
                 "texts": list(texts)},
    )  # fmt: skip
    apply_actions(engine, [action])


def cache_decision(
    engine: sa.Engine, user: str, memory_ids: Sequence[UUID], value: dict[str, Any]
) -> None:
    from gc_worker.llm_store import PostgresDecisionCache

    key = uuid4().hex
    PostgresDecisionCache(engine).put(key, "merge_group", user, [str(m) for m in memory_ids], value)


def text_columns(conn: sa.Connection) -> list[tuple[str, str, str]]:
    """(schema, table, column) of every text-like column of every user table."""
    rows = conn.execute(
        sa.text(
            "SELECT c.table_schema, c.table_name, c.column_name"
            " FROM information_schema.columns c JOIN information_schema.tables t"
            "   ON t.table_schema = c.table_schema AND t.table_name = c.table_name"
            " WHERE t.table_type = 'BASE TABLE'"
            "   AND c.table_schema NOT IN ('pg_catalog', 'information_schema')"
            "   AND (c.data_type IN ('text', 'character varying', 'json', 'jsonb', 'USER-DEFINED')"
            "        OR c.data_type = 'ARRAY')"
        )
    )
    return [tuple(r) for r in rows]


def full_text_scan(engine: sa.Engine, needles: Sequence[str]) -> list[tuple[str, str, str]]:
    """Every (table, column, needle) where a column's text contains a needle, database-wide."""
    found = []
    with engine.connect() as conn:
        for schema, table, column in text_columns(conn):
            for needle in needles:
                sql = sa.text(
                    f'SELECT count(*) FROM "{schema}"."{table}"'
                    f' WHERE CAST("{column}" AS text) ILIKE :pattern'
                )
                if conn.execute(sql, {"pattern": f"%{needle}%"}).scalar():
                    found.append((table, column, needle))
    return found


def requests(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM gc_erasure_requests ORDER BY requested_at"))
        return [dict(r._mapping) for r in rows]


def tombstones(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM gc_erasure_tombstones ORDER BY id"))
        return [dict(r._mapping) for r in rows]


def count(engine: sa.Engine, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar_one()


def as_json(value: Any) -> str:
    return json.dumps(value, default=str)
