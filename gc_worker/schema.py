"""Schema management: Alembic migrations, and the check every command runs first."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from gc_worker.errors import ConfigError, SchemaOutdated

VERSION_TABLE = "memory_gc_alembic_version"
MIGRATIONS = Path(__file__).parent / "migrations"


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head() or ""


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return ctx.get_current_revision()


def migrate(engine: Engine, *, embedding_dim: int) -> tuple[str | None, str]:
    """Upgrade to head; returns (revision before, revision after)."""
    before = current_revision(engine)
    if before is not None:
        check_embedding_dim(engine, embedding_dim)
    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        cfg.attributes["embedding_dim"] = embedding_dim
        command.upgrade(cfg, "head")
    return before, head_revision()


def require_current(engine: Engine, *, embedding_dim: int) -> None:
    """Refuse to work on a schema this code does not match (exit 2 with what to do)."""
    current, head = current_revision(engine), head_revision()
    if current is None:
        raise SchemaOutdated("the database has no memory-gc schema yet; run `memory-gc migrate`")
    if current != head:
        known = {
            rev.revision for rev in ScriptDirectory.from_config(_alembic_config()).walk_revisions()
        }
        if current not in known:
            raise SchemaOutdated(
                f"the database schema ({current}) is newer than this memory-gc ({head}); "
                "upgrade memory-gc before running it against this database"
            )
        raise SchemaOutdated(
            f"the database schema is at {current}, this memory-gc needs {head}; "
            "run `memory-gc migrate`"
        )
    check_embedding_dim(engine, embedding_dim)


def check_embedding_dim(engine: Engine, embedding_dim: int) -> None:
    with engine.connect() as conn:
        stored = conn.execute(
            sa.text(
                "SELECT atttypmod FROM pg_attribute"
                " WHERE attrelid = 'memories'::regclass AND attname = 'embedding'"
            )
        ).scalar()
    if stored is not None and stored > 0 and stored != embedding_dim:
        raise ConfigError(
            f"embeddings.dim = {embedding_dim} but the store's embedding column is "
            f"vector({stored}); set embeddings.dim = {stored} (MEMORY_GC_EMBEDDINGS__DIM)"
        )
