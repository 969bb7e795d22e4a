"""Pure similarity building blocks for the `compaction` and `contradiction` jobs.

No database, no clock, no LLM: every function here is a deterministic function of its arguments.
What a text *states* (numbers, dates, names, negations) and the checks built on it are in
jobs.text_facts.

Text
    normalise_text(text)             casefold + NFKC, whitespace collapsed, surrounding punctuation
                                     stripped; equal results = exact duplicates offline.
    content_hash(user_id, text)      sha256 hex of user_id + NUL + normalised text (tombstones).

Vectors
    invalid_vector_rows(vectors)     rows with a NaN/inf or zero norm; every function below skips
                                     them (they never join a group or a pair).
    cosine_matrix(vectors)           pairwise cosine similarity; invalid rows/columns are NaN.
    complete_linkage_groups(...)     groups (size >= 2, <= max_group_size) in which EVERY pair
                                     reaches `similarity` - no chaining.
    threshold_components(...)        connected components of the graph of pairs reaching
                                     `similarity`, built a block of rows at a time: every
                                     complete-linkage group lies inside one, so a big partition
                                     is grouped one component at a time in bounded memory.
    pairs_above(...)                 all pairs reaching `similarity`, most similar first.

A pair "reaches" a threshold when its cosine is >= similarity - SIMILARITY_TOLERANCE (1e-9), so a
pair constructed at exactly the threshold counts as within despite floating-point rounding.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np

Id = TypeVar("Id", bound=Hashable)

SIMILARITY_TOLERANCE = 1e-9
SIMILARITY_DECIMALS = 12  # grouping reads cosines to 1e-12: below that, rounding noise
# Cells of the similarity matrix held at once by threshold_components (rows of a block x the
# rows after it): 4M float64 = 32 MB, whatever the partition's size.
BLOCK_CELLS = 1 << 22
# How far below the threshold a pair still links two components: a block product may round a
# cosine differently from a component's own matrix (~1e-15). A link too many only makes a
# component bigger; one too few could split a group.
EDGE_MARGIN = 1e-9

# ---------------------------------------------------------------------------------------------
# Text normalisation and hashing
# ---------------------------------------------------------------------------------------------


def _is_edge_junk(char: str) -> bool:
    return char.isspace() or unicodedata.category(char).startswith("P")


def normalise_text(text: str) -> str:
    """Casefold, NFKC, collapse whitespace and strip surrounding punctuation."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    collapsed = " ".join(folded.split())
    start, end = 0, len(collapsed)
    while start < end and _is_edge_junk(collapsed[start]):
        start += 1
    while end > start and _is_edge_junk(collapsed[end - 1]):
        end -= 1
    return collapsed[start:end]


def content_hash(user_id: str, text: str) -> str:
    """Return the sha256 hex digest of ``user_id + NUL + normalise_text(text)``."""
    payload = f"{user_id}\0{normalise_text(text)}".encode()
    return hashlib.sha256(payload).hexdigest()


# ---------------------------------------------------------------------------------------------
# Vectors
# ---------------------------------------------------------------------------------------------


