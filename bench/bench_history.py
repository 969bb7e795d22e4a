"""Time to prune a realistic history: 30 nightly runs of 10,000 audit rows each.

Starts the embedded PostgreSQL in a temporary directory and seeds, set-based, 30 applied runs
that ended 430-401 days ago (past the default ``[history] retention_days = 400``), each with a
batch row, a model spend row and 10,000 ``gc_actions`` rows shaped like a night's work: 60 %
soft deletes and 20 % purges of rows since gone, 5 % merges of purged members, 10 % importance
scores still in place on 30,000 stored memories, 5 % merged records still stored (those 15 %
are still needed and stay). Then ``history.prune`` runs once with its default slice size and
the figures are printed: seconds, audit rows deleted per second, rows kept.

Prints figures; asserts nothing on time.

    .venv/bin/python -m bench.bench_history
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from gc_worker import db, history, logs, schema
from gc_worker.config import EmbeddingSettings, Settings

DIM = 8
RUNS = 30
ACTIONS_PER_RUN = 10_000
STORED = 30_000  # memories still stored: the importance scores and merged records point at them

SEED = [
    """
    INSERT INTO memories (id, user_id, content, importance, importance_assessed_at)
    SELECT md5('m' || i)::uuid, 'u' || (i % 1000), 'stored memory ' || i, 4,
           timestamptz '2025-09-01' + (i % 30) * interval '1 day'
    FROM generate_series(1, :stored) AS i
    """,
    """
    INSERT INTO gc_runs (id, mode, status, now, started_at, finished_at, jobs)
    SELECT md5('r' || r)::uuid, 'apply', 'completed',
           timestamptz '2025-09-01' + r * interval '1 day',
           now() - (431 - r) * interval '1 day', now() - (431 - r) * interval '1 day',
           ARRAY['ttl_expiry', 'hard_delete', 'importance', 'compaction']
    FROM generate_series(0, :runs - 1) AS r
    """,
    """
    INSERT INTO gc_run_batches (run_id, batch_no, users, state)
    SELECT md5('r' || r)::uuid, 0, ARRAY['u1'], 'done' FROM generate_series(0, :runs - 1) AS r
    """,
    """
    INSERT INTO gc_run_llm_spend (run_id, calls, tokens)
    SELECT md5('r' || r)::uuid, 10, 1000 FROM generate_series(0, :runs - 1) AS r
    """,
    # per run: seq 0-5999 soft deletes, 6000-7999 purges, 8000-8499 merges (rows gone),
    # 8500-9499 scores in place, 9500-9999 merged records still stored
    """
    INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id, reason,
                            details, outcome, prior, content_preview)
    SELECT md5('r' || r)::uuid, 0, s,
           k.job, k.action,
           CASE WHEN s < 8500 THEN gen_random_uuid()
                ELSE md5('m' || (1 + (r * 1000 + s) % :stored))::uuid END,
           'u' || (s % 1000), k.reason,
           CASE k.action
               WHEN 'set_importance' THEN jsonb_build_object('importance', 4, 'previous', 3)
               WHEN 'create_merged' THEN jsonb_build_object(
                   'sources', jsonb_build_array(gen_random_uuid(), gen_random_uuid()),
                   'record', jsonb_build_object('content', 'merged ' || s))
               ELSE '{}' END,
           'applied',
           jsonb_build_object('status', 'active', 'status_reason', NULL, 'valid_until', NULL),
           'a preview of the memory''s first two hundred characters ' || s
    FROM generate_series(0, :runs - 1) AS r,
         generate_series(0, :actions - 1) AS s,
         LATERAL (SELECT CASE WHEN s < 6000 THEN 'ttl_expiry' WHEN s < 8000 THEN 'hard_delete'
                              WHEN s < 8500 THEN 'compaction' WHEN s < 9500 THEN 'importance'
                              ELSE 'compaction' END AS job,
                         CASE WHEN s < 6000 THEN 'soft_delete' WHEN s < 8000 THEN 'hard_delete'
                              WHEN s < 8500 THEN 'merge' WHEN s < 9500 THEN 'set_importance'
                              ELSE 'create_merged' END AS action,
                         CASE WHEN s < 6000 THEN 'ttl_expired' ELSE 'bench' END AS reason) AS k
    """,
    "ANALYZE",
]


def seed(engine: sa.Engine) -> None:
    params = {"runs": RUNS, "actions": ACTIONS_PER_RUN, "stored": STORED}
    with engine.begin() as conn:
        for statement in SEED:
            conn.execute(sa.text(statement), params)


def main() -> None:
    logs.configure("warning")
    settings = Settings(embeddings=EmbeddingSettings(dim=DIM))
    with tempfile.TemporaryDirectory() as tmp:
        server = db.embedded_server(Path(tmp))
        engine = db.make_engine(db.embedded_url(Path(tmp)))
        try:
            schema.migrate(engine, embedding_dim=DIM)
            started = time.perf_counter()
            seed(engine)
            print(f"seeded {RUNS} runs x {ACTIONS_PER_RUN:,} audit rows, {STORED:,} stored "
                  f"memories in {time.perf_counter() - started:.1f} s")  # fmt: skip
            started = time.perf_counter()
            result = history.prune(engine, settings, now=datetime.now(UTC))
            seconds = time.perf_counter() - started
            print(f"prune-history: {seconds:.2f} s; deleted {result.actions:,} audit rows "
                  f"({result.actions / seconds:,.0f} rows/s), {result.batches} batch rows, "
                  f"{result.spend} spend rows, {result.runs} runs; kept "
                  f"{result.kept_actions:,} audit rows still needed of {result.kept_runs} runs; "
                  f"slices of {history.CHUNK_ROWS:,} rows")  # fmt: skip
        finally:
            engine.dispose()
            server.cleanup()


if __name__ == "__main__":
    main()
