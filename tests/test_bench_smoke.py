"""The benchmark pipeline at a tiny scale: the correctness check of the set-based baseline and the
naive loop (they must leave exactly the store memory-gc leaves)."""

from __future__ import annotations

import pytest

from bench import BENCH_NOW
from bench.compare import end_state
from bench.generate import Scale
from bench.runner import TEMPLATE, Cluster, Results, build_template, run_all, run_in_process
from gc_worker import db
from gc_worker.config import EmbeddingSettings, Settings, UserCapSettings

from .conftest import TEST_DIM

JOBS = ("ttl_expiry", "decay", "usage_prune", "user_cap", "hard_delete", "refresh")
SCALE = Scale(memories=3_000, users=30, embedded_share=0.2, dim=TEST_DIM)


@pytest.fixture(scope="module")
def bench_settings() -> Settings:
    # a cap of 150 puts several of the 30 users (about 100 memories each) over it
    return Settings(
        embeddings=EmbeddingSettings(dim=TEST_DIM), user_cap=UserCapSettings(max_memories=150)
    )


@pytest.fixture(scope="module")
def results(pg_server, bench_settings: Settings) -> Results:
    cluster = Cluster(pg_server)
    results = build_template(cluster, SCALE, bench_settings, BENCH_NOW)
    return run_all(
        cluster, results, bench_settings, BENCH_NOW, say=lambda _: None, worker=run_in_process
    )


class TestBenchPipeline:
    def test_every_contender_leaves_the_same_store(self, results: Results) -> None:
        """Set-based SQL (bare and audited), the naive loop and plan+apply all match memory-gc."""
        assert set(results.measures) == {
            "memory_gc", "memory_gc_rerun", "set_based", "set_based_audit", "naive", "plan_apply",
        }  # fmt: skip
        assert results.mismatches() == {}

    def test_every_job_has_work_and_counts_agree(self, results: Results) -> None:
        """Each deterministic job changes rows, and every contender changes as many per job."""
        gc = results.measures["memory_gc"].changed
        assert all(gc[job] > 0 for job in JOBS), gc
        for name in ("set_based", "set_based_audit", "naive", "plan_apply"):
            assert {job: results.measures[name].changed.get(job) for job in JOBS} == {
                job: gc[job] for job in JOBS
            }, name

    def test_audited_baseline_writes_the_same_audit(self, results: Results) -> None:
        """The audited set-based SQL writes one applied audit row per memory-gc action."""
        assert results.audit_match is True

    def test_rerun_has_nothing_to_do(self, results: Results) -> None:
        """A second memory-gc run right after the first changes nothing."""
        assert sum(results.measures["memory_gc_rerun"].changed.values()) == 0
        assert results.measures["memory_gc"].rss_mb is not None

    def test_generated_store_has_the_asked_size(self, pg_server, results: Results) -> None:
        """The template holds exactly the requested memories over the requested users."""
        engine = db.make_engine(Cluster(pg_server).url(TEMPLATE))
        try:
            state = end_state(engine)
            with engine.connect() as conn:
                users = conn.exec_driver_sql("SELECT count(DISTINCT user_id) FROM memories")
                assert users.scalar_one() == SCALE.users
        finally:
            engine.dispose()
        assert state.rows == SCALE.memories
