"""Packaging metadata: what building the package needs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_setuptools_floor_reads_an_spdx_license_string():
    """`license = "Apache-2.0"` (PEP 639) needs setuptools 77; an older one refuses to build."""
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    [setuptools] = [r for r in config["build-system"]["requires"] if r.startswith("setuptools")]
    floor = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools.replace(" ", ""))
    assert floor is not None, setuptools
    if isinstance(config["project"].get("license"), str):
        assert int(floor.group(1)) >= 77, setuptools
