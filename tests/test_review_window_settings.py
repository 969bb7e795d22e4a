"""A plan_then_apply review window longer than run.max_plan_age_hours (a plan made on Friday
night, reviewed on Monday) loads as it did before the limit existed, for every command, and a
plan stored before the limit existed still applies: the limit is never shorter than the window
plus an hour (a validator had made every command exit 2). Found by a review."""

from __future__ import annotations

from gc_worker.cli import main
from tests.store import add


def test_erasure_commands_still_work_with_a_three_day_review_window(
    engine, cli_env, monkeypatch, tmp_path, capsys
):
    config = tmp_path / "gc.toml"
    config.write_text('[schedule]\nmode = "plan_then_apply"\napply_delay_minutes = 4320\n')
    monkeypatch.setenv("MEMORY_GC_CONFIG", str(config))
    add(engine, "alice", "Alice lives in Lyon")
    code = main(["forget-user", "alice"])
    err = capsys.readouterr().err
    assert code == 0, err


def test_a_plan_made_before_the_upgrade_can_still_be_applied(
    engine, cli_env, monkeypatch, tmp_path, capsys
):
    """A plan made before the limit existed stores settings without max_plan_age_hours; with a
    raised limit it still applies (stored settings are read with the new field's default)."""
    import sqlalchemy as sa

    config = tmp_path / "gc.toml"
    config.write_text(
        '[schedule]\nmode = "plan_then_apply"\napply_delay_minutes = 4320\n'
        "[run]\nmax_plan_age_hours = 96\n"
    )
    monkeypatch.setenv("MEMORY_GC_CONFIG", str(config))
    add(
        engine,
        "alice",
        "Alice lives in Lyon",
        expires_at=__import__("tests.store").store.days_ago(1),
    )
    assert main(["run", "--dry-run"]) == 0
    with engine.begin() as conn:  # as 9940023 stored it: its Settings had no such field
        plan_id = conn.execute(
            sa.text(
                "UPDATE gc_runs SET settings = settings #- '{run,max_plan_age_hours}' RETURNING id"
            )
        ).scalar()
    capsys.readouterr()
    code = main(["apply", str(plan_id)])
    assert code == 0, capsys.readouterr().err
