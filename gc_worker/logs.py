"""structlog, configured once: JSON lines on stderr with run_id, dry_run, batch_no and job bound
via contextvars, and user_id when the batch is one user (a sweep; a nightly batch of 500 users
logs user_id only where a job names one). Level from ``MEMORY_GC_LOG_LEVEL`` (default info)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
import threading
import time

import structlog

from gc_worker.errors import ConfigError


class _Stderr:
    """Whatever sys.stderr is at write time (it may be swapped after configuration). A line
    that cannot be written (the reader of `memory-gc run 2>&1 | head -1` left) is dropped: it
    raised BrokenPipeError into whatever was logging, and a run was left unworked for it. A
    non-blocking stderr whose reader is slow is waited for (up to DRAIN_SECONDS a flush)."""

    def write(self, text: str) -> int:
        try:
            if not drain_stderr():  # what a slow reader left goes first, whole; while it
                return 0  # cannot, this line is dropped whole (part of it would be cut)
            return sys.stderr.write(text)
        except BrokenPipeError:  # the reader left for good
            stderr_to_nothing()
        except BlockingIOError:  # the line is in the buffer: wait for the reader to take it
            with contextlib.suppress(OSError, ValueError):
                drain_stderr()
        except (OSError, ValueError, AttributeError):  # this line only: a full disk; no stderr
            pass
        return 0

    def flush(self) -> None:
        try:
            drain_stderr()
        except BrokenPipeError:
            stderr_to_nothing()
        except (OSError, ValueError, AttributeError):
            pass


DRAIN_SECONDS = 5.0
# set when a wait for a non-blocking stderr's reader ran out: until a flush goes through again,
# nothing waits (a reader that never reads costs one wait, not one per line: the first version
# waited 5 s per flush, 15–20 s per log line, and 11 s at exit)
_stalled = threading.Event()


def drain_stderr() -> bool:
    """Flush stderr; whether everything went. When it is non-blocking and its reader slow
    (BlockingIOError: the rest is kept in the buffer), wait until it can take more, up to
    DRAIN_SECONDS in all, unless an earlier wait ran out and nothing went through since."""
    deadline = None
    while True:
        try:
            sys.stderr.flush()
            _stalled.clear()
            return True
        except BlockingIOError:
            if _stalled.is_set():
                return False
            deadline = deadline or time.monotonic() + DRAIN_SECONDS
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [sys.stderr.fileno()], [], left)[1]:
                _stalled.set()
                return False


def stderr_to_nothing() -> None:
    """Send what is left for stderr nowhere: its reader left (no error at the exit's flush)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real file
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())


LEVELS = ("debug", "info", "warning", "error")


def configure(level: str | None = None) -> None:
    """Configure logging; an unknown level is a ConfigError (logging stays configured at info,
    so the error itself can be reported)."""
    name = (level or os.environ.get("MEMORY_GC_LOG_LEVEL") or "info").lower()
    if name not in LEVELS:
        _configure(logging.INFO)
        raise ConfigError(
            f"MEMORY_GC_LOG_LEVEL={name!r} is not a log level; use one of {', '.join(LEVELS)}"
        )
    _configure(logging.getLevelName(name.upper()))


HANDLER_NAME = "memory-gc"


def _configure(numeric: int) -> None:
    _configure_libraries(numeric)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),
        cache_logger_on_first_use=False,
    )


def _configure_libraries(numeric: int) -> None:
    """Libraries' own log records (APScheduler's skipped or missed firings, a driver's
    warning) as the same JSON lines: without a handler, Python's last-resort handler wrote them
    to stderr as plain text, which a JSON-lines pipeline rejects. The root logger stays at
    WARNING, so a library only logs below it when asked to (openai's OPENAI_LOG=info|debug),
    down to the configured level. One handler per process, its level set on each call."""
    root = logging.getLogger()
    for handler in root.handlers:
        if handler.get_name() == HANDLER_NAME:
            handler.setLevel(numeric)
            return
    handler = logging.StreamHandler(_Stderr())
    handler.set_name(HANDLER_NAME)
    handler.setLevel(numeric)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root.addHandler(handler)
