"""The run report as a contract (DESIGN.md section 5): totals agree with the job counters and
the listed actions for every kind of run, and a run whose audit `prune-history` partly removed
says so instead of presenting what is left as the whole run (cases a review reproduced; each
failed before its fix)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

import jobs.ttl_expiry as ttl
from gc_worker import engine as gc_engine
from gc_worker import history, render
from gc_worker.cli import main
from gc_worker.errors import RunFailed
from gc_worker.render_banner import banner
from gc_worker.report import build_report
from tests.store import NOW, add, days_ago, execute, run
from tests.test_compaction import E0, at_similarity
from tests.test_lifecycle_failures import failing_for, seed_users

RETENTION = timedelta(days=400)


def report_of(engine: Any, run_id: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        return build_report(conn, UUID(str(run_id)), plan_age_limit_hours=72)


def pruned_run(engine: Any, settings: Any) -> tuple[str, dict[str, Any]]:
    """A run that soft-deleted three expired rows of u1; the application then deleted two of
    them physically, so a prune keeps only the audit row of the one still soft-deleted. Returns
    the run id and its report before the prune."""
    rows = [add(engine, "u1", f"expired {i}", expires_at=days_ago(1)) for i in range(3)]
    report = run(engine, settings, jobs=["ttl_expiry"])
    execute(engine, "DELETE FROM memories WHERE id = ANY(:ids)", ids=rows[:2])
    at = datetime.now(UTC) - RETENTION - timedelta(days=1)
    execute(engine, "UPDATE gc_runs SET started_at = :t, finished_at = :t", t=at)
    return report["run_id"], report


class TestPrunedRun:
    def test_a_pruned_run_says_so_and_keeps_its_recorded_totals(self, engine, settings):
        """After `prune-history` kept one of the run's three audit rows, its report showed
        totals of 1 soft_delete, job counters of 1 and nothing saying two rows were gone: a
        partial figure presented as the whole run."""
        run_id, before = pruned_run(engine, settings)
        assert before["totals"] == {"actions": 3, "by_action": {"soft_delete": 3}}
        result = history.prune(engine, settings, now=datetime.now(UTC))
        assert (result.actions, result.kept_actions) == (2, 1)
        after = report_of(engine, run_id)
        assert len(after["actions"]) == 1
        assert after["history_pruned"]["actions_recorded"] == 3
        assert after["history_pruned"]["actions_listed"] == 1
        assert after["totals"] == before["totals"]
        assert after["jobs"]["ttl_expiry"]["actions"] == 3
        assert after["llm"] == before["llm"]
        for fmt in ("md", "html"):
            text = render.render(after, fmt)
            assert "pruned" in text and "1 of 3" in text, fmt

    def test_a_second_prune_keeps_the_figures_of_the_first(self, engine, settings):
        """The figures are recorded once, before anything goes: a later prune (of what is
        left) does not overwrite them with the partial ones."""
        run_id, before = pruned_run(engine, settings)
        history.prune(engine, settings, now=datetime.now(UTC))
        history.prune(engine, settings, now=datetime.now(UTC))
        assert report_of(engine, run_id)["totals"] == before["totals"]

    def test_a_dry_prune_records_nothing(self, engine, settings):
        """`prune-history --dry-run` deletes nothing, so the report stays unmarked."""
        run_id, before = pruned_run(engine, settings)
        history.prune(engine, settings, now=datetime.now(UTC), dry_run=True)
        after = report_of(engine, run_id)
        assert after["history_pruned"] is None and after["totals"] == before["totals"]

    def test_an_unpruned_report_is_not_marked(self, engine, settings):
        run_id, _ = pruned_run(engine, settings)
        assert report_of(engine, run_id)["history_pruned"] is None

    def test_a_run_pruned_before_figures_were_recorded_says_its_figures_are_partial(
        self, engine, settings, cli_env, capsys
    ):
        """A run pruned by an earlier version (no figures recorded; its batch rows gone, audit
        rows left) is still marked: what is left is not the whole run."""
        run_id, _ = pruned_run(engine, settings)
        history.prune(engine, settings, now=datetime.now(UTC))
        execute(engine, "UPDATE gc_runs SET pruned_figures = NULL")  # as an earlier prune left it
        after = report_of(engine, run_id)
        assert after["history_pruned"] == {
            "pruned_at": None, "actions_recorded": None, "actions_listed": 1
        }  # fmt: skip
        assert main(["report", run_id, "--format", "md"]) == 0
        assert "pruned" in capsys.readouterr().out


def test_the_figures_kept_for_a_pruned_run_hold_no_batch_error(engine, settings, monkeypatch):
    """A failed batch's error may name a memory (a trigger's message naming NEW.id); kept in
    gc_runs.pruned_figures, no erasure's scrub would reach it. The batch and its users are
    kept; its error is not (the run's own error stays, where the scrub reaches it)."""
    from gc_worker.report import recorded_figures

    seed_users(engine)
    monkeypatch.setattr(ttl, "plan", failing_for("user-1"))
    batched = settings.model_copy(
        update={"run": settings.run.model_copy(update={"batch_users": 1})}
    )
    with pytest.raises(RunFailed) as failed_run:
        gc_engine.run_once(engine, batched, gc_engine.RunRequest(
            mode="dry_run", now=NOW, jobs=("ttl_expiry",)))  # fmt: skip
    run_id = str(failed_run.value).split("run ", 1)[1].split(":", 1)[0]
    with engine.connect() as conn:
        [failed] = build_report(conn, run_id)["failed_batches"]
        assert "cannot handle a row" in failed["error"]
        [kept] = recorded_figures(conn, run_id)["failed_batches"]
    assert kept == {**failed, "error": None}


class TestFailedRunSaysWhy:
    def test_a_dry_run_with_a_failed_batch_names_its_error_and_users(
        self, engine, cli_env, capsys, monkeypatch
    ):
        """The JSON of a dry run whose batch failed has `error` and `failed_batches` (which
        users were left, and why); its Markdown and HTML said only "1 batch(es) failed": not
        which users, nor the error a person needs to act on."""
        seed_users(engine)
        monkeypatch.setenv("MEMORY_GC_RUN__BATCH_USERS", "1")
        monkeypatch.setattr(ttl, "plan", failing_for("user-1"))
        assert main(["run", "--dry-run", "--now", NOW.isoformat()]) == 1
        run_id = capsys.readouterr().out.split("run ", 1)[1].split(" ", 1)[0]
        report = report_of(engine, run_id)
        [failed] = report["failed_batches"]
        assert failed["users"] == ["user-1"] and "cannot handle a row" in report["error"]
        consistent(report)
        for fmt in ("md", "html"):
            text = render.render(report, fmt)
            assert "cannot handle a row of user" in text, fmt
            assert "Failed batches" in text and "user" in text.split("Failed batches", 1)[1], fmt

    def test_a_failed_run_without_failed_batches_shows_its_error(self, engine, settings):
        """A run that failed as a whole (no batch to blame: a stop, a lost database, a plan
        that could not start) showed "Not complete — failed." and never its error."""
        run_id, _ = pruned_run(engine, settings)
        execute(engine, "UPDATE gc_runs SET status = 'failed', error = 'lost the database'")
        report = report_of(engine, run_id)
        assert report["failed_batches"] == []
        for fmt in ("md", "html"):
            assert "lost the database" in render.render(report, fmt), fmt


class TestPrunedBanner:
    def test_a_pruned_run_with_nothing_left_to_undo_does_not_blame_purges(self, engine, settings):
        """A run whose row a completed erasure request keeps, all its audit pruned: the
        banner said "Nothing it did can be undone (purges and erasures are not)" above totals
        of soft deletes, which a restore would have undone before the prune."""
        run_id, _ = pruned_run(engine, settings)
        execute(engine, "DELETE FROM memories")
        execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, status, run_id)"
                " VALUES ('user', 'u1', 'completed', :id)", id=UUID(run_id))  # fmt: skip
        history.prune(engine, settings, now=datetime.now(UTC))
        report = report_of(engine, run_id)
        assert report["history_pruned"]["actions_listed"] == 0
        assert report["totals"]["by_action"] == {"soft_delete": 3}
        _, _, rest = banner(report)
        assert "purges and erasures" not in rest and "pruned" in rest


