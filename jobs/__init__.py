"""The GC jobs, one module each, in the order a run applies them (DESIGN.md section 3).

Every job module has ``NAME`` and ``plan(ctx) -> list[Action]`` (fetch candidates, then a pure
``plan_*`` function); a job may also have ``refresh(ctx) -> int`` for non-action upkeep that
runs after the batch's actions (decay scores).
"""

from __future__ import annotations

from types import ModuleType

from jobs import (
    compaction,
    contradiction,
    decay,
    erasure,
    hard_delete,
    importance,
    ttl_expiry,
    usage_prune,
    user_cap,
)

ORDER: tuple[str, ...] = (
    "erasure",
    "ttl_expiry",
    "importance",
    "decay",
    "contradiction",
    "compaction",
    "usage_prune",
    "user_cap",
    "hard_delete",
)

REGISTRY: dict[str, ModuleType] = {
    module.NAME: module
    for module in (
        erasure,
        ttl_expiry,
        importance,
        decay,
        contradiction,
        compaction,
        usage_prune,
        user_cap,
        hard_delete,
    )
}


def available() -> list[str]:
    """Job names this build can run, in run order."""
    return [name for name in ORDER if name in REGISTRY]
