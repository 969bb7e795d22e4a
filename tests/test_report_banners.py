"""The banner of a run's report suggests only commands that work, and shows no store text as
markup (cases a review reproduced; each failed before its fix): a stopped apply, a cancelled
plan whose other batches all committed, a failed batch whose error quotes a user id."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import pytest

import jobs.ttl_expiry as ttl
from gc_worker import engine as gc_engine
from gc_worker import render
from gc_worker.cancel import cancel
from gc_worker.cli import main
from gc_worker.errors import UsageError
from gc_worker.report import build_report
from tests.store import NOW
from tests.test_cancel import apply_request, expired_rows, one_at_a_time
from tests.test_lifecycle_failures import seed_users


def report_of(engine: Any, run_id: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        return build_report(conn, UUID(str(run_id)), plan_age_limit_hours=72)


def suggested(report: dict[str, Any]) -> list[str]:
    """The commands the Markdown banner suggests, in order."""
    banner = next(ln for ln in render.render(report, "md").splitlines() if ln.startswith("> "))
    return re.findall(r"`memory-gc ([^`]+)`", banner)


def run_all(commands: list[str], capsys: Any) -> None:
    """Run the suggested commands in order: each must work."""
    for command in commands:
        code = main(command.split())
        err = capsys.readouterr().err
        assert code == 0, f"report suggests `memory-gc {command}`; it exits {code}: {err}"


class TestStoppedApply:
    def test_the_banner_does_not_suggest_a_restore_that_is_refused(
        self, engine, settings, cli_env, capsys
    ):
        """A run stopped after one batch (left running, nobody works it) shows as stopped;
        its banner said "`memory-gc restore --run RUN` undoes it", which refuses a run still
        running ("Stop it for good first: `memory-gc cancel RUN`")."""
        settings = one_at_a_time(settings)
        expired_rows(engine)
        run_id = gc_engine.start_run(engine, settings, apply_request())
        stops = iter([False, True])
        gc_engine.process_run(engine, run_id, settings, should_stop=lambda: next(stops, True))
        report = report_of(engine, run_id)
        assert report["status"] == "stopped"
        commands = suggested(report)
        assert any(c.startswith("restore --run") for c in commands), commands
        run_all(commands, capsys)


def cancelled_plan_with_a_failed_batch(engine, settings, monkeypatch) -> UUID:
    """A dry run over three users, one batch each: user-0's batch fails, and an operator
    cancels the run while user-2's (the last) is planned; that batch commits. The run is
    failed, cancelled, with one failed batch and none pending."""
    real = ttl.plan

    def plan(ctx):
        if "user-0" in ctx.users:
            raise RuntimeError("cannot handle a row of user-0")
        if "user-2" in ctx.users:
            (run_id,) = running(engine)
            cancel(engine, run_id, wait_seconds=0)
        return real(ctx)

    seed_users(engine)
    monkeypatch.setattr(ttl, "plan", plan)
    request = gc_engine.RunRequest(mode="dry_run", now=NOW, jobs=("ttl_expiry",))
    plan_id = gc_engine.run_once(engine, one_at_a_time(settings), request)
    monkeypatch.undo()
    return plan_id


def running(engine) -> list[UUID]:
    with engine.connect() as conn:
        return (
            conn.exec_driver_sql("SELECT id FROM gc_runs WHERE status = 'running'").scalars().all()
        )


class TestCancelledPlan:
    def test_the_banner_does_not_suggest_applying_a_cancelled_plan(
        self, engine, settings, monkeypatch
    ):
        """It read as a plan failed only by failed batches, and the banner said "The other
        users' plan can be applied: `memory-gc apply PLAN`", which `apply` refuses for a
        cancelled plan."""
        plan_id = cancelled_plan_with_a_failed_batch(engine, settings, monkeypatch)
        report = report_of(engine, plan_id)
        assert report["failed_batches"] and report["pending_batches"] == 0
        with pytest.raises(UsageError, match="cancelled"):
            gc_engine.apply_plan(engine, plan_id)
        assert not [c for c in suggested(report) if c.startswith("apply")]
        assert "cancel" in render.render(report, "md").split("\n\n")[1]


class TestStoreTextInTheBanner:
    @pytest.mark.parametrize("fmt", ["md", "html"])
    def test_a_failed_batch_error_makes_no_link_or_code(self, fmt):
        """A batch's error can quote a user id (a job's own exception message): the banner
        repeated it as banner text, so Markdown made a link (or an image) of it and a backtick
        in it turned the rest of the HTML banner into code."""
        error = "RuntimeError: no row of ![x](https://evil.example/t.png) `x"
        report = {
            "report_version": 1, "run_id": "r1", "mode": "apply", "status": "failed",
            "error": f"1 batch(es) failed, the others were applied: batch 0 (1 users): {error}",
            "failed_batches": [{"batch_no": 0, "users": ["u"], "error": error}],
            "totals": {"actions": 0, "by_action": {}}, "jobs": {}, "actions": [], "llm": {},
        }  # fmt: skip
        text = render.render(report, fmt)
        banner = text.split("\n\n")[1] if fmt == "md" else text.split('class="banner')[1]
        banner = banner.split("</p>", 1)[0]
        assert "<code>x" not in banner and (fmt == "html" or "](https" not in banner), banner
        assert "2 users" not in banner and "1 users left as they were" in banner
