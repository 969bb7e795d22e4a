"""compaction: per user, groups of near-duplicate memories → one merged record.

Options (``[compaction]``):
    enabled = true        run the job at all
    similarity = 0.85     cosine similarity every pair of a group must reach (no chaining)
    max_group_size = 8    bigger clusters are split: no snowball merges
    max_merge_depth = 1   a merged record is merged again only while its depth is below this
                          (records the application wrote have depth 0; 0 and 1 both mean a
                          merged record is never merged again), and then only with rows that
                          reach `similarity` with every row it stands for, not only with it
                          (``compaction_records.cohesive``: no chain across nights)

Candidates: active, unpinned rows with an embedding, no ``valid_until`` (bounded facts and
overrides are the contradiction job's), no declared ``supersedes`` and not the target of one,
not in an open review (nor in one queued earlier in this batch), not retired earlier in this
batch; two rows of a set a person kept apart (a model merge `restore` undid: a dismissed
compaction review; a merged record of it with the rows it stands for) are never in one group
(``kept_apart``). Rows whose embedding is unusable
(wrong size, zero, non-finite) are counted in ``skipped``. Groups never span two users, two
slots, two scopes, two memory types, two trust levels, or — for episodic memories, which are
events — two minutes of ``observed_at`` (jobs.similarity.complete_linkage_groups).

Per group:
- members that differ in a fact that matters (``jobs.text_facts.near_miss_reasons``: number,
  date, negation, direction, antonym) never merge, online or offline: taken earliest first, a
  member differing so from one already kept stays out (``fact_consistent``); with fewer than
  two left no model is asked and the group is one ``deferred`` action (reason ``near_miss``,
  the reasons per pair) — such pairs are the contradiction job's to judge;
- exact duplicates (same normalised text) merge deterministically, online or offline: the
  earliest member's text, its embedding copied (reason ``exact_duplicates``);
- otherwise the LLM is asked once (cached on the exact inputs): one merged statement for the
  whole group (reason ``near_duplicates``), or "not a duplicate set" → only the group's exact
  duplicates merge (as they do when the answer is rejected). The merged text
  must state the members' numbers, dates, names (inside a sentence) and negations, and no
  others (``unsupported_facts``): one that adds or drops one is a rejected answer, like a malformed
  one — its text is not used, ``errors`` + 1. Over budget or with the LLM down → one ``deferred``
  action (reason ``llm_unavailable`` / ``llm_budget``, details.memory_ids); offline (no model
  configured, none will ever be asked) the group's exact duplicates merge and the rest, two or
  more, is deferred (``offline_outcomes``).

Merged texts are embedded in one embeddings call per batch (cached by text, so a re-run makes no
call); if that fails the record gets the normalised centroid of its members
(``metadata.embedding_source``; jobs.compaction_embed). The merged record is described in
jobs.compaction_records.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import numpy as np
import structlog

from gc_worker.actions import Action
from gc_worker.batch import BatchContext
from gc_worker.config import Settings
from gc_worker.queries import q
from gc_worker.vector_loader import ARRAYS
from jobs.compaction_embed import EMBED_KIND, EMBED_VERSION, embed_merges
from jobs.compaction_records import (
    NAME,
    cohesive,
    earliest,
    merge_actions,
    merge_depth,
    mergeable,
    merged_record,
)
from jobs.llm_support import (
    LLM_UNAVAILABLE,
    Deferral,
    ModelGate,
    deferred,
    first_preview,
    rows_by_user,
    with_embeddings,
)
from jobs.similarity import complete_linkage_groups, normalise_text, threshold_components
from jobs.text_facts import near_miss_reasons, unsupported_reason

log = structlog.get_logger("memory_gc")

__all__ = ["EMBED_KIND", "EMBED_VERSION", "NAME", "exact_duplicates", "find_groups", "plan"]

EXACT = "exact_duplicates"
NEAR = "near_duplicates"
NEAR_MISS = "near_miss"
# near-miss reasons that state a different fact; a differing name is often a rephrased first
# word ("Likes" / "Enjoys"), so the model is asked and its merged text checked for names
FACT_REASONS = frozenset({"number", "date", "negation", "direction", "antonym"})


@dataclass
class Merge:
    """A group the plan will merge, waiting for its embedding."""

    user_id: str
    members: list[Any]
    content: str
    reason: str
    similarity: float
    embedding: list[float] | None = None
    embedding_source: str = "model"


# Rows of one connected component of a partition's threshold graph (rows linked by pairs reaching
# `similarity`) grouped in one run, the newest: complete linkage needs its similarity matrices,
# which grow with its rows squared (5,000 rows: 1.2 GB; 20,000 would need 15 GB). Only a set of
# thousands of mutually near rows (a bulk import, a looping writer) is that big; its older rows
# wait, counted in `skipped`. A partition of many small components is grouped whole.
MAX_CLUSTER_ROWS = 3_000


def find_groups(
    rows: Sequence[Any], *, similarity: float, max_group_size: int, max_merge_depth: int, dim: int,
    ancestors: Mapping[Any, Sequence[Sequence[float]]] | None = None,
) -> tuple[list[list[Any]], int]:  # fmt: skip
    """One user's candidate groups (per slot, scope and memory type: rows of two scopes are read
    apart, so one merged record cannot stand for both) and how many rows had an unusable
    embedding or wait in a capped component."""
    eligible = [row for row in rows if mergeable(row, max_merge_depth)]
    kept, vectors, skipped = with_embeddings(eligible, dim)
    by_slot: dict[tuple[str, str, str, str, int], list[int]] = defaultdict(list)
    for index, row in enumerate(kept):
        # an episodic memory is an event: the same text at another time is another event
        when = row.observed_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
        event = when if row.memory_type == "episodic" else ""
        # rows of one trust level only: a merge neither raises a claim nor lowers a statement;
        # of one memory type: a procedural rule merged with a fact would become a fact
        key = (_key(row.slot), _key(row.scope), row.memory_type or "", event, row.trust)
        by_slot[key].append(index)
    groups = []
    for slot in sorted(by_slot):
        found, waiting = _partition_groups(kept, vectors, by_slot[slot], similarity, max_group_size)
        groups += found
        skipped += waiting
    if ancestors:  # a merged record is in a group only with rows like all it stands for
        footprints = _footprints(kept, vectors, ancestors, dim)
        groups = [cohesive(group, footprints, similarity) for group in groups]
    return [group for group in groups if len(group) >= 2], skipped


def _partition_groups(
    kept: Sequence[Any], vectors: np.ndarray, indexes: list[int], similarity: float, cap: int
) -> tuple[list[list[Any]], int]:
    """One partition's groups, complete linkage run per connected component of its threshold
    graph (the same groups as over the whole partition; memory bounded by the biggest
    component, itself capped at its newest MAX_CLUSTER_ROWS), and how many rows wait."""
    matrix = vectors if len(indexes) == len(kept) else vectors[indexes]
    found, waiting = [], 0
    for component in threshold_components(matrix, similarity=similarity):
        members = [indexes[i] for i in component]
        if len(members) > MAX_CLUSTER_ROWS:  # the newest only: memory grows with rows squared
            members.sort(key=lambda i: (kept[i].created_at, str(kept[i].id)))
            waiting += len(members) - MAX_CLUSTER_ROWS
            log.warning("compaction.partition_capped", user_id=kept[members[0]].user_id,
                        rows=len(members), grouped=MAX_CLUSTER_ROWS)  # fmt: skip
            members = members[-MAX_CLUSTER_ROWS:]
        found += complete_linkage_groups(
            [kept[i].id for i in members],
            vectors[members],
            similarity=similarity,
            max_group_size=cap,
        )
    by_id = {kept[i].id: kept[i] for i in indexes}
    return [[by_id[memory_id] for memory_id in group] for group in sorted(found)], waiting


def _footprints(
    kept: Sequence[Any], vectors: np.ndarray, ancestors: Mapping[Any, Any], dim: int
) -> dict[Any, np.ndarray]:
    """Per row, the unit vectors of the row and of every usable row it stands for."""
    footprints = {}
    for row, vector in zip(kept, vectors, strict=True):
        found = [vector] + [v for v in ancestors.get(row.id, ()) if _usable(v, dim)]
        matrix = np.asarray(found, dtype=np.float64)
        footprints[row.id] = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    return footprints


def _usable(vector: Sequence[float], dim: int) -> bool:
    array = np.asarray(vector, dtype=np.float64)
    return len(array) == dim and bool(np.isfinite(array).all() and np.any(array))


def ancestor_embeddings(ctx: BatchContext, rows: Sequence[Any], max_merge_depth: int) -> dict:
    """Per merged record that may be merged again, the embeddings of the rows it stands for."""
    ids = [r.id for r in rows if merge_depth(r) > 0 and mergeable(r, max_merge_depth)]
    if not ids:
        return {}
    found: dict[Any, list[Any]] = defaultdict(list)
    read = q("compaction_ancestor_embeddings").execution_options(**ARRAYS)
    for row in ctx.conn.execute(read, {"ids": ids}):
        found[row.memory_id].append(row.embedding)
    return found


def _key(value: str | None) -> str:
    return "" if value is None else "=" + value


def near_misses(members: Sequence[Any]) -> list[dict[str, Any]]:
    """Member pairs that differ in a fact that matters, with the reason codes."""
    found = []
    for a, b in itertools.combinations(members, 2):
        reasons = near_miss_reasons(a.content, b.content)
        if reasons:
            found.append({"memory_ids": [str(a.id), str(b.id)], "reasons": reasons})
    return found


def exact_duplicates(members: Sequence[Any]) -> bool:
    """Same normalised text and no near-miss reason between any two members."""
    texts = {normalise_text(m.content) for m in members}
    return len(texts) == 1 and not near_misses(members)


def min_similarity(members: Sequence[Any]) -> float:
    vectors = np.asarray([m.embedding for m in members], dtype=np.float64)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return round(float((unit @ unit.T).min()), 4)


def plan_group(user_id: str, members: list[Any], gate: ModelGate) -> list[Merge | Action]:
    """The merges and deferrals for one candidate group (none: the model found no duplicates)."""
    score = min_similarity(members)
    consistent = fact_consistent(members)
    if len(consistent) < 2:
        # the members differ in a fact (a number, date, negation…): not a duplicate set,
        # whatever a model would say — such pairs are the contradiction job's to judge
        ids, preview = [m.id for m in members], first_preview(members)
        return [deferred(NAME, user_id, ids, NEAR_MISS, preview=preview, similarity=score,
                         near_misses=near_misses(members))]  # fmt: skip
    # members that differ in a fact from an earlier one stay out; the rest may still merge
    members = consistent
    if exact_duplicates(members):
        return [exact_merge(user_id, members)]
    if gate.offline:
        return offline_outcomes(user_id, members)
    score = min_similarity(members)
    ids, preview = [m.id for m in members], first_preview(members)
    answer = gate.ask(
        lambda llm: llm.merge_group(
            user_id,
            [(m.id, m.content) for m in members],
            vet=lambda decision: unsupported_merge(decision, members),
        ),
        user_id=user_id,
        size=len(members),
    )
    if isinstance(answer, Deferral):
        return [deferred(NAME, user_id, ids, answer.reason, preview=preview, similarity=score)]
    if answer is None or not answer.is_duplicate_set:
        # the group is not one fact (or the answer was rejected): its exact duplicates still are
        return list(exact_sets(user_id, members)[0])
    return [Merge(user_id, members, answer.merged_text, NEAR, score)]


def exact_merge(user_id: str, members: Sequence[Any]) -> Merge:
    """Exact duplicates: the earliest member's text, its embedding copied."""
    keep = earliest(members)
    score = min_similarity(members)
    copied = np.asarray(keep.embedding, dtype=np.float64).tolist()
    return Merge(user_id, list(members), keep.content, EXACT, score, copied, "copied")


