"""CLI inputs that once escaped as a traceback or were taken silently: each exits 2 with a
message naming what to fix, and changes nothing."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gc_worker.cli import main

NOW_ARG = "2026-06-01T03:00:00+00:00"
UUID0 = "00000000-0000-0000-0000-000000000000"


def cli(argv: list[str], capsys) -> tuple[object, str]:
    """(exit code, stderr) of one command; an exception escaping main (what an operator sees as a
    traceback) is returned as the code, so the assertion shows it."""
    try:
        code: object = main(argv)
    except BaseException as exc:
        code = f"traceback: {type(exc).__name__}: {exc}"
    return code, capsys.readouterr().err


def run_count(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM gc_runs")).scalar_one()


# --- environment ------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["https://[::1/v1", "http://[bad]/v1"])
def test_openai_base_url_with_broken_brackets_is_a_config_error(monkeypatch, capsys, url):
    """OPENAI_BASE_URL=https://[::1/v1 (a missing bracket): urlsplit's ValueError escapes
    _check_base_url -> traceback, exit 1. Should be exit 2 naming OPENAI_BASE_URL."""
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    code, err = cli(["runs"], capsys)
    assert code == 2, code
    assert "OPENAI_BASE_URL" in err


@pytest.mark.parametrize("host", ["db..example.com", "a" * 64 + ".example.com"])
def test_database_url_with_an_empty_or_too_long_host_label_is_a_clean_error(
    monkeypatch, capsys, host
):
    """MEMORY_GC_DATABASE_URL=postgresql://u@db..example.com/db (a doubled dot): the idna
    UnicodeError from getaddrinfo escapes make_engine -> traceback, exit 1. Should be a one-line
    error naming MEMORY_GC_DATABASE_URL (a malformed URL: exit 2)."""
    monkeypatch.setenv("MEMORY_GC_DATABASE_URL", f"postgresql://u:pw@{host}/db")
    code, err = cli(["runs"], capsys)
    assert code == 2, code
    assert "MEMORY_GC_DATABASE_URL" in err


@pytest.mark.parametrize("port", ["0", "70000"])
def test_database_url_port_out_of_range_in_the_query_exits_2(
    cli_env, monkeypatch, capsys, engine, port
):
    """`?port=0` / `?port=70000` (instead of host:port): exit 1 "cannot connect … check … that the
    server is running". The README promises exit 2 for an unusable URL, port included (the
    host:port form is refused with exit 2)."""
    monkeypatch.setenv("MEMORY_GC_DATABASE_URL", f"{cli_env}&port={port}")
    code, err = cli(["runs"], capsys)
    assert code == 2, (code, err)


@pytest.mark.parametrize("how", ["--config", "MEMORY_GC_CONFIG"])
def test_an_empty_config_path_is_refused(cli_env, monkeypatch, capsys, how):
    """`--config ""` or MEMORY_GC_CONFIG="" (an unset variable in `--config "$CFG"`, an unset
    secret): silently ignored, the command runs on the built-in defaults (e.g. 30-day
    retention instead of the operator's). MEMORY_GC_DATABASE_URL="" is refused (exit 2) for
    exactly this reason; the config path should be too."""
    if how == "--config":
        argv = ["--config", "", "runs"]
    else:
        monkeypatch.setenv("MEMORY_GC_CONFIG", "")
        argv = ["runs"]
    code, err = cli(argv, capsys)
    assert code == 2, (code, err)


# --- configuration values ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ['""', '"   "'])
def test_an_empty_llm_model_is_refused(cli_env, monkeypatch, capsys, value):
    """[llm] model = "" is accepted; with an LLM configured every chat request is refused by the
    API (400, treated per request as refused-for-content) and every decision is deferred, night
    after night - the same silent failure that makes a malformed OPENAI_BASE_URL exit 2."""
    monkeypatch.setenv("MEMORY_GC_LLM__MODEL", value)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    code, err = cli(["runs"], capsys)
    assert code == 2, (code, err)
    assert "llm.model" in err


# --- arguments --------------------------------------------------------------------------------

LONG = "a" * 300  # one path component longer than NAME_MAX (255)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--dry-run", "--now", NOW_ARG, "--report", "{tmp}/" + LONG + ".json"],
        ["run", "--now", NOW_ARG, "--report", "{tmp}/" + LONG + ".json"],
        ["apply", UUID0, "--report", "{tmp}/" + LONG + ".md"],
        ["report", UUID0, "--output", "{tmp}/" + LONG + ".html"],
        ["demo", "--output-dir", "{tmp}/" + LONG],
    ],
    ids=["run-dry", "run-apply", "apply", "report", "demo"],
)
def test_a_report_path_with_a_too_long_name_exits_2(cli_env, engine, tmp_path, capsys, argv):
    """`memory-gc run --report /tmp/<300 chars>.json`: Path.is_dir() raises OSError ENAMETOOLONG
    inside _check_report_path -> traceback, exit 1. Should be the usual "--report … cannot be
    written (File name too long)" exit 2, nothing run."""
    before = run_count(engine)
    code, err = cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2, code
    assert "cannot be written" in err or "too long" in err
    assert run_count(engine) == before


@pytest.mark.parametrize("host", ["é..b", "é" * 70])
def test_a_metrics_host_that_cannot_be_encoded_exits_2(cli_env, capsys, host):
    """`schedule --metrics-host é..b`: socket.bind raises TypeError("encoding of hostname
    failed"), which only OSError is caught for -> traceback, exit 1. Should be exit 2 "pick
    another --metrics-host" like any other bad host."""
    code, err = cli(
        ["schedule", "--once-due", "--now", NOW_ARG, "--metrics-port", "0",
         "--metrics-host", host],
        capsys,
    )  # fmt: skip
    assert code == 2, code
    assert "--metrics-host" in err


def test_a_metrics_host_without_a_port_exits_2(engine, cli_env, capsys):
    """`schedule --metrics-host 'bad host!'` without --metrics-port: there is no endpoint, and
    the host was ignored without a word (the pass ran, exit 0). It is refused before anything
    runs, naming the missing flag."""
    before = run_count(engine)
    code, err = cli(
        ["schedule", "--once-due", "--now", NOW_ARG, "--metrics-host", "bad host!"], capsys
    )
    assert code == 2, code
    assert "--metrics-port" in err
    assert run_count(engine) == before


# --- user ids ---------------------------------------------------------------------------------

NUL_ID = "a\x00b"


def row_counts(engine) -> tuple[int, ...]:
    """Rows of the tables a command taking a user id writes to (runs, sweeps, erasures)."""
    with engine.connect() as conn:
        return tuple(
            conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("gc_runs", "gc_sweep_requests", "gc_erasure_requests")
        )


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["reviews", "list", "--user", NUL_ID], "--user"),
        (["run", "--dry-run", "--now", NOW_ARG, "--user", NUL_ID], "--user"),
        (["run", "--now", NOW_ARG, "--user", "u1", "--user", NUL_ID], "--user"),
        (["request-sweep", NUL_ID], "user_id"),
        (["forget-user", NUL_ID, "--now", NOW_ARG], "user_id"),
        (["verify-erasure", NUL_ID, "--now", NOW_ARG], "user_id"),
    ],
    ids=["reviews-list", "run-dry", "run-apply", "request-sweep", "forget-user", "verify"],
)
def test_a_user_id_with_a_nul_byte_exits_2(cli_env, engine, capsys, argv, argument):
    """A user id containing NUL (`\\x00`), which PostgreSQL text cannot hold, reached the
    server: "database error: DataError", exit 1. No stored user id can contain one, so it is
    refused where the arguments are parsed: exit 2 naming the argument, nothing written."""
    before = row_counts(engine)
    code, err = cli(argv, capsys)
    assert code == 2, code
    assert f"argument {argument}" in err and "NUL" in err and "database error" not in err
    assert row_counts(engine) == before


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--metrics-port", "70000"], "--metrics-port"),
        (["--metrics-port", "-1"], "--metrics-port"),
        (["--metrics-port", "0", "--metrics-host", "no.such.host.invalid"], "--metrics-host"),
    ],
)
def test_a_bad_metrics_address_is_named_before_connecting(monkeypatch, capsys, flags, names):
    """`schedule --metrics-port 70000` (or an unknown --metrics-host) with the database down
    exited 1 "cannot connect to the database": the daemon connected before the endpoint's
    address was checked. The port's range and the host's name are checked first (exit 2)."""
    monkeypatch.setenv("MEMORY_GC_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    code, err = cli(["schedule", "--once-due", "--now", NOW_ARG, *flags], capsys)
    assert code == 2, (code, err)
    assert names in err and "database" not in err


# --- found by the CLI review ------------------------------------------------------------------

NOT_UTF8 = "a\udcffb"  # what Python makes of a byte that is not UTF-8 (a Latin-1 shell's 'ÿ')


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["reviews", "list", "--user", NOT_UTF8], "--user"),
        (["run", "--dry-run", "--now", NOW_ARG, "--user", NOT_UTF8], "--user"),
        (["request-sweep", NOT_UTF8], "user_id"),
        (["forget-user", NOT_UTF8, "--now", NOW_ARG], "user_id"),
        (["verify-erasure", NOT_UTF8, "--now", NOW_ARG], "user_id"),
    ],
    ids=["reviews-list", "run", "request-sweep", "forget-user", "verify"],
)
def test_a_user_id_that_is_not_utf8_exits_2(cli_env, engine, capsys, argv, argument):
    """`memory-gc forget-user $'\\xff'` (an id typed in a Latin-1 terminal): the driver's
    UnicodeEncodeError escaped main -> traceback, exit 1. No stored user id can hold it: exit 2
    naming the argument, nothing written."""
    before = row_counts(engine)
    code, err = cli(argv, capsys)
    assert code == 2, code
    assert f"argument {argument}" in err and "UTF-8" in err
    assert row_counts(engine) == before


