"""The command line: happy paths, and bad input that exits 2 (or 1) and changes nothing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest
from alembic import command

from gc_worker import db, schema
from gc_worker.cli import main
from tests.store import NOW, add, days_ago, execute, snapshot, status

NOW_ARG = NOW.isoformat()


def seeded(engine):
    expired = add(engine, "u1", "expired", expires_at=days_ago(1))
    add(engine, "u2", "kept")
    return expired


def main_run(engine, settings) -> UUID:
    """One applied run over the seeded store (u1's expired row deleted); its id."""
    from gc_worker import engine as gc_engine

    request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
    return gc_engine.run_once(engine, settings, request)


def planned(engine, capsys) -> str:
    """A dry run over the seeded store through the CLI; its run id."""
    seeded(engine)
    main(["run", "--dry-run", "--now", NOW_ARG])
    return run_id_from(capsys.readouterr().out)


def age_plan(engine, run_id: str, hours: float) -> None:
    """Move a run's start and finish ``hours`` into the past."""
    execute(
        engine,
        "UPDATE gc_runs SET started_at = started_at - make_interval(secs => :s), "
        "finished_at = finished_at - make_interval(secs => :s) WHERE id = :id",
        s=hours * 3600, id=run_id,
    )  # fmt: skip


def run_id_from(out: str) -> str:
    return out.split("run ", 1)[1].split(" ", 1)[0]


class TestHappyPath:
    def test_dry_run_apply_report_restore(self, engine, cli_env, tmp_path, capsys):
        """run --dry-run writes reports; apply executes them; restore undoes the apply."""
        expired = seeded(engine)
        paths = [tmp_path / f"plan.{ext}" for ext in ("json", "md", "html")]
        args = ["run", "--dry-run", "--now", NOW_ARG] + [f"--report={p}" for p in paths]
        assert main(args) == 0
        plan_id = run_id_from(capsys.readouterr().out)
        plan = json.loads(paths[0].read_text())
        assert plan["mode"] == "dry_run" and plan["totals"]["by_action"]["soft_delete"] == 1
        assert "memory-gc apply" in paths[1].read_text() and "<html" in paths[2].read_text()
        assert status(engine, expired) == "active"

        assert main(["apply", plan_id]) == 0
        apply_id = run_id_from(capsys.readouterr().out)
        assert status(engine, expired) == "deleted"

        assert main(["restore", "--run", apply_id]) == 0
        assert "1 restored" in capsys.readouterr().out
        assert status(engine, expired) == "active"

    def test_a_user_named_twice_is_one_user(self, engine, cli_env, tmp_path, capsys):
        """`--user u1 --user u1` runs u1 once and names it once ("Users: u1, u1" before)."""
        seeded(engine)
        path = tmp_path / "run.json"
        argv = ["run", "--dry-run", "--user", "u1", "--user", "u1", "--now", NOW_ARG]
        assert main([*argv, f"--report={path}"]) == 0
        assert json.loads(path.read_text())["scope"]["users"] == ["u1"]

    @pytest.mark.parametrize("first_apply", ["new", "taking up a stopped one"])
    def test_a_second_apply_started_meanwhile_is_refused(
        self, engine, cli_env, capsys, monkeypatch, first_apply
    ):
        """Two `apply PLAN` at once: the second is told the plan is being applied right now
        (exit 2), even when it starts in the moment after the first recorded (or took up) its
        apply run and before its batches began — it used to take the run up as stopped and
        print "nothing to do". The first completes the run."""
        from gc_worker import engine as gc_engine
        from gc_worker.apply_start import start_apply

        expired = seeded(engine)
        assert main(["run", "--dry-run", "--now", NOW_ARG]) == 0
        plan_id = run_id_from(capsys.readouterr().out)
        if first_apply != "new":
            start_apply(engine, UUID(plan_id))  # an apply run, then "killed"
        second: list[int] = []
        real = gc_engine.process_run

        def first_worker(*args, **kwargs):
            if not second:  # the second command arrives before the first starts working
                second.append(main(["apply", plan_id]))
            return real(*args, **kwargs)

        monkeypatch.setattr(gc_engine, "process_run", first_worker)
        assert main(["apply", plan_id]) == 0
        out, err = capsys.readouterr()
        assert second == [2] and "right now" in err
        assert "(apply, completed)" in out and status(engine, expired) == "deleted"

    def test_restore_says_what_it_cannot_bring_back_and_refuses_twice(
        self, engine, cli_env, capsys
    ):
        """A restored run that also purged rows says how many are gone for good (they used to
        go unmentioned); restoring it again is refused (it used to say "0 restored", exit 0)."""
        expired = seeded(engine)
        add(engine, "u2", "long gone", status="deleted", status_reason="ttl_expired",
            deleted_at=days_ago(90), status_changed_at=days_ago(90))  # fmt: skip
        assert main(["run", "--now", NOW_ARG]) == 0
        run_id = run_id_from(capsys.readouterr().out)
        assert main(["restore", "--run", run_id]) == 0
        out = capsys.readouterr().out
        assert "1 restored" in out and "cannot be brought back: 1 purged by the run" in out
        assert status(engine, expired) == "active"
        assert main(["restore", "--run", run_id]) == 2
        assert "already restored" in capsys.readouterr().err

    @pytest.mark.parametrize("fmt", ["json", "md", "html"])
    def test_report_command_formats(self, engine, cli_env, capsys, fmt):
        """report RUN_ID renders the stored run in each format."""
        seeded(engine)
        main(["run", "--now", NOW_ARG])
        run_id = run_id_from(capsys.readouterr().out)
        assert main(["report", run_id, "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert run_id in out

    @pytest.mark.parametrize("fmt", ["md", "html"])
    def test_a_plan_too_old_to_apply_is_not_offered_for_apply(self, engine, cli_env, capsys, fmt):
        """The banner used to suggest `apply` for a plan `apply` refuses (older than
        run.max_plan_age_hours); the JSON says how old the plan is against the limit."""
        run_id = planned(engine, capsys)
        assert main(["report", run_id, "--format", fmt]) == 0
        assert f"memory-gc apply {run_id}" in capsys.readouterr().out
        age_plan(engine, run_id, 96)
        assert main(["report", run_id, "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert f"memory-gc apply {run_id}" not in out
        assert "older than run.max_plan_age_hours" in out and "memory-gc run --dry-run" in out
        assert main(["report", run_id]) == 0
        age = json.loads(capsys.readouterr().out)["plan_age"]
        assert 95 < age["hours"] < 97 and age["limit_hours"] == 72
        assert main(["apply", run_id]) == 2  # what the banner says
        assert "older than run.max_plan_age_hours" in capsys.readouterr().err

    @pytest.mark.parametrize(("hours", "offered"), [(71.9, True), (72.1, False)])
    def test_the_banner_offers_apply_up_to_the_plan_age_limit(
        self, engine, cli_env, capsys, hours, offered
    ):
        """run.max_plan_age_hours = 72: a plan just younger is offered for apply and applies;
        one just older is not, and apply refuses it."""
        run_id = planned(engine, capsys)
        age_plan(engine, run_id, hours)
        assert main(["report", run_id, "--format", "md"]) == 0
        assert (f"memory-gc apply {run_id}" in capsys.readouterr().out) is offered
        assert main(["apply", run_id]) == (0 if offered else 2)

    def test_a_stopped_apply_of_a_plan_too_old_is_not_offered_apply(self, engine, cli_env, capsys):
        """A stopped apply's banner offered `apply PLAN` to finish it, which `apply` refuses
        once the plan is older than run.max_plan_age_hours."""
        from gc_worker.apply_start import start_apply

        plan = planned(engine, capsys)
        applying = start_apply(engine, UUID(plan))  # and the process is gone
        assert main(["report", str(applying), "--format", "md"]) == 0
        assert f"memory-gc apply {plan}` finishes it" in capsys.readouterr().out
        age_plan(engine, plan, 96)
        assert main(["report", str(applying), "--format", "md"]) == 0
        out = capsys.readouterr().out
        assert f"memory-gc apply {plan}" not in out and "older than run.max_plan_age_hours" in out
        assert main(["apply", plan]) == 2

    @pytest.mark.parametrize(
        ("stored", "code"), [(60 * 86_400, 0), (10**12, 2)], ids=["valid-then", "refused-now"]
    )
    def test_a_plan_stored_with_settings_applies_or_is_refused_by_name(
        self, engine, cli_env, capsys, stored, code
    ):
        """A plan keeps the settings it was made with; a value this version bounds tighter
        than the one that stored it is refused naming the key (exit 2), not a traceback."""
        plan = planned(engine, capsys)
        execute(
            engine,
            "UPDATE gc_runs SET settings = jsonb_set(settings, "
            "'{schedule,misfire_grace_seconds}', to_jsonb(CAST(:v AS bigint))) WHERE id = :id",
            v=stored, id=plan,
        )  # fmt: skip
        assert main(["apply", plan]) == code
        if code == 2:
            err = capsys.readouterr().err
            assert "schedule.misfire_grace_seconds" in err and "make a new plan" in err

    def test_runs_lists_mode_status_and_trigger(self, engine, cli_env, capsys):
        """runs lists recent runs, newest first, with what started them."""
        seeded(engine)
        main(["run", "--dry-run", "--now", NOW_ARG])
        plan_id = run_id_from(capsys.readouterr().out)
        main(["apply", plan_id])
        apply_id = run_id_from(capsys.readouterr().out)
        assert main(["runs"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split()[:4] for line in lines[:2]] == [
            [apply_id, "apply", "completed", "cli"],
            [plan_id, "dry_run", "completed", "cli"],
        ]

    def test_runs_shows_a_running_run_nobody_works_as_stopped(self, engine, cli_env, capsys):
        """A run left `running` by a killed process reads `stopped`; while a process works it
        (holds its participation lock), `running`."""
        from gc_worker import engine as gc_engine
        from gc_worker.config import Settings
        from gc_worker.queries import q

        seeded(engine)
        request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("ttl_expiry",))
        run_id = gc_engine.start_run(engine, Settings(), request)  # then "killed"

        def listed() -> str:
            assert main(["runs"]) == 0
            [line] = [x for x in capsys.readouterr().out.splitlines() if str(run_id) in x]
            return line.split()[2]

        assert listed() == "stopped"
        assert main(["report", str(run_id), "--format", "md"]) == 0  # the report agrees
        md = capsys.readouterr().out
        assert "**Status:** stopped" in md and "Not complete — stopped." in md
        assert "Applied." not in md
        with engine.connect() as worker:
            worker.execute(q("lock_run_shared"), {"run_id": run_id})
            worker.commit()
            assert listed() == "running"
            worker.execute(q("unlock_run_shared"), {"run_id": run_id})
            worker.commit()
        assert listed() == "stopped"

    def test_migrate_is_idempotent(self, cli_env, capsys):
        """migrate on a current schema says so and changes nothing."""
        assert main(["migrate"]) == 0
        assert "current" in capsys.readouterr().out

    def test_migrate_creates_schema(self, empty_database_url, monkeypatch, capsys):
        """migrate on an empty database creates the schema."""
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", empty_database_url)
        assert main(["migrate"]) == 0
        assert "empty ->" in capsys.readouterr().out
        engine = db.make_engine(empty_database_url)
        assert schema.current_revision(engine) == schema.head_revision()
        engine.dispose()


class TestBadInput:
    @pytest.mark.parametrize(
        ("argv", "env", "fragment"),
        [
            (["run", "--now", "yesterday"], {}, "not an ISO 8601"),
            (["run", "--now", "2026-01-01T03:00:00"], {}, "no timezone"),
            (["run", "--job", "compactify"], {}, "unknown job"),
            (["run", "--report", "out.pdf"], {}, ".json, .md or .html"),
            (["run", "--user", "ghost"], {}, "no memories for user"),
            (["run"], {"MEMORY_GC_DECAY__HALF_LIFE": "3"}, "did you mean `half_life_days`"),
            (["run"], {"MEMORY_GC_DECAY__HALF_LIFE_DAYS": "-1"}, "(allowed: float >= 1e-06"),
            (["run"], {"MEMORY_GC_EMBEDDINGS__DIM": "768"}, "vector(8)"),
            (["apply", "not-a-uuid"], {}, "not a UUID"),
            (["apply", str(UUID(int=5))], {}, "no run with id"),
            (["report", str(UUID(int=5))], {}, "no run with id"),
            (["restore", "--memory", str(UUID(int=5))], {}, "no restorable change"),
            (["frobnicate"], {}, "invalid choice"),
            (["run", "--now", "0001-01-02T00:00:00Z"], {}, "outside the years"),
            (["runs"], {"MEMORY_GC_LOG_LEVEL": "verbose"}, "not a log level"),
            (
                ["run"],
                {"MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS": "[1, 2, 3]"},
                "exactly 5 numbers",
            ),
            (["runs"], {"MEMORY_GC_LOG_FORMAT": "json"}, "MEMORY_GC_LOG_FORMAT"),
            (["run", "--now", "2026-01-01"], {}, "e.g. 2026-01-01T00:00:00Z"),
            (["runs", "--limit", "-5"], {}, "from 1 to"),
            (["reviews", "list", "--limit", "0"], {}, "from 1 to"),
            (["runs", "--limit", "99999999999999999999"], {}, "from 1 to"),
            (
                ["run"],
                {"MEMORY_GC_DECAY__IMPORTANCE_MULTIPLIERS": "[1e308, 1, 1, 1, 1]"},
                "between 1e-6 and 1e12",
            ),
            (["run"], {"MEMORY_GC_DECAY__HALF_LIFE_DAYS": "1e-300"}, "half_life_days"),
            (
                ["run"],
                {"MEMORY_GC_SCHEDULE__MISFIRE_GRACE_SECONDS": "100000000000000"},
                "misfire_grace_seconds",
            ),
            (
                ["run"],
                {"MEMORY_GC_SCHEDULE__APPLY_DELAY_MINUTES": "100000000000000"},
                "apply_delay_minutes",
            ),
            (["report", str(UUID(int=5)), "--output", "out.txt"], {}, ".json, .md or .html"),
            (
                ["report", str(UUID(int=5)), "--format", "html", "--output", "r.json"],
                {},
                "does not match",
            ),
        ],
    )
    def test_exit_2_and_nothing_changed(
        self, engine, cli_env, monkeypatch, capsys, argv, env, fragment
    ):
        """Bad usage or configuration exits 2 with a message naming the problem."""
        seeded(engine)
        before = snapshot(engine)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert main(argv) == 2
        assert fragment in capsys.readouterr().err
        assert snapshot(engine) == before

    @pytest.mark.parametrize(
        ("argv", "code"),
        [
            (["run", "--dry-run", "--now", "1971-01-01T00:00:00Z"], 0),
            (["run", "--dry-run", "--now", "1970-12-31T23:59:59Z"], 2),
            (["run", "--dry-run", "--now", "9000-12-31T23:59:59Z"], 0),
            (["run", "--dry-run", "--now", "9001-01-01T00:00:00Z"], 2),
            (["runs", "--limit", "1"], 0),
            (["runs", "--limit", "0"], 2),
            (["runs", "--limit", "1000000000"], 0),
            (["runs", "--limit", "1000000001"], 2),
        ],
    )
    def test_bounds_just_inside_and_just_outside(self, engine, cli_env, capsys, argv, code):
        """--now within the years 1971–9000 runs (the edges included), one second outside is
        refused; --limit 1 is the smallest accepted."""
        seeded(engine)
        before = snapshot(engine)
        assert main(argv) == code
        assert snapshot(engine) == before

    @pytest.mark.parametrize("where", ["directory", "unwritable"])
    def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(
        self, engine, cli_env, capsys, tmp_path, where
    ):
        """`run --report PATH` used to apply the run and then fail writing the report (exit 1,
        a traceback, no run id): the operator would run it again. Now nothing runs."""
        seeded(engine)
        before = snapshot(engine)
        path = tmp_path / "r.json" if where == "directory" else Path("/proc/no-such/r.json")
        if where == "directory":
            path.mkdir()
        assert main(["run", "--report", str(path)]) == 2
        err = capsys.readouterr().err
        assert ("is a directory" if where == "directory" else "cannot be written") in err
        assert snapshot(engine) == before
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 0

    @pytest.mark.parametrize(
        ("env", "fragment"),
        [
            ({"MEMORY_GC_DATABASE_URL": "notaurl"}, "not a usable PostgreSQL URL"),
            ({"MEMORY_GC_DATABASE_URL": "mysql://x@y/z"}, "not a usable PostgreSQL URL"),
            ({"MEMORY_GC_DATABASE_URL": "postgresql://u:p@h:abc/db"}, "not a usable PostgreSQL"),
            ({"MEMORY_GC_DATABASE_URL": "sqlite:///x.db"}, "names a sqlite database"),
            ({"MEMORY_GC_DATA_DIR": "/proc/no-such-dir"}, "MEMORY_GC_DATA_DIR"),
            ({"MEMORY_GC_CONFIG": "/tmp"}, "cannot be read"),
            # libpq's "invalid port number" used to read as a server that is down (exit 1)
            ({"MEMORY_GC_DATABASE_URL": "postgresql://u@127.0.0.1:99999/x"}, "names port 99999"),
            # a mistyped model endpoint used to defer every model decision, exit 0, every night
            ({"OPENAI_BASE_URL": "not-a-url"}, "OPENAI_BASE_URL is not an http(s) URL"),
            ({"OPENAI_BASE_URL": "ftp://models.example/v1"}, "is not an http(s) URL"),
            ({"OPENAI_BASE_URL": "http://localhost:99999/v1"}, "(http://localhost) has a port"),
            ({"OPENAI_BASE_URL": "http://models.test/v 1"}, "a space or a control character"),
            # an unset secret used to switch to an empty embedded store, and succeed
            ({"MEMORY_GC_DATABASE_URL": ""}, "MEMORY_GC_DATABASE_URL is set but empty"),
        ],
    )
    def test_unusable_settings_exit_2_naming_them(self, monkeypatch, capsys, env, fragment):
        """An unusable URL, data directory or config path is named, with what to do (exit 2),
        instead of a traceback."""
        monkeypatch.delenv("MEMORY_GC_DATABASE_URL", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert main(["runs"]) == 2
        assert fragment in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("env", "code"),
        [
            ({"MEMORY_GC_DATABASE_URL": "postgresql://u@127.0.0.1:65535/x"}, 1),  # unreachable
            ({"MEMORY_GC_DATABASE_URL": "postgresql://u@127.0.0.1:65536/x"}, 2),
            ({"OPENAI_BASE_URL": "http://127.0.0.1:65535/v1"}, 0),
            ({"OPENAI_BASE_URL": "http://127.0.0.1:65536/v1"}, 2),
            ({"OPENAI_BASE_URL": "http://127.0.0.1:1/v1"}, 0),
            ({"OPENAI_BASE_URL": "http://127.0.0.1:0/v1"}, 2),
        ],
    )
    def test_ports_just_inside_and_just_outside(self, cli_env, monkeypatch, capsys, env, code):
        """1-65535 is a port: the edges are accepted (the database one is then unreachable,
        exit 1), one past them is bad input (exit 2)."""
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert main(["runs"]) == code

    def test_an_unreachable_database_is_one_line(self, monkeypatch, capsys):
        """libpq's "\n\tIs the server running …" made the one-line error two."""
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", "postgresql://u@127.0.0.1:1/x")
        assert main(["runs"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot connect to the database" in err, err

    def test_a_stopped_plan_is_not_called_running(self, engine, cli_env, capsys):
        """A dry run left unfinished shows as stopped in `runs`; `apply` said it "is running"."""
        seeded(engine)
        assert main(["run", "--dry-run", "--now", NOW_ARG]) == 0
        plan = run_id_from(capsys.readouterr().out)
        execute(engine, "UPDATE gc_runs SET status = 'running', finished_at = NULL")
        assert main(["apply", plan]) == 2
        assert "has not completed (it is running, or was stopped" in capsys.readouterr().err

    def test_a_bad_model_url_is_named_without_its_key(self, monkeypatch, capsys):
        monkeypatch.setenv("OPENAI_BASE_URL", "https://user:sk-SECRET@proxy.internal:70000/v1")
        assert main(["runs"]) == 2
        err = capsys.readouterr().err
        assert "(https://proxy.internal) has a port that is not 1-65535" in err
        assert "SECRET" not in err and "user" not in err

    @pytest.mark.parametrize(
        "argv",
        [
            ["run", "--now", "yesterday"],
            ["apply", "not-a-uuid"],
            ["report", "not-a-uuid"],
            ["restore", "--run", "not-a-uuid"],
            ["restore", "--memory", "not-a-uuid"],
            ["reject", "not-a-uuid"],
            ["reviews", "resolve", "x", "--dismiss"],
            ["reviews", "resolve", "1", "--keep", "not-a-uuid"],
            ["reviews", "resolve", "1", "--dismiss", "--now", "yesterday"],
            ["forget-user", "u1", "--now", "yesterday"],
            ["forget", "not-a-uuid"],
            ["verify-erasure", "u1", "--now", "yesterday"],
            ["schedule", "--once-due", "--now", "yesterday"],
        ],
    )
    def test_bad_input_is_refused_before_connecting(self, monkeypatch, capsys, argv):
        """A malformed id or --now is bad input (exit 2) whatever the database's state; some
        commands connected first and reported an unreachable database (exit 1) instead."""
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is not a UUID" in err or "--now" in err or "not a number" in err, err

    @pytest.mark.parametrize("option", ["bogus=1", "sslmode=bogus", "target_session_attrs=x"])
    def test_a_url_option_the_driver_refuses_exits_2(self, cli_env, monkeypatch, capsys, option):
        """An option or value libpq refuses is an unusable URL; `sslmode=bogus` used to read as
        a server that is down (exit 1, "check that the server is running")."""
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", f"{cli_env}&{option}")
        assert main(["runs"]) == 2
        assert "refused by the driver" in capsys.readouterr().err

    @pytest.mark.parametrize("argv", [["run", "--dry-run"], ["schedule", "--once-due"]])
    def test_a_secret_files_newline_around_the_model_url_and_key_is_dropped(
        self, engine, cli_env, monkeypatch, argv
    ):
        """Values read from secret files end in a newline: the URL passed the start-up check
        stripped and then failed the client raw, a traceback after the run was recorded (left
        stopped), and a daemon whose nightly run failed at every upkeep."""
        add(engine, "u1", "expired", expires_at=days_ago(1))
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1/v1\n")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test\n")
        assert main([*argv, "--now", NOW.isoformat()]) == 0
        runs = execute(engine, "SELECT status FROM gc_runs").scalars().all()
        assert runs and set(runs) == {"completed"}

    def test_config_named_by_the_option_is_named_in_the_error(self, capsys, tmp_path):
        assert main(["--config", str(tmp_path / "none.toml"), "runs"]) == 2
        assert "fix --config" in capsys.readouterr().err

    def test_a_refused_command_leaves_no_folder_behind(self, engine, cli_env, tmp_path):
        """Checking a report path creates nothing: a command refused for another reason
        leaves no folders (the report's folders are made when it is written)."""
        seeded(engine)
        target = tmp_path / "new" / "deeper" / "r.json"
        assert main(["run", "--report", str(target), "--now", "yesterday"]) == 2
        assert not (tmp_path / "new").exists()
        assert main(["run", "--report", str(target), "--now", NOW_ARG]) == 0
        assert target.is_file()

    @pytest.mark.parametrize(
        "argv",
        [
            ["forget-user", "u1", "--purge-now"],
            ["forget-user", "u1"],
            ["forget", "{expired}", "--purge-now"],
            ["verify-erasure", "u1"],
            ["reviews", "resolve", "1", "--dismiss"],
            ["schedule", "--once-due"],
            ["run", "--dry-run"],
        ],
    )
    def test_every_commands_clock_is_bounded_before_anything_is_written(
        self, engine, cli_env, capsys, argv
    ):
        """`forget-user --purge-now --now 0001-…` used to exit 2 *after* filing the request:
        the next run would purge the user. A resolution stamped in year 1 made its row's
        history retention end at once. Every command's --now is checked as a run's is."""
        expired = seeded(engine)
        before = snapshot(engine)
        argv = [arg.replace("{expired}", str(expired)) for arg in argv]
        assert main([*argv, "--now", "0001-01-01T00:00:00Z"]) == 2
        assert "--now '0001-01-01T00:00:00Z' is outside the years 1971-9000" in (
            capsys.readouterr().err
        )
        assert snapshot(engine) == before
        for table in ("gc_erasure_requests", "gc_runs", "gc_actions"):
            assert execute(engine, f"SELECT count(*) FROM {table}").scalar() == 0, table

    @pytest.mark.parametrize("argv", [["run"], ["schedule", "--once-due"]])
    def test_an_applied_clock_far_ahead_is_refused(self, engine, cli_env, capsys, argv):
        """`--now 2062-…` for 2026 (a typo) stamped the run ahead: hard_delete's cutoff moved
        36 years on, and rows whose retention had not ended were purged, past any restore."""
        add(engine, "u1", "deleted yesterday", status="deleted", status_reason="unused",
            deleted_at=days_ago(1), status_changed_at=days_ago(1))  # fmt: skip
        before = snapshot(engine)
        assert main([*argv, "--now", "2062-06-01T03:00:00Z"]) == 2
        assert "more than a day ahead of this machine's clock" in capsys.readouterr().err
        assert snapshot(engine) == before
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 0

    @pytest.mark.parametrize(("ahead", "code"), [(timedelta(hours=23, minutes=59), 0),
                                                 (timedelta(days=1, minutes=1), 2)])  # fmt: skip
    def test_an_applied_clock_up_to_a_day_ahead_runs(self, engine, cli_env, capsys, ahead, code):
        """Clock skew between hosts is allowed for: a day ahead of the machine's clock, not more."""
        seeded(engine)
        at = (datetime.now(UTC) + ahead).isoformat()
        assert main(["run", "--job", "ttl_expiry", "--now", at]) == code, capsys.readouterr().err
        runs = execute(engine, "SELECT count(*) FROM gc_runs").scalar()
        assert runs == (1 if code == 0 else 0)

    def test_a_plan_for_a_later_date_is_a_preview_not_applied(self, engine, cli_env, capsys):
        """A dry run may look ahead (what would happen then); its apply waits for that date."""
        add(engine, "u1", "deleted yesterday", status="deleted", status_reason="unused",
            deleted_at=days_ago(1), status_changed_at=days_ago(1))  # fmt: skip
        before = snapshot(engine)
        assert main(["run", "--dry-run", "--now", "2062-06-01T03:00:00Z"]) == 0
        plan = execute(engine, "SELECT id FROM gc_runs").scalar()
        capsys.readouterr()
        assert main(["apply", str(plan)]) == 2
        assert f"run {plan} was planned for 2062-06-01T03:00:00+00:00, which is more" in (
            capsys.readouterr().err
        )
        assert snapshot(engine) == before
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 1

    @pytest.mark.parametrize("call", ["forget", "restore_run", "restore_memory", "verify"])
    def test_a_clock_out_of_range_is_refused_through_the_api(self, engine, settings, call):
        """The same for library callers: erasure.forget filed its request first; a restore
        stamps the records it retires with its clock (retention counts from it)."""
        from gc_worker import erasure, restore, verify_erasure
        from gc_worker.errors import UsageError

        expired = seeded(engine)
        applied = main_run(engine, settings)
        before = snapshot(engine)
        far = datetime(1, 1, 2, tzinfo=UTC)
        calls = {
            "forget": lambda: erasure.forget(
                engine, settings, now=far, user_id="u1", purge_now=True
            ),
            "restore_run": lambda: restore.restore_run(engine, applied, now=far),
            "restore_memory": lambda: restore.restore_memory(engine, expired, now=far),
            "verify": lambda: verify_erasure.verify(engine, now=far, user_id="u1"),
        }
        with pytest.raises(UsageError, match="outside the years"):
            calls[call]()
        assert snapshot(engine) == before
        assert execute(engine, "SELECT count(*) FROM gc_erasure_requests").scalar() == 0
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 1

    @pytest.mark.parametrize("target", ["file", "unwritable"])
    def test_a_demo_folder_that_cannot_be_written_is_refused_before_the_demo(
        self, capsys, tmp_path, monkeypatch, target
    ):
        """`demo --output-dir` used to drop, seed and plan the demo database and then fail
        writing the reports with a traceback (exit 1)."""
        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(tmp_path / "data"))
        folder = tmp_path / "a-file" if target == "file" else Path("/proc/no-such/reports")
        if target == "file":
            folder.write_text("not a folder")
        assert main(["demo", "--output-dir", str(folder)]) == 2
        err = capsys.readouterr().err
        assert ("is a file; name a folder" if target == "file" else "cannot be written") in err
        assert not (tmp_path / "data").exists()  # no embedded server was started for it

    def test_a_metrics_host_that_is_not_here_names_the_host(self, engine, cli_env, capsys):
        """The message used to send the operator to --metrics-port for a bad host."""
        argv = ["schedule", "--once-due", "--metrics-host", "203.0.113.7", "--metrics-port", "0"]
        assert main(argv) == 2
        assert "pick another --metrics-host" in capsys.readouterr().err

    def test_unreachable_database_exits_1(self, monkeypatch, capsys):
        """A database that cannot be reached is a runtime failure (exit 1) with what to check."""
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
        assert main(["run"]) == 1
        assert "MEMORY_GC_DATABASE_URL" in capsys.readouterr().err

    def test_database_without_schema(self, empty_database_url, monkeypatch, capsys):
        """A database with no schema asks for `memory-gc migrate` (exit 2)."""
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", empty_database_url)
        assert main(["run"]) == 2
        assert "memory-gc migrate" in capsys.readouterr().err

    def test_schema_older_than_code(self, empty_database_url, monkeypatch, capsys):
        """A schema at an older revision is refused until migrated, then works."""
        engine = db.make_engine(empty_database_url)
        cfg = schema._alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            cfg.attributes["embedding_dim"] = 8
            command.upgrade(cfg, "0001")
        engine.dispose()
        monkeypatch.setenv("MEMORY_GC_DATABASE_URL", empty_database_url)
        monkeypatch.setenv("MEMORY_GC_EMBEDDINGS__DIM", "8")
        assert main(["run", "--dry-run"]) == 2
        assert "run `memory-gc migrate`" in capsys.readouterr().err
        assert main(["migrate"]) == 0

    def test_apply_twice_is_refused(self, engine, cli_env, capsys):
        """A plan applies once; the second apply exits 2 and changes nothing."""
        seeded(engine)
        main(["run", "--dry-run", "--now", NOW_ARG])
        plan_id = run_id_from(capsys.readouterr().out)
        assert main(["apply", plan_id]) == 0
        before = snapshot(engine)
        assert main(["apply", plan_id]) == 2
        assert "already applied" in capsys.readouterr().err
        assert snapshot(engine) == before


class TestSignals:
    def test_a_reader_that_left_is_no_traceback(self, engine, cli_env):
        """`memory-gc runs | head -1`: the pipe's reader is gone before the output is written;
        that was a BrokenPipeError traceback."""
        seeded(engine)
        assert main(["run", "--now", NOW_ARG]) == 0
        env = cli_env_of_this_checkout()
        env.pop("PYTHONUNBUFFERED", None)  # buffered, as on a bare machine: fails at the flush
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run([sys.executable, "-m", "gc_worker.cli", "runs"], env=env,
                                  stdout=write_end, stderr=subprocess.PIPE, text=True,
                                  timeout=120)  # fmt: skip
        finally:
            os.close(write_end)
        assert "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr
        assert proc.returncode == 1

    @pytest.mark.parametrize("ending", ["ctrl-c", "database error"])
    def test_a_reader_that_left_before_an_interrupt_or_error_keeps_the_exit_code(
        self, engine, cli_env, ending
    ):
        """stdout's reader left, then Ctrl-C or a database error after something was printed
        (forget-user --purge-now reads its request back): Python's flush at exit failed and
        the process exited 120 with "Exception ignored … BrokenPipeError", outside the 0/1/2
        contract. Found by a review."""
        seeded(engine)
        hit = {
            "ctrl-c": "raise KeyboardInterrupt",
            "database error": "conn.exec_driver_sql('SELECT pg_terminate_backend("
            "pg_backend_pid())')",
        }[ending]
        child = (
            "import sys\nfrom gc_worker import cli, erasure\nreal = erasure.get_request\n"
            f"def get_request(conn, request_id):\n    {hit}\n    return real(conn, request_id)\n"
            "erasure.get_request = get_request\nsys.exit(cli.main(sys.argv[1:]))\n"
        )
        argv = ["forget-user", "u2", "--purge-now", "--now", NOW_ARG]
        proc = gone_reader(cli_env_of_this_checkout(), [sys.executable, "-c", child, *argv])
        assert proc.returncode == 1, proc.stderr
        assert "Exception ignored" not in proc.stderr, proc.stderr

    def test_a_log_reader_that_left_does_not_stop_the_run(self, engine, cli_env):
        """stderr's reader left (`memory-gc run 2>&1 | head -1`): the first log line raised
        BrokenPipeError, the run was left unworked and the process exited 120. A log line
        that cannot be written is dropped; the run completes (its report is in the database)."""
        seeded(engine)
        env = cli_env_of_this_checkout()
        env.pop("PYTHONUNBUFFERED", None)
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run([sys.executable, "-m", "gc_worker.cli", "run", "--now", NOW_ARG],
                                  env=env, stdout=subprocess.PIPE, stderr=write_end, text=True,
                                  timeout=120)  # fmt: skip
        finally:
            os.close(write_end)
        assert proc.returncode == 0 and "completed" in proc.stdout, proc.stdout
        done = execute(engine, "SELECT count(*) FROM gc_runs WHERE status = 'completed'")
        assert done.scalar() == 1

    def test_sigterm_stops_a_one_shot_command_as_ctrl_c_does(self, engine, cli_env):
        """SIGTERM to `run` (as `docker stop` sends to PID 1) interrupts it like Ctrl-C: exit 1
        with the interrupt message, instead of the signal's default (ignored as PID 1)."""
        seeded(engine)
        code, err = sigterm_while_blocked(engine, ["run", "--dry-run", "--now", NOW_ARG])
        assert code == 1, err
        assert "interrupted; committed batches stay applied" in err

    def test_sigterm_during_a_once_due_pass_is_no_success(self, engine, cli_env):
        """`schedule --once-due` stopped by SIGTERM leaves the nightly run to the next pass;
        it exited 0, which a cron wrapper reads as a pass done."""
        seeded(engine)
        argv = ["schedule", "--once-due", "--now", NOW_ARG]
        code, err = sigterm_while_blocked(engine, argv, release_first=True)
        assert code == 1, err
        assert "interrupted" in err
        left = execute(engine, "SELECT count(*) FROM gc_runs WHERE status = 'running'")
        assert left.scalar() == 1  # the next pass resumes it

    def test_sigterm_stops_the_daemon_while_it_still_connects(self, cli_env):
        """`schedule` whose first connection hangs (a server that accepts and never answers,
        no connect_timeout in the URL) still handles SIGTERM: exit 1 with the interrupt
        message, not the signal's default, which PID 1 of a container ignores."""
        import socket

        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            env = cli_env_of_this_checkout() | {
                "MEMORY_GC_DATABASE_URL": f"postgresql+psycopg://gc@127.0.0.1:{port}/memories"
            }
            argv = [sys.executable, "-m", "gc_worker.cli", "schedule"]
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)  # fmt: skip
            try:
                listener.settimeout(60)
                accepted, _ = listener.accept()  # the worker is now waiting for an answer
                time.sleep(0.5)  # past its imports: inside the connect
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=60)
                accepted.close()
            finally:
                proc.kill()
        assert proc.returncode == 1, err
        assert "interrupted" in err

    def test_a_one_shot_command_puts_the_sigterm_handler_back(self, cli_env):
        """The handler lives only while the command runs (in-process callers keep theirs)."""
        before = signal.getsignal(signal.SIGTERM)
        assert main(["runs"]) == 0
        assert signal.getsignal(signal.SIGTERM) is before


def gone_reader(env: dict[str, str], argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` with stdout a pipe whose reader has left, buffered as on a bare machine."""
    env.pop("PYTHONUNBUFFERED", None)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, env=env, stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120)  # fmt: skip
    finally:
        os.close(write_end)


def cli_env_of_this_checkout() -> dict[str, str]:
    """The environment of a `python -m gc_worker.cli` subprocess running this checkout."""
    return dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))


def sigterm_while_blocked(
    engine, argv: list[str], *, release_first: bool = False
) -> tuple[int, str]:
    """Run the CLI with ``argv`` in a subprocess until it waits on a lock of memories, send it
    SIGTERM, and return its exit code and stderr. ``release_first``: end the lock half a
    second after the signal, before waiting for the process (one that only notes the signal
    finishes its statement first)."""
    argv = [sys.executable, "-m", "gc_worker.cli", *argv]
    with engine.connect() as blocker, engine.connect() as watcher:
        blocker.exec_driver_sql("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
        proc = subprocess.Popen(argv, env=cli_env_of_this_checkout(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            waiting_for_lock(watcher)
            proc.send_signal(signal.SIGTERM)
            if release_first:
                time.sleep(0.5)
                blocker.rollback()
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            blocker.rollback()
    return proc.returncode, err


def waiting_for_lock(conn, timeout: float = 60.0) -> None:
    """Until another session of this database waits on a lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).scalar()
        conn.rollback()
        if waiting:
            return
        time.sleep(0.1)
    raise AssertionError("no session started waiting on the lock")


def test_a_slow_reader_of_a_non_blocking_stderr_gets_every_log_line_whole(monkeypatch):
    """A non-blocking stderr whose reader stalls refuses writes (BlockingIOError, an OSError
    like a broken pipe): the lines are waited for, not dropped, and none is cut into another;
    stderr is not sent to /dev/null as it is once its reader left. Found by a review: the
    first version dropped the refused lines, and the buffer glued a cut line to the next."""
    import fcntl
    import io

    from gc_worker import logs

    read_end, write_end = os.pipe()
    flags = fcntl.fcntl(write_end, fcntl.F_GETFL)
    fcntl.fcntl(write_end, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    raw = open(write_end, "wb", buffering=8192)  # noqa: SIM115  (closed below, as stderr)
    stream = io.TextIOWrapper(raw, line_buffering=True)
    monkeypatch.setattr(sys, "stderr", stream)
    received = bytearray()

    def read_after_a_stall() -> None:
        time.sleep(0.5)
        while chunk := os.read(read_end, 65536):
            received.extend(chunk)

    reader = threading.Thread(target=read_after_a_stall)
    reader.start()
    out = logs._Stderr()
    for i in range(3000):  # ~600 KB: ten times what the pipe holds
        out.write(json.dumps({"i": i, "pad": "x" * 180}) + "\n")
    out.flush()
    assert os.readlink(f"/proc/self/fd/{write_end}").startswith("pipe:")
    stream.close()
    reader.join(30)
    os.close(read_end)
    lines = received.decode().splitlines()
    assert [json.loads(line)["i"] for line in lines] == list(range(3000))


def test_a_closed_stderr_keeps_the_exit_code() -> None:
    """`memory-gc --help 2>&-`: Python has no sys.stderr; the exit flush raised and --help
    exited 1 (a configuration error, 1 instead of 2). Found by a review."""
    env = cli_env_of_this_checkout()
    for argv, code in ((["--help"], 0), (["run", "--now", "yesterday"], 2)):
        proc = subprocess.run([sys.executable, "-m", "gc_worker.cli", *argv], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                              preexec_fn=lambda: os.close(2))  # fmt: skip
        assert proc.returncode == code, argv


def test_a_reader_of_a_non_blocking_stderr_that_never_reads_costs_one_wait(monkeypatch):
    """A reader that never reads: the first version waited DRAIN_SECONDS for every flush
    (three or four per log line: 15–20 s a line with the default 5 s, and 11 s at exit).
    Once a wait ran out nothing waits again until a flush goes through. Found by a review."""
    import fcntl
    import io

    from gc_worker import logs

    monkeypatch.setattr(logs, "DRAIN_SECONDS", 0.3)
    monkeypatch.setattr(logs, "_stalled", threading.Event(), raising=False)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETFL, fcntl.fcntl(write_end, fcntl.F_GETFL) | os.O_NONBLOCK)
    raw = open(write_end, "wb", buffering=8192)  # noqa: SIM115  (closed below, as stderr)
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, line_buffering=True))
    out = logs._Stderr()
    started = time.monotonic()
    for i in range(400):  # ~80 KB: more than the pipe holds
        out.write(json.dumps({"i": i, "pad": "x" * 180}) + "\n")
        out.flush()
    waited = time.monotonic() - started
    assert logs.drain_stderr() is False  # what is left cannot go: the exit sends it nowhere
    assert waited < 3.0, f"{waited:.1f} s: the writer waited more than once"
    received = bytearray()
    fcntl.fcntl(read_end, fcntl.F_SETFL, fcntl.fcntl(read_end, fcntl.F_GETFL) | os.O_NONBLOCK)
    for line in range(3):  # the reader comes back: later lines arrive, and none is cut
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_end, 65536):
                received.extend(chunk)
        out.write(json.dumps({"after": line}) + "\n")
        out.flush()
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(read_end, 65536):
            received.extend(chunk)
    lines = [json.loads(line) for line in received.decode().splitlines()]  # each one whole
    assert [x["after"] for x in lines if "after" in x] == [0, 1, 2]
    os.close(read_end)
    with contextlib.suppress(OSError):
        sys.stderr.close()
