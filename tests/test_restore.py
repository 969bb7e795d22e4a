"""restore against the application's later writes: the application always wins. A row comes
back only while everything the worker wrote on it is still in place; a record the worker
created is taken off the read path only while the application has not made it its own."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from gc_worker import restore
from tests.store import NOW, add, days_ago, execute, get, run, status


def slot_pair(engine) -> tuple[UUID, UUID]:
    """An older and a newer fact in one slot: contradiction obsoletes the older one and closes
    its valid_until at the newer one's start (one day ago)."""
    old = add(engine, "u1", "Lives in Paris", slot="profile.city", created_at=days_ago(10))
    new = add(engine, "u1", "Lives in Berlin", slot="profile.city", created_at=days_ago(1))
    return old, new


class TestStillInPlace:
    def test_a_closed_valid_until_goes_back_to_the_prior_one(self, engine, settings):
        """Undoing a contradiction reopens the validity the run closed."""
        old, _ = slot_pair(engine)
        report = run(engine, settings, jobs=["contradiction"])
        assert get(engine, old)["valid_until"] == days_ago(1)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        row = get(engine, old)
        assert result.restored == [old]
        assert (row["status"], row["valid_until"], row["superseded_by"]) == ("active", None, None)

    def test_a_valid_until_the_application_corrected_since_is_kept(self, engine, settings):
        """After the run closed valid_until, the application corrected it (the user moved out
        earlier): the row is not restorable and the application's value stays (restore used to
        write the pre-run value over it)."""
        old, _ = slot_pair(engine)
        report = run(engine, settings, jobs=["contradiction"])
        correction = days_ago(5)
        execute(engine, "UPDATE memories SET valid_until = :v WHERE id = :id", v=correction, id=old)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        row = get(engine, old)
        assert result.restored == [] and result.not_restorable == [old]
        assert (row["status"], row["valid_until"]) == ("obsolete", correction)

    def test_a_valid_until_the_application_set_on_a_deleted_row_is_kept(self, engine, settings):
        """A soft delete does not touch valid_until; one the application set afterwards is its
        own write, so the row stays as the application left it."""
        m = add(engine, "u1", "Is in Rome this week", expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        execute(engine, "UPDATE memories SET valid_until = :v WHERE id = :id", v=days_ago(2), id=m)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        row = get(engine, m)
        assert result.not_restorable == [m]
        assert (row["status"], row["valid_until"]) == ("deleted", days_ago(2))

    def test_a_superseded_by_the_application_rewrote_is_kept(self, engine, settings):
        """The application pointed the obsolete row at another record after the run: its
        pointer stays and the row is not restorable."""
        old, _ = slot_pair(engine)
        other = add(engine, "u1", "Lives in Munich")
        report = run(engine, settings, jobs=["contradiction"])
        execute(engine, "UPDATE memories SET superseded_by = :o WHERE id = :id", o=other, id=old)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW)
        assert result.not_restorable == [old]
        assert (status(engine, old), get(engine, old)["superseded_by"]) == ("obsolete", other)

    def test_an_untouched_row_next_to_a_changed_one_is_restored(self, engine, settings):
        """The check is per row: the run's other rows still come back."""
        changed = add(engine, "u1", "first", expires_at=days_ago(1))
        untouched = add(engine, "u1", "second", expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry"])
        execute(engine, "UPDATE memories SET valid_until = :v WHERE id = :id", v=NOW, id=changed)
        result = restore.restore_run(engine, UUID(report["run_id"]), now=NOW + timedelta(hours=1))
        assert result.restored == [untouched] and result.not_restorable == [changed]
        assert (status(engine, untouched), status(engine, changed)) == ("active", "deleted")
