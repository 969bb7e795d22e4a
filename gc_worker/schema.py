"""Schema management: Alembic migrations, and the check every command runs first.

``migrate`` runs in one transaction that first takes a transaction-level advisory lock, so two
``migrate`` processes at once (replicas' init containers) run one after the other: the second
finds the schema current. It refuses (exit 2) a schema newer than this build.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy.engine import Connection, Engine

from gc_worker import adoption
from gc_worker.adoption_columns import dim_mismatch
from gc_worker.adoption_guards import ROW_SECURITY, row_security_hides_rows
from gc_worker.db import describe_error
from gc_worker.errors import ConfigError, DatabaseUnavailable, SchemaOutdated
from gc_worker.queries import q

VERSION_TABLE = "memory_gc_alembic_version"
MIGRATIONS = Path(__file__).parent / "migrations"
# one `migrate` at a time; the others wait for it whatever lock_timeout the URL sets (it is for
# the application's tables): the wait has no time limit, then the session's setting is back
# A lock migrate waits for on the application's tables queues every read and write of them
# behind it, for as long as the transaction it waits on stays open: without a lock_timeout of
# the operator's (the URL's options), migrate waits at most this long, then rolls back and
# tries again, MIGRATE_ATTEMPTS times in all.
MIGRATE_LOCK_TIMEOUT = "5s"
MIGRATE_ATTEMPTS = 3
# A statement_timeout of the database's or role's is for the application's queries; migrate's
# waits are bounded by its lock_timeout, and its index builds and checks take what the table's
# size takes, so it runs without one. One the URL sets (the session's own, source 'client') is
# the operator's for this command and is kept: when it cancels a statement, migrate says so.
# The same for transaction_timeout (PostgreSQL 17+), which ends the session (FATAL 25P04).
STATEMENT_TIMEOUT_CANCELLED = (
    "migrate was cancelled by the statement_timeout or transaction_timeout your database URL "
    "(or PGOPTIONS) sets, or by an administrator: nothing was changed. Run migrate with a URL "
    "without it (drop `-c statement_timeout=…` / `-c transaction_timeout=…` from its "
    "options), or run docs/operations.md's online statements first on a large table"
)
CANCELLED = {"57014", "25P04"}  # query_canceled, transaction_timeout
INSUFFICIENT_PRIVILEGE = "42501"  # an upgrade run as a role that does not own the schema
# (name, value while waiting for another migrate, value after: the URL's, else this)
_TIMEOUTS = (
    ("lock_timeout", MIGRATE_LOCK_TIMEOUT, "default"),
    ("statement_timeout", "0", "client"),
    ("transaction_timeout", "0", "client"),
)


def _migrate_lock() -> str:
    """One migrate at a time (waiting without limit for another), then the lock timeout (the
    operator's: any not at its default, 0 included; else MIGRATE_LOCK_TIMEOUT), and the
    statement and transaction timeouts (the URL's, else none). A setting this server does not
    have (transaction_timeout before PostgreSQL 17) is left alone."""
    keep, wait, restore = [], [], []
    for name, value, kept in _TIMEOUTS:
        has = f"WHERE current_setting('{name}', true) IS NOT NULL"
        source = f"(SELECT source FROM pg_settings WHERE name = '{name}')"
        if kept == "default":  # kept unless at its default
            chosen = (
                f"CASE {source} WHEN 'default' THEN '{value}' ELSE current_setting('{name}') END"
            )
        else:  # kept only when the session's own (the URL's options, PGOPTIONS)
            chosen = (
                f"CASE {source} WHEN 'client' THEN current_setting('{name}') ELSE '{value}' END"
            )
        keep.append(f"SELECT set_config('memory_gc.{name}', {chosen}, true) {has};")
        wait.append(f"SELECT set_config('{name}', '0', true) {has};")
        restore.append(
            f"SELECT set_config('{name}', current_setting('memory_gc.{name}'), true) {has};"
        )
    return "".join([*keep, *wait, "SELECT pg_advisory_xact_lock(4242004, 0);", *restore])


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_alembic_config())


def migration(revision: str) -> Any:
    """A migration's module (adoption reads what 0001 adds, kept there alone)."""
    return _scripts().get_revision(revision).module


def head_revision() -> str:
    return _scripts().get_current_head() or ""


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return _revision_on(conn)


def _revision_on(conn: Connection) -> str | None:
    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def migrate(engine: Engine, *, embedding_dim: int) -> tuple[str | None, str]:
    """Upgrade to head in one transaction; returns (revision before, revision after). A lock
    not had within the lock timeout rolls everything back; tried MIGRATE_ATTEMPTS times."""
    attempt = 1
    while True:
        try:
            return _migrate(engine, embedding_dim)
        except sa.exc.DBAPIError as exc:  # a transaction_timeout is an InternalError
            if getattr(exc.orig, "sqlstate", None) in CANCELLED:
                raise ConfigError(STATEMENT_TIMEOUT_CANCELLED) from None
            if getattr(exc.orig, "sqlstate", None) == INSUFFICIENT_PRIVILEGE:
                raise ConfigError(_not_permitted(engine, exc)) from None
            if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            if attempt == MIGRATE_ATTEMPTS:
                raise DatabaseUnavailable(
                    f"migrate could not take a lock it needs within the lock timeout "
                    f"({MIGRATE_LOCK_TIMEOUT} unless the URL sets one), {attempt} times: a "
                    "transaction of the application's holds it. Nothing was changed; run "
                    "migrate again at a quieter moment, or run docs/operations.md's online "
                    "statements first"
                ) from None
        time.sleep(attempt)
        attempt += 1


def _not_permitted(engine: Engine, exc: sa.exc.DBAPIError) -> str:
    """What to do when the server refused a change of the schema to this role (the daemon's
    role, granted use of the tables but not their owner): migrate as gc_runs's owner."""
    with engine.connect() as conn:
        role, owner = conn.execute(q("migrate_role_and_owner")).one()
    who = f"role {owner} (which owns gc_runs)" if owner else "the role that owns the store"
    return (
        f"role {role} may not change memory-gc's schema ({describe_error(exc)}); nothing was "
        f"changed: run `memory-gc migrate` as {who}, or a member of it"
    )


def _migrate(engine: Engine, embedding_dim: int) -> tuple[str | None, str]:
    cfg = _alembic_config()
    with engine.begin() as conn:
        conn.exec_driver_sql(_migrate_lock())
        before = _revision_on(conn)  # read under the lock: a concurrent migrate has committed
        _refuse_unknown(before)
        if before is None:
            adoption.prepare(conn, embedding_dim)
        else:
            check_embedding_dim(conn, embedding_dim)
        cfg.attributes["connection"] = conn
        cfg.attributes["embedding_dim"] = embedding_dim
        with adoption.translated_violations():
            try:
                command.upgrade(cfg, "head")
            except CommandError as exc:
                raise SchemaOutdated(f"cannot migrate this database's schema: {exc}") from None
    return before, head_revision()


def require_current(engine: Engine, *, embedding_dim: int) -> None:
    """Refuse to work on a schema this code does not match (exit 2 with what to do)."""
    current, head = current_revision(engine), head_revision()
    if current is None:
        raise SchemaOutdated("the database has no memory-gc schema yet; run `memory-gc migrate`")
    if current != head:
        _refuse_unknown(current)
        raise SchemaOutdated(
            f"the database schema is at {current}, this memory-gc needs {head}; "
            "run `memory-gc migrate`"
        )
    with engine.connect() as conn:
        check_embedding_dim(conn, embedding_dim)
        if row_security_hides_rows(conn):  # migrate checked its own role, not this one
            raise ConfigError(ROW_SECURITY)


def _refuse_unknown(current: str | None) -> None:
    """A revision this build does not know was written by a newer memory-gc."""
    if current is None or current in {rev.revision for rev in _scripts().walk_revisions()}:
        return
    raise SchemaOutdated(
        f"the database schema ({current}) is newer than this memory-gc ({head_revision()}); "
        "upgrade memory-gc before running it against this database"
    )


def stored_embedding_dim(conn: Connection) -> int | None:
    """The n of ``memories.embedding vector(n)``; None when unconstrained or absent."""
    stored = conn.execute(
        sa.text(
            "SELECT atttypmod FROM pg_attribute"
            " WHERE attrelid = to_regclass('memories') AND attname = 'embedding'"
            " AND NOT attisdropped"
        )
    ).scalar()
    return stored if stored is not None and stored > 0 else None


def check_embedding_dim(conn: Connection, embedding_dim: int) -> None:
    stored = stored_embedding_dim(conn)
    if stored is not None and stored != embedding_dim:
        raise ConfigError(dim_mismatch(embedding_dim, stored))
