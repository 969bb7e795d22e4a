"""Benchmarks of the deterministic GC jobs: memory-gc against hand-written set-based SQL and the
naive per-user loop, side by side on clones of one generated store (``python -m bench``).

See docs/benchmarks.md for the procedure, the targets and the latest results.
"""

from __future__ import annotations

from datetime import UTC, datetime

# The fixed clock of every benchmark run (a nightly 03:00 UTC run).
BENCH_NOW = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)

# The jobs that need no LLM, in run order: what all three contenders do.
DETERMINISTIC_JOBS = ("ttl_expiry", "decay", "usage_prune", "user_cap", "hard_delete")
