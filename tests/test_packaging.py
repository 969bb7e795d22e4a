"""Packaging: what building the package needs, and what the image and its documented
deployment run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


class TestImage:
    def test_the_healthcheck_probes_the_default_commands_metrics_port(self):
        """The image had no HEALTHCHECK although its default command serves /healthz: the
        probe asks that port, with python (the slim image has no curl)."""
        cmd = json.loads(_dockerfile_instruction("CMD"))
        port = cmd[cmd.index("--metrics-port") + 1]
        probe = _dockerfile_instruction("HEALTHCHECK")
        assert f"http://127.0.0.1:{port}/healthz" in probe and '"python"' in probe

    @pytest.mark.parametrize("healthy", [True, False])
    def test_the_probe_fails_when_healthz_says_unhealthy(self, healthy):
        """The probe's code exits 0 on a 200 and not 0 on the daemon's 503."""
        probe = json.loads(_dockerfile_instruction("HEALTHCHECK").split(" CMD ", 1)[1])
        server = serve_http(Metrics(), lambda: (healthy, {}), "127.0.0.1", 0)
        try:
            script = re.sub(r":\d+/healthz", f":{server.server_port}/healthz", probe[-1])
            done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30)
        finally:
            server.shutdown()
            server.server_close()
        assert (done.returncode == 0) == healthy, done.stderr[-300:]


def test_the_kubernetes_example_migrates_before_the_daemon_starts():
    """docs/operations.md's Deployment ran only `schedule`, which against a database without the
    schema exits 2 ("run `memory-gc migrate`"): an init container runs `migrate` first."""
    text = OPERATIONS.read_text(encoding="utf-8")
    [example] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "schedule" in b]
    init = example.index("initContainers:")
    assert init < example.index("containers:", init + len("initContainers:"))
    assert re.search(r'args: \["migrate"\]', example[init:]), example
