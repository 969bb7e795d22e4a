"""Seeding and reading the memory store in tests (real SQL, no mocks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import sqlalchemy as sa

NOW = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)


def days_ago(days: float, now: datetime = NOW) -> datetime:
    return now - timedelta(days=days)


def add(engine: sa.Engine, user_id: str = "u1", content: str | None = None, **columns: Any) -> UUID:
    """Insert one memory; unset columns take schema defaults, timestamps default to NOW."""
    memory_id = columns.pop("id", None) or uuid4()
    row = {
        "id": memory_id,
        "user_id": user_id,
        "content": content or f"memory {memory_id.hex[:8]}",
        "created_at": NOW,
        "updated_at": columns.get("created_at", NOW),
        "observed_at": columns.get("created_at", NOW),
        **columns,
    }
    if "embedding" in row and row["embedding"] is not None:
        row["embedding"] = "[" + ",".join(str(float(x)) for x in row["embedding"]) + "]"
    cols = ", ".join(row)
    binds = ", ".join(f"CAST(:{k} AS vector)" if k == "embedding" else f":{k}" for k in row)
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO memories ({cols}) VALUES ({binds})"), row)
    return memory_id


def get(engine: sa.Engine, memory_id: UUID) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = (
            conn.execute(sa.text("SELECT * FROM memories WHERE id = :id"), {"id": memory_id})
            .mappings()
            .first()
        )
    return dict(row) if row else None


def status(engine: sa.Engine, memory_id: UUID) -> str | None:
    row = get(engine, memory_id)
    return None if row is None else row["status"]


def snapshot(engine: sa.Engine) -> dict[UUID, dict[str, Any]]:
    """Every memory row, for before/after comparisons."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM memories ORDER BY id")).mappings().all()
    return {row["id"]: {k: v for k, v in row.items() if k != "embedding"} for row in rows}


def execute(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.begin() as conn:
        return conn.execute(sa.text(sql), params)


def run(
    engine: sa.Engine,
    settings: Any,
    *,
    jobs: list[str] | None = None,
    dry_run: bool = False,
    now: datetime = NOW,
    users: list[str] | None = None,
    llm: Any = None,
) -> dict[str, Any]:
    """One run through the engine; returns its report."""
    from gc_worker import engine as gc_engine
    from gc_worker.report import build_report

    request = gc_engine.RunRequest(
        mode="dry_run" if dry_run else "apply",
        now=now,
        users=tuple(users) if users else None,
        jobs=gc_engine.resolve_jobs(jobs or [], settings),
    )
    run_id = gc_engine.run_once(engine, settings, request, llm=llm)
    with engine.connect() as conn:
        return build_report(conn, run_id)


def acted_on(report: dict[str, Any], action: str | None = None) -> set[str]:
    """Memory ids the report's changes name (optionally only one kind of action)."""
    return {
        a["memory_id"]
        for a in report["actions"]
        if a["memory_id"] is not None
        and a["action"] != "deferred"
        and (action is None or a["action"] == action)
    }


def city_pair(engine: sa.Engine, user_id: str = "u1") -> tuple[UUID, UUID]:
    """Two values of one slot: "Lives in Paris" (10 days old), then "Lives in Berlin" (1 day)."""
    old = add(engine, user_id, "Lives in Paris", slot="profile.city", created_at=days_ago(10),
              observed_at=days_ago(10))  # fmt: skip
    new = add(engine, user_id, "Lives in Berlin", slot="profile.city", created_at=days_ago(1),
              observed_at=days_ago(1))  # fmt: skip
    return old, new
