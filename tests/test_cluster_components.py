"""compaction groups a partition one connected component of the threshold graph at a time: the
same groups as the whole partition at once, memory bounded by a block, old rows not starved."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from structlog.testing import capture_logs

import jobs.compaction as compaction
from jobs.similarity import BLOCK_CELLS, complete_linkage_groups, pairs_above, threshold_components
from tests.conftest import TEST_DIM
from tests.store import days_ago
from tests.test_compaction import groups_of, row

THRESHOLD = 0.85


def near_pair(axis: int, similarity: float = 0.99) -> tuple[list[float], list[float]]:
    """Two unit vectors of cosine `similarity`: e_axis, and it turned towards e_(axis+1)."""
    base, copy = [0.0] * TEST_DIM, [0.0] * TEST_DIM
    base[axis] = 1.0
    copy[axis] = similarity
    copy[(axis + 1) % TEST_DIM] = math.sqrt(1.0 - similarity * similarity)
    return base, copy


class TestAPartitionOfManySmallComponents:
    """A partition over MAX_CLUSTER_ROWS made of small sets of near-duplicates is grouped whole:
    capping the partition at its newest rows left a big user's old near-duplicates waiting
    forever (counted in skipped, night after night)."""

    def test_old_pairs_of_a_big_partition_are_grouped(self, monkeypatch):
        """Six rows in three distinct pairs, cap 4: all three pairs are groups, none skipped."""
        monkeypatch.setattr(compaction, "MAX_CLUSTER_ROWS", 4)
        rows = []
        for k, axis in enumerate((0, 3, 6)):
            base, copy = near_pair(axis)
            rows += [row(f"Likes tea {k}", base, created_at=days_ago(30 - 2 * k)),
                     row(f"Enjoys tea {k}", copy, created_at=days_ago(29 - 2 * k))]  # fmt: skip
        groups, skipped = groups_of(rows)
        assert skipped == 0
        assert sorted(sorted(r.content for r in g) for g in groups) == [
            [f"Enjoys tea {k}", f"Likes tea {k}"] for k in range(3)
        ]

    def test_a_giant_component_keeps_its_newest_rows_and_logs(self, monkeypatch):
        """Six mutually near rows and an old pair elsewhere, cap 4: the pair is grouped, the
        component's two oldest rows wait (skipped 2, logged), its four newest are grouped."""
        monkeypatch.setattr(compaction, "MAX_CLUSTER_ROWS", 4)
        base, copy = near_pair(4)
        pair = [row("Has a cat", base, created_at=days_ago(90)),
                row("Owns a cat", copy, created_at=days_ago(89))]  # fmt: skip
        near = [row(f"Likes tea, take {i}", near_pair(0, 0.99 - i * 1e-4)[1],
                    created_at=days_ago(10 - i)) for i in range(6)]  # fmt: skip
        with capture_logs() as logs:
            groups, skipped = groups_of(near + pair)
        grouped = {member.id for group in groups for member in group}
        assert skipped == 2
        assert {r.id for r in pair} <= grouped
        assert grouped - {r.id for r in pair} <= {r.id for r in near[2:]}
        capped = [e for e in logs if e["event"] == "compaction.partition_capped"]
        assert [(e["rows"], e["grouped"]) for e in capped] == [(6, 4)]

    @pytest.mark.parametrize("limit", [5, 6])
    def test_a_component_at_the_limit_is_grouped_whole(self, monkeypatch, limit):
        """A component of exactly MAX_CLUSTER_ROWS rows is not capped; one row more is."""
        monkeypatch.setattr(compaction, "MAX_CLUSTER_ROWS", limit)
        near = [row(f"Likes tea, take {i}", near_pair(0, 0.99 - i * 1e-4)[1],
                    created_at=days_ago(10 - i)) for i in range(6)]  # fmt: skip
        _, skipped = groups_of(near)
        assert skipped == 6 - limit


def by_components(ids, vectors, *, similarity=THRESHOLD, cap=8, block_cells=BLOCK_CELLS):
    """complete_linkage_groups run per threshold component, groups sorted as one run sorts."""
    found = []
    for component in threshold_components(vectors, similarity=similarity, block_cells=block_cells):
        members = [ids[i] for i in component]
        found += whole(members, np.asarray(vectors)[component], similarity=similarity, cap=cap)
    return sorted(found)


