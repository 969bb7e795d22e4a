"""Observability: Prometheus metrics and the health endpoint, scraped over HTTP."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gc_worker import daemon as daemon_module
from gc_worker import metrics as metrics_module
from gc_worker import sweeps
from gc_worker.cli import main
from gc_worker.config import LLMSettings, Runtime, Settings
from gc_worker.daemon import Daemon
from gc_worker.llm_store import open_run_llm
from gc_worker.metrics import Metrics, serve_http
from tests.store import NOW, add, days_ago, execute
from tests.test_schedule import runs, seed

SLOT = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
BASE_URL = "http://llm.test/v1"


def scores_reply(request: httpx2.Request) -> httpx2.Response:
    """An importance answer scoring the single memory of the batch 4."""
    content = json.dumps({"scores": [{"index": 0, "score": 4}]})
    message = {"role": "assistant", "content": content, "refusal": None}
    body = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1_700_000_000,
        "model": "gpt-4.1-mini",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": message}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    }  # fmt: skip
    return httpx2.Response(200, json=body)


class LLMServer:
    """Answers the first chat request, fails every later one with a 500."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.calls += 1
        if self.calls == 1:
            return scores_reply(request)
        return httpx2.Response(500, json={"error": {"message": "boom", "type": "server_error"}})


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, keyed by name and sorted labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def endpoint(engine: sa.Engine, settings: Settings, tmp_path: Path) -> Iterator[tuple[Daemon, str]]:
    """A daemon whose LLM is a fake server at the HTTP boundary, and its metrics URL."""
    runtime = Runtime(data_dir=tmp_path, openai_api_key="test-key", openai_base_url=BASE_URL)
    llm_settings = settings.model_copy(update={"llm": LLMSettings(max_retries=0)})
    server = LLMServer()

    def llm():
        client = httpx2.Client(transport=httpx2.MockTransport(server))
        return open_run_llm(llm_settings, runtime, engine, http_client=client)

    daemon = Daemon(engine, llm_settings, clock=lambda: SLOT, llm_factory=llm)
    http = serve_http(daemon.metrics, daemon.health, "127.0.0.1", 0)
    yield daemon, f"http://127.0.0.1:{http.server_port}"
    http.shutdown()
    http.server_close()
    daemon.close()


def sample(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, tuple(sorted(labels.items()))))


class TestMetricsEndpoint:
    def test_nightly_run_shows_in_the_metrics(self, engine, endpoint):
        """After a nightly run the scrape has its actions, run, duration, last success, LLM use."""
        daemon, url = endpoint
        for user in ("alice", "bob"):
            add(engine, user, "expired", expires_at=days_ago(1), importance_assessed_at=NOW)
            add(engine, user, "never assessed", created_at=days_ago(1))
        run_id = daemon.nightly()
        metrics = scrape(url + "/metrics")
        actions = "memory_gc_actions_total"
        assert (
            sample(metrics, actions, job="ttl_expiry", action="soft_delete", outcome="applied") == 2
        )
        assert (
            sample(metrics, actions, job="importance", action="set_importance", outcome="applied")
            == 1
        )
        assert sample(metrics, actions, job="importance", action="deferred", outcome="applied") == 1
        assert sample(metrics, "memory_gc_batches_total", trigger="nightly") == 1
        assert (
            sample(
                metrics, "memory_gc_runs_total", trigger="nightly", mode="apply", status="completed"
            )
            == 1
        )
        assert (
            sample(metrics, "memory_gc_run_duration_seconds_count", trigger="nightly", mode="apply")
            == 1
        )
        finished = execute(
            engine, "SELECT finished_at FROM gc_runs WHERE id = :r", r=run_id
        ).scalar()
        last = sample(metrics, "memory_gc_last_success_timestamp_seconds", trigger="nightly")
        assert last == pytest.approx(finished.timestamp())
        assert sample(metrics, "memory_gc_llm_calls_total") == 2
        assert sample(metrics, "memory_gc_llm_errors_total", kind="error") == 1

    def test_a_second_participation_does_not_count_batches_again(self, engine, endpoint):
        """Joining a completed slot again adds nothing to the counters."""
        daemon, url = endpoint
        add(engine, "alice", "expired", expires_at=days_ago(1), importance_assessed_at=NOW)
        daemon.nightly()
        daemon.nightly()
        metrics = scrape(url + "/metrics")
        assert sample(metrics, "memory_gc_batches_total", trigger="nightly") == 1
        assert (
            sample(
                metrics, "memory_gc_runs_total", trigger="nightly", mode="apply", status="completed"
            )
            == 1
        )

    def test_sweeps_are_counted(self, engine, endpoint):
        """Finished sweeps are counted by outcome."""
        daemon, url = endpoint
        add(engine, "alice", "expired", expires_at=days_ago(1), importance_assessed_at=NOW)
        sweeps.request_sweep(engine, "alice")
        execute(engine, "INSERT INTO gc_sweep_requests (user_id) VALUES ('ghost')")
        while daemon.sweep_next():
            pass
        assert daemon.last_progress > daemon.last_loop  # the sweep's batch was a sign of life
        metrics = scrape(url + "/metrics")
        assert sample(metrics, "memory_gc_sweep_requests_total", status="done") == 1
        assert sample(metrics, "memory_gc_sweep_requests_total", status="failed") == 1
        assert sample(metrics, "memory_gc_runs_total", trigger="sweep", mode="apply",
                      status="completed") == 1  # fmt: skip

    def test_failed_units_are_counted(self, engine, endpoint, unreachable_engine):
        """A unit of work that fails (here: the database is down at the fire time and for the
        upkeep) is counted per unit; the daemon carries on."""
        daemon, url = endpoint
        daemon.engine = unreachable_engine
        try:
            daemon.attempt(daemon.nightly)
            daemon.upkeep()
        finally:
            daemon.engine = engine
        metrics = scrape(url + "/metrics")
        failures = "memory_gc_unit_failures_total"
        upkeep = ("catch_up_slot", "apply_due_plans", "resume_orphans", "count_held_plans")
        for unit in ("nightly", *upkeep):
            assert sample(metrics, failures, unit=unit) == 1, unit
        assert daemon.failures == 5


