"""structlog, configured once: JSON lines on stderr with run_id, dry_run, batch_no and job bound
via contextvars, and user_id when the batch is one user (a sweep; a nightly batch of 500 users
logs user_id only where a job names one). Level from ``MEMORY_GC_LOG_LEVEL`` (default info)."""

from __future__ import annotations

import logging
import os
import sys

import structlog


class _Stderr:
    """Whatever sys.stderr is at write time (it may be swapped after configuration)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str | None = None) -> None:
    name = (level or os.environ.get("MEMORY_GC_LOG_LEVEL") or "info").upper()
    numeric = logging.getLevelName(name)
    if not isinstance(numeric, int):
        numeric = logging.INFO
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
