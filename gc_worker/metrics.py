"""Prometheus metrics of the daemon and its HTTP endpoint (``/metrics``, ``/healthz``).

Metrics (one registry per daemon; all counters are this replica's, sum them across replicas):
    memory_gc_actions_total{job, action, outcome}   actions in batches this replica committed
                                                    (outcome planned / applied / drifted)
    memory_gc_batches_total{trigger}                batches this replica committed
    memory_gc_runs_total{trigger, mode, status}     runs this replica finished (completed/failed)
    memory_gc_run_duration_seconds{trigger, mode}   start to finish of those runs (histogram)
    memory_gc_last_success_timestamp_seconds{trigger}  when the last run of a trigger completed
                                                    (from the database at start: any replica's)
    memory_gc_llm_calls_total                       model calls made by this replica
    memory_gc_llm_errors_total{kind}                error (after retries) / invalid_answer
    memory_gc_sweep_requests_total{status}          on-demand sweeps finished (done / failed)
    memory_gc_sweep_requests_pending                queue length at the last poll
    memory_gc_plans_held                            nightly plans held for a person, still waiting
    memory_gc_unit_failures_total{unit}             units of work that failed (logged as
                                                    gc.daemon.unit_failed; the daemon carries on)

Counters move after the batch's transaction committed, never before.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from uuid import UUID

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from sqlalchemy.engine import Engine

from gc_worker.queries import q

DURATION_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400)
Health = Callable[[], tuple[bool, dict[str, Any]]]


# The daemon's units of work (memory_gc_unit_failures_total{unit}).
UNITS = ("nightly", "catch_up_slot", "apply_due_plans", "resume_orphans", "sweep_next",
         "count_pending_sweeps", "count_held_plans")  # fmt: skip


class Metrics:
    """The daemon's counters, on their own registry (several daemons may share a process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.actions = Counter(
            "memory_gc_actions",
            "Actions committed, by job, action and outcome",
            ["job", "action", "outcome"],
            registry=r,
        )
        self.batches = Counter("memory_gc_batches", "Batches committed", ["trigger"], registry=r)
        self.runs = Counter(
            "memory_gc_runs",
            "Runs finished by this replica",
            ["trigger", "mode", "status"],
            registry=r,
        )
        self.run_duration = Histogram(
            "memory_gc_run_duration_seconds",
            "Run start to finish",
            ["trigger", "mode"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.last_success = Gauge(
            "memory_gc_last_success_timestamp_seconds",
            "Unix time the last run of a trigger completed",
            ["trigger"],
            registry=r,
        )
        self.llm_calls = Counter("memory_gc_llm_calls", "LLM calls made", registry=r)
        self.llm_errors = Counter("memory_gc_llm_errors", "LLM errors", ["kind"], registry=r)
        self.sweeps = Counter(
            "memory_gc_sweep_requests", "On-demand sweeps finished", ["status"], registry=r
        )
        self.sweep_queue = Gauge("memory_gc_sweep_requests_pending", "Sweeps waiting", registry=r)
        self.plans_held = Gauge(
            "memory_gc_plans_held", "Nightly plans waiting for a person (too large)", registry=r
        )
        self.unit_failures = Counter(
            "memory_gc_unit_failures", "Units of work that failed", ["unit"], registry=r
        )
        # the series an alert on increase() watches exist from the start, at 0: a series first
        # seen at 1 has no earlier sample, and its first failure would not count as an increase
        for unit in UNITS:
            self.unit_failures.labels(unit)
        # every run a daemon finishes: erasure is a held plan's users' forget requests
        for trigger, mode in (("nightly", "apply"), ("nightly", "dry_run"),
                              ("nightly_apply", "apply"), ("sweep", "apply"),
                              ("sweep", "dry_run"), ("erasure", "apply")):  # fmt: skip
            for status in ("completed", "failed"):
                self.runs.labels(trigger, mode, status)
        for status in ("done", "failed"):
            self.sweeps.labels(status)
        self._seen: dict[UUID, set[int]] = {}
        self._owed: dict[UUID, set[int]] = {}  # committed, not counted yet (a read failed)
        self._lock = threading.Lock()

    def batches_committed(
        self, engine: Engine, run_id: UUID, trigger: str, batch_nos: Sequence[int] = ()
    ) -> None:
        """Count the actions of ``batch_nos``, batches of the run this daemon committed, and of
        those it committed before whose count a failed read missed."""
        with self._lock:
            seen = self._seen.setdefault(run_id, set())
            owed = self._owed.setdefault(run_id, set())
            owed.update(batch_nos)
            if not owed:
                return
            with engine.connect() as conn:
                rows = conn.execute(
                    q("batch_action_counts"),
                    {"run_id": run_id, "batches": sorted(owed), "seen": sorted(seen)},
                ).all()
            for row in rows:
                if row.job is not None:
                    self.actions.labels(row.job, row.action, row.outcome).inc(row.n)
            new = {row.batch_no for row in rows} - seen
            self.batches.labels(trigger).inc(len(new))
            seen |= new
            owed.clear()

    def load_last_successes(self, engine: Engine, triggers: tuple[str, ...]) -> None:
        """Start the last-success gauge from the store: a replica started after the last
        success (a deploy, a restart) otherwise exported no series, and an alert on the time
        since the last nightly success had nothing to compare until the next one."""
        with engine.connect() as conn:
            rows = conn.execute(q("last_successes"), {"triggers": list(triggers)}).all()
        for row in rows:
            self.last_success.labels(row.trigger).set(row.finished_at.timestamp())

    def run_finished(self, engine: Engine, run_id: UUID) -> None:
        """Count a run this replica completed or saw fail."""
        with engine.connect() as conn:
            row = conn.execute(q("run_outcome"), {"run_id": run_id}).first()
        if row is not None and row.finished_at is None:
            return  # left running (to be resumed): the batches counted stay counted
        with self._lock:
            self._seen.pop(run_id, None)
        if row is None:
            return
        self.runs.labels(row.trigger, row.mode, row.status).inc()
        if row.status == "completed":
            self.run_duration.labels(row.trigger, row.mode).observe(float(row.seconds))
            self.last_success.labels(row.trigger).set(row.finished_at.timestamp())

    def llm_used(self, usage: dict[str, int]) -> None:
        self.llm_calls.inc(usage.get("calls", 0))
        for kind, key in (("error", "errors"), ("invalid_answer", "invalid_answers")):
            if usage.get(key):
                self.llm_errors.labels(kind).inc(usage[key])

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def serve_http(metrics: Metrics, health: Health, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` in a daemon thread; port 0 picks a free port. The
    host's address family is the one it resolves to first (``::`` and ``::1`` are IPv6)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, metrics.exposition())
            elif self.path.split("?")[0] in ("/healthz", "/health"):
                ok, detail = health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **detail}).encode()
                self._send(200 if ok else 503, "application/json", body)
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            pass

    server = _server_class(host, port)((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="memory-gc-metrics", daemon=True).start()
    return server


class _IPv6HTTPServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _server_class(host: str, port: int) -> type[ThreadingHTTPServer]:
    """The HTTP server for the host's address family: ThreadingHTTPServer is IPv4 only, and
    refused an IPv6 host (``::`` in an IPv6-only cluster) as an address not here. A host that
    does not resolve raises socket.gaierror, an OSError like any host that cannot be bound."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return _IPv6HTTPServer if family == socket.AF_INET6 else ThreadingHTTPServer