class TestHealth:
    def test_healthy_until_stopping(self, endpoint):
        """/healthz is 200 while the daemon runs and 503 once it is stopping."""
        daemon, url = endpoint
        code, body = get(url + "/healthz")
        assert code == 200 and json.loads(body)["status"] == "ok"
        daemon.request_stop()
        code, body = get(url + "/healthz")
        assert code == 503 and json.loads(body)["stopping"] is True

    def test_stalled_loop_is_unhealthy(self, endpoint):
        """A sweep loop that has not turned for longer than the limit is reported unhealthy."""
        daemon, url = endpoint
        daemon.last_loop -= 61
        assert get(url + "/healthz")[0] == 503

    def test_a_long_sweep_stays_healthy_while_batches_commit(self, endpoint):
        """Inside a sweep the loop does not turn; health then follows committed batches, up to
        BUSY_LIMIT_SECONDS apart (a liveness probe must not kill a pod mid-sweep)."""
        daemon, url = endpoint
        daemon.sweeping = True
        try:
            daemon.last_loop -= 600
            daemon.last_progress = daemon.last_loop + 300
            assert get(url + "/healthz")[0] == 200
            daemon.last_loop -= daemon_module.BUSY_LIMIT_SECONDS
            daemon.last_progress -= daemon_module.BUSY_LIMIT_SECONDS
            code, body = get(url + "/healthz")
            assert code == 503 and json.loads(body)["sweeping"] is True
        finally:
            daemon.sweeping = False

    def test_a_nightly_run_does_not_vouch_for_a_hung_sweep(self, engine, endpoint):
        """The nightly thread's batches and model requests are not the sweep loop's progress: a
        hung sweep goes red even while the same replica's nightly run moves on."""
        daemon, _ = endpoint
        add(engine, "alice", "expired", expires_at=days_ago(1))  # unassessed: the model is asked
        before = daemon.last_progress
        assert daemon.nightly() is not None
        assert daemon.last_progress == before  # what /healthz follows inside a sweep

    def test_unknown_path_is_404(self, endpoint):
        """Anything else is 404 with a hint."""
        code, body = get(url := endpoint[1] + "/nope")
        assert code == 404 and "/metrics" in body, url


def test_the_erasure_runs_failed_series_is_exported_from_the_start():
    """operations.md: the completed / failed series of memory_gc_runs_total exist at 0 from the
    start, so that `increase(memory_gc_runs_total{status="failed"}[1d]) > 0` sees a first
    failure. The daemon also finishes runs with trigger `erasure` (a held plan's users' forget
    requests, carried out meanwhile), whose series were missing: the first failed erasure run
    appeared at 1 and was no increase."""
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(Metrics().exposition().decode())
        for s in family.samples
    }
    for status in ("completed", "failed"):
        labels = {"trigger": "erasure", "mode": "apply", "status": status}
        assert sample(metrics, "memory_gc_runs_total", **labels) == 0, status