def consistent(report: dict[str, Any]) -> None:
    """DESIGN.md section 5: the totals are the sum of the job counters, of the per-user counts
    and of the listed actions; the fields are there with their types; rendering is pure."""
    for key, kind in [("report_version", int), ("run_id", str), ("mode", str), ("now", str),
                      ("started_at", str), ("scope", dict), ("totals", dict), ("jobs", dict),
                      ("actions", list), ("llm", dict)]:  # fmt: skip
        assert isinstance(report[key], kind), key
    assert report["mode"] in ("dry_run", "apply")
    totals = report["totals"]
    assert totals["actions"] == sum(totals["by_action"].values()) == len(report["actions"])
    assert totals["actions"] == sum(j["actions"] for j in report["jobs"].values())
    assert totals["actions"] == sum(u["actions"] for u in report["per_user"].values())
    by_job: dict[str, int] = {}
    for job in report["jobs"].values():
        for action, n in job["by_action"].items():
            by_job[action] = by_job.get(action, 0) + n
    assert by_job == totals["by_action"]
    for job in report["jobs"].values():
        assert {"actions", "by_action", "skipped", "errors", "llm_calls"} <= job.keys()
    assert set(report["llm"]) == {"calls", "input_tokens", "output_tokens", "cache_hits"}
    for fmt in ("json", "md", "html"):
        assert render.render(report, fmt) == render.render(report, fmt)


