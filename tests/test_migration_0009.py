"""Migration 0009 upgrades a store with history and downgrades cleanly (failed batches, the
read rule per slot, the index of merged plan rows by source)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from gc_worker import db, schema
from tests.conftest import migrating


def test_0009_round_trip_keeps_the_runs(empty_database_url):
    with migrating(empty_database_url) as (cfg, conn):
        command.upgrade(cfg, "0008")
        conn.execute(sa.text(
            "INSERT INTO gc_runs (id, mode, trigger, now, jobs, settings)"
            " VALUES (gen_random_uuid(), 'apply', 'cli', now(), '{}', '{}');"
            "INSERT INTO gc_run_batches (run_id, batch_no, users)"
            " SELECT id, 0, '{u1}' FROM gc_runs"
        ))  # fmt: skip
        command.upgrade(cfg, "0009")
        conn.execute(sa.text("UPDATE gc_run_batches SET state = 'failed', error = 'x'"))
        partition = conn.execute(sa.text(
            "SELECT pg_get_functiondef('memory_gc_current'::regproc)"
        )).scalar()  # fmt: skip
        assert "PARTITION BY l.slot" in partition
        command.downgrade(cfg, "0008")
        state = conn.execute(sa.text("SELECT state FROM gc_run_batches")).scalar()
        assert state == "pending"  # a failed batch is one still to do, for 0008
        command.upgrade(cfg, "head")
    engine = db.make_engine(empty_database_url)
    try:
        assert schema.current_revision(engine) == schema.head_revision()
    finally:
        engine.dispose()
