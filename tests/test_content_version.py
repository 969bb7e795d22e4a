"""Merges and contradictions are versioned by content: a read between plan and apply does not
drift them, any other write does; the jobs whose rules read the access columns keep ``xmin``.

Before migration 0010 every action compared ``xmin``, so the application putting a stale fact
into a model context between a dry run and its apply (which it does with the facts it retrieves
most) drifted the obsolete that closes it — under ``plan_then_apply``, every night again."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import pytest
import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker import erasure
from gc_worker.actions import CONTENT_VERSIONED, Kind
from gc_worker.audit import load_planned
from gc_worker.db import transaction
from gc_worker.execute import execute as run_executor
from gc_worker.read_rule import current_memories
from gc_worker.report import build_report
from gc_worker.restore import restore_run
from tests.conftest import TEST_DIM, check_round_trip
from tests.fake_model import FakeModel, fake_port
from tests.store import NOW, acted_on, add, city_pair, days_ago, execute, get, run, status
from tests.test_compaction import E0, unit
from tests.test_erasure_helpers import merge, requests

# what the request path writes when it puts a memory into a model context, and the worker's
# own score refresh (another run of the user between plan and apply)
READ = (
    "UPDATE memories SET last_accessed_at = :now, access_count = access_count + 1,"
    " decayed_confidence = 0.5 WHERE id = ANY(:ids)"
)

EDITS = [
    "UPDATE memories SET content = 'Lives in Lyon' WHERE id = ANY(:ids)",
    "UPDATE memories SET metadata = jsonb_build_object('turn', 7) WHERE id = ANY(:ids)",
    "UPDATE memories SET pinned = true WHERE id = ANY(:ids)",
    "UPDATE memories SET importance = 5 WHERE id = ANY(:ids)",
    "UPDATE memories SET valid_from = now() - interval '3 days' WHERE id = ANY(:ids)",
    "UPDATE memories SET updated_at = now() WHERE id = ANY(:ids)",
]


def apply(engine, plan):
    run_id = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    with engine.connect() as conn:
        return build_report(conn, run_id)


class TestContradiction:
    @pytest.mark.parametrize("read", ["older", "newer", "both"])
    def test_a_read_between_plan_and_apply_does_not_drift_the_obsolete(
        self, engine, settings, read
    ):
        old, new = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        assert acted_on(plan, "obsolete") == {str(old)}
        ids = {"older": [old], "newer": [new], "both": [old, new]}[read]
        execute(engine, READ, ids=ids, now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == [] and acted_on(applied) == {str(old)}
        closed = get(engine, old)
        assert closed["status"] == "obsolete" and closed["superseded_by"] == new
        if read != "newer":  # what the read wrote stands
            assert closed["access_count"] == 1 and closed["last_accessed_at"] == NOW

    @pytest.mark.parametrize("edit", EDITS)
    @pytest.mark.parametrize("target", ["older", "newer"])
    def test_any_other_write_still_drifts_it(self, engine, settings, edit, target):
        """Of the older fact: its action drifts; of the newer one: the premise is broken."""
        old, new = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        execute(engine, edit, ids=[old if target == "older" else new])
        applied = apply(engine, plan)
        assert [d["memory_id"] for d in applied["drifted"]] == [str(old)]
        assert status(engine, old) == "active" and get(engine, old)["valid_until"] is None

    def test_a_plan_recorded_with_xmin_drifts(self, engine, settings):
        """A plan made before the content version (its obsolete carries ``xmin``) is not applied
        on a version it did not record: it drifts and is planned again."""
        old, _ = city_pair(engine)
        plan = run(engine, settings, jobs=["contradiction"], dry_run=True)
        execute(
            engine,
            "UPDATE gc_actions a SET row_version = m.xmin::text::bigint FROM memories m"
            " WHERE a.run_id = :run AND a.memory_id = m.id",
            run=UUID(plan["run_id"]),
        )
        applied = apply(engine, plan)
        assert len(applied["drifted"]) == 1 and status(engine, old) == "active"


class TestPremiseOfAHeldRow:
    """The newer fact is both the premise of the obsolete and, in the same batch, re-assessed by
    importance; the application holds it while the plan is applied. Share-locking it as a
    premise must not count as the lock its own action needs."""

    @staticmethod
    def plan(engine, settings):
        old, new = city_pair(engine)
        with fake_port(engine, settings, FakeModel("good", dim=TEST_DIM)) as llm:
            jobs = ["importance", "contradiction"]
            plan = run(engine, settings, jobs=jobs, dry_run=True, llm=llm)
        assert str(new) in acted_on(plan, "set_importance")
        assert acted_on(plan, "obsolete") == {str(old)}
        return old, new, plan

    def test_its_own_action_drifts_and_the_run_restores(self, engine, settings):
        """Held FOR KEY SHARE (what an insert referencing it takes): its set_importance drifts —
        applied, it had no prior state in the audit and the run's restore failed."""
        old, new, plan = self.plan(engine, settings)
        with engine.connect() as app:
            app.execute(sa.text("SELECT 1 FROM memories WHERE id = :id FOR KEY SHARE"), {"id": new})
            applied = apply(engine, plan)
            app.rollback()
        assert (str(new), "set_importance") in {
            (d["memory_id"], d["action"]) for d in applied["drifted"]
        }
        restore_run(engine, UUID(applied["run_id"]), now=NOW + timedelta(hours=1))
        assert status(engine, old) == "active" and get(engine, new)["importance"] == 3

    def test_the_executor_does_not_wait_for_it(self, engine, settings):
        """Held FOR SHARE: the executor skips its action instead of waiting on the lock."""
        _, new, plan = self.plan(engine, settings)
        with engine.connect() as conn:
            actions = load_planned(conn, UUID(plan["run_id"]), 0)
        with engine.connect() as app:
            app.execute(sa.text("SELECT 1 FROM memories WHERE id = :id FOR SHARE"), {"id": new})
            with engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
                outcome = run_executor(conn, actions, now=NOW)
            app.rollback()
        assert new in {a.memory_id for a in outcome.drifted if a.action is Kind.SET_IMPORTANCE}


