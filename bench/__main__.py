"""``python -m bench``: generate a store, run every contender on a clone, print the figures.

    python -m bench                       # 1,000,000 memories over 10,000 users (the issue's scale)
    python -m bench --quick               # 20,000 memories over 200 users: a smoke run
    python -m bench --memories 100000 --users 1000 --json results.json

The benchmark prints figures and checks that the end states agree (exit 1 if they do not); it
asserts nothing about timings. docs/benchmarks.md has the procedure and the latest results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import BENCH_NOW
from bench.generate import Scale
from bench.runner import Cluster, Results, build_template, median_of, run_all
from gc_worker import db
from gc_worker.config import EmbeddingSettings, RunSettings, Settings

QUICK = {"memories": 20_000, "users": 200}
LABELS = {
    "memory_gc": "1  memory-gc run (apply)",
    "set_based": "2  set-based SQL",
    "set_based_audit": "2a set-based SQL + audit rows",
    "naive": "3  naive per-user loop",
    "memory_gc_rerun": "4  memory-gc re-run",
    "plan_apply": "5  memory-gc dry run + apply",
}
TARGETS = (
    ("memory-gc / set-based SQL + audit", "memory_gc", "set_based_audit", "<=", 1.3),
    ("memory-gc / set-based SQL (bare)", "memory_gc", "set_based", "<=", 1.3),
    ("naive loop / memory-gc", "naive", "memory_gc", ">=", 10.0),
    ("re-run / first run", "memory_gc_rerun", "memory_gc", "<=", 0.05),
)
RSS_TARGET_MB = 400.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--memories", type=int, default=1_000_000)
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument(
        "--embedded-share",
        type=float,
        default=0.1,
        help="share of users whose memories carry embeddings (default 0.1)",
    )
    p.add_argument("--dim", type=int, default=1536, help="embedding dimension (default 1536)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".bench-data"),
        help="where the embedded PostgreSQL keeps its files (default .bench-data)",
    )
    p.add_argument("--quick", action="store_true", help="20,000 memories over 200 users")
    p.add_argument("--no-naive", action="store_true", help="skip the (slow) naive loop")
    p.add_argument(
        "--workers",
        type=int,
        default=Settings().run.workers,
        help="memory-gc's run.workers: batches worked at once (default: the config default, "
        f"{Settings().run.workers})",
    )
    p.add_argument("--keep", action="store_true", help="keep the contenders' databases")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every contender; the median round is shown (default 1)",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument(
        "--pg-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="server setting for the run, e.g. shared_buffers=2GB (repeatable; "
        "default: the stock settings of the embedded PostgreSQL)",
    )
    args = p.parse_args(argv)  # fmt: skip
    if args.quick:
        args.memories, args.users = QUICK["memories"], QUICK["users"]
    if not 0 < args.users <= args.memories:
        p.error("need 0 < --users <= --memories")
    if not 1 <= args.workers <= 8:
        p.error("--workers takes 1 to 8 (run.workers)")
    if any("=" not in pair for pair in args.pg_setting):
        p.error("--pg-setting takes NAME=VALUE, e.g. shared_buffers=2GB")
    return args


def machine() -> dict[str, Any]:
    meminfo = Path("/proc/meminfo")
    ram = meminfo.read_text().split()[1] if meminfo.exists() else "0"
    cpu = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else cpu
    return {"cpus": os.cpu_count(), "cpu": cpu, "ram_gib": round(int(ram) / 1024**2, 1),
            "python": platform.python_version(), "os": platform.platform(),
            "load_average": os.getloadavg()}  # fmt: skip


def print_results(results: Results, info: dict[str, Any]) -> list[str]:
    """Print the figures; returns the failed checks (end states / audit)."""
    store, m = results.store, results.measures
    print(f"\nstore: {store['memories']:,} memories, {store['users']:,} users, "
          f"{store['embedded']:,} embedded (dim {results.scale.dim}), {store['size']}; "
          f"generated in {results.generate_seconds:.1f} s")  # fmt: skip
    load = ", ".join(f"{x:.1f}" for x in info["load_average"])
    print(f"machine: {info['cpus']} CPUs ({info['cpu']}), {info['ram_gib']} GiB RAM, load average "
          f"{load} at the end; PostgreSQL {store['server_version']}")  # fmt: skip
    print("server: " + ", ".join(f"{k} {v}" for k, v in store["settings"].items()))
    print(f"memory-gc: run.workers {info['workers']}, run.batch_users {info['batch_users']}\n")
    print(f"{'contender':<34}{'wall s':>9}{'rows changed':>14}{'rows/s':>10}{'peak RSS MiB':>14}")
    for name, label in LABELS.items():
        if name in m:
            x = m[name]
            rate = x.rows_changed / x.seconds if x.seconds else 0.0
            rss = f"{x.rss_mb:.0f}" if x.rss_mb is not None else "-"
            low, high = x.extra.get("spread", [x.seconds, x.seconds])
            spread = f"  ({low:.1f}–{high:.1f})" if high > low else ""
            print(
                f"{label:<34}{x.seconds:>9.2f}{x.rows_changed:>14,}{rate:>10,.0f}{rss:>14}{spread}"
            )
    gc = m["memory_gc"].extra
    print(f"   memory-gc peak RSS: {gc['rss_mb']['start']:.0f} MiB after imports, "
          f"{gc['rss_mb']['run']:.0f} after the run, {gc['rss_mb']['summary']:.0f} after its "
          f"summary ({gc['seconds']['summary']:.2f} s; what `memory-gc run` does), "
          f"{gc['rss_mb']['report']:.0f} after a full report of every action "
          f"({gc['seconds']['report']:.2f} s; `--report PATH`)")  # fmt: skip
    if "plan_apply" in m:
        print(f"   dry run {m['plan_apply'].extra['seconds']['plan']:.2f} s of the total")
    print(
        "\nrows changed per job: "
        + ", ".join(f"{k} {v:,}" for k, v in m["memory_gc"].changed.items())
    )
    return _print_checks(results)


def _print_checks(results: Results) -> list[str]:
    failed = [f"end state of {name} differs: {'; '.join(how)}"
              for name, how in results.mismatches().items()]  # fmt: skip
    if results.audit_match is False:
        failed.append("audit rows per (job, reason) differ between memory-gc and set-based + audit")
    names = " = ".join(n for n in LABELS if n in results.measures)
    print(f"end states ({names}): {'DIFFER' if failed else 'identical'}")
    for line in failed:
        print("  " + line)
    print("\ntargets:")
    m = results.measures
    for label, num, den, op, target in TARGETS:
        if num in m and den in m:
            ratio = m[num].seconds / m[den].seconds
            met = ratio <= target if op == "<=" else ratio >= target
            print(f"  {label:<36} {ratio:8.3f}   target {op} {target:<5} "
                  f"{'met' if met else 'MISSED'}")  # fmt: skip
    rss = max(x.rss_mb for x in m.values() if x.rss_mb is not None)
    print(f"  {'worker peak RSS (MiB)':<36} {rss:8.0f}   target <= {RSS_TARGET_MB:<5.0f} "
          f"{'met' if rss <= RSS_TARGET_MB else 'MISSED'}")  # fmt: skip
    return failed


def to_json(results: Results, info: dict[str, Any]) -> dict[str, Any]:
    measures = {
        name: {"seconds": x.seconds, "changed": x.changed, "rows_changed": x.rows_changed,
               "rss_mb": x.rss_mb, "extra": x.extra}
        for name, x in results.measures.items()
    }  # fmt: skip
    return {"scale": asdict(results.scale), "machine": info, "store": results.store,
            "generate_seconds": results.generate_seconds, "measures": measures,
            "mismatches": results.mismatches(), "audit_match": results.audit_match}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scale = Scale(args.memories, args.users, args.embedded_share, args.dim)
    settings = Settings(
        embeddings=EmbeddingSettings(dim=args.dim),
        run=RunSettings(workers=args.workers),
    )
    cluster = Cluster(db.embedded_server(args.data_dir))
    cluster.configure(dict(pair.split("=", 1) for pair in args.pg_setting))
    started = time.perf_counter()
    print(f"generating {scale.memories:,} memories over {scale.users:,} users …")
    template = build_template(cluster, scale, settings, BENCH_NOW)
    rounds = []
    for n in range(args.repeat):
        print(f"round {n + 1} of {args.repeat}")
        results = Results(scale, template.generate_seconds, template.store)
        rounds.append(run_all(cluster, results, settings, BENCH_NOW, naive=not args.no_naive,
                              keep=args.keep))  # fmt: skip
    mismatched = [name for r in rounds for name in r.mismatches()]
    results = median_of(rounds)
    info = machine() | {"workers": args.workers, "batch_users": settings.run.batch_users}
    failed = print_results(results, info)
    if mismatched and not failed:
        failed = [f"end states differ in some round: {', '.join(sorted(set(mismatched)))}"]
        print(failed[0])
    print(f"\ntotal benchmark time {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(to_json(results, info), indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
