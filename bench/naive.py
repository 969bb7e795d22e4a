"""The naive loop tutorials show: for each user, one transaction running the GC rules as one
statement each (expire, decay, prune, cap, purge, rescore) scoped to that user.

The rules are bench.baseline's, scoped with ``m.user_id = :user``, so the end state is the same
as memory-gc's and the set-based SQL's; what differs is the shape: a round trip, a plan and an
execution per rule per user, and a commit per user, instead of a few statements per batch of
users or per store. It writes no audit (tutorials don't), which only flatters it.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.baseline import ONE_USER, params, statements
from gc_worker.config import Settings


def run_naive(engine: Engine, settings: Settings, *, now: datetime) -> dict[str, int]:
    """Loop over every user, one transaction each; rows changed per step, summed."""
    binds = params(settings, now)
    steps = list(statements(ONE_USER, audit=False))
    counts: Counter[str] = Counter()
    with engine.connect() as conn:
        users = conn.execute(sa.text("SELECT DISTINCT user_id FROM memories ORDER BY 1")).scalars()
        users = list(users)
    for user in users:
        with engine.begin() as conn:
            for label, statement in steps:
                counts[label] += conn.execute(statement, binds | {"user": user}).rowcount
    return dict(counts)
