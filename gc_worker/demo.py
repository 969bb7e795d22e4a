"""``memory-gc demo``: a realistic sample store in the embedded database, and its dry run.

Seeds five users and ~3,000 memories spread over a year, and one user's request to forget a
memory, into a fresh ``memory_gc_demo`` database of the embedded PostgreSQL (never the
configured store), then runs a dry run at a fixed instant and prints the summary and where
the JSON / Markdown / HTML reports are.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from gc_worker import db, erasure, schema
from gc_worker import engine as gc_engine
from gc_worker.config import EmbeddingSettings
from gc_worker.demo_data import DEMO_DIM, forget_me_id, seed_rows
from gc_worker.report import build_report, write_report

DEMO_DB = "memory_gc_demo"
DEMO_NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def run_demo(ctx: Any, *, output_dir: Path | None = None, apply: bool = False) -> int:
    settings = ctx.settings.model_copy(update={"embeddings": EmbeddingSettings(dim=DEMO_DIM)})
    server = db.embedded_server(ctx.runtime.data_dir)
    if "(1 row)" in server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DEMO_DB}';"):
        server.psql(f"DROP DATABASE {DEMO_DB} WITH (FORCE);")
    engine = db.make_engine(db.embedded_url(ctx.runtime.data_dir, DEMO_DB))
    schema.migrate(engine, embedding_dim=DEMO_DIM)
    rows = seed_rows(DEMO_NOW)
    _insert(engine, rows)
    with engine.begin() as conn:  # as `memory-gc forget ID` files it
        erasure.file_request(conn, memory_id=UUID(forget_me_id(rows)), requested_by="demo")
    request = gc_engine.RunRequest(
        mode="dry_run", now=DEMO_NOW, jobs=gc_engine.resolve_jobs([], settings), trigger="demo"
    )
    run_id = gc_engine.run_once(engine, settings, request, llm=None)
    with engine.connect() as conn:
        report = build_report(conn, run_id)
    out = output_dir or ctx.runtime.data_dir / "demo-reports"
    paths = [write_report(report, out / f"dry-run.{fmt}") for fmt in ("json", "md", "html")]
    print(demo_summary(report, len(rows), paths, applying=apply))
    if apply:
        _apply_and_rerun(engine, settings, run_id, out)
    engine.dispose()
    return 0


def _apply_and_rerun(engine: sa.Engine, settings: Any, plan_id: Any, out: Path) -> None:
    """Apply the plan, then show that an immediate second run has nothing to do. Both runs are
    the demo's (trigger ``demo``): their reports suggest no command of the configured store."""
    applied = gc_engine.apply_plan(engine, plan_id, workers=settings.run.workers, trigger="demo")
    request = gc_engine.RunRequest(
        mode="apply", now=DEMO_NOW, jobs=gc_engine.resolve_jobs([], settings), trigger="demo"
    )
    again = gc_engine.run_once(engine, settings, request)
    with engine.connect() as conn:
        applied_report, again_report = build_report(conn, applied), build_report(conn, again)
    path = write_report(applied_report, out / "applied.html")
    changes, deferred = _changes(applied_report)  # a deferred group is listed, not applied
    print(f"\napplied: {changes} changes ({deferred} deferred groups left as they are; {path})")
    changes, deferred = _changes(again_report)
    print(f"second run right after: {changes} changes ({deferred} groups still wait for an LLM)")


def _changes(report: dict[str, Any]) -> tuple[int, int]:
    """(actions that change a row, groups deferred) of a report."""
    by_action = report["totals"]["by_action"]
    deferred = by_action.get("deferred", 0)
    return sum(by_action.values()) - deferred, deferred


def _insert(engine: sa.Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO memories SELECT * FROM jsonb_populate_recordset("
                "NULL::memories, CAST(:rows AS jsonb))"
            ),
            {"rows": json.dumps(rows, default=str)},
        )


def demo_summary(
    report: dict[str, Any], seeded: int, paths: list[Path], applying: bool = False
) -> str:
    users = report["per_user"]
    lines = [
        f"memory-gc demo: seeded {seeded} memories for {len(users) or 'no'} users "
        f"(embedded PostgreSQL, database {DEMO_DB}), dry run at {report['now']}",
        "nothing was changed; this is the plan the nightly run would apply:",
        "",
        f"  {'job':<14} {'actions':>7}  by action",
    ]
    for job, row in report["jobs"].items():
        detail = ", ".join(f"{k} {v}" for k, v in row["by_action"].items()) or "-"
        extra = f" (scores refreshed: {row['refreshed']})" if row.get("refreshed") else ""
        lines.append(f"  {job:<14} {row['actions']:>7}  {detail}{extra}")
    lines += ["", "  per user: " + ", ".join(f"{u} {r['actions']}" for u, r in users.items())]
    lines += deferred_lines([a for a in report["actions"] if a["action"] == "deferred"])
    lines += ["", "reports:"] + [f"  {p}" for p in paths]
    if not applying:
        lines += [
            "",
            "to apply it and see a second run find nothing left: memory-gc demo --apply",
            "(in a clone, where scripts/demo installed it in .venv: scripts/demo --apply)",
        ]
    return "\n".join(lines)


DEFERRED_SHOWN = 4  # per job; the reports list every group


def deferred_lines(deferred: list[dict[str, Any]]) -> list[str]:
    """The groups waiting for an LLM, per job: user, size, reason and a preview."""
    if not deferred:
        return []
    lines = [
        "",
        f"deferred: {len(deferred)} groups left undecided (an LLM would decide most — no"
        " OPENAI_API_KEY / OPENAI_BASE_URL: listed, not guessed; near misses are never merged)",
    ]
    by_job: dict[str, list[dict[str, Any]]] = {}
    for action in deferred:
        by_job.setdefault(action["job"], []).append(action)
    for job, items in by_job.items():
        lines.append(f"  {job}: {len(items)} groups")
        for a in items[:DEFERRED_SHOWN]:
            size = len(a["details"].get("memory_ids", ()))
            text = (a["details"].get("content") or "").replace("\n", " ")[:48]
            preview = repr(text) if text else "(never-assessed rows)" if job == "importance" else ""
            lines.append(f"    {a['user_id']:<8} {size:>3} memories  {a['reason']:<16} {preview}")
        if len(items) > DEFERRED_SHOWN:
            lines.append(f"    … and {len(items) - DEFERRED_SHOWN} more (see the reports)")
    return lines
