"""One memory-gc run in its own process, so its peak RSS is its own (``ru_maxrss``).

    python -m bench.worker --url URL --mode apply|plan_apply --now ISO --settings SETTINGS.json \
        --out RESULT.json

``apply`` is ``memory-gc run``: a plan-and-apply run over every user, then its summary (what
the CLI prints), then the full report with every action (what ``--report PATH`` writes).
``plan_apply`` is ``memory-gc run --dry-run`` followed by ``memory-gc apply RUN_ID``. The result
file holds wall times per phase, peak RSS after each phase, and what the run changed.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import DETERMINISTIC_JOBS
from gc_worker import db, logs
from gc_worker.config import Settings
from gc_worker.engine import RunRequest, apply_plan, run_once
from gc_worker.report import build_report


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB.

    On Linux it is ``VmHWM`` of /proc/self/status: ``ru_maxrss`` also counts the parent's peak
    (the kernel carries it across fork + exec), which would charge the benchmark's own memory to
    the worker. Elsewhere ``ru_maxrss`` (KiB on Linux, bytes on macOS).
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


def changed_rows(report: dict[str, Any]) -> dict[str, int]:
    """Rows of ``memories`` the run changed, per job (actions) plus score refreshes."""
    counts = {job: row.get("actions", 0) for job, row in report["jobs"].items()}
    counts["refresh"] = sum(row.get("refreshed", 0) for row in report["jobs"].values())
    return counts


def run(url: str, mode: str, now: datetime, settings: Settings) -> dict[str, Any]:
    engine = db.make_engine(url)
    request = RunRequest(mode="apply", now=now, jobs=DETERMINISTIC_JOBS, trigger="bench")
    result: dict[str, Any] = {"rss_mb": {"start": peak_rss_mb()}, "seconds": {}}
    started = time.perf_counter()
    if mode == "plan_apply":
        plan_id = run_once(engine, settings, replace(request, mode="dry_run"))
        result["seconds"]["plan"] = time.perf_counter() - started
        result["plan_run_id"] = str(plan_id)
        run_id = apply_plan(engine, plan_id)
    else:
        run_id = run_once(engine, settings, request)
    result["seconds"]["run"] = time.perf_counter() - started
    result["rss_mb"]["run"] = peak_rss_mb()
    for phase, listed in (("summary", False), ("report", True)):
        started = time.perf_counter()
        with engine.connect() as conn:
            report = build_report(conn, run_id, actions=listed)
        result["seconds"][phase] = time.perf_counter() - started
        result["rss_mb"][phase] = peak_rss_mb()
    result["run_id"] = str(run_id)
    result["changed"] = changed_rows(report)
    result["drifted"] = len(report.get("drifted", []))
    engine.dispose()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=("apply", "plan_apply"), required=True)
    parser.add_argument("--now", required=True, type=datetime.fromisoformat)
    parser.add_argument("--settings", required=True, type=Path, help="Settings as JSON")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    logs.configure("warning")
    settings = Settings.model_validate_json(args.settings.read_text(encoding="utf-8"))
    result = run(args.url, args.mode, args.now, settings)
    args.out.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