class TestCompaction:
    def test_a_read_of_a_member_does_not_drift_the_merge(self, engine, settings):
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", "has a dog named Rex", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        assert acted_on(plan, "merge") == {str(a), str(b)}
        execute(engine, READ, ids=[a], now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == []
        assert status(engine, a) == status(engine, b) == "merged"

    def test_the_merged_record_keeps_the_reads_made_after_planning(self, engine, settings):
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(120), embedding=E0,
                last_accessed_at=days_ago(100), access_count=3)  # fmt: skip
        add(engine, "u1", "has a dog named Rex", created_at=days_ago(110), embedding=E0,
            last_accessed_at=days_ago(95), access_count=2)  # fmt: skip
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        execute(engine, READ, ids=[a], now=NOW)
        apply(engine, plan)
        record = get(engine, get(engine, a)["superseded_by"])
        assert record["access_count"] == 3 + 1 + 2 and record["last_accessed_at"] == NOW

    def test_a_fact_read_after_planning_is_not_pruned_as_unused(self, engine, settings):
        """Members last used 89 days ago, one used again before the apply: the merged record
        is not unused two days later (usage_prune, unused_days = 90)."""
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(120), embedding=E0,
                last_accessed_at=days_ago(89), importance=2)  # fmt: skip
        add(engine, "u1", "has a dog named Rex", created_at=days_ago(110), embedding=E0,
            last_accessed_at=days_ago(89.5), importance=2)  # fmt: skip
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        execute(engine, READ, ids=[a], now=NOW + timedelta(hours=12))
        apply(engine, plan)
        record = get(engine, a)["superseded_by"]
        later = run(engine, settings, jobs=["usage_prune"], now=NOW + timedelta(days=2))
        assert str(record) not in acted_on(later) and status(engine, record) == "active"

    def test_a_new_embedding_of_a_member_drifts_the_merge(self, engine, settings):
        """Re-embedded (a new embeddings model) after planning: the record would keep the old
        model's vector, copied or averaged from the members as planned."""
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", "has a dog named Rex", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        vector = "[" + ",".join(map(str, unit(1.0, 3))) + "]"
        execute(engine, "UPDATE memories SET embedding = CAST(:v AS vector) WHERE id = :id",
                v=vector, id=b)  # fmt: skip
        applied = apply(engine, plan)
        assert {d["memory_id"] for d in applied["drifted"]} >= {str(a), str(b)}
        assert status(engine, a) == status(engine, b) == "active"

    def test_an_edit_of_a_member_drifts_the_whole_merge(self, engine, settings):
        a = add(engine, "u1", "Has a dog named Rex.", created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", "has a dog named Rex", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        execute(engine, "UPDATE memories SET content = 'Had a dog' WHERE id = ANY(:ids)", ids=[a])
        applied = apply(engine, plan)
        assert {d["memory_id"] for d in applied["drifted"]} >= {str(a), str(b)}
        assert status(engine, a) == status(engine, b) == "active"
        assert execute(engine, "SELECT count(*) FROM memories").scalar() == 2


class TestImportance:
    """A model's importance score rests on the text it read: a read does not drift it."""

    @staticmethod
    def plan(engine, settings):
        fact = add(engine, "u1", "Is training for a marathon in April")
        with fake_port(engine, settings, FakeModel("good", dim=TEST_DIM)) as llm:
            plan = run(engine, settings, jobs=["importance"], dry_run=True, llm=llm)
        assert acted_on(plan, "set_importance") == {str(fact)}
        return fact, plan

    def test_a_read_between_plan_and_apply_does_not_drift_the_score(self, engine, settings):
        fact, plan = self.plan(engine, settings)
        execute(engine, READ, ids=[fact], now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == [] and get(engine, fact)["importance_assessed_at"] is not None

    def test_an_edit_drifts_it(self, engine, settings):
        fact, plan = self.plan(engine, settings)
        execute(engine, "UPDATE memories SET content = 'Gave up running' WHERE id = :id", id=fact)
        applied = apply(engine, plan)
        assert [d["memory_id"] for d in applied["drifted"]] == [str(fact)]
        assert get(engine, fact)["importance_assessed_at"] is None


class TestErasure:
    def test_a_memory_read_after_planning_is_still_forgotten(self, engine, settings):
        """The user keeps talking; the application keeps retrieving the memory they asked to be
        forgotten until it is gone. With xmin each read drifted the erasure and the request
        stayed pending (under plan_then_apply, night after night)."""
        fact = add(engine, "u1", "Lives at 12 Rue de Rivoli")
        add(engine, "u1", "Likes chess")
        with transaction(engine) as conn:
            erasure.file_request(conn, memory_id=fact)
        plan = run(engine, settings, jobs=["erasure"], dry_run=True)
        execute(engine, READ, ids=[fact], now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == [] and get(engine, fact)["status_reason"] == "erasure"
        assert requests(engine)[0]["status"] == "completed"

    def test_an_edit_after_planning_waits_for_the_next_run(self, engine, settings):
        fact = add(engine, "u1", "Lives at 12 Rue de Rivoli")
        with transaction(engine) as conn:
            erasure.file_request(conn, memory_id=fact)
        plan = run(engine, settings, jobs=["erasure"], dry_run=True)
        execute(engine, "UPDATE memories SET content = 'Lives at 14' WHERE id = :id", id=fact)
        apply(engine, plan)
        assert status(engine, fact) == "active" and requests(engine)[0]["status"] == "pending"
        run(engine, settings, jobs=["erasure"])
        assert get(engine, fact)["status_reason"] == "erasure"
        assert requests(engine)[0]["status"] == "completed"


class TestLinksMadeSincePlanning:
    """Links between rows are in no row's version: the ones a merge or an erasure purge rests on
    are checked again at apply. (With xmin the read that comes with them usually drifted the
    action; without the read these were gaps before too.)"""

    def test_a_purge_now_waits_for_a_record_derived_after_planning(self, engine, settings):
        """forget --purge-now: the application reads the memory and stores a summary of it
        (lineage) before the apply. The purge would cascade the lineage away and the request
        complete with the summary active; it drifts instead, and the next run erases both."""
        fact = add(engine, "u1", "Lives at 12 Rue de Rivoli")
        with transaction(engine) as conn:
            erasure.file_request(conn, memory_id=fact, purge_now=True)
        plan = run(engine, settings, jobs=["erasure"], dry_run=True)
        summary = add(engine, "u1", "Home: 12 Rue de Rivoli, Paris")
        execute(engine, READ, ids=[fact], now=NOW)
        execute(engine, "INSERT INTO memory_lineage (derived_id, source_id) VALUES (:d, :s)",
                d=summary, s=fact)  # fmt: skip
        applied = apply(engine, plan)
        assert ("hard_delete", str(fact)) in {
            (d["action"], d["memory_id"]) for d in applied["drifted"]
        }
        assert requests(engine)[0]["status"] == "pending" and get(engine, fact) is not None
        run(engine, settings, jobs=["erasure"])
        assert get(engine, fact) is None and get(engine, summary) is None
        assert requests(engine)[0]["status"] == "completed"

    def test_a_merge_waits_when_its_members_were_declared_superseded(self, engine, settings):
        """The agent retrieves two copies of a fact, the user corrects it, and the application
        writes the correction declaring it supersedes both: merged, the stale fact (a new id
        no declaration names) would be current again beside its correction."""
        a = add(engine, "u1", "Lives in Paris.", created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", "lives in paris", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        assert acted_on(plan, "merge") == {str(a), str(b)}
        execute(engine, READ, ids=[a, b], now=NOW)
        add(engine, "u1", "Moved to Berlin", created_at=days_ago(1), supersedes=[a, b])
        applied = apply(engine, plan)
        assert {d["memory_id"] for d in applied["drifted"]} >= {str(a), str(b)}
        assert status(engine, a) == status(engine, b) == "active"
        current = [m["content"] for m in current_memories(engine, "u1", None, NOW)]
        assert current == ["Moved to Berlin"]

    @pytest.mark.parametrize(("declarer", "drifts"), [("obsolete", True), ("deleted", False)])
    def test_which_declarations_hold_a_merge(self, engine, settings, declarer, drifts):
        """The declarers compaction itself leaves rows out for (active, obsolete) hold the
        merge; a deleted one does not."""
        a = add(engine, "u1", "Lives in Paris.", created_at=days_ago(9), embedding=E0)
        add(engine, "u1", "lives in paris", created_at=days_ago(4), embedding=E0)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        add(engine, "u1", "Moved to Berlin", supersedes=[a], status=declarer)
        applied = apply(engine, plan)
        assert bool(applied["drifted"]) is drifts
        assert status(engine, a) == ("active" if drifts else "merged")


class TestAccessCountRange:
    def test_a_sum_just_inside_the_integer_range_is_kept(self, engine, settings):
        a = add(engine, "u1", "Has a dog named Rex.", embedding=E0, access_count=2_147_483_000)
        b = add(engine, "u1", "has a dog named Rex", embedding=E0, access_count=645)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        execute(engine, READ, ids=[b], now=NOW)
        apply(engine, plan)
        record = get(engine, get(engine, a)["superseded_by"])
        assert record["access_count"] == 2**31 - 2

    def test_a_sum_of_uses_past_the_integer_range_is_held_to_it(self, engine, settings):
        """Members used 2,147,483,000 and 1,000 times (and once more after planning): the
        merged record's access_count is the column's maximum, not a failed batch."""
        a = add(engine, "u1", "Has a dog named Rex.", embedding=E0, access_count=2_147_483_000)
        b = add(engine, "u1", "has a dog named Rex", embedding=E0, access_count=1_000)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        assert acted_on(plan, "merge") == {str(a), str(b)}
        execute(engine, READ, ids=[b], now=NOW)
        applied = apply(engine, plan)
        assert applied["drifted"] == [] and applied["status"] == "completed"
        record = get(engine, get(engine, a)["superseded_by"])
        assert record["access_count"] == 2**31 - 1


class TestAccessRulesKeepXmin:
    def test_a_read_still_drifts_a_usage_prune(self, engine, settings):
        """usage_prune decides on the last use: a use since planning wins."""
        unused = add(engine, "u1", "never used", created_at=days_ago(200), importance=3)
        plan = run(engine, settings, jobs=["usage_prune"], dry_run=True)
        assert acted_on(plan) == {str(unused)}
        execute(engine, READ, ids=[unused], now=NOW)
        applied = apply(engine, plan)
        assert [d["memory_id"] for d in applied["drifted"]] == [str(unused)]
        assert status(engine, unused) == "active"

    def test_every_planned_version_is_the_one_its_job_compares(self, engine, settings):
        """The versions a dry run records: content versions for CONTENT_VERSIONED actions,
        xmin for the rest — the executor compares each against the same kind."""
        city_pair(engine)
        add(engine, "u1", "Has a cat", embedding=E0)
        add(engine, "u1", "has a cat", embedding=E0)
        add(engine, "u1", "expired", expires_at=days_ago(1))
        add(engine, "u1", "never used", created_at=days_ago(200), importance=3)
        add(engine, "u1", "Is training for a marathon in April")
        # forgetting one source of a merged record: the record is erased, the other source
        # reactivated (restore), both purged at once (purge_now: hard_delete)
        forgotten = add(engine, "u1", "Lives at 12 Rue de Rivoli")
        other = add(engine, "u1", "Lives near the Louvre")
        merge(engine, "u1", [forgotten, other], "Lives at 12 Rue de Rivoli, near the Louvre", E0)
        with transaction(engine) as conn:
            erasure.file_request(conn, memory_id=forgotten, purge_now=True)
        with fake_port(engine, settings, FakeModel("good", dim=TEST_DIM)) as llm:
            plan = run(engine, settings, dry_run=True, llm=llm)
        rows = execute(
            engine,
            "SELECT a.job, a.action, a.row_version, m.xmin::text::bigint AS xmin,"
            " memory_gc_content_version(m) AS content FROM gc_actions a"
            " JOIN memories m ON m.id = a.memory_id"
            " WHERE a.run_id = :run AND a.row_version IS NOT NULL",
            run=UUID(plan["run_id"]),
        ).all()
        kinds = {(r.job, Kind(r.action)) for r in rows}
        assert kinds >= CONTENT_VERSIONED and len(kinds) > len(CONTENT_VERSIONED)
        for r in rows:
            versioned = (r.job, Kind(r.action)) in CONTENT_VERSIONED
            assert r.row_version == (r.content if versioned else r.xmin), r


def test_migration_0010_round_trip(empty_database_url):
    exists = "SELECT count(*) FROM pg_proc WHERE proname = 'memory_gc_content_version'"
    check_round_trip(empty_database_url, "0010", "0009", exists, present=1)
