"""Raw SQL, kept in ``gc_worker/sql/*.sql`` as named blocks and loaded once.

A block starts with ``-- name --`` on its own line, followed by one comment line saying what it
does; the Python side only maps arguments (``:name`` binds).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import sqlalchemy as sa

SQL_DIR = Path(__file__).parent / "sql"
_BLOCK = re.compile(r"^-- ([a-z0-9_]+) --$", re.MULTILINE)


@cache
def queries() -> dict[str, sa.TextClause]:
    found: dict[str, sa.TextClause] = {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        parts = _BLOCK.split(path.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in found:
                raise RuntimeError(f"SQL block {name!r} is defined twice (second in {path.name})")
            found[name] = sa.text(body.strip())
    return found


def q(name: str) -> sa.TextClause:
    return queries()[name]
