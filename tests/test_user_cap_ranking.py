"""user_cap ranks each over-cap user's rows in SQL and fetches only the ones it may take; the
choice must be exactly what ranking every evictable row in Python (``eviction_key``) gives,
ties, NULL last use and re-assessed importance included."""

from __future__ import annotations

import random
from datetime import timedelta
from uuid import UUID

import pytest
import sqlalchemy as sa

import jobs.user_cap as user_cap
from gc_worker.batch import BatchContext
from gc_worker.config import Settings, UserCapSettings
from tests.store import NOW, add, days_ago, execute, run, status

CAP = 8
EVICTABLE = """
SELECT id, user_id, xmin::text::bigint AS row_version, importance, created_at,
       last_accessed_at, memory_type, source, metadata
FROM memories WHERE status = 'active' AND NOT pinned ORDER BY user_id, id
"""


def seed(engine: sa.Engine, rng: random.Random) -> list[UUID]:
    """Three users around the cap, with many equal keys; returns the ids."""
    rows = []
    for user in ("a", "b", "c"):
        for _ in range(rng.randint(CAP - 1, 3 * CAP)):
            created = days_ago(rng.choice([10, 20, 30]))
            rows.append({
                "id": UUID(int=rng.getrandbits(128)), "user_id": user, "content": "m",
                "importance": rng.randint(1, 3), "pinned": rng.random() < 0.15,
                "created_at": created, "updated_at": created, "observed_at": created,
                "last_accessed_at": rng.choice([None, days_ago(5), days_ago(20), created]),
            })  # fmt: skip
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO memories (id, user_id, content, importance, pinned, created_at,"
                " updated_at, observed_at, last_accessed_at) VALUES (:id, :user_id, :content,"
                " :importance, :pinned, :created_at, :updated_at, :observed_at,"
                " :last_accessed_at)"
            ),
            rows,
        )
    return [r["id"] for r in rows]


@pytest.mark.parametrize("overflow", ["evict", "summarize"])
def test_sql_ranking_takes_what_python_ranking_takes(engine, overflow: str) -> None:
    settings = Settings(user_cap=UserCapSettings(max_memories=CAP, overflow=overflow))
    rng = random.Random(7)
    for _ in range(25):
        execute(engine, "DELETE FROM memories")
        ids = seed(engine, rng)
        reassessed = {i: rng.randint(1, 5) for i in rng.sample(ids, 6)}
        with engine.connect() as conn:
            ctx = BatchContext(
                conn=conn, users=["a", "b", "c"], settings=settings, now=NOW + timedelta(days=1),
                dry_run=True, importance=dict(reassessed),
            )  # fmt: skip
            counts, _ = user_cap.over_cap_counts(ctx)
            everything = conn.execute(sa.text(EVICTABLE)).all()
            expected = user_cap.plan_user_cap(everything, counts, cap=CAP, importance=reassessed)
            if overflow == "evict":
                got = user_cap.plan(ctx)
                assert [a.memory_id for a in got] == [a.memory_id for a in expected]
            else:  # offline: a user is deferred with the rows it would fold, or evicted
                got_ids: dict[str, list[str]] = {}
                for action in user_cap.plan(ctx):
                    ids_of = action.details.get("memory_ids") or [str(action.memory_id)]
                    got_ids.setdefault(action.user_id, []).extend(ids_of)
                want_ids = {}
                for user, active in counts.items():
                    split = user_cap.split_overflow(
                        user, [r for r in everything if r.user_id == user], active=active,
                        cap=CAP, max_depth=1, importance=reassessed,
                    )  # fmt: skip
                    want_ids[user] = [str(r.id) for r in (split.fold or split.evict)]
                assert got_ids == want_ids
        assert any(counts.values())


def test_the_sql_order_decides_where_python_cannot_tell_instants_apart(engine) -> None:
    """-infinity and year 1 both load as datetime.min (gc_worker.db): re-sorting in Python
    tied them and fell back to the creation time; PostgreSQL's order, the least recently used
    first, decides."""
    settings = Settings(user_cap=UserCapSettings(max_memories=1))
    never = add(engine, created_at=days_ago(10))
    year_one = add(engine, created_at=days_ago(20))
    execute(engine, "UPDATE memories SET last_accessed_at = '-infinity' WHERE id = :id", id=never)
    execute(
        engine,
        "UPDATE memories SET last_accessed_at = '0001-01-01 00:00:00+00' WHERE id = :id",
        id=year_one,
    )
    run(engine, settings, jobs=["user_cap"])
    assert (status(engine, never), status(engine, year_one)) == ("deleted", "active")
