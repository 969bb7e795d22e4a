"""The container image's health check: ``python -m gc_worker.healthcheck``.

Docker runs one ``HEALTHCHECK`` for every container of the image, whatever command it runs.
Only ``memory-gc schedule --metrics-port N`` serves ``/healthz``; this reads the command line of
the container's main process (PID 1) and fetches that endpoint when there is one. A container
running anything else (``migrate``, ``run``, ``forget-user``, a daemon without metrics) has no
endpoint, so there is nothing to check: healthy. Exit 0 healthy, 1 unhealthy (Docker's
convention), with one line on stdout saying why, which ``docker inspect`` shows.

``python -m gc_worker.healthcheck memory-gc schedule --metrics-port 9108`` checks the endpoint
of that command line instead of PID 1's (outside a container, or to try it).

Kubernetes ignores the image's ``HEALTHCHECK``; its ``livenessProbe`` fetches ``/healthz``
itself (docs/operations.md).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

MAIN_PROCESS = Path("/proc/1/cmdline")
TIMEOUT_SECONDS = 4.0  # under the image's --timeout=5s
WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def endpoint(argv: Sequence[str]) -> str | None:
    """The ``/healthz`` URL the process started with ``argv`` serves, or None if it serves none.

    ``argv`` is the whole command line (``python /usr/local/bin/memory-gc schedule …`` or
    ``memory-gc schedule …``); it is parsed with memory-gc's own parser, so an option's value
    that happens to read ``schedule`` is not taken for the command."""
    args = _memory_gc_args(argv)
    if args is None:
        return None
    from gc_worker.cli import build_parser
    from gc_worker.errors import UsageError

    try:
        parsed = build_parser().parse_args(args)
    except (UsageError, SystemExit):  # not a command line memory-gc would run
        return None
    if parsed.command != "schedule" or parsed.metrics_port in (None, 0) or parsed.once_due:
        return None  # no endpoint, one on a port nobody knows, or a daemon that exits by itself
    host = parsed.metrics_host or "0.0.0.0"
    host = WILDCARD_TO_LOOPBACK.get(host, host)
    if ":" in host:
        host = f"[{host.strip('[]')}]"
    return f"http://{host}:{parsed.metrics_port}/healthz"


def _memory_gc_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after the ``memory-gc`` program in ``argv``, or None if it is not there."""
    for i, word in enumerate(argv[:3]):  # memory-gc, or python [-options] memory-gc
        if Path(word).name == "memory-gc":
            return list(argv[i + 1 :])
    return None


def check(url: str | None) -> tuple[bool, str]:
    """Fetch ``url``: healthy only for an answer of 200. No URL: nothing to check."""
    if url is None:
        return (
            True,
            "no /healthz to check: the main process is not `memory-gc schedule --metrics-port N`",
        )
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            return answer.status == 200, f"{url}: {answer.status}"
    except urllib.error.HTTPError as exc:  # 503: the daemon says it is unhealthy
        return False, f"{url}: {exc.code} {exc.read(500).decode(errors='replace')}"
    except OSError as exc:  # refused, timed out, unreachable
        return False, f"{url}: no answer ({exc})"


def main_process_argv(path: Path = MAIN_PROCESS) -> list[str]:
    """PID 1's command line (NUL-separated in /proc); empty if it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def main(command_line: Sequence[str]) -> int:
    """Check the endpoint of ``command_line``, or of PID 1's when it is empty."""
    healthy, why = check(endpoint(list(command_line) or main_process_argv()))
    print(why)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
