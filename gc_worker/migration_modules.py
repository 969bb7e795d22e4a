"""Migration files as modules: their names start with digits, so they are not importable by
name, and a later migration that rewrites an object an earlier one made (a function, a view)
calls the earlier one's code to put it back on downgrade (or to reuse a generator)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).parent / "migrations" / "versions"


def load(file_name: str) -> ModuleType:
    """The migration ``file_name`` (e.g. ``"0005_read_rule.py"``), executed as a fresh module."""
    path = VERSIONS / file_name
    spec = importlib.util.spec_from_file_location(f"memory_gc_migration_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