def exact_sets(user_id: str, members: Sequence[Any]) -> tuple[list[Merge], list[Any]]:
    """A merge per set of members with one normalised text (an exact rule needs no model), and
    the members in none."""
    same: dict[str, list[Any]] = defaultdict(list)
    for member in members:
        same[normalise_text(member.content)].append(member)
    merges = [exact_merge(user_id, rows) for rows in same.values() if len(rows) >= 2]
    return merges, [m for m in members if len(same[normalise_text(m.content)]) < 2]


def offline_outcomes(user_id: str, members: Sequence[Any]) -> list[Merge | Action]:
    """With no model configured none will ever be asked: the exact duplicates among the members
    merge, the others, two or more, are one deferred group."""
    merges, rest = exact_sets(user_id, members)
    if len(rest) < 2:
        return list(merges)
    ids, score = [m.id for m in rest], min_similarity(rest)
    waiting = deferred(NAME, user_id, ids, LLM_UNAVAILABLE, preview=first_preview(rest),
                       similarity=score)  # fmt: skip
    return [*merges, waiting]


def fact_consistent(members: Sequence[Any]) -> list[Any]:
    """The members, earliest first, that differ in no fact (number, date, negation, direction,
    antonym) from any earlier one kept: one outlier does not keep a group of paraphrases
    from merging, night after night."""
    kept: list[Any] = []
    for member in sorted(members, key=lambda m: (m.created_at, str(m.id))):
        if not any(FACT_REASONS.intersection(near_miss_reasons(k.content, member.content))
                   for k in kept):  # fmt: skip
            kept.append(member)
    return kept