@pytest.mark.parametrize(
    ("toml", "env", "key"),
    [
        ('[llm]\nmodel = "gpt\\u0000x"\n', {}, "llm.model"),
        ('[embeddings]\nmodel = "e\\u0000"\n', {}, "embeddings.model"),
        ("", {"MEMORY_GC_SCHEDULE__CRON": "0 3 * * \udcff"}, "schedule.cron"),
        ("", {"MEMORY_GC_LLM__MODEL": "gpt\udcff"}, "llm.model"),
    ],
    ids=["toml-nul-model", "toml-nul-embeddings", "env-not-utf8-cron", "env-not-utf8-model"],
)
def test_a_setting_with_a_nul_or_non_utf8_text_exits_2(
    cli_env, engine, monkeypatch, tmp_path, capsys, toml, env, key
):
    """A text setting holding NUL (`model = "gpt\\u0000x"`) passed validation, and every run then
    failed storing its settings (jsonb refuses it: "database error", exit 1, every night); one
    with bytes that are not UTF-8 (an env value) was a traceback. Refused when the settings
    load, naming the key (exit 2), nothing run."""
    config = tmp_path / "c.toml"
    config.write_text(toml, encoding="utf-8")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, err = cli(["--config", str(config), "run", "--dry-run", "--now", NOW_ARG], capsys)
    assert code == 2, (code, err)
    assert key in err
    assert run_count(engine) == 0


