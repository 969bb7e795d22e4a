"""Peak memory and time of grouping one big compaction partition: 10,000 and 20,000 rows x 1536.

    python -m bench.bench_cluster_memory                    # new path at 10k and 20k, old at 10k
    python -m bench.bench_cluster_memory --rows 5000 --old-max 5000 --bulk 0

Synthetic partition, as a big user's store looks: mostly distinct memories spread over 40 topics
(pairwise cosine ~0.5 inside a topic, far below the compaction threshold 0.85) and 2 % of the
rows in near-duplicate sets of 2-8 (cosine ~0.92), embeddings stored as float4 (pgvector);
"+bulk": the same partition with 5,000 of its rows copies of one memory (one giant component,
grouped by its newest 3,000).
"new" is ``jobs.compaction.find_groups`` (threshold graph built in blocks, complete linkage per
connected component); "old" is one ``complete_linkage_groups`` over the whole partition, what
find_groups ran before (then capped at 3,000 rows). Each measurement runs in a fresh child
process: peak RSS is its ``VmHWM`` after data generation was reset (/proc/self/clear_refs), the
traced peak is tracemalloc's over the grouping alone. Figures only; no assertion on time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.worker import peak_rss_mb

DIM = 1536
SIMILARITY = 0.85
MAX_GROUP_SIZE = 8
TOPICS = 40
DUPLICATE_SHARE = 0.02
NOISE = 0.0075  # per dimension: copies of one memory sit at cosine ~0.92
START = datetime(2024, 1, 1, tzinfo=UTC)


def partition(rows: int, bulk: int = 0, seed: int = 42) -> np.ndarray:
    """Float4 embeddings of one partition: topic-spread distinct rows plus near-duplicate sets,
    and `bulk` of them noisy copies of one memory (a bulk import: one giant component)."""
    rng = np.random.default_rng(seed)
    topics = rng.normal(size=(TOPICS, DIM)).astype(np.float32)
    vectors = topics[rng.integers(0, TOPICS, size=rows)]
    vectors += rng.normal(size=(rows, DIM)).astype(np.float32)
    copies, start = int(rows * DUPLICATE_SHARE), 0
    while start < copies - 1:  # overwrite runs of rows with noisy copies of their first row
        size = min(int(rng.integers(2, MAX_GROUP_SIZE + 1)), copies - start)
        vectors[start:start + size] /= np.linalg.norm(vectors[start], keepdims=True)  # fmt: skip
        vectors[start + 1:start + size] = vectors[start] + rng.normal(
            scale=NOISE, size=(size - 1, DIM))  # fmt: skip
        start += size
    if bulk:
        one = vectors[-1] / np.linalg.norm(vectors[-1])
        vectors[-bulk:] = one + rng.normal(scale=NOISE, size=(bulk, DIM))
    return vectors[rng.permutation(rows)]


def memory_rows(vectors: np.ndarray) -> list[Any]:
    """Candidate rows as the compaction query returns them (one partition: same slot and type)."""
    return [
        SimpleNamespace(
            id=f"m{i:06d}",
            user_id="u1",
            embedding=vector,
            memory_type="semantic",
            source="explicit_user_statement",
            slot=None,
            scope=None,
            trust=3,
            metadata={},
            observed_at=START,
            created_at=START + timedelta(minutes=i),
        )
        for i, vector in enumerate(vectors)
    ]


def group_new(vectors: np.ndarray) -> list[list[str]]:
    from jobs.compaction import find_groups

    groups, _ = find_groups(memory_rows(vectors), similarity=SIMILARITY,
                            max_group_size=MAX_GROUP_SIZE, max_merge_depth=1, dim=DIM)  # fmt: skip
    return [[row.id for row in group] for group in groups]


def group_old(vectors: np.ndarray) -> list[list[str]]:
    from jobs.similarity import complete_linkage_groups

    ids = [f"m{i:06d}" for i in range(len(vectors))]
    matrix = vectors.astype(np.float64)  # what with_embeddings hands over
    return complete_linkage_groups(ids, matrix, similarity=SIMILARITY,
                                   max_group_size=MAX_GROUP_SIZE)  # fmt: skip


def measure(variant: str, rows: int, bulk: int) -> dict[str, Any]:
    """In this process: generate, reset the RSS peak, group once, report."""
    vectors = partition(rows, bulk)
    # imports (sklearn, scipy) are not the grouping's cost
    import sklearn.cluster  # noqa: F401

    import jobs.compaction  # noqa: F401

    before = peak_rss_mb()
    reset = Path("/proc/self/clear_refs")
    if reset.exists():
        reset.write_text("5")  # VmHWM := VmRSS
    tracemalloc.start()
    started = time.perf_counter()
    groups = (group_old if variant == "old" else group_new)(vectors)
    seconds = time.perf_counter() - started
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    digest = hashlib.sha256(json.dumps(groups).encode()).hexdigest()[:12]
    return {"variant": variant, "rows": rows, "groups": len(groups), "digest": digest,
            "seconds": round(seconds, 2),
            "peak_rss_mb": round(peak_rss_mb()), "rss_before_mb": round(before),
            "traced_peak_mb": round(traced / 2**20)}  # fmt: skip


def in_child(variant: str, rows: int, bulk: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.bench_cluster_memory", "--child", variant, str(rows),
               str(bulk)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 20_000])
    parser.add_argument("--old-max", type=int, default=10_000, help="old path up to this size")
    parser.add_argument(
        "--bulk",
        type=int,
        default=5_000,
        help="also: the partition with this many copies of one memory (0: not)",
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), int(args.child[2]))))
        return
    print(f"{'rows':>7} {'variant':>9} {'seconds':>8} {'RSS before MB':>14} {'peak RSS MB':>12} "
          f"{'traced MB':>10}  groups (digest)")  # fmt: skip
    for rows in args.rows:
        runs = [("new", 0), ("old", 0)] if rows <= args.old_max else [("new", 0)]
        if 0 < args.bulk < rows:
            runs.append(("new+bulk", args.bulk))
        for variant, bulk in runs:
            r = in_child(variant, rows, bulk)
            print(f"{rows:>7} {variant:>9} {r['seconds']:>8} {r['rss_before_mb']:>14} "
                  f"{r['peak_rss_mb']:>12} {r['traced_peak_mb']:>10}  {r['groups']} "
                  f"({r['digest']})")  # fmt: skip


if __name__ == "__main__":
    main()
