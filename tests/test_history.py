"""Pruning the worker's own history (gc_worker.history): what goes at the retention boundary,
what stays because something still needs it, and that erasure and restore answer the same."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker import history, restore
from gc_worker.cli import main
from gc_worker.config import HistorySettings, Settings, load_settings
from gc_worker.daemon import Daemon
from gc_worker.errors import ConfigError
from tests.store import NOW, add, city_pair, days_ago, execute, get, run
from tests.test_erasure_helpers import merge, requests
from tests.test_erasure_residue_review import DAY, LATER, erased, merged_fact

RETENTION = timedelta(days=400)
RUN_TABLES = ("gc_runs", "gc_actions", "gc_run_batches", "gc_run_llm_spend")
TABLES = ("gc_runs", "gc_actions", "gc_run_batches", "gc_run_llm_spend", "gc_llm_cache",
          "gc_erasure_requests", "gc_erasure_tombstones", "gc_review_items")  # fmt: skip


def clock() -> datetime:
    return datetime.now(UTC)


def ended(engine: sa.Engine, run_id: Any, at: datetime) -> None:
    """Say the run ended (and started) at ``at``."""
    execute(engine, "UPDATE gc_runs SET started_at = :t, finished_at = :t WHERE id = :id",
            t=at, id=UUID(str(run_id)))  # fmt: skip


def all_ended(engine: sa.Engine, at: datetime) -> None:
    execute(engine, "UPDATE gc_runs SET started_at = :t, finished_at = :t", t=at)


def counts(engine: sa.Engine, run_id: Any = None) -> dict[str, int]:
    """Rows per history table (of one run, for the run tables)."""
    out = {}
    with engine.connect() as conn:
        for table in TABLES:
            if run_id is not None and table in RUN_TABLES:
                column = "id" if table == "gc_runs" else "run_id"
                sql = f"SELECT count(*) FROM {table} WHERE {column} = :id"
                out[table] = conn.execute(sa.text(sql), {"id": UUID(str(run_id))}).scalar()
            elif run_id is None:
                out[table] = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()
    return out


def spent(engine: sa.Engine, run_id: Any) -> None:
    execute(engine, "INSERT INTO gc_run_llm_spend (run_id, calls, tokens) VALUES (:id, 1, 10)",
            id=UUID(str(run_id)))  # fmt: skip


def expired_run(engine: sa.Engine, settings: Settings, user: str) -> tuple[str, UUID]:
    """A run that soft-deleted one expired row of ``user``, which the application then
    deleted: nothing of the run's audit is still needed."""
    m = add(engine, user, f"expired note of {user}", expires_at=days_ago(1))
    report = run(engine, settings, jobs=["ttl_expiry"], users=[user])
    execute(engine, "DELETE FROM memories WHERE id = :id", id=m)
    return report["run_id"], m


