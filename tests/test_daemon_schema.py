"""A daemon whose database is migrated under it (a rolling update: the new image's migrate runs
while the old replicas serve). The schema was checked only at start, so the old code went on
against a schema it did not know — a newer release's hold on large plans ignored, say. Each unit
of work now first checks the schema is still this code's (at most every few seconds); once it is
not, the daemon stops, and `schedule` exits 2 saying why."""

from __future__ import annotations

from contextlib import closing
from datetime import timedelta

from gc_worker import cli
from gc_worker import daemon as daemon_module
from gc_worker.daemon import Daemon
from tests.store import execute
from tests.test_schedule import SLOT, runs, seed

NEWER = "9999_a_newer_release"


def migrated_by_a_newer_release(engine) -> None:
    execute(engine, "UPDATE memory_gc_alembic_version SET version_num = :v", v=NEWER)


def test_units_stop_once_the_schema_is_not_this_codes(engine, settings, monkeypatch):
    monkeypatch.setattr(daemon_module, "SCHEMA_CHECK_SECONDS", 0.0)
    seed(engine)
    with closing(Daemon(engine, settings, clock=lambda: SLOT - timedelta(hours=1))) as daemon:
        daemon.upkeep()  # nothing due, the schema is ours
        assert daemon.schema_changed is None and not daemon.stopping()
        migrated_by_a_newer_release(engine)
        daemon.clock = lambda: SLOT + timedelta(minutes=1)  # the slot is due now
        assert daemon.run_once() == 0  # no unit ran, none failed
        assert daemon.stopping()
        assert "newer than this memory-gc" in (daemon.schema_changed or "")
    assert runs(engine) == []  # the due slot was left to a daemon of the new release


def test_a_schema_checked_moments_ago_is_not_read_again(engine, settings, monkeypatch):
    """The check is throttled: a sweep loop's units do not each cost a read of the schema."""
    reads = []
    real = daemon_module.schema.require_current
    monkeypatch.setattr(
        daemon_module.schema, "require_current", lambda *a, **k: reads.append(1) or real(*a, **k)
    )
    with closing(Daemon(engine, settings, clock=lambda: SLOT - timedelta(hours=1))) as daemon:
        for _ in range(5):
            daemon.attempt(daemon.count_held_plans)
    assert len(reads) == 1


def test_schedule_exits_2_when_the_schema_changes_under_it(engine, cli_env, capsys, monkeypatch):
    monkeypatch.setattr(daemon_module, "SCHEMA_CHECK_SECONDS", 0.0)
    seed(engine)
    real = Daemon.run_once

    def migrate_first(self):  # the new image's migrate, after this command checked the schema
        migrated_by_a_newer_release(engine)
        return real(self)

    monkeypatch.setattr(Daemon, "run_once", migrate_first)
    at = (SLOT + timedelta(minutes=5)).isoformat()
    assert cli.main(["schedule", "--once-due", "--now", at]) == 2
    err = capsys.readouterr().err
    assert "the database changed under this daemon" in err and "newer than this" in err
    assert runs(engine) == []
