"""The embedded default: with no MEMORY_GC_DATABASE_URL the CLI starts PostgreSQL + pgvector
in MEMORY_GC_DATA_DIR, keeps it there, and the next process reuses it (same data)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = Path(sys.executable).parent / "memory-gc"


def memory_gc(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_GC_")}
    env |= {"MEMORY_GC_DATA_DIR": str(data_dir), "MEMORY_GC_EMBEDDINGS__DIM": "8"}
    return subprocess.run([str(CLI), *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip


def test_a_second_process_reuses_the_first_ones_store(tmp_path):
    """Process 1 starts a server in an empty data directory and creates the schema; process 2
    (process 1 stopped its server on exit) starts the same directory again and finds the schema
    current, and a third lists the (empty) run history from it."""
    first = memory_gc(tmp_path, "migrate")
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()
    again = memory_gc(tmp_path, "migrate")
    assert again.returncode == 0 and "current" in again.stdout, again.stdout + again.stderr
    listed = memory_gc(tmp_path, "runs")
    assert listed.returncode == 0 and listed.stdout == "", listed.stderr