class TestBoundary:
    def test_a_run_ended_just_past_the_retention_goes_one_just_inside_stays(self, engine, settings):
        """Runs ended a minute past and a minute short of 400 days: the first loses its audit,
        batches, spend and row; the second keeps everything."""
        now = clock()
        old, _ = expired_run(engine, settings, "u1")
        young, _ = expired_run(engine, settings, "u2")
        for run_id in (old, young):
            spent(engine, run_id)
        ended(engine, old, now - RETENTION - timedelta(minutes=1))
        ended(engine, young, now - RETENTION + timedelta(minutes=1))
        before = counts(engine, young)
        result = history.prune(engine, settings, now=now)
        assert counts(engine, old) == {"gc_runs": 0, "gc_actions": 0, "gc_run_batches": 0,
                                       "gc_run_llm_spend": 0}  # fmt: skip
        assert counts(engine, young) == before and before["gc_actions"] == 1
        assert (result.runs, result.actions, result.batches, result.spend) == (1, 1, 1, 1)

    def test_a_running_run_is_never_pruned(self, engine, settings):
        """A run still `running` (resumed, say) stays, however long ago it last ended."""
        run_id, _ = expired_run(engine, settings, "u1")
        ended(engine, run_id, clock() - 2 * RETENTION)
        execute(engine, "UPDATE gc_runs SET status = 'running'")
        before = counts(engine, run_id)
        assert history.prune(engine, settings, now=clock()).runs == 0
        assert counts(engine, run_id) == before

    def test_a_dry_run_changes_nothing_and_counts_what_would_go(self, engine, settings, cli_env,
                                                                 capsys):  # fmt: skip
        """`prune-history --dry-run` prints what a prune would delete and deletes nothing."""
        run_id, _ = expired_run(engine, settings, "u1")
        ended(engine, run_id, clock() - RETENTION - DAY)
        before = counts(engine)
        assert main(["prune-history", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "would delete 1 runs, 1 audit rows, 1 batch rows" in out
        assert counts(engine) == before
        assert main(["prune-history"]) == 0
        assert "deleted 1 runs, 1 audit rows" in capsys.readouterr().out
        assert counts(engine, run_id)["gc_runs"] == 0


class TestPlans:
    def test_a_plan_and_the_run_that_applied_it_go_together(self, engine, settings, cli_env):
        """A plan past the retention stays while the run that applied it does not; once both
        are past it, both go (the apply run names the plan)."""
        m = add(engine, "u1", "expired", expires_at=days_ago(1))
        plan = run(engine, settings, jobs=["ttl_expiry"], dry_run=True)["run_id"]
        applied = gc_engine.apply_plan(engine, UUID(plan))
        execute(engine, "DELETE FROM memories WHERE id = :id", id=m)
        now = clock()
        ended(engine, plan, now - RETENTION - DAY)
        ended(engine, applied, now - RETENTION + DAY)
        plan_rows = counts(engine, plan)
        assert history.prune(engine, settings, now=now).runs == 0
        assert counts(engine, plan) == plan_rows
        ended(engine, applied, now - RETENTION - DAY)
        assert history.prune(engine, settings, now=now).runs == 2
        assert counts(engine)["gc_runs"] == 0


class TestReferences:
    @pytest.mark.parametrize(
        "reference",
        [
            "INSERT INTO gc_erasure_requests (kind, user_id, run_id) VALUES ('user', 'u1', :id)",
            "INSERT INTO gc_sweep_requests (user_id, run_id, status) VALUES ('u1', :id, 'running')",
            "INSERT INTO gc_review_items (run_id, user_id, kind, memory_ids, reason)"
            " VALUES (:id, 'u1', 'contradiction', '{}', 'x')",
        ],
        ids=["pending_erasure", "open_sweep", "open_review"],
    )
    def test_a_run_something_open_names_stays_whole(self, engine, settings, reference):
        """A pending erasure request, an open sweep request or an open review item naming a
        run keeps all of it."""
        run_id, _ = expired_run(engine, settings, "u1")
        execute(engine, reference, id=UUID(run_id))
        ended(engine, run_id, clock() - 2 * RETENTION)
        before = counts(engine, run_id)
        history.prune(engine, settings, now=clock())
        assert counts(engine, run_id) == before and before["gc_actions"] == 1

    def test_a_completed_request_keeps_the_run_row_not_its_audit(self, engine, settings):
        """A completed erasure request's run_id still names a run: its row stays; the audit no
        longer needed goes. Requests, tombstones and the LLM cache are never touched."""
        run_id, m = expired_run(engine, settings, "u1")
        execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, status, run_id)"
                " VALUES ('user', 'u1', 'completed', :id)", id=UUID(run_id))  # fmt: skip
        execute(engine, "INSERT INTO gc_erasure_tombstones (user_id, memory_id, content_hash,"
                " preview_hash, reason) VALUES ('u1', :m, 'h', 'p', 'erasure')", m=m)  # fmt: skip
        execute(engine, "INSERT INTO gc_llm_cache (key, kind, user_id, value)"
                " VALUES ('k', 'merge_group', 'u1', '{}')")  # fmt: skip
        ended(engine, run_id, clock() - 2 * RETENTION)
        before = counts(engine)
        history.prune(engine, settings, now=clock())
        after = counts(engine)
        assert counts(engine, run_id)["gc_runs"] == 1 and after["gc_actions"] == 0
        for table in ("gc_erasure_requests", "gc_erasure_tombstones", "gc_llm_cache"):
            assert after[table] == before[table] == 1


