"""How user_cap's summarize mode splits one over-cap user's least valuable rows (jobs.user_cap
plans with it): ``eviction_key`` ranks them, ``fold_blocker`` says why a row may not be folded,
``split_overflow`` cuts the taken rows into chunks (one summary each), plain evictions and rows
left waiting for a later run (docs/importance-and-caps.md, "Far over the cap").

``k`` summaries take the ``excess + k`` least valuable rows (each summary is one more active
row). The fewest chunks (each of 2 .. ``max_summary_rows`` rows, sizes differing by at most
one) that bring the user to the cap are made, at most ``max_summaries_per_user``; when that
is not enough, that many full chunks of the most valuable taken rows are made and the least
valuable rows wait (or, with the fallback, are evicted plainly). Chunks are listed most
valuable first, so the run folds them in that order: whatever a spent budget or an outage
leaves waiting ranks before every summary made in that round (jobs.user_cap_fold; a later round,
split again around rows the model could not fold, takes only rows ranked after the first's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gc_worker.config_sections import UserCapSettings
from jobs.user_cap_records import Overflow, summary_depth

DEFAULTS = UserCapSettings()  # max_summary_rows, max_summaries_per_user: one place
WAITING = "summary_rows"  # a row the run's chunks could not take


def eviction_key(row: Any, importance: Mapping) -> tuple:
    """Effective importance, least recently used, oldest, id; a row ranked by
    user_cap_candidates keeps PostgreSQL's rank, which tells apart instants Python loads as one
    (-infinity, BC: gc_worker.db.ExtremeTimestamptzLoader)."""
    rank = getattr(row, "rank", None)
    if rank is not None:
        return (rank,)
    return (
        importance.get(row.id, row.importance),
        row.last_accessed_at or row.created_at,
        row.created_at,
        str(row.id),
    )


def fold_blocker(row: Any, max_depth: int) -> str | None:
    """Why a taken row is evicted plainly instead of folded, or None: at the depth limit, or a
    row an open-ended summary without slot or declaration cannot carry as the read path shows
    it (sql/user_cap.sql user_cap_candidates: ``unfoldable``)."""
    if summary_depth(row) >= max_depth:
        return "summary_depth"
    return getattr(row, "unfoldable", None)


def chunk_count(
    foldable: Sequence[bool], excess: int, max_rows: int, max_chunks: int
) -> tuple[int, bool]:
    """(how many summaries, whether they bring the user to the cap); 0: none is possible.
    ``foldable``: per ranked row, least valuable first, whether it may be folded."""
    count, enough = 0, False
    for k in range(1, max_chunks + 1):
        if len(foldable) < excess + k:
            break
        folds = sum(foldable[: excess + k])
        if folds < 2 * k:
            break
        count, enough = k, folds <= k * max_rows
        if enough:
            break
    return count, enough


def cut(rows: Sequence[Any], count: int) -> tuple[tuple[Any, ...], ...]:
    """``rows`` (least valuable first) in ``count`` runs of consecutive rows, sizes differing
    by at most one, the most valuable run first."""
    size, extra = divmod(len(rows), count)
    chunks, end = [], len(rows)
    for i in range(count):
        start = end - size - (1 if i < extra else 0)
        chunks.append(tuple(rows[start:end]))
        end = start
    return tuple(chunks)


def split_overflow(
    user_id: str,
    rows: Iterable[Any],
    *,
    active: int,
    cap: int,
    max_depth: int,
    importance: Mapping | None = None,
    max_rows: int = DEFAULTS.max_summary_rows,
    max_chunks: int = DEFAULTS.max_summaries_per_user,
    fallback: bool = False,
) -> Overflow:
    """Which of one user's evictable rows to fold (in chunks), to evict and to leave waiting
    (module docstring)."""
    importance = importance or {}
    ordered = tuple(sorted(rows, key=lambda row: eviction_key(row, importance)))
    excess = max(active - cap, 0)
    why = [fold_blocker(row, max_depth) for row in ordered[: excess + max_chunks]]
    count, enough = chunk_count([w is None for w in why], excess, max_rows, max_chunks)
    if excess == 0 or count == 0:
        plain = ordered[:excess]
        return Overflow(user_id, excess, (), plain, ordered)
    taken = list(zip(ordered[: excess + count], why, strict=False))
    foldable = [row for row, w in taken if w is None]
    fold = foldable if enough else foldable[-count * max_rows :]
    rest = [] if enough else foldable[: -count * max_rows]
    if rest and not fallback:
        # the user stays over the cap: a row ranked after the folded ones is not evicted
        # while less valuable rows wait (an earlier run's summary, at the depth limit)
        taken = taken[: next(i for i, (row, _) in enumerate(taken) if row is fold[-1])]
    blocked = [(row, w) for row, w in taken if w is not None]
    blocked += [(row, WAITING) for row in rest] if fallback else []
    evict = tuple(row for row, _ in blocked)
    waiting = () if fallback else tuple(rest)
    not_folded = tuple(w for _, w in blocked)
    return Overflow(user_id, excess, cut(fold, count), evict, ordered, not_folded, waiting)