def unsupported_merge(answer: Any, members: Sequence[Any]) -> str | None:
    """Why a model's merged text cannot stand for its members (None: it can): it adds or drops
    a number, date, name or negation that the members state (``unsupported_facts``)."""
    if not answer.is_duplicate_set:
        return None
    return unsupported_reason(answer.merged_text, [m.content for m in members], "merged text")


def _actions(ctx: BatchContext, outcome: Merge | Action) -> list[Action]:
    if isinstance(outcome, Action):
        return [outcome]
    record = merged_record(
        outcome.members,
        content=outcome.content,
        embedding=outcome.embedding or [],
        embedding_source=outcome.embedding_source,
        importance=ctx.scored,
        assessed_at=ctx.now,
        model_written=outcome.reason == NEAR,
    )
    return merge_actions(
        outcome.user_id,
        outcome.members,
        record,
        reason=outcome.reason,
        similarity=outcome.similarity,
    )


def dismissed_sets(ctx: BatchContext) -> dict[str, dict[Any, set[int]]]:
    """Per user, the memory sets a person kept apart (model merges a `restore` undid), as the
    numbers of the sets each memory is in."""
    sets: dict[str, dict[Any, set[int]]] = defaultdict(lambda: defaultdict(set))
    for number, row in enumerate(ctx.conn.execute(q("compaction_dismissed_sets"), ctx.params())):
        for memory_id in row.memory_ids:
            sets[row.user_id][memory_id].add(number)
    return sets


