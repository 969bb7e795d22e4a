"""A purge of erased rows waits while what a forget request reaches through the row's lineage is
not erased: the purge's ON DELETE CASCADE drops that lineage, and the request would complete
(verify-erasure clean) with the text still stored. (gc_worker.purge_holds.hold_purges; found by a
review of the content-version change, which let such purges apply after a mere read.)"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import sqlalchemy as sa

from gc_worker import engine as gc_engine
from gc_worker import erasure
from gc_worker.db import transaction
from gc_worker.report import build_report
from tests.store import NOW, add, execute, get, run, status
from tests.test_compaction import E0
from tests.test_erasure_helpers import merge, requests

LINK = "INSERT INTO memory_lineage (derived_id, source_id) VALUES (:d, :s)"
HOLD = "SELECT 1 FROM memories WHERE id = :id FOR NO KEY UPDATE"  # a touch in progress


def apply(engine, plan):
    run_id = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
    with engine.connect() as conn:
        return build_report(conn, run_id)


def erased(engine, memory_id) -> bool:
    row = get(engine, memory_id)
    return row is None or (row["status"], row["status_reason"]) == ("deleted", "erasure")


def fact_and_summary(engine) -> tuple[UUID, UUID]:
    fact = add(engine, "u1", "Lives at 12 Rue de Rivoli")
    summary = add(engine, "u1", "Home: 12 Rue de Rivoli, Paris")
    execute(engine, LINK, d=summary, s=fact)
    return fact, summary


def forget_later(engine, fact, **kw):
    with transaction(engine) as conn:
        erasure.file_request(conn, memory_id=fact, **kw)


class TestPurgeNow:
    def test_a_derived_record_erased_in_the_same_batch_does_not_hold_the_purge(
        self, engine, settings
    ):
        """Just outside: the summary existed at planning and its erasure applies beside the
        fact's: both are purged and the request completes in one run."""
        fact, summary = fact_and_summary(engine)
        erasure.forget(engine, settings, now=NOW, memory_id=fact, purge_now=True)
        assert get(engine, fact) is None and get(engine, summary) is None
        assert requests(engine)[0]["status"] == "completed"

    def test_a_derived_record_of_another_user_does_not_hold_the_purge(self, engine, settings):
        """Lineage to another user's record (which the worker never writes) is not followed."""
        fact = add(engine, "u1", "Lives at 12 Rue de Rivoli")
        foreign = add(engine, "u2", "Summary mentioning Rue de Rivoli")
        execute(engine, LINK, d=foreign, s=fact)
        erasure.forget(engine, settings, now=NOW, memory_id=fact, purge_now=True)
        assert get(engine, fact) is None and status(engine, foreign) == "active"
        assert requests(engine)[0]["status"] == "completed"

    def test_a_derived_records_erasure_that_drifts_holds_the_purge(self, engine, settings):
        """The summary is edited between plan and apply: its erasure drifts, so the fact's
        purge must not apply (it counted the summary as erased in this batch)."""
        fact, summary = fact_and_summary(engine)
        forget_later(engine, fact, purge_now=True)
        plan = run(engine, settings, jobs=["erasure"], dry_run=True)
        execute(engine, "UPDATE memories SET content = 'Home: Rivoli 12' WHERE id = :id",
                id=summary)  # fmt: skip
        apply(engine, plan)
        assert get(engine, fact) is not None and requests(engine)[0]["status"] == "pending"
        run(engine, settings, jobs=["erasure"], now=NOW + timedelta(days=1))
        assert erased(engine, summary) and get(engine, fact) is None
        assert requests(engine)[0]["status"] == "completed"

    def test_a_plain_purge_now_while_the_app_holds_the_summary(self, engine, settings):
        """forget --purge-now (plan and apply in one transaction) while a request-path
        transaction holds the summary: its erasure is skipped, the purge waits, the request
        stays pending and verify-erasure does not call the store clean."""
        from gc_worker.verify_erasure import verify

        fact, summary = fact_and_summary(engine)
        with engine.connect() as app:
            app.execute(sa.text(HOLD), {"id": summary})
            erasure.forget(engine, settings, now=NOW, memory_id=fact, purge_now=True)
            app.rollback()
        assert requests(engine)[0]["status"] == "pending" and get(engine, fact) is not None
        assert not verify(engine, now=NOW, memory_id=fact).clean
        run(engine, settings, jobs=["erasure"])
        assert erased(engine, summary) and requests(engine)[0]["status"] == "completed"

    def test_a_record_derived_from_the_summary_after_planning(self, engine, settings):
        """The application derives a note from the summary before the apply: the summary's
        purge waits for the note, and with it the fact's (same request)."""
        fact, summary = fact_and_summary(engine)
        forget_later(engine, fact, purge_now=True)
        plan = run(engine, settings, jobs=["erasure"], dry_run=True)
        note = add(engine, "u1", "Paris flat near the Louvre")
        execute(engine, LINK, d=note, s=summary)
        apply(engine, plan)
        assert requests(engine)[0]["status"] == "pending"
        run(engine, settings, jobs=["erasure"], now=NOW + timedelta(days=1))
        assert all(erased(engine, m) for m in (fact, summary, note))
        assert requests(engine)[0]["status"] == "completed"

    def test_a_merged_record_whose_member_is_held(self, engine, settings):
        """forget --purge-now of a merged record erases its members too; a member an
        application transaction holds is skipped, so the record's purge waits (the request
        reaches the member through the lineage the purge would drop)."""
        a = add(engine, "u1", "Home is number 12, Rue de Rivoli", embedding=E0)
        b = add(engine, "u1", "lives at 12 rue de rivoli", embedding=E0)
        m = merge(engine, "u1", [a, b], "Lives at 12 Rue de Rivoli", E0)
        with engine.connect() as app:
            app.execute(sa.text("SELECT 1 FROM memories WHERE id = :id FOR KEY SHARE"), {"id": a})
            erasure.forget(engine, settings, now=NOW, memory_id=m, purge_now=True)
            app.rollback()
        assert requests(engine)[0]["status"] == "pending" and get(engine, m) is not None
        run(engine, settings, jobs=["erasure"], now=NOW + timedelta(days=1))
        assert all(erased(engine, x) for x in (a, b, m))
        assert requests(engine)[0]["status"] == "completed"


