"""What "forget me" reaches, and what it must never reach: cases a review reproduced (each
failed before its fix)."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from tests.store import NOW, add, execute, run, status

DAY = timedelta(days=1)
LATER = NOW + 400 * DAY


def in_use(engine: sa.Engine, user: str = "u1") -> None:
    """Keep the user's active rows in use so no other job retires them."""
    execute(
        engine,
        "UPDATE memories SET last_accessed_at = :t, importance = 5"
        " WHERE user_id = :u AND status = 'active'",
        t=LATER - DAY,
        u=user,
    )


def test_a_misfiled_memory_request_of_a_user_with_rows_completes_and_scrubs_another_user(
    engine, settings
):
    """An application files forget-memory X under the wrong user id (u2, who has rows of her
    own; X belongs to u1). With no rows, such a request is left pending for the operator
    (test_erasure.py); with rows, the run completes it at once -- nothing erased, X active --
    and the completion's scrub (keyed by X's id, over every user of the batch and of the
    cache / review tables) deletes u1's cached decisions and review items and strips u1's
    audit rows: an erasure action touching another user's rows."""
    from tests.test_erasure_helpers import cache_decision, count, review

    x = add(engine, "u1", "Takes insulin at 8am")
    y = add(engine, "u1", "Takes insulin with breakfast")
    add(engine, "u2", "Keeps bees")
    in_use(engine, "u1")
    in_use(engine, "u2")
    cache_decision(engine, "u1", [x, y], {"merged_text": "Takes insulin at 8am with breakfast"})
    review(engine, "u1", [x, y], ["Takes insulin at 8am", "Takes insulin with breakfast"])
    execute(engine, "INSERT INTO gc_erasure_requests (kind, user_id, memory_id)"
                    " VALUES ('memory', 'u2', :x)", x=x)  # fmt: skip
    run(engine, settings, now=NOW + DAY)
    state = {
        "request": execute(engine, "SELECT status FROM gc_erasure_requests").scalar(),
        "x": status(engine, x),
        "u1 cache": count(engine, "SELECT count(*) FROM gc_llm_cache WHERE user_id = 'u1'"),
        "u1 reviews": count(engine, "SELECT count(*) FROM gc_review_items WHERE user_id = 'u1'"),
        "u1 audit scrubbed": count(
            engine, "SELECT count(*) FROM gc_actions WHERE user_id = 'u1' AND details ? 'scrubbed'"
        ),
    }
    assert state == {
        "request": "pending",
        "x": "active",
        "u1 cache": 1,
        "u1 reviews": 1,
        "u1 audit scrubbed": 0,
    }