def kept_apart(members: Sequence[Any], sets_of: Mapping[Any, set[int]]) -> list[Any]:
    """The group without the members that share a set a person kept apart with one taken
    before them (in the group's order): those rows are never merged together again."""
    kept: list[Any] = []
    taken: set[int] = set()
    for member in members:
        mine = sets_of.get(member.id, set())
        if not mine & taken:
            kept.append(member)
            taken |= mine
    return kept


def plan(ctx: BatchContext) -> list[Action]:
    settings = ctx.settings.compaction
    gate = ModelGate(ctx, NAME)
    dismissed = dismissed_sets(ctx)
    outcomes: list[Merge | Action] = []
    for user_id, rows in rows_by_user(ctx, "compaction_candidates", held=list(ctx.held)):
        groups, skipped = find_groups(
            rows,
            similarity=settings.similarity,
            max_group_size=settings.max_group_size,
            max_merge_depth=settings.max_merge_depth,
            dim=ctx.settings.embeddings.dim,
            ancestors=ancestor_embeddings(ctx, rows, settings.max_merge_depth),
        )
        ctx.job_stats(NAME).skipped += skipped
        for group in groups:
            members = kept_apart(group, dismissed.get(user_id, {}))
            if len(members) < 2:
                continue
            outcomes += plan_group(user_id, members, gate)
    embed_merges(ctx, gate, [o for o in outcomes if isinstance(o, Merge)])
    return [action for outcome in outcomes for action in _actions(ctx, outcome)]


def asks_model(settings: Settings) -> bool:
    """gc_worker.engine: planning may call the model, so it is done before the batch
    transaction."""
    return True
