"""`--now` of the commands that stamp a person's decision or a verification: bounded like `run`'s
and `--purge-now`'s (cli.not_ahead), a day ahead of this machine's clock at most."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gc_worker import erasure
from gc_worker.cli import main
from tests.store import NOW, add, execute, snapshot
from tests.test_reviews import queue, seed_conflict

FAR = "2999-01-01T00:00:00Z"


def cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def verified_at(engine) -> list:
    rows = execute(engine, "SELECT verified_at, result FROM gc_erasure_requests ORDER BY id")
    return [tuple(r) for r in rows]


def review_state(engine) -> list:
    rows = execute(engine, "SELECT id, status, resolution FROM gc_review_items ORDER BY id")
    return [tuple(r) for r in rows]


class TestReviewsClock:
    @pytest.mark.parametrize("decision", ["--dismiss", "--keep"])
    def test_a_far_future_resolution_is_refused(self, engine, settings, cli_env, capsys, decision):
        """`reviews resolve ID --now 2999-…` stamped the change (the run, status_changed_at)
        in 2999 and judged members' validity at that instant: exit 2 naming --now, nothing
        changed."""
        said, _ = seed_conflict(engine)
        review_id = queue(engine, settings)
        before, items = snapshot(engine), review_state(engine)
        extra = [str(said)] if decision == "--keep" else []
        code, err = cli(["reviews", "resolve", str(review_id), decision, *extra, "--now", FAR],
                        capsys)  # fmt: skip
        assert code == 2, err
        assert f"--now '{FAR}'" in err and "ahead of this machine's clock" in err
        assert snapshot(engine) == before and review_state(engine) == items

    def test_a_far_future_lift_is_refused(self, engine, settings, cli_env, capsys):
        """`reviews lift ID --now 2999-…` is refused the same way; the dismissal stays."""
        seed_conflict(engine)
        review_id = queue(engine, settings)
        assert main(["reviews", "resolve", str(review_id), "--dismiss"]) == 0
        capsys.readouterr()
        items = review_state(engine)
        code, err = cli(["reviews", "lift", str(review_id), "--now", FAR], capsys)
        assert code == 2, err
        assert f"--now '{FAR}'" in err
        assert review_state(engine) == items

    def test_a_clock_just_under_a_day_ahead_is_taken(self, engine, settings, cli_env, capsys):
        """Clock skew between hosts is allowed for, as for `run`."""
        seed_conflict(engine)
        review_id = queue(engine, settings)
        at = (datetime.now(UTC) + timedelta(hours=23, minutes=59)).isoformat()
        assert main(["reviews", "resolve", str(review_id), "--dismiss", "--now", at]) == 0

    def test_a_clock_just_over_a_day_ahead_is_refused(self, engine, settings, cli_env, capsys):
        """A minute past the day's allowance is refused, as for `run`: nothing changes."""
        seed_conflict(engine)
        review_id = queue(engine, settings)
        before, items = snapshot(engine), review_state(engine)
        at = (datetime.now(UTC) + timedelta(hours=24, minutes=1)).isoformat()
        code, err = cli(["reviews", "resolve", str(review_id), "--dismiss", "--now", at], capsys)
        assert code == 2 and "ahead of this machine's clock" in err, err
        assert snapshot(engine) == before and review_state(engine) == items


class TestVerifyClock:
    @pytest.mark.parametrize("by_memory", [False, True])
    def test_a_far_future_verification_is_refused(
        self, engine, settings, cli_env, capsys, by_memory
    ):
        """`verify-erasure --now 2999-…` recorded verified_at 2999 (and the verification's
        instant) on the request: exit 2 naming --now, nothing recorded."""
        memory_id = add(engine, "u1", "Lives in Quokkaville")
        erasure.forget(engine, settings, now=NOW, memory_id=memory_id, purge_now=True)
        before = verified_at(engine)
        target = ["--memory", str(memory_id)] if by_memory else ["u1"]
        code, err = cli(["verify-erasure", *target, "--now", FAR], capsys)
        assert code == 2, err
        assert f"--now '{FAR}'" in err and "ahead of this machine's clock" in err
        assert verified_at(engine) == before

    def test_a_clock_just_under_a_day_ahead_is_taken(self, engine, settings, cli_env, capsys):
        """A day of skew is allowed for: the verification is recorded."""
        memory_id = add(engine, "u1", "Lives in Quokkaville")
        erasure.forget(engine, settings, now=NOW, memory_id=memory_id, purge_now=True)
        at = datetime.now(UTC) + timedelta(hours=23, minutes=59)
        assert main(["verify-erasure", "--memory", str(memory_id), "--now", at.isoformat()]) == 0
        [(verified, _)] = verified_at(engine)
        assert verified == at

    def test_a_clock_just_over_a_day_ahead_is_refused(self, engine, settings, cli_env, capsys):
        """A minute past the day's allowance: exit 2, nothing recorded."""
        memory_id = add(engine, "u1", "Lives in Quokkaville")
        erasure.forget(engine, settings, now=NOW, memory_id=memory_id, purge_now=True)
        before = verified_at(engine)
        at = (datetime.now(UTC) + timedelta(hours=24, minutes=1)).isoformat()
        code, err = cli(["verify-erasure", "--memory", str(memory_id), "--now", at], capsys)
        assert code == 2 and "ahead of this machine's clock" in err, err
        assert verified_at(engine) == before
