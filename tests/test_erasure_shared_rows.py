"""Two forget requests erasing one derived row (A and B merged into M; forget A, forget B): each
request's verification looks for M's content, whichever request erased M first. A tombstone
recorded only the first request, so `verify-erasure --memory B` never hashed for M's text."""

from __future__ import annotations

from uuid import UUID

import pytest

from gc_worker import erasure
from gc_worker.verify_erasure import verify
from tests.store import NOW, add, execute, run
from tests.test_erasure_helpers import merge, tombstones

MERGED = "Drinks green tea every morning"


def merged_pair(engine, made_by: str) -> tuple[UUID, UUID, UUID]:
    """A and B folded into M, by the worker's compaction or by the application (lineage)."""
    a = add(engine, "u1", "Likes green tea")
    b = add(engine, "u1", "Has green tea each morning")
    if made_by == "worker":
        return a, b, merge(engine, "u1", [a, b], MERGED, [1.0] + [0.0] * 7)
    m = add(engine, "u1", MERGED, memory_type="summary")
    execute(engine, "UPDATE memories SET status = 'merged', superseded_by = :m"
            " WHERE id IN (:a, :b)", m=m, a=a, b=b)  # fmt: skip
    execute(engine, "INSERT INTO memory_lineage VALUES (:m, :a), (:m, :b)", m=m, a=a, b=b)
    return a, b, m


def forget(engine, settings, memory_id: UUID) -> None:
    with engine.begin() as conn:
        erasure.file_request(conn, memory_id=memory_id)


def copy_of_merged_text(engine) -> None:
    """M's text kept in a table of the worker's schema (a later table's copy of a preview)."""
    execute(engine, "CREATE TABLE gc_notes (id serial PRIMARY KEY, user_id text, note text)")
    execute(engine, "INSERT INTO gc_notes (user_id, note) VALUES ('u1', :t)", t=MERGED.upper())


def content_residues(engine, memory_id: UUID) -> set[str]:
    result = verify(engine, now=NOW, memory_id=memory_id)
    return {r.table for r in result.residues if r.match == "content"}


@pytest.mark.parametrize("made_by", ["worker", "application"])
@pytest.mark.parametrize("order", ["one_run", "a_then_b"])
def test_each_request_checks_the_row_both_erased(engine, settings, made_by, order):
    """forget A and forget B: M is erased for both (in one run, or for A first while B comes
    back, then B); `verify --memory B` finds M's text as `verify --memory A` does."""
    a, b, m = merged_pair(engine, made_by)
    forget(engine, settings, a)
    if order == "a_then_b":
        run(engine, settings, jobs=["erasure"])
        assert execute(engine, "SELECT status FROM memories WHERE id = :b", b=b).scalar() == (
            "active"
        )  # reactivated when M went
    forget(engine, settings, b)
    run(engine, settings, jobs=["erasure"])
    copy_of_merged_text(engine)
    assert "gc_notes" in content_residues(engine, a)
    assert "gc_notes" in content_residues(engine, b)
    ids = {str(r["id"]) for r in execute(engine, "SELECT id FROM gc_erasure_requests").mappings()}
    [tomb] = [t for t in tombstones(engine) if t["memory_id"] == m]
    assert {str(r) for r in tomb["request_ids"]} == ids


def test_a_purged_shared_row_is_still_checked_for_the_second_request(engine, settings):
    """A pending, B forgotten with --purge-now: one run erases both and purges B and M at once
    (M's lineage with them); B's verification still hashes for M's text through M's
    tombstone."""
    a, b, m = merged_pair(engine, "application")
    forget(engine, settings, a)
    erasure.forget(engine, settings, now=NOW, memory_id=b, purge_now=True)
    assert execute(engine, "SELECT count(*) FROM memories WHERE id IN (:b, :m)", b=b,
                   m=m).scalar() == 0  # fmt: skip
    copy_of_merged_text(engine)
    assert content_residues(engine, b) == {"gc_notes"}
    assert "gc_notes" in content_residues(engine, a)  # (and A's row: erased, not purged)


