"""The deterministic lifecycle jobs against the real database: each threshold just inside and
just outside, pinned rows untouched."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from gc_worker.config import DecaySettings, Settings, UserCapSettings
from jobs.decay import decayed_confidence
from tests.store import NOW, acted_on, add, days_ago, execute, get, run, status

SECOND = timedelta(seconds=1)


class TestTTLExpiry:
    def test_expired_at_now_is_deleted_one_second_later_is_not(self, engine, settings):
        """expires_at == now expires; now + 1 s does not."""
        at_now = add(engine, expires_at=NOW)
        later = add(engine, expires_at=NOW + SECOND)
        report = run(engine, settings, jobs=["ttl_expiry"])
        assert acted_on(report) == {str(at_now)}
        assert get(engine, at_now)["status_reason"] == "ttl_expired"
        assert status(engine, later) == "active"

    def test_pinned_and_retired_rows_untouched(self, engine, settings):
        """A pinned or already-obsolete expired row is not changed."""
        pinned = add(engine, expires_at=days_ago(3), pinned=True)
        obsolete = add(engine, expires_at=days_ago(3), status="obsolete")
        assert run(engine, settings, jobs=["ttl_expiry"])["actions"] == []
        assert status(engine, pinned) == "active"
        assert status(engine, obsolete) == "obsolete"


class TestDecay:
    def test_score_is_pure_function_of_columns(self, engine, settings):
        """The SQL score equals the Python twin, and a second run rewrites nothing."""
        m = add(engine, created_at=days_ago(45), importance=3, confidence=0.8)
        first = run(engine, settings, jobs=["decay"])
        expected = decayed_confidence(0.8, 3, days_ago(45), now=NOW, policy=settings.decay)
        assert abs(get(engine, m)["decayed_confidence"] - expected) < 1e-6
        assert first["jobs"]["decay"]["refreshed"] == 1
        assert run(engine, settings, jobs=["decay"])["jobs"]["decay"]["refreshed"] == 0

    def test_python_twin_matches_sql_function(self, engine, settings):
        """memory_gc_decayed and jobs.decay.decayed_confidence agree across ages and levels."""
        cases = [(c, i, d) for c in (0.3, 1.0) for i in (1, 3, 5) for d in (0, 1, 29.5, 300, 5000)]
        with engine.connect() as conn:
            for confidence, importance, age in cases:
                sql = conn.execute(
                    text(
                        "SELECT memory_gc_decayed(CAST(:c AS real), CAST(:i AS smallint), :a, :n,"
                        " :h, :m)"
                    ),
                    {"c": confidence, "i": importance, "a": days_ago(age), "n": NOW,
                     "h": 30.0, "m": [0.5, 0.75, 1.0, 2.0, 4.0]},
                ).scalar()  # fmt: skip
                py = decayed_confidence(
                    confidence, importance, days_ago(age), now=NOW, policy=settings.decay
                )
                assert abs(sql - py) < 1e-6 * max(py, 1e-30), (confidence, importance, age)

    def test_an_anchor_before_year_1_scores_as_sql_scores_it(self, engine):
        """A row whose every instant is -infinity: memory_gc_decayed scores it 0 (the refresh
        stores 0, under the floor), but the Python twin read the instant as year 1 (the
        loader's stand-in), and with a long half-life scored it far above the floor. Found by a
        review: the row was picked every night and never forgotten."""
        from gc_worker.config import Settings

        long = Settings.model_validate(
            {"embeddings": {"dim": 8}, "decay": {"half_life_days": 1_000_000}}
        )
        m = add(engine, importance=1)
        execute(engine, "UPDATE memories SET created_at = '-infinity', updated_at = '-infinity',"
                        " observed_at = '-infinity' WHERE id = :id", id=m)  # fmt: skip
        run(engine, long, jobs=["decay"])
        assert (get(engine, m)["status"], get(engine, m)["status_reason"]) == (
            "deleted", "decayed",
        )  # fmt: skip

    def test_extreme_age_scores_zero_without_error(self, engine, settings):
        """A row thousands of half-lives old scores 0 instead of failing on underflow."""
        m = add(engine, created_at=days_ago(20_000), importance=1, pinned=False)
        run(engine, settings, jobs=["decay"], dry_run=False)
        assert get(engine, m)["status_reason"] == "decayed"

    def test_future_timestamps_do_not_inflate(self, engine, settings):
        """A created_at in the future counts as age 0: score equals confidence."""
        m = add(engine, created_at=NOW + timedelta(days=30), confidence=0.7)
        run(engine, settings, jobs=["decay"])
        assert abs(get(engine, m)["decayed_confidence"] - 0.7) < 1e-6

    def test_epsilon_bounds_rewrites(self, engine, settings):
        """A score that moved by less than epsilon is left; one that moved more is rewritten."""
        m = add(engine, created_at=days_ago(10))
        run(engine, settings, jobs=["decay"], now=NOW)
        # ~0.0046 drop over 6 hours at 30-day half-life from 0.79: under epsilon 0.01
        assert (
            run(engine, settings, jobs=["decay"], now=NOW + timedelta(hours=6))["jobs"]["decay"][
                "refreshed"
            ]
            == 0
        )
        report = run(engine, settings, jobs=["decay"], now=NOW + timedelta(days=2))
        assert report["jobs"]["decay"]["refreshed"] == 1
        assert get(engine, m)["decayed_confidence"] < 0.78

    def test_anchor_is_latest_of_created_updated_accessed(self, engine, settings):
        """A recent access resets the age used for decay."""
        m = add(engine, created_at=days_ago(300), last_accessed_at=days_ago(1))
        run(engine, settings, jobs=["decay"])
        assert get(engine, m)["decayed_confidence"] > 0.97

    def test_forget_floor_just_inside_and_outside(self, engine):
        """Score just under forget_below is forgotten; just over is kept."""
        policy = DecaySettings(half_life_days=30, importance_multipliers=(1, 1, 1, 1, 1))
        settings = Settings(decay=policy)
        # confidence × 0.5^(age/30) = 0.05 at age = 30 × log2(conf / 0.05)
        below = add(engine, created_at=days_ago(30 * 4.33), confidence=1.0, importance=1)
        above = add(engine, created_at=days_ago(30 * 4.31), confidence=1.0, importance=1)
        report = run(engine, settings, jobs=["decay"])
        assert acted_on(report) == {str(below)}
        assert get(engine, below)["status_reason"] == "decayed"
        assert status(engine, above) == "active"

    def test_forget_only_low_importance(self, engine, settings):
        """Importance above forget_max_importance is never forgotten by decay."""
        low = add(engine, created_at=days_ago(400), importance=2)
        high = add(engine, created_at=days_ago(400), importance=3)
        report = run(engine, settings, jobs=["decay"])
        assert acted_on(report) == {str(low)}
        assert status(engine, high) == "active"

    def test_grace_period_just_inside_and_outside(self, engine):
        """A row younger than grace_days is never forgotten, however low its score."""
        settings = Settings(decay=DecaySettings(half_life_days=0.1, grace_days=14))
        young = add(engine, created_at=NOW - timedelta(days=14) + SECOND, importance=1)
        old = add(engine, created_at=NOW - timedelta(days=14), importance=1)
        report = run(engine, settings, jobs=["decay"])
        assert acted_on(report) == {str(old)}
        assert status(engine, young) == "active"

    @pytest.mark.parametrize("edge", [1e-6, 1e12])
    def test_the_half_life_bounds_are_finite_in_sql(self, engine, edge):
        """At either edge of half_life_days and of the multipliers, a row written in 1971
        decays at a clock in year 9000 (the run's bounds) without the server's float8
        overflow, which 1e308 made fail the batch; just past them is refused."""
        policy = DecaySettings(half_life_days=edge, importance_multipliers=(edge,) * 5)
        far = NOW.replace(year=9000)
        old = add(engine, created_at=NOW.replace(year=1971), importance=5)
        report = run(engine, Settings(decay=policy), jobs=["decay"], now=far)
        assert report["status"] == "completed"
        expected = 0.0 if edge < 1 else 1.0
        assert abs(get(engine, old)["decayed_confidence"] - expected) < 1e-3
        with pytest.raises(ValidationError):
            DecaySettings(half_life_days=edge * (0.5 if edge < 1 else 2))
        with pytest.raises(ValidationError):
            DecaySettings(importance_multipliers=(edge * (0.5 if edge < 1 else 2),) * 5)

    def test_pinned_never_scored_nor_forgotten(self, engine, settings):
        """Pinned rows keep their score column and status."""
        m = add(engine, created_at=days_ago(900), importance=1, pinned=True)
        run(engine, settings, jobs=["decay"])
        row = get(engine, m)
        assert row["status"] == "active" and row["decayed_confidence"] is None


class TestUsagePrune:
    def test_unused_days_just_inside_and_outside(self, engine, settings):
        """Last used exactly 90 days ago is pruned; 90 days minus a second is kept."""
        stale = add(engine, created_at=days_ago(200), last_accessed_at=days_ago(90))
        fresh = add(engine, created_at=days_ago(200), last_accessed_at=days_ago(90) + SECOND)
        report = run(engine, settings, jobs=["usage_prune"])
        assert acted_on(report) == {str(stale)}
        assert get(engine, stale)["status_reason"] == "unused"
        assert status(engine, fresh) == "active"

    def test_created_at_counts_when_never_accessed(self, engine, settings):
        """A never-accessed row is judged by its creation time."""
        old = add(engine, created_at=days_ago(91))
        new = add(engine, created_at=days_ago(89))
        assert acted_on(run(engine, settings, jobs=["usage_prune"])) == {str(old)}
        assert status(engine, new) == "active"

    def test_importance_limit(self, engine, settings):
        """Importance 3 is pruned, 4 is not (max_importance = 3)."""
        three = add(engine, created_at=days_ago(200), importance=3)
        four = add(engine, created_at=days_ago(200), importance=4)
        assert acted_on(run(engine, settings, jobs=["usage_prune"])) == {str(three)}
        assert status(engine, four) == "active"

    def test_grace_days(self, engine):
        """With unused_days under grace_days, a row inside the grace period is kept."""
        settings = Settings.model_validate({"usage_prune": {"unused_days": 1, "grace_days": 14}})
        inside = add(engine, created_at=NOW - timedelta(days=14) + SECOND)
        outside = add(engine, created_at=NOW - timedelta(days=14))
        assert acted_on(run(engine, settings, jobs=["usage_prune"])) == {str(outside)}
        assert status(engine, inside) == "active"


class TestUserCap:
    def _settings(self, cap: int) -> Settings:
        return Settings(user_cap=UserCapSettings(max_memories=cap))

    def test_at_cap_nothing_over_cap_evicts_excess(self, engine):
        """Exactly max_memories stays; one more evicts exactly one."""
        for i in range(3):
            add(engine, "at", created_at=days_ago(i))
        for i in range(4):
            add(engine, "over", created_at=days_ago(i))
        report = run(engine, self._settings(3), jobs=["user_cap"])
        assert [a["user_id"] for a in report["actions"]] == ["over"]
        assert report["actions"][0]["reason"] == "over_cap"

    def test_eviction_order(self, engine):
        """Lowest importance first, then least recently used, then oldest."""
        keep_important = add(engine, importance=5, created_at=days_ago(300))
        low_old = add(engine, importance=1, created_at=days_ago(10))
        low_recent_use = add(
            engine, importance=1, created_at=days_ago(20), last_accessed_at=days_ago(1)
        )
        mid = add(engine, importance=2, created_at=days_ago(50))
        report = run(engine, self._settings(2), jobs=["user_cap"])
        assert acted_on(report) == {str(low_old), str(low_recent_use)}
        assert status(engine, keep_important) == "active" and status(engine, mid) == "active"

    def test_pinned_count_but_are_never_evicted(self, engine):
        """Pinned rows count toward the cap; only unpinned rows are evicted."""
        pinned = [add(engine, pinned=True, importance=1) for _ in range(3)]
        free = add(engine, importance=5)
        report = run(engine, self._settings(2), jobs=["user_cap"])
        assert acted_on(report) == {str(free)}
        assert all(status(engine, p) == "active" for p in pinned)

    def test_rows_retired_earlier_in_the_run_do_not_count(self, engine):
        """A row expired by ttl_expiry in the same run no longer counts toward the cap."""
        add(engine, expires_at=days_ago(1))
        add(engine)
        add(engine)
        report = run(engine, self._settings(2), jobs=["ttl_expiry", "user_cap"])
        assert [a["job"] for a in report["actions"]] == ["ttl_expiry"]


class TestHardDelete:
    def test_deleted_retention_just_inside_and_outside(self, engine, settings):
        """Deleted exactly 30 days ago is purged; a second less is kept."""
        old = add(engine, status="deleted", deleted_at=days_ago(30), status_changed_at=days_ago(30))
        young = add(
            engine,
            status="deleted",
            deleted_at=days_ago(30) + SECOND,
            status_changed_at=days_ago(29),
        )
        report = run(engine, settings, jobs=["hard_delete"])
        assert acted_on(report, "hard_delete") == {str(old)}
        assert get(engine, old) is None
        assert status(engine, young) == "deleted"

    def test_history_retention(self, engine, settings):
        """Obsolete / merged rows are purged after history_retention_days, not before."""
        old = add(engine, status="obsolete", status_changed_at=days_ago(365))
        young = add(engine, status="merged", status_changed_at=days_ago(364))
        assert acted_on(run(engine, settings, jobs=["hard_delete"])) == {str(old)}
        assert status(engine, young) == "merged"

    def test_never_without_soft_delete_first(self, engine, settings):
        """Active rows, and deleted rows with no deletion instant, are never purged."""
        active = add(engine, created_at=days_ago(3000))
        unknown = add(engine, status="deleted")
        assert run(engine, settings, jobs=["hard_delete"])["actions"] == []
        assert status(engine, active) == "active" and status(engine, unknown) == "deleted"

    def test_pinned_deleted_row_is_kept(self, engine, settings):
        """A pinned row is not purged by the automatic job."""
        m = add(engine, status="deleted", deleted_at=days_ago(400), pinned=True)
        assert run(engine, settings, jobs=["hard_delete"])["actions"] == []
        assert status(engine, m) == "deleted"

    def test_lineage_goes_and_audit_content_is_scrubbed(self, engine, settings):
        """Purging removes lineage rows and the content preview kept in earlier audit rows."""
        src = add(engine, content="secret thing", created_at=days_ago(400), importance=1)
        derived = add(engine, content="derived")
        execute(engine, "INSERT INTO memory_lineage VALUES (:d, :s)", d=derived, s=src)
        run(engine, settings, jobs=["usage_prune"], now=days_ago(40))
        assert status(engine, src) == "deleted"
        run(engine, settings, jobs=["hard_delete"])
        assert get(engine, src) is None
        with engine.connect() as conn:
            from sqlalchemy import text

            lineage = conn.execute(text("SELECT count(*) FROM memory_lineage")).scalar()
            previews = conn.execute(
                text("SELECT count(*) FROM gc_actions WHERE content_preview LIKE '%secret%'")
            ).scalar()
        assert lineage == 0 and previews == 0


def test_the_earliest_instant_scores_zero_and_the_next_day_does_not():
    """jobs.decay.EARLIEST (what -infinity and BC load as) scores 0, as SQL scores -infinity;
    a day later is an ordinary, if ancient, instant."""
    from gc_worker.config import Settings
    from jobs.decay import EARLIEST

    policy = Settings.model_validate(
        {"embeddings": {"dim": 8}, "decay": {"half_life_days": 1_000_000}}
    ).decay
    assert decayed_confidence(0.9, 1, EARLIEST, now=NOW, policy=policy) == 0.0
    assert decayed_confidence(0.9, 1, EARLIEST + timedelta(days=1), now=NOW, policy=policy) > 0.05
