"""Forgetting a merged record takes its exact twin's sources too: they state the same facts,
and brought back they would put the forgotten fact on the read path in their own words."""

from __future__ import annotations

from datetime import timedelta

from gc_worker import erasure
from tests.store import NOW, add, execute, run, status

DAY = timedelta(days=1)


def keep_in_use(engine, user="u1", at=NOW):
    execute(
        engine,
        "UPDATE memories SET last_accessed_at = :t, importance = 5"
        " WHERE user_id = :u AND status = 'active'",
        t=at,
        u=user,
    )


def twin_merges(engine) -> dict[str, object]:
    """Two merged records of u1 with the same text: M from A and B, M2 from C and D; all in
    use (no other job retires them)."""
    from tests.test_erasure_helpers import merge

    text = "Drinks oolong tea every morning"
    ids = {
        "a": add(engine, "u1", "Has oolong tea each morning"),
        "b": add(engine, "u1", "Morning drink: oolong"),
        "c": add(engine, "u1", "Starts the day with oolong tea"),
        "d": add(engine, "u1", "Oolong is the morning tea"),
    }
    add(engine, "u1", "Likes jazz")
    ids["m"] = merge(engine, "u1", [ids["a"], ids["b"]], text, [1.0] + [0.0] * 7)
    ids["m2"] = merge(engine, "u1", [ids["c"], ids["d"]], text, [0.0, 1.0] + [0.0] * 6)
    keep_in_use(engine)
    return ids


def test_forgetting_a_merged_record_erases_the_sources_of_its_same_text_twin(engine, settings):
    """forget M, a merged record ("Drinks oolong tea every morning", from A and B): A and B are
    erased with it (they state its facts: docs/erasure.md). M2, another merged record of the
    user with the same text (from C and D), is erased as M's twin (same_content_as), and so
    are C and D: reactivated, they would put the forgotten fact back in their own words."""
    ids = twin_merges(engine)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=ids["m"])
    run(engine, settings, now=NOW + DAY, jobs=["erasure"])
    states = {name: status(engine, i) for name, i in ids.items()}
    assert states["m"] == states["m2"] == states["a"] == states["b"] == "deleted"
    assert (states["c"], states["d"]) == ("deleted", "deleted"), states


def test_the_twin_of_a_record_erased_for_a_source_gives_its_sources_back(engine, settings):
    """The other way round stays as it was: forget A, a source of M. M is erased as derived
    from A, M2 as M's twin, and M's other source B and M2's sources C and D come back (the
    request named a source, not the merged facts)."""
    ids = twin_merges(engine)
    erasure.forget(engine, settings, now=NOW + DAY, memory_id=ids["a"])
    run(engine, settings, now=NOW + DAY, jobs=["erasure"])
    states = {name: status(engine, i) for name, i in ids.items()}
    assert states == {"a": "deleted", "m": "deleted", "m2": "deleted",
                      "b": "active", "c": "active", "d": "active"}  # fmt: skip