RUN = "10000000-0000-0000-0000-000000000001"
REQ_A = "20000000-0000-0000-0000-00000000000a"
REQ_B = "20000000-0000-0000-0000-00000000000b"
MEM = "30000000-0000-0000-0000-000000000001"


# a completed erasure run of u1 with one done batch, as a 0018 store holds it
ERASURE_RUN_0018 = (
    f"INSERT INTO gc_runs (id, mode, status, now, jobs, finished_at) VALUES"
    f" ('{RUN}', 'apply', 'completed', now(), '{{erasure}}', now())",
    f"INSERT INTO gc_run_batches (run_id, batch_no, users, state)"
    f" VALUES ('{RUN}', 0, '{{u1}}', 'done')",
)


class TestMigration0019:
    def test_upgrade_from_0018_keeps_the_tombstones_and_finds_their_requests(
        self, empty_database_url
    ):
        """Tombstones of a 0018 store are kept; each gets its request_id and every request
        the erasure's applied audit row names (two requests that erased M in one run)."""
        from alembic import command

        from tests.conftest import migrating

        with migrating(empty_database_url) as (cfg, conn):
            command.upgrade(cfg, "0018")
            for statement in (
                *ERASURE_RUN_0018,
                f"INSERT INTO gc_erasure_requests (id, kind, user_id, memory_id, status) VALUES"
                f" ('{REQ_A}', 'memory', 'u1', '{UUID(int=1)}', 'completed'),"
                f" ('{REQ_B}', 'memory', 'u1', '{UUID(int=2)}', 'completed')",
                "INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id,"
                " reason, row_version, outcome, details) VALUES"
                f" ('{RUN}', 0, 0, 'erasure', 'soft_delete', '{MEM}', 'u1', 'erasure', 1,"
                f'  \'applied\', \'{{"request_ids": ["{REQ_B}", "{REQ_A}"]}}\'),'
                f" ('{RUN}', 0, 1, 'erasure', 'soft_delete', '{UUID(int=3)}', 'u1',"
                "  'erasure_tombstone', 1, 'applied', '{\"request_ids\": \"junk\"}')",
                "INSERT INTO gc_erasure_tombstones (user_id, memory_id, content_hash,"
                " preview_hash, request_id, reason) VALUES"
                f" ('u1', '{MEM}', 'h1', 'p1', '{REQ_A}', 'erasure'),"
                f" ('u1', '{UUID(int=3)}', 'h3', 'p3', NULL, 'erasure_tombstone')",
            ):
                conn.exec_driver_sql(statement)
            command.upgrade(cfg, "head")
            rows = conn.exec_driver_sql(
                "SELECT memory_id, content_hash, request_id, request_ids"
                " FROM gc_erasure_tombstones ORDER BY id"
            ).all()
        assert [tuple(r) for r in rows] == [
            (UUID(MEM), "h1", UUID(REQ_A), [UUID(REQ_A), UUID(REQ_B)]),
            (UUID(int=3), "h3", None, []),
        ]

    def test_round_trip(self, empty_database_url):
        """0019 adds the column; its downgrade takes it away; upgrading again works."""
        from tests.conftest import check_round_trip

        count = (
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'gc_erasure_tombstones' AND column_name = 'request_ids'"
        )
        check_round_trip(empty_database_url, "0019", "0018", count, 1)


