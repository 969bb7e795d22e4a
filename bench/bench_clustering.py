"""Clustering time for one user: 500 memories x 1536 dimensions, median of 5 runs.

Synthetic store: 60 clusters of noisy copies around random centres (pairwise cosine ~0.92, above
the default compaction threshold 0.85) plus singletons. Prints timings and group counts only; no
assertions on time.

    python bench/bench_clustering.py
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

from jobs.similarity import complete_linkage_groups, pairs_above

N_MEMORIES = 500
DIM = 1536
N_CLUSTERS = 60
N_CLUSTERED = 380  # the remaining 120 memories are singletons
NOISE = 0.0075  # per-dimension sigma: DIM * NOISE**2 ~ 0.086, so copies sit at cosine ~0.92
RUNS = 5
COMPACTION_SIMILARITY = 0.85
CONTRADICTION_SIMILARITY = 0.75
MAX_GROUP_SIZE = 8


def synthetic_user(seed: int = 42) -> tuple[list[str], np.ndarray]:
    """Ids and embeddings for one user: clusters of noisy copies plus singletons, shuffled."""
    rng = np.random.default_rng(seed)
    sizes = 2 + rng.multinomial(N_CLUSTERED - 2 * N_CLUSTERS, [1 / N_CLUSTERS] * N_CLUSTERS)
    centres = rng.normal(size=(N_CLUSTERS, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    copies = np.repeat(centres, sizes, axis=0)
    copies += rng.normal(scale=NOISE, size=copies.shape)
    singletons = rng.normal(size=(N_MEMORIES - N_CLUSTERED, DIM))
    vectors = np.vstack([copies, singletons])[rng.permutation(N_MEMORIES)]
    return [f"mem-{i:04d}" for i in range(N_MEMORIES)], vectors.astype(np.float32)


def median_seconds(work: Callable[[], object]) -> float:
    """Median wall time of RUNS calls."""
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ids, vectors = synthetic_user()
    groups = complete_linkage_groups(
        ids, vectors, similarity=COMPACTION_SIMILARITY, max_group_size=MAX_GROUP_SIZE
    )
    pairs = pairs_above(ids, vectors, similarity=CONTRADICTION_SIMILARITY)
    cluster_time = median_seconds(
        lambda: complete_linkage_groups(
            ids, vectors, similarity=COMPACTION_SIMILARITY, max_group_size=MAX_GROUP_SIZE
        )
    )
    pairs_time = median_seconds(
        lambda: pairs_above(ids, vectors, similarity=CONTRADICTION_SIMILARITY)
    )
    sizes = Counter(len(group) for group in groups)
    print(f"memories: {N_MEMORIES} x {DIM} dims, planted clusters: {N_CLUSTERS}")
    print(
        f"complete_linkage_groups (similarity {COMPACTION_SIMILARITY}, max {MAX_GROUP_SIZE}): "
        f"median {cluster_time * 1000:.1f} ms over {RUNS} runs"
    )
    print(f"  groups: {len(groups)}, sizes: {dict(sorted(sizes.items()))}")
    print(
        f"pairs_above (similarity {CONTRADICTION_SIMILARITY}): "
        f"median {pairs_time * 1000:.1f} ms over {RUNS} runs, pairs: {len(pairs)}"
    )


if __name__ == "__main__":
    main()