def whole(ids, vectors, *, similarity=THRESHOLD, cap=8):
    return complete_linkage_groups(ids, vectors, similarity=similarity, max_group_size=cap)


def noisy_copies(seed: int, dim: int, noise: float, n_centres: int = 12) -> np.ndarray:
    """1-6 noisy copies of random centres (noise per dimension, relative to a unit centre)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_centres, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rows = np.repeat(centres, rng.integers(1, 7, size=n_centres), axis=0)
    rows += rng.normal(scale=noise / math.sqrt(dim), size=rows.shape)
    return rows[rng.permutation(len(rows))]


def shuffled_ids(count: int, seed: int) -> list[str]:
    return [f"m{i:04d}" for i in np.random.default_rng(seed).permutation(count)]


class TestThresholdComponents:
    def test_a_pair_exactly_at_the_threshold_links(self):
        """A pair at exactly the threshold is one component; one 1e-6 below is none."""
        at = np.array([[1.0, 0.0], [THRESHOLD, math.sqrt(1 - THRESHOLD**2)]])
        below = np.array([[1.0, 0.0], [THRESHOLD - 1e-6, math.sqrt(1 - (THRESHOLD - 1e-6) ** 2)]])
        assert threshold_components(at, similarity=THRESHOLD) == [[0, 1]]
        assert threshold_components(below, similarity=THRESHOLD) == []

    def test_a_chain_is_one_component(self):
        """Rows linked only through their neighbours are one component (a group never is)."""
        angles = np.arange(6) * math.acos(0.9)
        vectors = np.column_stack([np.cos(angles), np.sin(angles)])
        assert threshold_components(vectors, similarity=THRESHOLD) == [list(range(6))]

    def test_invalid_rows_are_in_no_component(self):
        """NaN, infinite and zero rows never link, even next to exact duplicates."""
        vectors = np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, 0.0], [np.inf, 1.0], [1.0, 0.0]])
        assert threshold_components(vectors, similarity=THRESHOLD) == [[0, 4]]

    @pytest.mark.parametrize("block_cells", [1, 7, 64, BLOCK_CELLS])
    def test_the_block_size_does_not_change_the_components(self, block_cells):
        """Blocks of one row, of a few rows, and the whole matrix at once give one answer."""
        vectors = noisy_copies(seed=3, dim=16, noise=0.3)
        expected = threshold_components(vectors, similarity=THRESHOLD)
        assert threshold_components(vectors, similarity=THRESHOLD, block_cells=block_cells) == (
            expected
        )
        assert len(expected) > 3

    def test_memory_is_bounded_by_the_block_not_the_rows_squared(self):
        """6,000 rows (a full similarity matrix: 288 MB) in well under 64 MB."""
        vectors = noisy_copies(seed=4, dim=8, noise=0.2, n_centres=1700)[:6000]
        tracemalloc.start()
        try:
            components = threshold_components(vectors, similarity=0.999)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert components and peak < 64 * 2**20


class TestTheSameGroupsAsTheWholePartition:
    """Grouping per component gives exactly the groups of one run over the partition."""

    @pytest.mark.parametrize("seed", range(6))
    @pytest.mark.parametrize(("dim", "noise"), [(8, 0.3), (64, 0.45), (384, 0.4)])
    def test_random_near_duplicates(self, seed, dim, noise):
        """Noisy copies of random centres, shuffled ids, blocks of a few rows."""
        vectors = noisy_copies(seed, dim, noise)
        ids = shuffled_ids(len(vectors), seed)
        assert by_components(ids, vectors, block_cells=50) == whole(ids, vectors)

    @pytest.mark.parametrize("seed", range(4))
    def test_float4_stored_vectors(self, seed):
        """Vectors as pgvector stores them (float4), small groups capped at 3."""
        vectors = noisy_copies(seed, 256, 0.4).astype(np.float32)
        ids = shuffled_ids(len(vectors), seed)
        assert by_components(ids, vectors, cap=3) == whole(ids, vectors, cap=3)

    @pytest.mark.parametrize("seed", range(4))
    def test_exact_duplicates_beyond_the_group_size(self, seed):
        """Sets of identical vectors bigger than max_group_size are carved the same way (the
        carving broke ties by float noise of the one big matrix product: rounded away)."""
        rng = np.random.default_rng(seed)
        vectors = rng.normal(size=(5, 16))[rng.integers(0, 5, size=60)]
        ids = shuffled_ids(len(vectors), seed)
        for cap in (2, 3, 8):
            assert by_components(ids, vectors, cap=cap) == whole(ids, vectors, cap=cap)

    def test_pairs_exactly_at_the_threshold(self):
        """Chains whose steps are exactly the threshold, one per plane, beside unrelated rows."""
        angles = np.arange(5) * math.acos(THRESHOLD)
        planes = []
        for plane in range(3):
            block = np.zeros((5, 8))
            block[:, 2 * plane], block[:, 2 * plane + 1] = np.cos(angles), np.sin(angles)
            planes.append(block)
        vectors = np.vstack([*planes, np.eye(8)[6:]])
        ids = shuffled_ids(len(vectors), 1)
        assert by_components(ids, vectors, block_cells=3) == whole(ids, vectors)
        assert len(whole(ids, vectors)) >= 3


class TestFindGroupsMatchesOneRun:
    def test_a_partition_grouped_per_component_as_in_one_run(self):
        """find_groups returns the groups (and their order) of one run over the partition."""
        vectors = noisy_copies(seed=7, dim=TEST_DIM, noise=0.3)
        rows = [row(f"Likes tea {i}", v.tolist(), created_at=days_ago(i))
                for i, v in enumerate(vectors)]  # fmt: skip
        groups, skipped = groups_of(rows)
        expected = whole([r.id for r in rows], vectors)
        assert skipped == 0 and [[m.id for m in g] for g in groups] == expected


def pair_at(similarity: float) -> np.ndarray:
    return np.array([[1.0, 0.0], [similarity, math.sqrt(1.0 - similarity * similarity)]])


class TestTheToleranceIsNotWidenedByRounding:
    """A pair "reaches" the threshold at cosine >= threshold - 1e-9 (float noise of a pair built
    at the threshold); reading cosines to 12 decimals moves that edge by 5e-13 at most, so a
    pair a hundredth of the tolerance beyond it stays apart in groups and in pairs alike."""

    @pytest.mark.parametrize("threshold", [0.5, 0.75, 0.8, 0.85, 0.95])
    @pytest.mark.parametrize(("below", "joined"), [(0.0, True), (0.99e-9, True),
                                                   (1.01e-9, False), (2e-9, False)])  # fmt: skip
    def test_just_inside_and_just_outside_the_tolerance(self, threshold, below, joined):
        """threshold - 0.99e-9 is a group and a pair; threshold - 1.01e-9 is neither."""
        vectors = pair_at(threshold - below)
        groups = complete_linkage_groups(["a", "b"], vectors, similarity=threshold,
                                         max_group_size=8)  # fmt: skip
        assert bool(groups) is joined
        assert bool(pairs_above(["a", "b"], vectors, similarity=threshold)) is joined

    def test_find_groups_keeps_a_pair_beyond_the_tolerance_apart(self):
        """Through compaction's own path: 0.85 - 0.99e-9 merges, 0.85 - 1.01e-9 does not."""
        for below, joined in ((0.99e-9, True), (1.01e-9, False)):
            vectors = pair_at(THRESHOLD - below)
            padded = np.zeros((2, TEST_DIM))
            padded[:, :2] = vectors
            rows = [row(f"Likes tea {i}", padded[i].tolist()) for i in range(2)]
            groups, skipped = groups_of(rows)
            assert (len(groups) == 1) is joined and skipped == 0


class TestACappedComponentIsDeterministic:
    def test_the_same_groups_whatever_the_order_of_the_rows(self, monkeypatch):
        """A component over the cap keeps its newest rows and groups them the same way however
        the candidate rows arrive."""
        monkeypatch.setattr(compaction, "MAX_CLUSTER_ROWS", 5)
        vectors = np.repeat(np.eye(TEST_DIM)[:1], 9, axis=0)
        rows = [row(f"Likes tea {i}", v.tolist(), created_at=days_ago(i % 4))
                for i, v in enumerate(vectors)]  # fmt: skip
        results = []
        for seed in range(4):
            order = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
            groups, skipped = groups_of(order, max_group_size=2)
            results.append(([[m.id for m in g] for g in groups], skipped))
        assert all(result == results[0] for result in results) and results[0][1] == 4