class TestErasureAfterPrune:
    def test_forget_a_purged_member_still_erases_the_record_after_a_prune(
        self, engine, settings, cli_env
    ):
        """A and B merged into M; hard_delete purged A (its lineage edge went with it); the
        history is pruned. The audit row that is the only link from A to M stays, so
        `forget A` still erases M."""
        a, m = merged_fact(engine)
        run(engine, settings, jobs=["hard_delete"], now=LATER)
        assert get(engine, a) is None
        all_ended(engine, clock() - 2 * RETENTION)
        result = history.prune(engine, settings, now=clock())
        assert result.actions > 0 and result.kept_actions >= 1
        assert main(["forget", str(a), "--now", LATER.isoformat()]) == 0
        (filed,) = requests(engine)
        assert (filed["user_id"], filed["memory_id"]) == ("u1", a)
        run(engine, settings, now=LATER)
        assert requests(engine)[0]["status"] == "completed" and erased(engine, m)

    def test_a_chain_of_records_the_application_deleted_keeps_its_links(self, engine, settings):
        """A and B merged into M, M summarised into S, then the application deleted A, B and M:
        M's create_merged row (its record and sources gone, but M is a source of S) and S's
        stay, so forgetting A still reaches S."""
        from gc_worker import erasure

        a = add(engine, "u1", "Drinks oat milk")
        b = add(engine, "u1", "Prefers oat milk")
        m = merge(engine, "u1", [a, b], "Drinks oat milk", [1.0] + [0.0] * 7)
        c = add(engine, "u1", "Takes coffee black")
        s = merge(engine, "u1", [m, c], "Coffee habits", [0.0, 1.0] + [0.0] * 6)
        execute(engine, "DELETE FROM memories WHERE id IN (:a, :b, :m)", a=a, b=b, m=m)
        all_ended(engine, clock() - 2 * RETENTION)
        history.prune(engine, settings, now=clock())
        erasure.forget(engine, settings, now=NOW, memory_id=a, purge_now=True)
        assert get(engine, s) is None


class TestRestoreAfterPrune:
    def test_restore_gives_the_same_answer_for_what_is_still_restorable(self, engine, settings):
        """A run soft-deleted X and Y; Y was purged since. After a prune X's row stays:
        `restore --memory X` and `restore --run` still bring X back."""
        x = add(engine, "u1", "expired x", expires_at=days_ago(1))
        y = add(engine, "u1", "expired y", expires_at=days_ago(1))
        run_id = UUID(run(engine, settings, jobs=["ttl_expiry"])["run_id"])
        execute(engine, "DELETE FROM memories WHERE id = :id", id=y)
        ended(engine, run_id, clock() - 2 * RETENTION)
        result = history.prune(engine, settings, now=clock())
        assert (result.actions, result.kept_actions, result.runs) == (1, 1, 0)
        done = restore.restore_run(engine, run_id, now=NOW + DAY)
        assert done.restored == [x] and get(engine, x)["status"] == "active"

    def test_the_read_rule_answers_the_same_after_a_prune(self, engine, settings):
        """A slot's older value was obsoleted (its validity closed): the read rule reads its
        prior valid_until from the audit, at every instant, before and after a prune."""
        old, _new = city_pair(engine)
        run(engine, settings, jobs=["contradiction"])
        assert get(engine, old)["status"] == "obsolete"
        instants = [(days_ago(d), days_ago(k)) for d in (5, 0, -3) for k in (20, 5, 0)]

        def answers() -> list[list[UUID]]:
            with engine.connect() as conn:
                return [
                    sorted(
                        conn.execute(
                            sa.text("SELECT id FROM memory_gc_current('u1', NULL, :at, :known)"),
                            {"at": at, "known": known},
                        ).scalars()
                    )
                    for at, known in instants
                ] + [
                    sorted(
                        conn.execute(
                            sa.text("SELECT id FROM memory_gc_current('u1', NULL, :at)"),
                            {"at": NOW},
                        ).scalars()
                    )
                ]

        before = answers()
        all_ended(engine, clock() - 2 * RETENTION)
        history.prune(engine, settings, now=clock())
        assert answers() == before


