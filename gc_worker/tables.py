"""SQLAlchemy Core tables for the worker's own bookkeeping (the DDL lives in migrations/)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

metadata = sa.MetaData()

gc_actions = sa.Table(
    "gc_actions",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("run_id", UUID(as_uuid=True), nullable=False),
    sa.Column("batch_no", sa.Integer, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("memory_id", UUID(as_uuid=True)),
    sa.Column("user_id", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("details", JSONB, nullable=False),
    sa.Column("row_version", sa.BigInteger),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("prior", JSONB),
    sa.Column("content_preview", sa.Text),
)

gc_run_batches = sa.Table(
    "gc_run_batches",
    metadata,
    sa.Column("run_id", UUID(as_uuid=True), primary_key=True),
    sa.Column("batch_no", sa.Integer, primary_key=True),
    sa.Column("users", ARRAY(sa.Text), nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("worker", sa.Text),
    sa.Column("stats", JSONB, nullable=False),
    sa.Column(
        "work", JSONB(none_as_null=True), nullable=True
    ),  # gc_worker.triage; NULL: every job, every user
)
