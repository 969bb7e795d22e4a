"""Properties of summarize mode's split of one over-cap user's rows (jobs.user_cap_split), of
how its chunks are asked, a rejected one in parts (jobs.user_cap_fold), and of what a run plans
once some of its chunks are made (jobs.user_cap.leftovers), over generated rankings: no
database, no model (docs/importance-and-caps.md, "Far over the cap")."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from uuid import uuid4

from hypothesis import given, settings
from hypothesis import strategies as st

from gc_worker.actions import Action, Kind
from jobs.importance import INVALID, further_calls
from jobs.user_cap import leftovers
from jobs.user_cap_fold import Answer, Folding, ModelState, fold_chunks
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
        folding = Folding(made=[(chunk, f"summary:{i}") for i, chunk in enumerate(made)])
        if reason is not None:
            folding.end(reason, overflow.chunks[len(made) :])
        ctx = SimpleNamespace(settings=SimpleNamespace(user_cap=overflow_policy(case)))
        actions = leftovers(ctx, overflow, folding)
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


@st.composite
def isolation_cases(draw: st.DrawFn) -> dict[str, Any]:
    sizes = draw(st.lists(st.integers(2, 20), min_size=1, max_size=4))
    total = sum(sizes)
    return {
        "sizes": sizes,
        "bad": draw(st.sets(st.integers(0, total - 1), max_size=3)),
        "stop_after": draw(st.one_of(st.none(), st.integers(0, 40))),  # calls answered
        "stop": draw(st.sampled_from(["llm_budget", "llm_unavailable"])),
    }


class TestIsolation:
    @settings(max_examples=400, deadline=None)
    @given(isolation_cases())
    def test_parts_fold_around_bad_rows_within_the_bound(self, case) -> None:
        """A model that rejects any part holding a bad row, and stops answering after so
        many calls: every chunk row is folded once or waits, a folded part has 2+ rows and no
        bad row, a chunk costs at most 1 + 2 * ceil(log2(rows)) calls, what the stop leaves
        waiting ranks before every folded row, and one bad row leaves at most 3 rows aside."""
        rows = ranked_rows([False] * sum(case["sizes"]))
        chunks, end = [], len(rows)
        for size in case["sizes"]:  # most valuable first, each least valuable first
            chunks.append(tuple(rows[end - size : end]))
            end -= size
        chunk_of = {row.id: n for n, chunk in enumerate(chunks) for row in chunk}
        calls: list[int] = []

        def ask(part: tuple[Any, ...]) -> Answer:
            calls.append(chunk_of[part[0].id])
            if case["stop_after"] is not None and len(calls) > case["stop_after"]:
                return Answer([], case["stop"], down=True)
            if any(row.rank - 1 in case["bad"] for row in part):
                return Answer([], INVALID)
            group = f"summary:{len(calls)}"
            return Answer([Action("user_cap", Kind.CREATE_MERGED, "u1", "x", group=group)])

        folding, model = Folding(), ModelState()
        fold_chunks(chunks, ask, model, folding)
        folded = [row for part, _ in folding.made for row in part]
        waiting = [row for rows in folding.waits.values() for row in rows]
        assert sorted(r.rank for r in folded + waiting) == sorted(r.rank for c in chunks for r in c)
        for part, _ in folding.made:
            assert len(part) >= 2 and not any(row.rank - 1 in case["bad"] for row in part)
        for n, chunk in enumerate(chunks):
            assert calls.count(n) <= 1 + further_calls(len(chunk))
        stopped = folding.waits.get(case["stop"], [])
        if stopped and folded:
            assert max(r.rank for r in stopped) < min(r.rank for r in folded)
        if len(case["bad"]) == 1 and not stopped and model.isolate:
            assert len(folding.waits.get(INVALID, [])) <= 3