class TestRetentionPurge:
    def setup_pending(self, engine, settings):
        """The fact is erased, the request pending on a summary derived after planning."""
        fact = add(engine, "u1", "Lives at 12 Rue de Rivoli")
        forget_later(engine, fact)
        plan = run(engine, settings, jobs=["erasure"], dry_run=True)
        summary = add(engine, "u1", "Home: 12 Rue de Rivoli, Paris")
        execute(engine, LINK, d=summary, s=fact)
        apply(engine, plan)
        assert status(engine, fact) == "deleted" and requests(engine)[0]["status"] == "pending"
        return fact, summary

    def test_hard_delete_waits_while_the_summary_is_held(self, engine, settings):
        """Two days on (erasure retention 1 day), the summary's erasure is skipped (held):
        hard_delete's purge of the fact waits instead of cutting the request's lineage."""
        fact, summary = self.setup_pending(engine, settings)
        later = NOW + timedelta(days=2)
        with engine.connect() as app:
            app.execute(sa.text(HOLD), {"id": summary})
            run(engine, settings, jobs=["erasure", "hard_delete"], now=later)
            app.rollback()
        assert get(engine, fact) is not None and requests(engine)[0]["status"] == "pending"
        run(engine, settings, jobs=["erasure", "hard_delete"], now=later)
        assert erased(engine, summary) and requests(engine)[0]["status"] == "completed"

    def test_a_hard_delete_only_run_waits_for_the_erasure(self, engine, settings):
        fact, summary = self.setup_pending(engine, settings)
        later = NOW + timedelta(days=2)
        report = run(engine, settings, jobs=["hard_delete"], now=later)
        assert [d["memory_id"] for d in report["drifted"]] == [str(fact)]
        run(engine, settings, jobs=["erasure"], now=later)
        assert erased(engine, summary) and requests(engine)[0]["status"] == "completed"
