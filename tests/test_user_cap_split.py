"""Properties of summarize mode's split of one over-cap user's rows (jobs.user_cap_split) and
of what a run plans once some of its chunks are made (jobs.user_cap.leftovers), over generated
rankings: no database, no model (docs/importance-and-caps.md, "Far over the cap")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from uuid import uuid4

from hypothesis import given, settings
from hypothesis import strategies as st

from gc_worker.actions import Kind
from jobs.user_cap import leftovers
from jobs.user_cap_split import split_overflow


def ranked_rows(blocked: list[bool]) -> list[Any]:
    """One user's evictable rows, least valuable first (``rank``), each foldable or not."""
    return [
        SimpleNamespace(
            id=uuid4(), user_id="u1", rank=i + 1, row_version=1, preview=None, metadata={},
            memory_type="semantic", source="app", unfoldable="slot" if no else None,
        )
        for i, no in enumerate(blocked)
    ]  # fmt: skip


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    excess = draw(st.integers(1, 40))
    max_chunks = draw(st.integers(1, 4))
    pinned = draw(st.sampled_from([0, 0, 0, 1, 2, excess]))  # fewer evictable rows
    evictable = max(excess + max_chunks - pinned, 0)
    tenths = draw(st.integers(0, 5))  # of the rows, blocked
    blocked = st.integers(0, 9).map(lambda n: n < tenths)
    return {
        "excess": excess,
        "cap": draw(st.integers(1, 30)),
        "max_rows": draw(st.integers(2, 6)),
        "max_chunks": max_chunks,
        "fallback": draw(st.booleans()),
        "blocked": draw(st.lists(blocked, min_size=evictable, max_size=evictable)),
        # chunks made before one fails (max_chunks: all made)
        "failed_at": draw(st.sampled_from([max_chunks, *range(max_chunks)])),
    }


def split(case: dict[str, Any]) -> tuple[Any, list[Any]]:
    rows = ranked_rows(case["blocked"])
    overflow = split_overflow(
        "u1", rows, active=case["cap"] + case["excess"], cap=case["cap"], max_depth=1,
        max_rows=case["max_rows"], max_chunks=case["max_chunks"], fallback=case["fallback"],
    )  # fmt: skip
    return overflow, rows


class TestSplit:
    @settings(max_examples=400, deadline=None)
    @given(cases())
    def test_chunks_are_disjoint_bounded_foldable_and_most_valuable_first(self, case) -> None:
        """Every chunk has 2 .. max_summary_rows foldable rows, least valuable first, no row
        in two chunks or both folded and evicted, at most max_summaries_per_user chunks."""
        overflow, _ = split(case)
        fold = [row.id for row in overflow.fold]
        assert len(fold) == len(set(fold))
        assert not set(fold) & {row.id for row in overflow.evict}
        assert len(overflow.chunks) <= case["max_chunks"]
        for chunk in overflow.chunks:
            assert 2 <= len(chunk) <= case["max_rows"]
            assert all(row.unfoldable is None for row in chunk)
            assert [row.rank for row in chunk] == sorted(row.rank for row in chunk)
        for more, less in zip(overflow.chunks, overflow.chunks[1:], strict=False):
            assert min(row.rank for row in more) > max(row.rank for row in less)


class TestLeftovers:
    @settings(max_examples=400, deadline=None)
    @given(cases())
    def test_the_user_never_ends_below_the_cap_and_what_waits_is_listed(self, case) -> None:
        """Whichever chunk fails (or none): no folded row is evicted, the user ends at the cap
        with the fallback and never below it, over_cap_by is how far over the user stays, a
        listed row is left alone and ranks before every row a summary made folds, and while
        rows wait no row ranked after the folded ones is evicted (none when none is folded)."""
        overflow, rows = split(case)
        if not overflow.chunks:
            return
        made = list(overflow.chunks[: case["failed_at"]])
        reason = "llm_unavailable" if len(made) < len(overflow.chunks) else None
        ctx = SimpleNamespace(settings=SimpleNamespace(user_cap=overflow_policy(case)))
        actions = leftovers(ctx, overflow, made, reason)
        folded = {row.id for chunk in made for row in chunk}
        evicted = {a.memory_id for a in actions if a.action is Kind.SOFT_DELETE}
        listings = [a for a in actions if a.action is Kind.DEFERRED]
        assert not folded & evicted
        after = case["cap"] + case["excess"] - len(folded) + len(made) - len(evicted)
        assert after == case["cap"] if case["fallback"] else after >= case["cap"]
        assert bool(listings) == (after > case["cap"])
        rank = {str(row.id): row.rank for row in rows}
        lowest_folded = min(row.rank for row in folded_rows(made)) if made else None
        if listings:  # nothing more valuable than a folded row is evicted while rows wait
            top = max((row.rank for row in folded_rows(made)), default=0)
            assert all(rank[str(i)] < top for i in evicted)
        for listing in listings:
            assert listing.details["over_cap_by"] == after - case["cap"]
            listed = listing.details["memory_ids"]
            assert not {str(i) for i in folded | evicted} & set(listed)
            if lowest_folded is not None:
                assert all(rank[i] < lowest_folded for i in listed)


def overflow_policy(case: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(fallback_to_evict=case["fallback"])


def folded_rows(made: list[tuple[Any, ...]]) -> list[Any]:
    return [row for chunk in made for row in chunk]