class TestAUserRequestDoesNotWidenAMemoryCheck:
    @pytest.mark.parametrize("also_forget_memory", [False, True])
    def test_verify_memory_reads_that_memory_only(self, engine, settings, also_forget_memory):
        """forget-user u1 (and forget M, one run): M's tombstone names the user request too.
        `verify --memory M` still looks for M's erasure only — not at the user's other erased
        row N — and leaves the user request's verification (and verified_at) alone."""
        m = add(engine, "u1", "Lives in Quokkaville")
        add(engine, "u1", "Works at the zoo")  # N
        if also_forget_memory:
            forget(engine, settings, m)
        with engine.begin() as conn:
            erasure.file_request(conn, user_id="u1")
        run(engine, settings, jobs=["erasure"])
        result = verify(engine, now=NOW, memory_id=m)
        rows = {r.row for r in result.residues if r.table == "memories"}
        assert rows == {str(m)}  # M erased, not purged yet; N is not M's
        kinds = {r["kind"]: r for r in execute(engine, "SELECT * FROM gc_erasure_requests")
                 .mappings()}  # fmt: skip
        assert "verification" not in kinds["user"]["result"]
        assert kinds["user"]["verified_at"] is None


def plan_nodes(node: dict) -> list[dict]:
    return [node, *(n for child in node.get("Plans", ()) for n in plan_nodes(child))]


def test_migration_0019_reads_the_audit_in_linear_time(empty_database_url):
    """The backfill reads each audit row about once, not once per tombstone: per tombstone it
    intersected the user's audit rows (gc_actions_user_idx) with the memory's, so a forgotten
    user with 50,000 tombstones and 250,000 audit rows took 6 minutes (quadratic) under an
    exclusive lock on the tombstones the request path's check reads."""
    from alembic import command

    from gc_worker.migration_modules import load
    from tests.conftest import migrating

    with migrating(empty_database_url) as (cfg, conn):
        command.upgrade(cfg, "0018")
        for statement in (
            *ERASURE_RUN_0018,
            f"INSERT INTO gc_erasure_requests (id, kind, user_id, status)"
            f" VALUES ('{REQ_A}', 'user', 'u1', 'completed')",
            "INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id,"
            " reason, row_version, outcome, details)"
            f" SELECT '{RUN}', 0, g, 'erasure', 'soft_delete', md5(g::text)::uuid, 'u1',"
            f" 'erasure', 1, 'applied', '{{\"request_ids\": [\"{REQ_A}\"]}}'"
            " FROM generate_series(1, 40) g",
            "INSERT INTO gc_erasure_tombstones (user_id, memory_id, content_hash, preview_hash,"
            f" request_id, reason) SELECT 'u1', md5(g::text)::uuid, 'h' || g, 'p', '{REQ_A}',"
            " 'erasure' FROM generate_series(1, 40) g",
            # the rest of the audit: u1's other jobs' (5 rows a memory), and smaller users' (50
            # rows each): the planner then intersects a user's rows with a memory's
            "INSERT INTO gc_actions (run_id, batch_no, seq, job, action, memory_id, user_id,"
            " reason, row_version, outcome)"
            f" SELECT '{RUN}', 0, 100 + g, 'decay', 'soft_delete',"
            " md5(CASE WHEN g <= 200 THEN 1 + g % 40 ELSE 1000 + g % 1000 END::text)::uuid,"
            " CASE WHEN g <= 200 THEN 'u1' ELSE 'v' || (g % 100) END, 'decayed', 1, 'applied'"
            " FROM generate_series(1, 5200) g",
            "ANALYZE",
        ):
            conn.exec_driver_sql(statement.replace("%", "%%"))
        migration = load("0019_tombstone_requests.py")
        conn.exec_driver_sql(migration.ADD)
        [[plan]] = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + migration.BACKFILL.replace("%", "%%")
        ).all()
        read = sum(
            n["Actual Rows"] * n["Actual Loops"]
            for n in plan_nodes(plan[0]["Plan"])
            if n.get("Relation Name") == "gc_actions"
            or n.get("Index Name", "").startswith("gc_actions")
        )
        assert read <= 3 * 40  # linear: not u1's 240 audit rows for each of 40 tombstones
        rows = conn.exec_driver_sql("SELECT DISTINCT request_ids FROM gc_erasure_tombstones")
        assert [r[0] for r in rows] == [[UUID(REQ_A)]]
