"""Errors memory-gc raises on purpose.

One base class whose default message is its docstring; subclasses pick the exit code the CLI
uses: 2 for bad usage or configuration (the operator can fix the input), 1 for runtime failures.
Driver errors are translated into these at one boundary (``gc_worker.db``).
"""

from __future__ import annotations


class MemoryGCError(Exception):
    """memory-gc failed."""

    exit_code = 1

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UsageError(MemoryGCError):
    """The command line was not valid; run `memory-gc --help`."""

    exit_code = 2


class ConfigError(UsageError):
    """The configuration is not valid."""


class NotFoundError(UsageError):
    """The run, memory or user named on the command line does not exist."""


class SchemaOutdated(UsageError):
    """The database schema is older than this version of memory-gc; run `memory-gc migrate`."""


class DatabaseUnavailable(MemoryGCError):
    """The database could not be reached; check MEMORY_GC_DATABASE_URL and that the server runs."""

    # False: the server answered, with an error that would come back on a new connection (an
    # application trigger's, a missing data file): not a blip a resumed run gets past
    connection_lost = True
    # True: the server ended the session itself (shut down or restarted, 57P01; another
    # backend crashed, 57P02; still starting, 57P03), not something this session did
    server_restart = False


class WriteConflict(DatabaseUnavailable):
    """A concurrent writer conflicted with this transaction (deadlock or serialization failure);
    it was rolled back whole, so running the command again is safe."""


class StatementFailed(MemoryGCError):
    """The server refused one statement for what it was doing (cancelled by statement_timeout,
    a program limit, out of memory); the transaction was rolled back, the connection is fine."""


class PlanAbandoned(MemoryGCError):
    """A stop was asked for while a batch was planned before its transaction; nothing of the
    batch was written and it stays pending (the model's answers so far are cached)."""


class RunFailed(MemoryGCError):
    """The run failed; no batch was half-applied (each batch commits or rolls back whole)."""
