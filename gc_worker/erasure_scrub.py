"""Scrubbing the worker's own tables of erased memories (gc_worker.erasure, verify_erasure).

- ``scrub``: audit and plan rows (``gc_actions``: content preview gone, details cut to
  ``KEEP_DETAILS`` — ids, codes, instants and numbers — and ``prior`` to status fields), cached
  LLM decisions, review items and dismissals, stored errors naming an erased memory; also what
  the worker holds about a forgotten user, and texts found by their content hash.
- ``erased_ids`` / ``gone_ids``: of some ids, those an erasure reached / no longer stored.
- ``audited_reach``: the records the audit says were made into or from requested memories,
  gone or erased (what is kept about them states the memories' facts).
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from sqlalchemy.engine import Connection

from gc_worker.actions import ERASURE_REASONS
from gc_worker.execute import PRIOR_FIELDS
from gc_worker.queries import q

# Details an erased memory's audit rows keep: ids, codes, instants and numbers, never text.
KEEP_DETAILS = (
    "into", "sources", "memory_ids", "superseded_by", "group", "request_ids", "derived_from",
    "source_of",
    "same_content_as", "reactivated_from", "matched", "status", "status_reason", "importance",
    "close_valid_until", "expires_at", "undid", "run", "later_run", "over_cap_by",
)  # fmt: skip


def erased_ids(conn: Connection, ids: Sequence[UUID]) -> list[UUID]:
    """Of ``ids``, those an erasure reached (erased, or purged with a tombstone)."""
    return _ids_where(conn, "erasure_erased_ids", ids)


def gone_ids(conn: Connection, ids: Sequence[UUID]) -> list[UUID]:
    """Of ``ids``, those no longer stored or erased (a misfiled request's memory, still on the
    read path under its owner, is not)."""
    return _ids_where(conn, "erasure_gone", ids)


def audited_reach(conn: Connection, asked: Sequence[tuple[UUID, str]]) -> list[UUID]:
    """Of the records the audit says requested memories (id, user) were made into or from,
    those gone or erased: what is kept about them states the memories' facts (a summary of a
    merge of A, both deleted by the application, names neither A nor anything A's id finds)."""
    if not asked:
        return []
    params = {"targets": [m for m, _ in asked], "owners": [u for _, u in asked]}
    found = {row[1] for name in ("erasure_audited_derived", "erasure_audited_sources")
             for row in conn.execute(q(name), params)}  # fmt: skip
    return gone_ids(conn, sorted(found, key=str))


def _ids_where(conn: Connection, query: str, ids: Sequence[UUID]) -> list[UUID]:
    if not ids:
        return []
    params = {"ids": list(ids), "erasure_reasons": list(ERASURE_REASONS)}
    return list(conn.execute(q(query), params).scalars())


def scrub(
    conn: Connection,
    memory_ids: Sequence[UUID],
    *,
    users: Sequence[str],
    whole_users: Sequence[str] = (),
    hashes: Sequence[str] = (),
    hash_owners: Sequence[str] = (),
) -> dict[str, int]:
    """Remove erased memories' content from every table the worker owns, and everything the
    worker holds about the ``whole_users`` (forgotten users: also what it keeps about memories
    no longer in the store). What no id names — about an exact twin the application deleted —
    is found by content: the audit and plan rows, and the cached decisions, of ``hash_owners``
    (the users whose rows were erased) whose text hashes to one of ``hashes`` (the new
    tombstones'), and their cached decisions about rows no longer stored. What any other user's
    rows recorded about an id no longer stored or erased goes too: the application moved the
    memory, and the worker's tables kept it under each user it belonged to. Stored errors (of
    runs, batches, sweep requests) lose the erased ids they named. Counts per table."""
    if not memory_ids and not whole_users:
        return {}
    ids = list(memory_ids)
    gone = gone_ids(conn, ids)
    params = {
        "ids": ids,
        "id_texts": [str(m) for m in ids],
        "gone": gone,
        "gone_texts": [str(m) for m in gone],
        "owners": list(users),
        "whole_users": list(whole_users),
        "hashes": list(hashes),
        "hash_owners": list(hash_owners),
        "keep_details": list(KEEP_DETAILS),
        "keep_prior": list(PRIOR_FIELDS),
    }
    dropped = {"ids": ids, "gone": gone, "owners": list(users), "whole_users": list(whole_users)}
    by_content = {"hashes": list(hashes), "hash_owners": list(hash_owners)}
    return {
        "gc_actions": len(conn.execute(q("erasure_scrub_actions"), params).all()),
        "gc_llm_cache": len(conn.execute(q("erasure_drop_llm_cache"), dropped).all())
        + (
            len(conn.execute(q("erasure_drop_llm_cache_by_content"), by_content).all())
            if hash_owners
            else 0
        ),
        "gc_review_items": len(conn.execute(q("erasure_trim_dismissals"), dropped).all())
        + len(conn.execute(q("erasure_drop_reviews"), dropped).all()),
        "gc_sweep_requests": len(
            conn.execute(q("erasure_scrub_sweep_errors"), {"whole_users": list(whole_users)}).all()
        ),
        "errors": conn.execute(q("erasure_scrub_error_ids"), params).scalar_one() if ids else 0,
    }
