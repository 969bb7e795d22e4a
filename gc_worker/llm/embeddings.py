"""Pure embedding helpers for when no embeddings model is configured.

- ``centroid_embedding(vectors)``: the mean of the vectors scaled to unit length (a zero mean
  is returned as is); the caller flags such an embedding in the record's metadata.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def centroid_embedding(vectors: Sequence[Sequence[float]]) -> list[float]:
    """The normalised mean of equally long vectors."""
    if not vectors:
        raise ValueError("centroid_embedding needs at least one vector")
    if len({len(vector) for vector in vectors}) != 1:
        raise ValueError("centroid_embedding needs vectors of one dimension")
    mean = np.asarray(vectors, dtype=np.float64).mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return (mean / norm if norm > 0 else mean).tolist()
