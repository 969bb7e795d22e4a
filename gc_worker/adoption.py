"""What ``memory-gc migrate`` checks before it creates the store.

Run inside the migration transaction, before any DDL, on a database without memory-gc's version
table (``prepare``). Every refusal is a :class:`ConfigError` (exit 2) that says how to fix it:

- the role may create tables in the target schema (``GRANT CREATE ON SCHEMA …``);
- pgvector is installed on the server and created in the database (a superuser may have to run
  ``CREATE EXTENSION vector``).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gc_worker.errors import ConfigError
from gc_worker.queries import q

# SQLSTATEs of CREATE EXTENSION
INSUFFICIENT_PRIVILEGE, NOT_AVAILABLE, NO_CONTROL_FILE = "42501", "0A000", "58P01"
RERUN = "then re-run `memory-gc migrate`"


def prepare(conn: Connection) -> None:
    """Refuse (ConfigError) unless migration 0001 can create the store here."""
    who = _require_schema_privilege(conn)
    _ensure_pgvector(conn, who)


def _require_schema_privilege(conn: Connection) -> Any:
    """Role, database and schema, once the role may create tables where migrate puts them."""
    who = conn.execute(q("migrate_prerequisites")).one()
    if who.schema_name is None:
        raise ConfigError(
            f"no schema of the search_path of role {who.role_name} exists in database "
            f"{who.database_name}; set search_path (e.g. ?options=-csearch_path%3Dpublic in "
            f"MEMORY_GC_DATABASE_URL), {RERUN}"
        )
    if not who.can_create:
        raise ConfigError(
            f"role {who.role_name} may not create tables in schema {who.schema_name} of "
            f"database {who.database_name}: grant CREATE on schema {who.schema_name} to "
            f"{who.role_name} (GRANT CREATE ON SCHEMA {who.schema_name} TO {who.role_name};), "
            f"{RERUN}"
        )
    return who


def _ensure_pgvector(conn: Connection, who: Any) -> None:
    try:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
    except sa.exc.DBAPIError as exc:
        state = getattr(exc.orig, "sqlstate", None)
        if state in (NOT_AVAILABLE, NO_CONTROL_FILE):
            raise ConfigError(
                "the PostgreSQL server has no pgvector extension: install pgvector on the "
                "server (e.g. the postgresql-<version>-pgvector package, or an image that "
                f"ships it), {RERUN}"
            ) from None
        if state == INSUFFICIENT_PRIVILEGE:
            raise ConfigError(
                f"role {who.role_name} may not create the pgvector extension: have a superuser "
                f"run CREATE EXTENSION vector; in database {who.database_name}, {RERUN}"
            ) from None
        raise