class TestSettings:
    def test_a_retention_shorter_than_the_restore_window_is_refused(self, tmp_path):
        """history.retention_days under hard_delete.history_retention_days plus the plan age
        limit is refused, naming both settings and the minimum; at the minimum it loads."""
        path = tmp_path / "gc.toml"
        path.write_text("[history]\nretention_days = 367\n")
        with pytest.raises(ConfigError) as err:
            load_settings(path, env={})
        message = str(err.value)
        for part in ("history.retention_days = 367", "hard_delete.history_retention_days (365",
                     "run.max_plan_age_hours (72", "at least 368", "enabled = false"):  # fmt: skip
            assert part in message
        path.write_text("[history]\nretention_days = 368\n")
        assert load_settings(path, env={}).history.retention_days == 368

    def test_the_minimum_follows_the_longest_retention(self, tmp_path):
        """A longer hard_delete.retention_days raises the minimum and is the one named."""
        path = tmp_path / "gc.toml"
        path.write_text("[hard_delete]\nretention_days = 500\n[history]\nretention_days = 450\n")
        with pytest.raises(ConfigError, match=r"hard_delete.retention_days \(500 days\)"):
            load_settings(path, env={})

    def test_turned_off_any_retention_loads_and_the_command_refuses(self, cli_env, capsys,
                                                                    monkeypatch):  # fmt: skip
        """enabled = false skips the check; prune-history then exits 2 naming the setting."""
        monkeypatch.setenv("MEMORY_GC_HISTORY__ENABLED", "false")
        monkeypatch.setenv("MEMORY_GC_HISTORY__RETENTION_DAYS", "10")
        assert main(["prune-history"]) == 2
        assert "[history] enabled = false" in capsys.readouterr().err

    def test_a_too_short_retention_fails_the_command_with_exit_2(self, cli_env, capsys,
                                                                 monkeypatch):  # fmt: skip
        """The check runs at load: every command refuses, before touching the database."""
        monkeypatch.setenv("MEMORY_GC_HISTORY__RETENTION_DAYS", "30")
        assert main(["prune-history"]) == 2
        assert "history.retention_days = 30" in capsys.readouterr().err


class TestBoundedTransactions:
    def test_each_transaction_deletes_at_most_a_slice(self, engine, settings, monkeypatch):
        """With slices of 3 rows, 10 audit rows go in 4 transactions of at most 3."""
        for i in range(10):
            add(engine, "u1", f"expired {i}", expires_at=days_ago(1))
        run_id = run(engine, settings, jobs=["ttl_expiry"])["run_id"]
        execute(engine, "DELETE FROM memories")
        ended(engine, run_id, clock() - 2 * RETENTION)
        seen: list[int] = []
        real = history._slice

        def counting(conn, run_id, name, params, apply):
            row = real(conn, run_id, name, params, apply)
            if name == "history_prune_actions":
                seen.append(row.deleted)
            return row

        monkeypatch.setattr(history, "_slice", counting)
        assert history.prune(engine, settings, now=clock(), chunk_rows=3).actions == 10
        assert max(seen) <= 3 and sum(seen) == 10 and len(seen) >= 4

    def test_a_run_another_transaction_holds_is_left_without_waiting(self, engine, settings):
        """An application transaction holding a row the prune needs (a done sweep request naming
        an old run, locked) is not waited on past the lock timeout: that run is left, the
        others go, and the next prune takes it."""
        held, _ = expired_run(engine, settings, "u1")
        free, _ = expired_run(engine, settings, "u2")
        execute(engine, "INSERT INTO gc_sweep_requests (user_id, run_id, status)"
                " VALUES ('u1', :id, 'done')", id=UUID(held))  # fmt: skip
        all_ended(engine, clock() - 2 * RETENTION)
        with engine.connect() as app:
            app.execute(sa.text("SELECT * FROM gc_sweep_requests FOR UPDATE"))
            started = time.monotonic()
            result = history.prune(engine, settings, now=clock())
            assert time.monotonic() - started < 10
            app.rollback()
        assert result.busy_runs == [UUID(held)] and counts(engine, free)["gc_runs"] == 0
        assert history.prune(engine, settings, now=clock()).runs == 1
        assert counts(engine)["gc_runs"] == 0

    def test_an_application_write_waits_at_most_one_slice(self, engine, settings):
        """While a prune works, an application transaction updating a row the prune is about to
        delete through (a done sweep request) commits within seconds."""
        ids = [expired_run(engine, settings, f"u{i}")[0] for i in range(5)]
        for run_id in ids:
            execute(engine, "INSERT INTO gc_sweep_requests (user_id, run_id, status)"
                    " VALUES ('u', :id, 'done')", id=UUID(run_id))  # fmt: skip
        all_ended(engine, clock() - 2 * RETENTION)
        waits: list[float] = []

        def application() -> None:
            for _ in range(20):
                started = time.monotonic()
                with engine.begin() as conn:
                    conn.execute(sa.text("UPDATE gc_sweep_requests SET error = NULL"))
                waits.append(time.monotonic() - started)

        writer = threading.Thread(target=application)
        writer.start()
        history.prune(engine, settings, now=clock(), chunk_rows=1)
        writer.join(30)
        assert waits and max(waits) < 3


