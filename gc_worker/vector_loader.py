"""pgvector values read as numpy arrays, not as lists of Python floats.

The jobs that compare embeddings (compaction, contradiction) read ``memories.embedding`` as the
column's own type, ``vector``. A ``real[]`` read gave each row a list of 1536 Python floats
(~49 KB a row: 1 GB for a 20,000-row user before any grouping); this loader parses pgvector's
text form straight into one float64 array (12 KB). It parses the same decimal digits the
``real[]`` form carried (both are the float4's shortest round-trip text) to the same float64
values, so every cosine, group and stored centroid is bit for bit what it was.

Only a statement that asks for them (execution option ``vector_arrays``) gets arrays: the
loader is put on that statement's cursor, by the oid of the ``vector`` type of the database the
connection is on (an adopted store's extension may live in any schema), looked up once per
connection checkout — never per row — and only once the extension exists (``migrate`` then
``run`` in one process). The oid is forgotten when the connection goes back to the pool: a
``DROP EXTENSION vector; CREATE EXTENSION vector`` gives the type a new one, and a pooled
connection holding the old one would read text, which every job takes for no embedding.
Every other read of a vector column is as it was (text).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

# the `vector` type of the pgvector extension, whatever schema it was created in
VECTOR_OID = (
    "SELECT t.oid FROM pg_type t JOIN pg_extension e ON e.extnamespace = t.typnamespace"
    " WHERE e.extname = 'vector' AND t.typname = 'vector'"
)
OPTION = "vector_arrays"  # the execution option asking for numpy arrays
ARRAYS = {OPTION: True}
INFO_KEY = "memory_gc_vector_oid"  # in the pooled connection's info, once found per checkout


class EmbeddingLoader(psycopg.adapt.Loader):
    """pgvector text (``[0.5,1e-05,…]``) → a 1-D float64 numpy array."""

    def load(self, data: Any) -> np.ndarray:
        text = bytes(data)
        return np.fromstring(text[1:-1], dtype=np.float64, sep=",")


def _vector_oid(conn: Any, cursor: Any) -> int | None:
    if INFO_KEY not in conn.info:
        found = cursor.connection.execute(VECTOR_OID).fetchone()
        if found is None:
            return None  # no extension (yet): nothing to load, look again next time
        conn.info[INFO_KEY] = found[0]
    return conn.info[INFO_KEY]


def _on_cursor(conn: Any, cursor: Any, _sql: Any, _params: Any, context: Any, _many: Any) -> None:
    if context is None or not context.execution_options.get(OPTION):
        return
    if isinstance(cursor, psycopg.Cursor | psycopg.ServerCursor):
        oid = _vector_oid(conn, cursor)
        if oid is not None:
            cursor.adapters.register_loader(oid, EmbeddingLoader)


# every engine (the worker's, a helper thread's, an adopted store's): only statements with the
# option are touched
sa.event.listen(Engine, "before_cursor_execute", _on_cursor)


def _forget_oid(_dbapi_connection: Any, record: Any) -> None:
    if record is not None:
        record.info.pop(INFO_KEY, None)


sa.event.listen(Pool, "checkin", _forget_oid)
