"""What a purge (hard_delete after retention) leaves in the worker's own tables: ids and codes,
never the purged rows' content — also where a merged or summary text quotes them (a stored
plan's record, the model's cached merge text)."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import sqlalchemy as sa

from gc_worker import engine as gc_engine
from tests.fake_model import FakeModel, fake_port
from tests.store import NOW, add, days_ago, run
from tests.test_compaction import E0, unit
from tests.test_erasure_helpers import count

SECRET = "My bank PIN is 4921"
LEAKS = "SELECT count(*) FROM gc_actions WHERE content_preview LIKE :t OR details::text LIKE :t"


def expiring_duplicates(engine, user: str = "u1", text: str = SECRET) -> list[UUID]:
    """Two exact duplicates that a TTL run at NOW + 2 days soft-deletes."""
    return [
        add(engine, user, text, embedding=E0, created_at=days_ago(3),
            expires_at=NOW + timedelta(days=1))
        for _ in range(2)
    ]  # fmt: skip


def purge(engine, settings, days: int = 40) -> dict:
    """Expire the TTL rows, then purge what is past retention ``days`` after NOW."""
    run(engine, settings, jobs=["ttl_expiry"], now=NOW + timedelta(days=2))
    return run(engine, settings, jobs=["hard_delete"], now=NOW + timedelta(days=days))


def created_rows(engine) -> list[dict]:
    """The create_merged audit and plan rows, by user."""
    sql = sa.text(
        "SELECT user_id, memory_id, content_preview, details FROM gc_actions"
        " WHERE action = 'create_merged' ORDER BY user_id"
    )
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(sql).mappings()]


class TestMergedTextsInPlans:
    def test_an_unapplied_plan_loses_the_merged_text_of_purged_rows(self, engine, settings):
        """A dry run planned a merge nobody applied; its members expired and were purged. The
        plan's merged record (a record that never existed: content, embedding, preview) is
        scrubbed like an erased row's audit: ids and codes stay (it used to keep the text)."""
        members = expiring_duplicates(engine)
        run(engine, settings, jobs=["compaction"], dry_run=True)
        purged = purge(engine, settings)
        assert {a["memory_id"] for a in purged["actions"]} == {str(m) for m in members}
        assert count(engine, LEAKS, t="%PIN%") == 0
        [row] = created_rows(engine)
        assert row["content_preview"] is None and row["details"]["scrubbed"] is True
        assert set(row["details"]["sources"]) == {str(m) for m in members}
        assert "record" not in row["details"] and row["memory_id"] is not None

    def test_a_plan_over_rows_still_there_keeps_its_text(self, engine, settings):
        """Only plans naming a purged row are scrubbed: another user's plan, whose rows are
        still in the store, stays applicable as it was."""
        expiring_duplicates(engine, "u1")
        kept = [add(engine, "u2", "Has a dog", embedding=E0) for _ in range(2)]
        run(engine, settings, jobs=["compaction"], dry_run=True)
        purge(engine, settings)
        other, scrubbed = sorted(created_rows(engine), key=lambda r: r["user_id"] != "u2")
        assert other["content_preview"] == "Has a dog"
        assert other["details"]["record"]["content"] == "Has a dog"
        assert set(other["details"]["sources"]) == {str(m) for m in kept}
        assert scrubbed["details"].get("scrubbed") is True

    def test_the_audit_of_an_applied_merge_loses_the_text_with_its_members(self, engine, settings):
        """An applied merge whose members history retention purged: its create_merged audit
        row names them and quotes them; it is scrubbed (the merged record itself, a memory
        of its own, stays in the store)."""
        members = [add(engine, "u1", SECRET, embedding=E0, created_at=days_ago(3)) for _ in "ab"]
        merged = run(engine, settings, jobs=["compaction"])
        record = next(a["memory_id"] for a in merged["actions"] if a["action"] == "create_merged")
        purged = run(engine, settings, jobs=["hard_delete"], now=NOW + timedelta(days=365))
        assert {a["memory_id"] for a in purged["actions"]} == {str(m) for m in members}
        assert count(engine, LEAKS, t="%PIN%") == 0
        assert count(engine, "SELECT count(*) FROM memories WHERE id = :id", id=record) == 1

    def test_a_scrubbed_plan_applies_as_drifted(self, engine, settings):
        """Applying the scrubbed plan later creates nothing: its members are gone."""
        expiring_duplicates(engine)
        plan = run(engine, settings, jobs=["compaction"], dry_run=True)
        purge(engine, settings)
        gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        assert count(engine, "SELECT count(*) FROM memories") == 0


class TestLLMCache:
    def test_cached_merge_texts_of_purged_rows_are_dropped(self, engine, settings):
        """The model's merge text for the members stays cached after the merge; once members
        and merged record are purged, the cache entry goes too (it used to stay). A cached
        decision about rows still in the store (u2's, merged later) stays."""
        cached = "SELECT count(*) FROM gc_llm_cache WHERE value::text LIKE :t"
        for user, text, at in (
            ("u1", "the spare key is under the blue flowerpot", NOW),
            ("u2", "the bike is in the red shed", NOW + timedelta(days=300)),
        ):
            expires = NOW + timedelta(days=1) if user == "u1" else None
            add(
                engine,
                user,
                f"Keeps {text}",
                embedding=E0,
                created_at=days_ago(3),
                expires_at=expires,
            )
            add(
                engine,
                user,
                f"Always keeps {text}",
                embedding=unit(0.05),
                created_at=days_ago(3),
                expires_at=expires,
            )
            with fake_port(engine, settings, FakeModel("good")) as llm:
                report = run(engine, settings, jobs=["compaction"], llm=llm, users=[user], now=at)
            assert report["totals"]["by_action"].get("create_merged") == 1, report["totals"]
        assert count(engine, cached, t="%flowerpot%") == 1
        purged = purge(engine, settings, days=400)
        assert len(purged["actions"]) == 3  # u1's members and merged record
        assert count(engine, cached, t="%flowerpot%") == 0
        assert count(engine, cached, t="%red shed%") == 1