def test_an_empty_data_dir_is_refused(monkeypatch, tmp_path, capsys):
    """MEMORY_GC_DATA_DIR="" (an unset variable) silently meant the default folder: another
    embedded store, where `forget-user` answers "no memories for user" for a user whose rows
    are in the real one. Refused like an empty MEMORY_GC_DATABASE_URL or MEMORY_GC_CONFIG."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # where the default store would start
    monkeypatch.setenv("MEMORY_GC_DATA_DIR", "")
    code, err = cli(["runs"], capsys)
    assert code == 2, (code, err)
    assert "MEMORY_GC_DATA_DIR is set but empty" in err


@pytest.mark.parametrize("command", ["forget-user", "forget"])
def test_a_purge_now_clock_far_ahead_is_refused(cli_env, engine, capsys, command):
    """`forget-user u1 --purge-now --now 2100-…` ran its erasure stamped 2100: the rows of
    every pending request of the user got deleted_at 2100, so hard_delete would purge them
    only then (a forgotten user's rows kept for decades), and the requests read completed in
    2100. A --purge-now run's clock is bounded as `run`'s is (docs/erasure.md: "as for run")."""
    from tests.store import add, days_ago, snapshot

    kept = add(engine, "u1", "kept")
    add(engine, "u1", "other", expires_at=days_ago(1))
    before = snapshot(engine)
    target = "u1" if command == "forget-user" else str(kept)
    code, err = cli([command, target, "--purge-now", "--now", "2100-01-01T00:00:00Z"], capsys)
    assert code == 2, (code, err)
    assert "more than a day ahead of this machine's clock" in err
    assert snapshot(engine) == before
    assert row_counts(engine) == (0, 0, 0)