class TestDaemon:
    def test_the_nightly_run_is_followed_by_a_prune(self, engine, settings):
        """The daemon prunes after its nightly run; off (`enabled = false`), it does not."""
        old, _ = expired_run(engine, settings, "u1")
        ended(engine, old, clock() - 2 * RETENTION)
        off = settings.model_copy(update={"history": HistorySettings(enabled=False)})
        for current, left in ((off, 1), (settings, 0)):
            daemon = Daemon(engine, current, clock=clock)
            daemon.prune_history()
            daemon.close()
            assert counts(engine, old)["gc_runs"] == left

    def test_nightly_calls_the_prune(self, engine, settings, monkeypatch):
        """`nightly` ends with prune_history when it worked a run."""
        slot = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
        calls: list[bool] = []
        monkeypatch.setattr(Daemon, "prune_history", lambda self: calls.append(True))
        add(engine, "u1", "fresh")
        daemon = Daemon(engine, settings, clock=lambda: slot + timedelta(minutes=1))
        assert daemon.nightly() is not None
        daemon.close()
        assert calls == [True]


class TestScale:
    """A prune's cost per run must not grow with tables that are never pruned (sweep requests,
    review items: an application sweeping every user daily makes 100,000s of runs a day)."""

    def test_every_foreign_key_to_gc_runs_is_indexed(self, engine):
        """Deleting a run checks each table that references gc_runs: without an index on the
        referencing column that is a scan of the whole table per run deleted (2,000 runs with
        200,000 sweep requests took 78 s)."""
        unindexed = execute(engine, """
            SELECT c.conrelid::regclass::text || '.' || a.attname
            FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
            WHERE c.contype = 'f' AND c.confrelid = 'gc_runs'::regclass
              AND cardinality(c.conkey) = 1
              AND NOT EXISTS (SELECT 1 FROM pg_index i
                              WHERE i.indrelid = c.conrelid AND i.indkey[0] = c.conkey[1])
            ORDER BY 1""").scalars().all()  # fmt: skip
        assert unindexed == []

    def test_migration_0017_round_trip(self, empty_database_url):
        from tests.conftest import check_round_trip

        names = "'gc_sweep_requests_run_idx', 'gc_review_items_run_idx', 'gc_runs_plan_run_idx'"
        count = f"SELECT count(*) FROM pg_indexes WHERE indexname IN ({names})"
        check_round_trip(empty_database_url, "0017", "0016", count, 3)

    def test_the_old_runs_are_listed_without_a_scan_of_the_review_items_per_run(
        self, engine, settings
    ):
        """history_runs asks, for every old run, whether a review item names it: once per
        prune, not once per run (1,000 runs against 50,000 review items took 10 s)."""
        at = clock() - RETENTION - DAY
        execute(engine, """
            INSERT INTO gc_runs (id, mode, trigger, now, status, started_at, finished_at, users,
                                 jobs, settings)
            SELECT gen_random_uuid(), 'apply', 'sweep', :t, 'completed', :t, :t, ARRAY['u'],
                   ARRAY['ttl_expiry'], '{}'
            FROM generate_series(1, 200)""", t=at)  # fmt: skip
        execute(engine, """
            INSERT INTO gc_review_items (user_id, kind, memory_ids, reason, status)
            SELECT 'u' || g, 'x', '{}', 'r', CASE WHEN g % 2 = 0 THEN 'open' ELSE 'resolved' END
            FROM generate_series(1, 2000) g""")  # fmt: skip
        execute(engine, """
            INSERT INTO gc_erasure_requests (kind, user_id, status)
            SELECT 'user', 'e' || g, 'completed' FROM generate_series(1, 2000) g""")  # fmt: skip
        execute(engine, """
            INSERT INTO gc_sweep_requests (user_id, status)
            SELECT 's' || g, 'done' FROM generate_series(1, 2000) g""")  # fmt: skip
        # one open item names a run (it stays whole), one resolved item another (its row stays)
        execute(engine, """
            UPDATE gc_review_items i SET run_id = r.id
            FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM gc_runs) r
            WHERE i.id IN (1, 2) AND r.n = i.id""")  # fmt: skip
        execute(engine, "ANALYZE")
        from gc_worker.queries import q

        sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + q("history_runs").text
        with engine.connect() as conn:
            (plan,) = conn.execute(sa.text(sql), {"cutoff": clock() - RETENTION}).scalar()

        def loops(node: dict, table: str) -> int:
            own = node["Actual Loops"] if node.get("Relation Name") == table else 0
            return own + sum(loops(child, table) for child in node.get("Plans", ()))

        for table in ("gc_review_items", "gc_erasure_requests", "gc_sweep_requests"):
            assert loops(plan["Plan"], table) <= 4, table
        result = history.prune(engine, settings, now=clock(), dry_run=True)
        assert (result.runs, result.kept_runs) == (198, 1)