def session_ended_in(monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    """The metrics' first read of ``query`` finds its session ended by the server (57P01, as
    in a restart or a reaped session), after the work it counts committed."""
    real, ended = metrics_module.q, []

    def q(name: str) -> sa.TextClause:
        if name == query and not ended:
            ended.append(name)
            return sa.text("SELECT pg_terminate_backend(pg_backend_pid())")
        return real(name)

    monkeypatch.setattr(metrics_module, "q", q)


def not_updated(logs: list[dict]) -> list[str]:
    """The updates logged as skipped."""
    return [e["update"] for e in logs if e["event"] == "gc.metrics_not_updated"]


class TestMetricsAreBestEffort:
    @pytest.mark.parametrize(
        ("query", "update"),
        [("batch_action_counts", "batches_committed"), ("run_outcome", "run_finished")],
    )
    def test_a_failed_metrics_read_does_not_fail_the_nightly_run(
        self, engine, settings, monkeypatch, query, update
    ):
        """A metrics read that loses its session after a batch (or the run) committed is
        logged and skipped: the run goes on and completes, the unit does not fail, and a batch
        the read missed is counted by the next one."""
        seed(engine, users=3)
        settings = settings.model_copy(
            update={"run": settings.run.model_copy(update={"batch_users": 1, "workers": 1})}
        )
        session_ended_in(monkeypatch, query)
        daemon = Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=1))
        with closing(daemon) as d, capture_logs() as logs:
            d.attempt(d.nightly)
        (night,) = runs(engine)
        assert (night["status"], night["error"], d.failures) == ("completed", None, 0)
        assert (
            execute(engine, "SELECT count(*) FROM memories WHERE status = 'deleted'").scalar() == 3
        )
        assert not_updated(logs) == [update]
        assert d.metrics.batches.labels("nightly")._value.get() == 3

    @pytest.mark.parametrize("query", ["batch_action_counts", "run_outcome"])
    def test_a_sweep_whose_metrics_read_failed_is_done(self, engine, settings, monkeypatch, query):
        """The sweep's batch committed, then a metrics read lost its session: the request
        ends done (its changes are applied), not failed."""
        seed(engine, users=1)
        session_ended_in(monkeypatch, query)
        request_id = sweeps.request_sweep(engine, "user-000")
        daemon = Daemon(engine, settings, clock=lambda: SLOT + timedelta(minutes=1))
        with closing(daemon) as d, capture_logs() as logs:
            d.attempt(d.sweep_next)
        request = sweeps.get_sweep(engine, request_id)
        assert (request["status"], request["error"], d.failures) == ("done", None, 0)
        assert (
            execute(engine, "SELECT count(*) FROM memories WHERE status = 'deleted'").scalar() == 1
        )
        assert len(not_updated(logs)) == 1
        assert d.metrics.sweeps.labels("done")._value.get() == 1


class TestMetricsHost:
    @pytest.mark.parametrize(("host", "family"), [("::1", socket.AF_INET6),
                                                  ("::", socket.AF_INET6),
                                                  ("127.0.0.1", socket.AF_INET)])  # fmt: skip
    def test_the_endpoint_is_served_in_the_hosts_address_family(self, host, family):
        """An IPv6 host (`::`, `::1`: an IPv6-only cluster) is served over IPv6, an IPv4 one
        over IPv4; the HTTP server used to be IPv4 only and refused every IPv6 address."""
        server = serve_http(Metrics(), lambda: (True, {}), host, 0)
        try:
            assert server.address_family == family
            loopback = "[::1]" if family == socket.AF_INET6 else "127.0.0.1"
            assert get(f"http://{loopback}:{server.server_port}/healthz")[0] == 200
        finally:
            server.shutdown()
            server.server_close()

    def test_schedule_serves_metrics_on_an_ipv6_host(self, cli_env, capsys):
        """`schedule --metrics-host ::1` runs (it exited 2, "pick another --metrics-host") and
        prints a URL that can be opened: the address in brackets."""
        argv = ["schedule", "--once-due", "--metrics-port", "0", "--metrics-host", "::1"]
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 0, err[-300:]
        assert "metrics: http://[::1]:" in out
