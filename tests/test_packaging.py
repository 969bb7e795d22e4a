"""Packaging: what building the package needs, and what the image and its documented
deployment run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gc_worker import healthcheck
from gc_worker.metrics import Metrics, serve_http

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
DOCKERFILE = ROOT / "Dockerfile"
OPERATIONS = ROOT / "docs" / "operations.md"


def test_the_setuptools_floor_reads_an_spdx_license_string():
    """`license = "Apache-2.0"` (PEP 639) needs setuptools 77; an older one refuses to build."""
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    [setuptools] = [r for r in config["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools.replace(" ", ""))
    assert floor is not None, setuptools
    if isinstance(config["project"].get("license"), str):
        assert int(floor.group(1)) >= 77, setuptools


def _dockerfile_instruction(name: str) -> str:
    """One Dockerfile instruction's arguments, continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"{name} ")]
    return line.removeprefix(f"{name} ").strip()


def _serving(healthy: bool):
    """A real /healthz endpoint on a free loopback port saying ``healthy``."""
    return serve_http(Metrics(), lambda: (healthy, {}), "127.0.0.1", 0)


class TestImage:
    def test_the_healthcheck_probes_the_default_commands_metrics_port(self):
        """The image had no HEALTHCHECK although its default command serves /healthz: the probe
        reads PID 1's command line, which for the image's default command is the interpreter,
        the `memory-gc` script and CMD, and asks that port (python: the slim image has no curl)."""
        cmd = json.loads(_dockerfile_instruction("CMD"))
        probe = json.loads(_dockerfile_instruction("HEALTHCHECK").split(" CMD ", 1)[1])
        assert probe == ["python", "-m", "gc_worker.healthcheck"]
        pid1 = ["/usr/local/bin/python", "/usr/local/bin/memory-gc", *cmd]
        port = cmd[cmd.index("--metrics-port") + 1]
        assert healthcheck.endpoint(pid1) == f"http://127.0.0.1:{port}/healthz"

    @pytest.mark.parametrize("healthy", [True, False])
    def test_the_probe_fails_when_healthz_says_unhealthy(self, healthy):
        """The probe exits 0 on a 200 and 1 on the daemon's 503, run as the image runs it."""
        server = _serving(healthy)
        try:
            line = ["memory-gc", "schedule", "--metrics-host", "127.0.0.1",
                    "--metrics-port", str(server.server_port)]  # fmt: skip
            done = subprocess.run([sys.executable, "-m", "gc_worker.healthcheck", *line],
                                  capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
        finally:
            server.shutdown()
            server.server_close()
        assert done.returncode == (0 if healthy else 1), done.stderr[-300:]
        assert f":{server.server_port}/healthz: {200 if healthy else 503}" in done.stdout

    def test_a_daemon_that_does_not_answer_is_unhealthy(self):
        server = _serving(True)
        port = server.server_port
        server.shutdown()
        server.server_close()  # the port is free again: nothing listens
        line = ["memory-gc", "schedule", "--metrics-port", str(port)]
        assert healthcheck.check(healthcheck.endpoint(line))[0] is False
        assert healthcheck.main(line) == 1

    @pytest.mark.parametrize(
        "line",
        [
            ["memory-gc", "migrate"],
            ["/usr/local/bin/python", "/usr/local/bin/memory-gc", "run", "--user", "schedule"],
            ["memory-gc", "forget-user", "schedule"],
            ["memory-gc", "schedule"],
            ["memory-gc", "schedule", "--once-due", "--metrics-port", "9108"],
            ["memory-gc", "schedule", "--metrics-port", "0"],
            ["memory-gc", "schedule", "--metrics-port", "nine"],
            ["/bin/sh", "-c", "memory-gc schedule --metrics-port 9108"],
            [],
        ],
    )
    def test_a_command_without_an_endpoint_is_healthy(self, line, capsys):
        """A one-shot command in the image (`docker run memory-gc migrate`, a long `run`) was
        marked unhealthy after the start period: it serves no /healthz, so there is nothing to
        check. An option's value reading `schedule` is not the command."""
        assert healthcheck.endpoint(line) is None
        if line:  # main() of an empty line reads this test process's PID 1 instead
            assert healthcheck.main(line) == 0
            assert "no /healthz to check" in capsys.readouterr().out

    @pytest.mark.parametrize(
        ("extra", "url"),
        [
            ([], "http://127.0.0.1:9108/healthz"),
            (["--metrics-host", "::"], "http://[::1]:9108/healthz"),
            (["--metrics-host", "10.1.2.3"], "http://10.1.2.3:9108/healthz"),
            (["--metrics-host", "fd00::5"], "http://[fd00::5]:9108/healthz"),
        ],
    )
    def test_the_probe_asks_where_the_daemon_listens(self, extra, url):
        """A wildcard address is asked on loopback; a given address as given, IPv6 bracketed;
        options before the command (`--config`) are memory-gc's own."""
        line = ["memory-gc", "--config", "/etc/gc.toml", "schedule", "--metrics-port", "9108"]
        assert healthcheck.endpoint(line + extra) == url

    def test_pid_1s_command_line_is_read_from_proc(self, tmp_path):
        cmdline = tmp_path / "cmdline"
        cmdline.write_bytes(b"/usr/local/bin/python\0/usr/local/bin/memory-gc\0schedule\0")
        assert healthcheck.main_process_argv(cmdline) == [
            "/usr/local/bin/python", "/usr/local/bin/memory-gc", "schedule"
        ]  # fmt: skip
        assert healthcheck.main_process_argv(tmp_path / "absent") == []


def test_the_kubernetes_example_migrates_before_the_daemon_starts():
    """docs/operations.md's Deployment ran only `schedule`, which against a database without the
    schema exits 2 ("run `memory-gc migrate`"): an init container runs `migrate` first."""
    text = OPERATIONS.read_text(encoding="utf-8")
    [example] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "schedule" in b]
    init = example.index("initContainers:")
    assert init < example.index("containers:", init + len("initContainers:"))
    assert re.search(r'args: \["migrate"\]', example[init:]), example