class TestEveryKindOfRunAddsUp:
    def test_plan_apply_restore_erasure_and_deferred_groups(self, engine, settings, cli_env,
                                                            capsys):  # fmt: skip
        for user in ("u1", "u2"):
            add(engine, user, f"expired {user}", expires_at=days_ago(1))
        add(engine, "u1", "a", created_at=days_ago(3), embedding=E0)  # offline: deferred
        add(engine, "u1", "b", created_at=days_ago(2), embedding=at_similarity(0.99))
        plan = run(engine, settings, dry_run=True)
        assert plan["totals"]["by_action"].get("deferred")
        applied = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        assert main(["restore", "--run", str(applied)]) == 0
        restored = capsys.readouterr().out.split("restore run ", 1)[1].split(":", 1)[0]
        assert main(["forget-user", "u2", "--purge-now", "--now", NOW.isoformat()]) == 0
        erased = re.findall(r"run ([0-9a-f-]{36})", capsys.readouterr().out)[-1]
        for run_id in (plan["run_id"], applied, restored, erased):
            consistent(report_of(engine, run_id))
        assert report_of(engine, restored)["kind"] == "restore"


class TestRestoreRunCounters:
    def test_changes_a_restore_kept_are_counted_as_skipped_in_their_job(self, engine, settings):
        """An apply's drifted rows are counted in their job's `skipped` (and `drifted`); a
        restore's kept changes (outcome drifted) were counted nowhere: a restore that undid
        one change of two showed `skipped` 0, and one that undid none showed no job at all."""
        from gc_worker import restore

        rows = [add(engine, "u1", f"expired {i}", expires_at=days_ago(1)) for i in range(2)]
        applied = run(engine, settings, jobs=["ttl_expiry"])
        execute(engine, "UPDATE memories SET status = 'active' WHERE id = :id", id=rows[0])
        result = restore.restore_run(engine, UUID(applied["run_id"]))
        report = report_of(engine, result.run_id)
        assert [d["memory_id"] for d in report["drifted"]] == [str(rows[0])]
        job = report["jobs"]["ttl_expiry"]
        assert (job["actions"], job["skipped"], job["drifted"]) == (1, 1, 1)
        consistent(report)

    def test_a_pruned_restore_run_names_its_jobs_in_its_scope(self, engine, settings):
        """A restore run stores no jobs: its scope names those its actions were of. Once
        `prune-history` took its audit rows (its row kept: a review item or a completed
        erasure request names it), the report showed the recorded job counters under a scope
        of no jobs at all."""
        from gc_worker import restore

        add(engine, "u1", "expired", expires_at=days_ago(1))
        applied = run(engine, settings, jobs=["ttl_expiry"])
        result = restore.restore_run(engine, UUID(applied["run_id"]))
        # its row stays, as a review item naming it keeps it (a restored model merge's)
        execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, status, run_id)"
                " VALUES ('user', 'u9', 'completed', :id)", id=result.run_id)  # fmt: skip
        at = datetime.now(UTC) - RETENTION - timedelta(days=1)
        execute(engine, "UPDATE gc_runs SET started_at = :t, finished_at = :t", t=at)
        history.prune(engine, settings, now=datetime.now(UTC))
        report = report_of(engine, result.run_id)
        assert report["history_pruned"] and report["jobs"]
        assert set(report["jobs"]) <= set(report["scope"]["jobs"]), report["scope"]
