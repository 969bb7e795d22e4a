"""The benchmark procedure: one generated template store, a clone per contender, timings and
end states side by side (all in the same embedded PostgreSQL).

1. memory-gc apply run over all users (child process: its own peak RSS);
2. the set-based SQL (bench.baseline), without and with the audit rows;
3. the naive per-user loop (bench.naive);
4. a second memory-gc run right after 1, on 1's database (nothing left to do);
5. memory-gc dry run, then apply of that plan (child process).

Each contender starts from a fresh ``CREATE DATABASE … TEMPLATE`` clone after a checkpoint, so
none pays for another's dirty buffers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.baseline import apply_set_based
from bench.compare import EndState, audit_counts, differences, end_state
from bench.generate import Scale, generate
from bench.naive import run_naive
from gc_worker import db, schema
from gc_worker.config import Settings

TEMPLATE = "bench_template"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Measure:
    """One contender's figures."""

    seconds: float
    changed: dict[str, int]
    rss_mb: float | None = None
    state: EndState | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_changed(self) -> int:
        return sum(self.changed.values())


@dataclass
class Results:
    scale: Scale
    generate_seconds: float = 0.0
    store: dict[str, Any] = field(default_factory=dict)
    measures: dict[str, Measure] = field(default_factory=dict)
    audit_match: bool | None = None

    def mismatches(self, reference: str = "memory_gc") -> dict[str, list[str]]:
        """Contenders whose end state differs from the reference's, with how."""
        ref = self.measures[reference].state
        assert ref is not None
        found = {}
        for name, measure in self.measures.items():
            if measure.state is not None and not measure.state.matches(ref):
                found[name] = differences(ref, measure.state)
        return found


