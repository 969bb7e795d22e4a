"""Subcommands: ``schedule`` (the daemon), ``request-sweep USER_ID``, ``reject RUN_ID``.

``memory-gc schedule [--metrics-port N] [--metrics-host H] [--once-due [--now ISO]]``
    runs until SIGTERM / SIGINT (then finishes the current batch and exits 0); with
    ``--once-due`` it does what is due now and exits (1 if some unit of work failed).
``memory-gc request-sweep USER_ID [--dry-run]``
    queues an on-demand sweep of one user for the daemon; prints the request id (that of a
    request of the user still waiting for a daemon, if there is one).
``memory-gc reject RUN_ID``
    plan_then_apply: a completed nightly plan not yet applied will never be applied.
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gc_worker.cli import Context, not_ahead, parse_now, parse_uuid, user_id_arg
from gc_worker.errors import SchemaOutdated, UsageError


def register(sub: Any) -> None:
    """Add this module's subcommands to the parser."""
    schedule = _add(sub, "schedule", cmd_schedule, "the daemon: nightly cron + on-demand sweeps")
    schedule.add_argument(
        "--metrics-port", type=int, metavar="N",
        help="serve /metrics and /healthz on this port (0: any free port)",
    )  # fmt: skip
    schedule.add_argument("--metrics-host", metavar="HOST",
                          help="address of the metrics endpoint (with --metrics-port; "
                               "default 0.0.0.0)")  # fmt: skip
    schedule.add_argument("--once-due", action="store_true",
                          help="do what is due now (resume, nightly slot, due plans, queued "
                               "sweeps), then exit")  # fmt: skip
    schedule.add_argument("--now", help="with --once-due: fix the clock (ISO 8601 with timezone)")
    sweep = _add(sub, "request-sweep", cmd_request_sweep, "queue an on-demand sweep of one user")
    sweep.add_argument("user_id", type=user_id_arg)
    sweep.add_argument("--dry-run", action="store_true", help="plan and report only")
    reject = _add(sub, "reject", cmd_reject, "reject a nightly plan so it is never applied")
    reject.add_argument("run_id")


def _add(sub: Any, name: str, handler: Callable, help_text: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(handler=handler)
    return parser


def cmd_schedule(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker.daemon import Daemon, system_clock
    from gc_worker.llm_store import open_run_llm

    clock = _clock(args, system_clock)
    _check_metrics_address(args)  # before connecting: a bad flag is exit 2 with the database down
    engine = ctx.engine()
    daemon = Daemon(
        engine, ctx.settings, clock=clock,
        llm_factory=lambda: open_run_llm(ctx.settings, ctx.runtime, engine),
    )  # fmt: skip
    server = _metrics_server(args, daemon)
    previous = {sig: signal.signal(sig, lambda *_: daemon.request_stop())
                for sig in (signal.SIGTERM, signal.SIGINT)}  # fmt: skip
    previous_fd = signal.set_wakeup_fd(daemon.wake_fd)  # a signal wakes the sweep loop at once
    try:
        if args.once_due:
            failed = daemon.run_once()
            if daemon.schema_changed is not None:
                raise SchemaOutdated(_schema_changed(daemon.schema_changed))
            if daemon.stopping():  # a cron wrapper must not read an abandoned pass as done
                print("memory-gc: interrupted; committed batches stay applied, the next pass "
                      "resumes the run", file=sys.stderr)  # fmt: skip
                return 1
            return 1 if failed else 0
        daemon.serve()
        if daemon.schema_changed is not None:
            raise SchemaOutdated(_schema_changed(daemon.schema_changed))
        return 0
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()
            server.server_close()
        daemon.close()


def _schema_changed(why: str) -> str:
    return (
        f"stopped: the database changed under this daemon — {why}. Committed batches stay "
        "applied; run the memory-gc image that matches the database"
    )


def _clock(args: argparse.Namespace, default: Callable[[], datetime]) -> Callable[[], datetime]:
    if args.now is None:
        return default
    if not args.once_due:
        raise UsageError("--now fixes the clock of one pass; use it with --once-due")
    fixed = parse_now(args.now)
    not_ahead(fixed, f"--now {args.now!r}", "The daemon's pass applies what is due then.")
    return lambda: fixed


def _check_metrics_address(args: argparse.Namespace) -> None:
    """What can be known of the metrics endpoint's address without binding it: the flags
    together, the port's range, the host's name (resolving binds nothing). Whether the address
    can be bound — taken, not this machine's — is known only when the server binds it."""
    if args.metrics_port is None:
        if args.metrics_host is not None:
            raise UsageError(
                "--metrics-host says where the metrics endpoint listens, but there is none "
                "without --metrics-port: add --metrics-port N (e.g. 9108), or drop --metrics-host"
            )
        return
    if not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port {args.metrics_port} is not a port (0-65535)")
    args.metrics_host = args.metrics_host or "0.0.0.0"
    try:
        socket.getaddrinfo(
            args.metrics_host, args.metrics_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, TypeError, UnicodeError) as exc:  # no such name; one it cannot encode
        raise _unservable(args, exc, "--metrics-host") from None


def _unservable(args: argparse.Namespace, exc: Exception, fix: str) -> UsageError:
    return UsageError(
        f"cannot serve metrics on {args.metrics_host}:{args.metrics_port}: {exc}; "
        f"pick another {fix}"
    )


def _metrics_server(args: argparse.Namespace, daemon: Any) -> Any:
    from gc_worker.metrics import serve_http

    if args.metrics_port is None:
        return None
    try:
        server = serve_http(daemon.metrics, daemon.health, args.metrics_host, args.metrics_port)
    except OSError as exc:
        # taken (or a privileged port): the port; no such address here: the host
        fix = (
            "--metrics-port" if exc.errno in (errno.EADDRINUSE, errno.EACCES) else "--metrics-host"
        )
        raise _unservable(args, exc, fix) from None
    host = f"[{args.metrics_host}]" if ":" in args.metrics_host else args.metrics_host  # IPv6
    print(f"metrics: http://{host}:{server.server_port}/metrics", flush=True)
    return server


def cmd_request_sweep(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker.render_text import printable_id
    from gc_worker.sweeps import queue_sweep

    request_id, created = queue_sweep(ctx.engine(), args.user_id, dry_run=args.dry_run)
    kind = "dry-run sweep" if args.dry_run else "sweep"
    state = "queued" if created else "already pending"  # it sweeps what is there when taken
    # the id is the application's (its users may choose it): shown, never a terminal escape
    print(f"{kind} request {request_id} {state} for user {printable_id(args.user_id)}; "
          "a running `memory-gc schedule` picks it up within seconds")  # fmt: skip
    return 0


def cmd_reject(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker.scheduler import reject_plan

    run_id = parse_uuid(args.run_id, "run id")
    reject_plan(ctx.engine(), run_id)
    print(f"run {run_id} rejected; its plan will not be applied")
    return 0