def _as_matrix(vectors: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    matrix = np.asarray(vectors, dtype=np.float64)
    if matrix.ndim == 1 and matrix.size == 0:
        matrix = matrix.reshape(0, 0)
    if matrix.ndim != 2:
        raise ValueError(f"vectors must be a 2-D array (n, dim), got shape {matrix.shape}")
    return matrix


def _valid_mask(matrix: np.ndarray) -> np.ndarray:
    finite = np.isfinite(matrix).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        norms = np.linalg.norm(np.where(finite[:, None], matrix, 0.0), axis=1)
    return finite & np.isfinite(norms) & (norms > 0.0)


def invalid_vector_rows(vectors: np.ndarray | Sequence[Sequence[float]]) -> list[int]:
    """Row positions holding a NaN/inf or a zero norm; callers skip (and report) them."""
    return np.flatnonzero(~_valid_mask(_as_matrix(vectors))).tolist()


def cosine_matrix(vectors: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """Pairwise cosine similarity (n, n), symmetric, clipped to [-1, 1]; invalid rows are NaN."""
    matrix = _as_matrix(vectors)
    valid = _valid_mask(matrix)
    safe = np.where(valid[:, None], matrix, 0.0)
    norms = np.linalg.norm(safe, axis=1)
    unit = safe / np.where(valid, norms, 1.0)[:, None]
    sims = unit @ unit.T
    sims = np.clip((sims + sims.T) / 2.0, -1.0, 1.0)
    sims[~valid, :] = np.nan
    sims[:, ~valid] = np.nan
    return sims


def _check_similarity(similarity: float) -> None:
    if not -1.0 <= similarity <= 1.0:
        raise ValueError(f"similarity must be within [-1, 1], got {similarity}")


def _sorted_valid(
    ids: Sequence[Id], vectors: np.ndarray | Sequence[Sequence[float]]
) -> tuple[list[Id], np.ndarray]:
    """Valid rows only, ordered by id, so results never depend on input order."""
    matrix = _as_matrix(vectors)
    if len(ids) != matrix.shape[0]:
        raise ValueError(f"{len(ids)} ids for {matrix.shape[0]} vectors")
    if len(set(ids)) != len(ids):
        raise ValueError("ids must be unique")
    valid = _valid_mask(matrix)
    order = sorted((i for i in range(len(ids)) if valid[i]), key=lambda i: ids[i])
    return [ids[i] for i in order], matrix[order]


def pairs_above(
    ids: Sequence[Id], vectors: np.ndarray | Sequence[Sequence[float]], *, similarity: float
) -> list[tuple[Id, Id, float]]:
    """All pairs (id_a < id_b) reaching `similarity`, most similar first, then by ids."""
    _check_similarity(similarity)
    sorted_ids, matrix = _sorted_valid(ids, vectors)
    sims = cosine_matrix(matrix)
    rows, cols = np.triu_indices(len(sorted_ids), k=1)
    keep = sims[rows, cols] >= similarity - SIMILARITY_TOLERANCE
    pairs = [
        (sorted_ids[i], sorted_ids[j], float(sims[i, j]))
        for i, j in zip(rows[keep].tolist(), cols[keep].tolist(), strict=True)
    ]
    return sorted(pairs, key=lambda pair: (-pair[2], pair[0], pair[1]))


def _cluster_labels(sims: np.ndarray, similarity: float) -> np.ndarray:
    """Complete-linkage labels; sklearn merges only below the threshold, hence the tolerance."""
    from sklearn.cluster import AgglomerativeClustering  # ~2 s to import: only when clustering

    distances = np.clip(1.0 - sims, 0.0, 2.0)
    np.fill_diagonal(distances, 0.0)
    model = AgglomerativeClustering(
        n_clusters=None,
        metric="precomputed",
        linkage="complete",
        distance_threshold=1.0 - similarity + SIMILARITY_TOLERANCE,
    )
    return model.fit_predict(distances)


def _grow_group(
    alive: np.ndarray, totals: np.ndarray, sims: np.ndarray, within: np.ndarray, cap: int
) -> list[int]:
    """Greedy clique: seed with the highest mean similarity to the other live members, add the
    most similar compatible member. Vector operations only: O(cap * n) per group."""
    seed = int(np.argmax(np.where(alive, totals, -np.inf)))
    group, score = [seed], sims[seed].copy()
    compatible = alive & within[seed]
    compatible[seed] = False
    while len(group) < cap and compatible.any():
        best = int(np.argmax(np.where(compatible, score, -np.inf)))
        group.append(best)
        score += sims[best]
        compatible &= within[best]
        compatible[best] = False
    return sorted(group)


def _carve(members: list[int], sims: np.ndarray, within: np.ndarray, cap: int) -> list[list[int]]:
    """Split a cluster into all-pairs-within groups of at most `cap` members. Each member's sum
    of similarities to the live members is kept up to date as groups leave, so a cluster of n is
    carved in O(n^2), not O(n^3) (re-reading the whole block for every group)."""
    block = within[np.ix_(members, members)]
    if len(members) <= cap and block.all():
        return [members]
    local = sims[np.ix_(members, members)]
    alive = np.ones(len(members), dtype=bool)
    totals = local.sum(axis=1) - np.diag(local)
    groups = []
    while alive.sum() >= 2:
        group = _grow_group(alive, totals, local, block, cap)
        if len(group) >= 2:
            groups.append([members[i] for i in group])
        alive[group] = False
        totals -= local[:, group].sum(axis=1)
    return groups


def complete_linkage_groups(
    ids: Sequence[Id],
    vectors: np.ndarray | Sequence[Sequence[float]],
    *,
    similarity: float,
    max_group_size: int,
) -> list[list[Id]]:
    """Groups of 2..max_group_size ids in which every pair reaches `similarity`.

    Invalid vectors are skipped. Members are sorted; groups are sorted by their smallest id.
    """
    _check_similarity(similarity)
    if max_group_size < 2:
        raise ValueError(f"max_group_size must be at least 2, got {max_group_size}")
    sorted_ids, matrix = _sorted_valid(ids, vectors)
    if len(sorted_ids) < 2:
        return []
    # rounded: ties (identical vectors) are broken by row order, not by how one matrix product
    # happened to round, so a component grouped alone gets the groups of the whole partition
    sims = np.round(cosine_matrix(matrix), SIMILARITY_DECIMALS)
    within = sims >= similarity - SIMILARITY_TOLERANCE
    labels = _cluster_labels(sims, similarity)
    clusters: dict[int, list[int]] = {}
    for index, label in enumerate(labels.tolist()):
        clusters.setdefault(label, []).append(index)
    groups = [
        group
        for members in clusters.values()
        if len(members) >= 2
        for group in _carve(members, sims, within, max_group_size)
    ]
    return [[sorted_ids[i] for i in group] for group in sorted(groups)]


def threshold_components(
    vectors: np.ndarray | Sequence[Sequence[float]],
    *,
    similarity: float,
    block_cells: int = BLOCK_CELLS,
) -> list[list[int]]:
    """Row positions of each connected component (2 rows or more) of the graph linking two rows
    whose cosine reaches `similarity`; invalid rows are in none. Every pair of a
    complete-linkage group reaches it, so each group lies inside one component. The matrix is
    built a block of rows at a time and only links are kept: memory O(block_cells + n * dim),
    not n^2. Positions ascend within a component; components are ordered by their first."""
    _check_similarity(similarity)
    matrix = _as_matrix(vectors)
    positions = np.flatnonzero(_valid_mask(matrix))
    unit = matrix[positions]  # the one copy of the rows: unit vectors, as cosine_matrix's
    unit /= np.linalg.norm(unit, axis=1)[:, None]
    del matrix
    count = len(positions)
    roots = np.arange(count)
    step = max(1, block_cells // max(count, 1))
    reach = similarity - SIMILARITY_TOLERANCE - EDGE_MARGIN
    for start in range(0, count, step):
        block = unit[start : start + step] @ unit[start:].T
        rows, cols = np.nonzero(block >= reach)
        del block
        roots = _linked(roots, rows + start, cols + start)
    members: dict[int, list[int]] = defaultdict(list)
    for position, root in zip(positions.tolist(), roots.tolist(), strict=True):
        members[root].append(position)
    return [found for found in members.values() if len(found) >= 2]


def _linked(roots: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Each row's component root (its smallest row) once the links rows[k]-cols[k] are added."""
    new = roots[rows] != roots[cols]
    if not new.any():
        return roots
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    count = len(roots)
    starts = np.concatenate([rows[new], np.arange(count)])
    ends = np.concatenate([cols[new], roots])
    graph = coo_matrix((np.ones(len(starts), dtype=np.int8), (starts, ends)), shape=(count, count))
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1, count)
    np.minimum.at(smallest, labels, np.arange(count))
    return smallest[labels]