def median_of(rounds: list[Results]) -> Results:
    """One Results of several rounds: per contender the round with the median wall time
    (``extra["spread"]`` = the fastest and slowest); the audit check must hold in every round."""
    merged = Results(scale=rounds[0].scale, generate_seconds=rounds[0].generate_seconds,
                     store=rounds[0].store)  # fmt: skip
    merged.audit_match = all(r.audit_match for r in rounds)
    for name in rounds[0].measures:
        runs = sorted((r.measures[name] for r in rounds), key=lambda m: m.seconds)
        pick = runs[(len(runs) - 1) // 2]
        pick.extra = pick.extra | {"spread": [runs[0].seconds, runs[-1].seconds]}
        merged.measures[name] = pick
    return merged


class Cluster:
    """Databases of the benchmark on one embedded (or test) PostgreSQL server."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def url(self, name: str) -> str:
        return self.server.get_uri(name, driver="psycopg")

    def recreate(self, name: str, template: str | None = None) -> str:
        self.drop(name)
        clone = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
        self.server.psql(f"CREATE DATABASE {name}{clone};")
        return self.url(name)

    def drop(self, name: str) -> None:
        exists = self.server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")
        if "(1 row)" in exists:
            self.server.psql(f"DROP DATABASE {name} WITH (FORCE);")

    def checkpoint(self) -> None:
        self.server.psql("CHECKPOINT;")

    def configure(self, settings: dict[str, str]) -> None:
        """Server settings for this benchmark (ALTER SYSTEM; anything else reset), restarting the
        embedded server when one needs it (shared_buffers)."""
        statements = ["ALTER SYSTEM RESET ALL;"]
        statements += [f"ALTER SYSTEM SET {name} = '{value}';" for name, value in settings.items()]
        self.server.psql("\n".join([*statements, "SELECT pg_reload_conf();"]))
        pending = self.server.psql("SELECT count(*) FROM pg_settings WHERE pending_restart;")
        if pending.split()[2] != "0":
            self.server.stop()
            self.server.ensure_postgres_running()

    def settings(self) -> dict[str, str]:
        """The server settings that matter to these figures."""
        names = ("shared_buffers", "work_mem", "max_wal_size", "synchronous_commit",
                 "max_parallel_workers_per_gather", "autovacuum")  # fmt: skip
        out = self.server.psql(
            "SELECT name || '=' || current_setting(name) FROM pg_settings"
            f" WHERE name IN ({', '.join(repr(n) for n in names)}) ORDER BY 1;"
        )
        pairs = [ln.strip() for ln in out.splitlines() if "=" in ln]
        return dict(p.split("=", 1) for p in pairs)


def build_template(cluster: Cluster, scale: Scale, settings: Settings, now: datetime) -> Results:
    results = Results(scale=scale)
    engine = db.make_engine(cluster.recreate(TEMPLATE))
    try:
        schema.migrate(engine, embedding_dim=scale.dim)
        started = time.perf_counter()
        generate(engine, scale, settings, now=now)
        results.generate_seconds = time.perf_counter() - started
        with engine.begin() as conn:  # the clones inherit it: see docs/benchmarks.md
            for table in ("memories", "memory_lineage", "gc_actions"):
                conn.execute(sa.text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        settings_now = cluster.settings() | {"autovacuum (benchmark tables)": "off"}
        results.store = store_facts(engine) | {"settings": settings_now}
    finally:
        engine.dispose()
    return results


def store_facts(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(sa.text(STORE_FACTS)).mappings().one()
        return dict(row)


STORE_FACTS = """
SELECT count(*) AS memories, count(DISTINCT user_id) AS users,
       count(*) FILTER (WHERE embedding IS NOT NULL) AS embedded,
       pg_size_pretty(pg_total_relation_size('memories')) AS size,
       current_setting('server_version') AS server_version
FROM memories
"""


def run_worker(url: str, mode: str, settings: Settings, now: datetime) -> dict[str, Any]:
    """memory-gc in a child process (see bench.worker); returns its result."""
    with tempfile.TemporaryDirectory() as tmp:
        out, config = Path(tmp) / "result.json", Path(tmp) / "settings.json"
        config.write_text(settings.model_dump_json(), encoding="utf-8")
        command = [
            sys.executable, "-m", "bench.worker", "--url", url, "--mode", mode,
            "--now", now.isoformat(), "--settings", str(config), "--out", str(out),
        ]  # fmt: skip
        subprocess.run(command, cwd=REPO, check=True)
        return json.loads(out.read_text(encoding="utf-8"))


def run_in_process(url: str, mode: str, settings: Settings, now: datetime) -> dict[str, Any]:
    """memory-gc in this process (tests: no interpreter start-up; RSS is then the caller's)."""
    from bench import worker

    return worker.run(url, mode, now, settings)


Worker = Callable[[str, str, Settings, datetime], dict[str, Any]]


def _worker_measure(
    worker: Worker, url: str, mode: str, settings: Settings, now: datetime, engine: Engine
) -> Measure:
    result = worker(url, mode, settings, now)
    return Measure(
        seconds=result["seconds"]["run"],
        changed=result["changed"],
        rss_mb=result["rss_mb"]["summary"],
        state=end_state(engine),
        extra=result,
    )


def _timed(work: Callable[[], dict[str, int]], engine: Engine) -> Measure:
    started = time.perf_counter()
    changed = work()
    seconds = time.perf_counter() - started
    return Measure(seconds=seconds, changed=changed, state=end_state(engine))


@contextmanager
def _clone(cluster: Cluster, name: str, *, keep: bool) -> Iterator[tuple[str, Engine]]:
    """A fresh clone of the template, after a checkpoint; dropped afterwards unless ``keep``."""
    database = f"bench_{name}"
    url = cluster.recreate(database, TEMPLATE)
    cluster.checkpoint()
    engine = db.make_engine(url)
    try:
        yield url, engine
    finally:
        engine.dispose()
        if not keep:
            cluster.drop(database)


def run_all(
    cluster: Cluster,
    results: Results,
    settings: Settings,
    now: datetime,
    *,
    naive: bool = True,
    keep: bool = False,
    say: Callable[[str], None] = print,
    worker: Worker = run_worker,
) -> Results:
    """Run every contender on its own clone of the template; fills ``results.measures``."""
    m = results.measures
    say("1. memory-gc run, then 4. the same run again")
    with _clone(cluster, "memory_gc", keep=keep) as (url, engine):
        m["memory_gc"] = _worker_measure(worker, url, "apply", settings, now, engine)
        m["memory_gc_rerun"] = _worker_measure(worker, url, "apply", settings, now, engine)
        gc_audit = audit_counts(engine, [m["memory_gc"].extra["run_id"]])
    say("2. set-based SQL, without and with the audit rows")
    with _clone(cluster, "set_based", keep=keep) as (_, engine):
        m["set_based"] = _timed(
            lambda: apply_set_based(engine, settings, now=now, audit=False), engine
        )
    with _clone(cluster, "set_based_audit", keep=keep) as (_, engine):
        m["set_based_audit"] = _timed(
            lambda: apply_set_based(engine, settings, now=now, audit=True), engine
        )
        results.audit_match = _all_audit(engine) == gc_audit
    if naive:
        say("3. naive per-user loop")
        with _clone(cluster, "naive", keep=keep) as (_, engine):
            m["naive"] = _timed(lambda: run_naive(engine, settings, now=now), engine)
    say("5. memory-gc dry run, then apply of its plan")
    with _clone(cluster, "plan_apply", keep=keep) as (url, engine):
        m["plan_apply"] = _worker_measure(worker, url, "plan_apply", settings, now, engine)
    return results


def _all_audit(engine: Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        runs = list(conn.execute(sa.text("SELECT id FROM gc_runs")).scalars())
    return audit_counts(engine, runs)
