"""Embeddings read as float64 numpy arrays, bit for bit the values a `real[]` read gave."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import numpy as np
import pytest
import sqlalchemy as sa

from gc_worker import db
from gc_worker import engine as gc_engine
from gc_worker.batch import BatchContext
from gc_worker.vector_loader import ARRAYS
from jobs.llm_support import rows_by_user
from tests.conftest import TEST_DIM
from tests.store import NOW, add, get, run

# float4 edge values: subnormals, the largest float4, a decimal float4 cannot hold exactly,
# negative zero, and a threshold-like cosine component
EDGES = [1e-45, -1.17549435e-38, 3.4028235e38, 0.1, -0.0, 0.85, 1.0 / 3.0, -2.5e-7]


def candidates(engine: sa.Engine, settings, *, in_transaction: bool) -> list:
    with engine.begin() as conn:
        ctx = BatchContext(conn=conn, users=["u1"], settings=settings, now=NOW, dry_run=True,
                           in_transaction=in_transaction)  # fmt: skip
        return [row for _, rows in rows_by_user(ctx, "compaction_candidates", held=[])
                for row in rows]  # fmt: skip


def as_real_array(engine: sa.Engine) -> dict[UUID, list[float]]:
    query = "SELECT id, CAST(embedding AS real[]) AS e FROM memories WHERE embedding IS NOT NULL"
    with engine.connect() as conn:
        return {row.id: row.e for row in conn.execute(sa.text(query))}


def bits(values) -> list[int]:
    return np.asarray(values, dtype=np.float64).view(np.uint64).tolist()


class TestCandidateEmbeddings:
    @pytest.mark.parametrize("in_transaction", [True, False])
    def test_arrays_equal_the_real_array_read_bit_for_bit(self, engine, settings, in_transaction):
        """Streamed or read per user, each embedding is one float64 array holding exactly the
        floats the `real[]` read gave (subnormals, float4's max, 0.1, -0.0 included)."""
        rng = np.random.default_rng(7)
        add(engine, "u1", "edges", embedding=EDGES)
        for i in range(20):
            add(engine, "u1", f"memory {i}", embedding=rng.normal(size=TEST_DIM).astype(np.float32))
        rows = candidates(engine, settings, in_transaction=in_transaction)
        expected = as_real_array(engine)
        assert len(rows) == 21
        for row in rows:
            assert isinstance(row.embedding, np.ndarray) and row.embedding.dtype == np.float64
            assert bits(row.embedding) == bits(expected[row.id])

    def test_other_reads_of_the_column_are_unchanged(self, engine, settings):
        """A statement that does not ask for arrays reads the vector as text, as before, on a
        connection that served an array read."""
        add(engine, "u1", "a", embedding=[1.0] * TEST_DIM)
        candidates(engine, settings, in_transaction=True)
        with engine.connect() as conn:
            value = conn.execute(sa.text("SELECT embedding FROM memories")).scalar()
        assert value == "[" + ",".join(["1"] * TEST_DIM) + "]"


class TestLoaderRegistration:
    def test_extension_created_after_connecting_in_another_schema(self, empty_database_url):
        """A connection opened before `CREATE EXTENSION vector` (here into its own schema, as
        an adopted store may have it) still reads arrays once the type exists."""
        engine = db.make_engine(empty_database_url)
        try:
            with engine.begin() as conn:
                statement = sa.text("SELECT CAST('[1.5,2,0.1]' AS ext.vector) AS e")
                conn.exec_driver_sql("CREATE SCHEMA ext")
                conn.exec_driver_sql("CREATE EXTENSION vector SCHEMA ext")
                value = conn.execute(statement.execution_options(**ARRAYS)).scalar()
            assert isinstance(value, np.ndarray)
            assert bits(value) == bits([1.5, 2.0, 0.1])
        finally:
            engine.dispose()

    def test_extension_recreated_while_the_connection_is_pooled(self, empty_database_url):
        """`DROP EXTENSION vector; CREATE EXTENSION vector` gives the type a new oid: a pooled
        connection that read arrays before reads arrays after (not text, which every job would
        take for an unusable embedding)."""
        engine = db.make_engine(empty_database_url)
        statement = sa.text("SELECT CAST('[1.5,2,0.1]' AS vector) AS e").execution_options(**ARRAYS)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("CREATE EXTENSION vector")
            with engine.connect() as conn:
                assert isinstance(conn.execute(statement).scalar(), np.ndarray)
            with engine.begin() as conn:
                conn.exec_driver_sql("DROP EXTENSION vector")
                conn.exec_driver_sql("CREATE EXTENSION vector")
            with engine.connect() as conn:
                value = conn.execute(statement).scalar()
            assert isinstance(value, np.ndarray)
            assert bits(value) == bits([1.5, 2.0, 0.1])
        finally:
            engine.dispose()


class TestPlanRoundTrip:
    def test_an_exact_merge_planned_then_applied_keeps_the_embedding(self, engine, settings):
        """The copied embedding goes into the dry run's plan (JSON) and comes out of apply as
        the member's own vector."""
        vector = np.asarray([x for x in EDGES if x] + [0.7], dtype=np.float32)  # (jsonb: -0 is 0)
        for minutes in range(2):
            add(engine, "u1", "Has a dog", embedding=vector,
                created_at=NOW - timedelta(minutes=minutes))  # fmt: skip
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        created = [a for a in plan["actions"] if a["action"] == "create_merged"]
        assert len(created) == 1
        merged = get(engine, UUID(created[0]["memory_id"]))
        member = get(engine, UUID(plan["actions"][1]["memory_id"]))
        assert merged["status"] == "active" and merged["embedding"] == member["embedding"]
