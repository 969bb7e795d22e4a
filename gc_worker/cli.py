"""The ``memory-gc`` command line (docs/design.md, section 4).

Exit codes: 0 success, 2 bad usage or configuration (the message says what and how to fix it),
1 runtime failure. Every command validates its input before it touches a memory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from tqdm import tqdm

from gc_worker import db, logs, schema
from gc_worker.config import (
    Runtime,
    Settings,
    ahead_of_clock,
    check_clock,
    is_utf8,
    load_settings,
)
from gc_worker.config_env import load_runtime
from gc_worker.errors import MemoryGCError, UsageError

Handler = Callable[[argparse.Namespace, "Context"], int]


class Context:
    """Settings and a lazily opened, schema-checked database engine for one command."""

    def __init__(self, settings: Settings, runtime: Runtime) -> None:
        self.settings, self.runtime = settings, runtime
        self._engine: Any = None
        self._llm: Any = False

    def close(self) -> None:
        if self._llm not in (False, None):
            self._llm.close()
        if self._engine is not None:
            self._engine.dispose()

    def llm(self) -> Any:
        """The run's LLM port, or None in offline mode."""
        if self._llm is False:
            from gc_worker.llm_store import open_run_llm

            self._llm = open_run_llm(self.settings, self.runtime, self.engine())
        return self._llm

    def engine(self, *, check_schema: bool = True) -> Any:
        if self._engine is None:
            self._engine = db.engine_for(self.runtime)
            if check_schema:
                schema.require_current(self._engine, embedding_dim=self.settings.embeddings.dim)
        return self._engine


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # exit 2 through our own error path
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parse_now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"--now {value!r} is not an ISO 8601 instant; use e.g. 2026-01-31T03:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        full = value if "T" in value or " " in value else f"{value}T00:00:00"
        raise UsageError(f"--now {value!r} has no timezone; add one, e.g. {full}Z or {full}+00:00")
    check_clock(parsed, f"--now {value!r}")  # every command's: it stamps what it changes
    return parsed


RETENTION_EARLY = "applied, it would end retention windows early (purging rows before their time)"


def not_ahead(when: datetime, label: str, fix: str, why: str = RETENTION_EARLY) -> None:
    """Refuse an applied change stamped more than a day past this machine's clock."""
    if ahead_of_clock(when):
        raise UsageError(f"{label} is more than a day ahead of this machine's clock; {why}. {fix}")


MAX_COUNT = 1_000_000_000  # a count given on the command line (a list's --limit)


def positive_int(value: str) -> int:
    """argparse type: a whole number from 1 to MAX_COUNT."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to {MAX_COUNT:,}, got {value!r}"
        )
    return number


def user_id_arg(value: str) -> str:
    """argparse type: a user id as given, refused when it holds a NUL byte — PostgreSQL text
    cannot store one, so no stored user has it, and the server would fail the command (exit 1)
    instead of naming the argument."""
    if "\x00" in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} contains a NUL byte (\\x00), which no stored user id can hold; check the id"
        )
    if not is_utf8(value):  # bytes that are not UTF-8 (a Latin-1 terminal): the driver's
        raise argparse.ArgumentTypeError(  # UnicodeEncodeError was a traceback
            f"{value!r} is not UTF-8 text, which every stored user id is; check the id "
            "(and the terminal's encoding)"
        )
    return value


def parse_uuid(value: str, what: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise UsageError(f"{what} {value!r} is not a UUID") from None


def progress(total: int) -> tqdm:
    """A progress bar on a terminal, none when stderr is not a terminal."""
    return tqdm(total=total, unit="batch", disable=not sys.stderr.isatty(), leave=False)


def build_parser() -> ArgumentParser:
    from gc_worker import commands

    parser = ArgumentParser(prog="memory-gc", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML config file (default: $MEMORY_GC_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    context: Context | None = None
    try:
        logs.configure()
        args = build_parser().parse_args(argv)
        context = Context(load_settings(args.config), load_runtime())
        # the daemon puts its own handler in once it is built; until then (a first connection
        # that hangs) SIGTERM interrupts it as it does any command
        with sigterm_interrupts():
            code = int(args.handler(args, context) or 0)
        sys.stdout.flush()  # a pipe's reader that left shows here, not at the exit's flush
        return code
    except MemoryGCError as exc:
        print(f"memory-gc: error: {exc}", file=sys.stderr)
        _stdout_or_nothing()
        return exc.exit_code
    except KeyboardInterrupt:
        print("memory-gc: interrupted; committed batches stay applied", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `memory-gc runs | head -1`: the reader left; no traceback
        _stdout_to_nothing()
        return 1
    except Exception as exc:
        from sqlalchemy.exc import DBAPIError

        if not isinstance(exc, DBAPIError):
            raise  # a bug: the traceback is what to report
        from gc_worker.db import describe_error

        # the server refused a statement: one line, without the statement's parameters or the
        # server's DETAIL (they can quote a memory's content)
        print(f"memory-gc: database error: {describe_error(exc)}", file=sys.stderr)
        return 1
    finally:
        if context is not None:
            context.close()
        _stdout_or_nothing()  # every exit: a reader that left fails no flush at exit (code 120)
        _stderr_or_nothing()


def _stderr_or_nothing() -> None:
    try:
        if not logs.drain_stderr():  # a reader that does not read: the exit's flush would fail
            logs.stderr_to_nothing()
    except BrokenPipeError:
        logs.stderr_to_nothing()
    except (OSError, ValueError, AttributeError):  # closed (`2>&-`: no sys.stderr at all)
        pass


def _stdout_or_nothing() -> None:
    """Flush stdout; if its reader left, send the rest nowhere (no error at exit's flush)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_nothing()


def _stdout_to_nothing() -> None:
    with contextlib.suppress(OSError, ValueError):  # not a real file (a test's capture)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a one-shot command as Ctrl-C does: the open batch rolls back, committed
    ones stay. Without a handler, a process that is PID 1 of a container (no init) ignores
    SIGTERM, and `docker stop` would wait for SIGKILL."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def entry() -> None:
    sys.exit(main())


def write_reports(report: dict[str, Any], paths: Sequence[Path]) -> list[Path]:
    from gc_worker.report import write_report

    return [write_report(report, path) for path in paths]


if __name__ == "__main__":
    entry()
