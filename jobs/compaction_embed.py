"""The embedding of a merged record compaction writes (a model's text needs one).

``embed_merges(ctx, gate, merges)``: every merge without an embedding gets one — cached (keyed
by model, size and text), from one embeddings call for the batch, or, if that fails or no
embeddings model is configured, the normalised centroid of its members
(``merge.embedding_source``: model / centroid).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from gc_worker.batch import BatchContext
from gc_worker.llm import decision_key
from gc_worker.queries import q
from jobs.compaction_records import centroid_of
from jobs.llm_support import Deferral, ModelGate

EMBED_KIND = "embedding"
EMBED_VERSION = "embed.v1"


def embed_merges(ctx: BatchContext, gate: ModelGate, merges: Sequence[Any]) -> None:
    """Give every LLM merge an embedding: cached, one embeddings call, or the centroid."""
    need = [m for m in merges if m.embedding is None]
    if not need:
        return
    keys = {}
    dim = ctx.settings.embeddings.dim
    if not gate.offline:
        # keyed by the size too: a vector cached before `[embeddings] dim` changed is not one
        # the store can hold (and a stale entry is never trusted: _usable_cached)
        model, version = gate.llm.options.embedding_model, f"{EMBED_VERSION}:{dim}"
        keys = {id(m): decision_key(EMBED_KIND, model, version, m.user_id, m.content) for m in need}
        for merge in need:
            cached = ctx.conn.execute(q("llm_cache_get"), {"key": keys[id(merge)]}).scalar()
            vector = _usable_cached(cached, dim)
            if vector is not None:
                merge.embedding = vector
                gate.llm.budget.count("cache_hits")
    missing = [m for m in need if m.embedding is None]
    # `[embeddings] model = ""`: no embeddings model is configured, the centroid is the answer
    modelled = not gate.offline and bool(gate.llm.options.embedding_model)
    vectors = _embed(gate, missing) if missing and modelled else None
    for index, merge in enumerate(missing):
        if vectors is None:
            merge.embedding = centroid_of([m.embedding for m in merge.members])
            merge.embedding_source = "centroid"
            continue
        merge.embedding = vectors[index]
        _cache_embedding(ctx, keys[id(merge)], merge)


def _usable_cached(value: Any, dim: int) -> list[float] | None:
    """A cached embedding the store can hold (``dim`` finite numbers, not all zero), or None."""
    vector = value.get("embedding") if isinstance(value, dict) else None
    if not isinstance(vector, list) or len(vector) != dim:
        return None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in vector):
        return None
    array = np.asarray(vector, dtype=np.float64)
    usable = np.isfinite(array).all() and np.any(array) and np.abs(array).max() < 3.4e38
    return [float(x) for x in vector] if usable else None


def _embed(gate: ModelGate, merges: Sequence[Any]) -> list[list[float]] | None:
    answer = gate.ask(
        lambda llm: llm.embed([m.content for m in merges]),
        user_id=merges[0].user_id,
        size=len(merges),
    )
    return None if answer is None or isinstance(answer, Deferral) else answer


def _cache_embedding(ctx: BatchContext, key: str, merge: Any) -> None:
    params = {
        "key": key,
        "kind": EMBED_KIND,
        "user_id": merge.user_id,
        "memory_ids": [str(m.id) for m in merge.members],
        "value": json.dumps({"embedding": merge.embedding}),
    }
    ctx.conn.execute(q("llm_cache_put"), params)