class TestBootstrap:
    def test_a_failed_install_is_not_stamped_as_done(self, tmp_path):
        """scripts/bootstrap checked its install with `python -c 'import gc_worker'` run in the
        clone, which imports the clone's own folder whatever pip did: an install that failed
        (the registry unreachable) was stamped as done, and every later `scripts/demo` failed on
        a missing .venv/bin/memory-gc without installing again. It exits 1 with pip's error and
        leaves no stamp, so the next run tries again."""
        clone = tmp_path / "clone"
        (clone / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "bootstrap", clone / "scripts" / "bootstrap")
        (clone / "pyproject.toml").write_text("", encoding="utf-8")
        (clone / "gc_worker").mkdir()
        (clone / "gc_worker" / "__init__.py").write_text("", encoding="utf-8")
        bin_dir = clone / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        python = bin_dir / "python"  # pip install fails as offline; else the real python
        python.write_text(
            '#!/bin/sh\nif [ "$1 $2 $3" = "-m pip install" ]; then\n'
            '  echo "ERROR: registry unreachable" >&2; exit 1\nfi\n'
            f'exec "{sys.executable}" "$@"\n',
            encoding="utf-8",
        )
        python.chmod(0o755)
        done = subprocess.run(["bash", str(clone / "scripts" / "bootstrap")],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "registry unreachable" in done.stderr
        assert not (clone / ".venv" / ".memory-gc-installed").exists()

    def test_a_venv_left_without_pip_is_made_again(self, tmp_path):
        """On Debian or Ubuntu without python3-venv, `python3 -m venv .venv` fails for want of
        ensurepip after making .venv/bin/python: once the user installed what its message asks
        for, every run skipped the venv (its python exists) and failed on "No module named
        pip". A .venv whose python has no pip is made again."""
        clone = tmp_path / "clone"
        (clone / "scripts").mkdir(parents=True)
        shutil.copy(ROOT / "scripts" / "bootstrap", clone / "scripts" / "bootstrap")
        (clone / "pyproject.toml").write_text("", encoding="utf-8")
        (clone / ".venv" / "bin").mkdir(parents=True)
        _script(clone / ".venv" / "bin" / "python", 'echo "No module named pip" >&2; exit 1')
        fake_bin = tmp_path / "bin"  # the python bootstrap picks: records that it made a venv
        fake_bin.mkdir()
        _script(
            fake_bin / "python3.13",
            'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then\n'
            "  touch venv-made; exit 0\n"
            "fi\n"
            f'exec "{sys.executable}" "$@"',
        )
        env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", str(clone / "scripts" / "bootstrap")], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert (clone / "venv-made").exists(), done.stdout + done.stderr
        assert done.returncode == 1  # the fake venv's pip still fails: no stamp
        assert not (clone / ".venv" / ".memory-gc-installed").exists()


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
