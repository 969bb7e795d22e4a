"""On-demand sweeps: the request row, claiming, lease, NOTIFY pick-up, one user only."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import psycopg
import pytest
import sqlalchemy as sa

import jobs.ttl_expiry as ttl
from gc_worker import cli, db, sweeps
from gc_worker.claims import participating
from gc_worker.config import RunSettings, ScheduleSettings, Settings
from gc_worker.daemon import BUSY_LIMIT_SECONDS, Daemon, listen_dsn
from gc_worker.errors import NotFoundError
from gc_worker.queries import q
from tests.store import NOW, add, days_ago, execute, status

NOON = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # no nightly slot is due


@pytest.fixture
def daemon(engine: sa.Engine, settings: Settings) -> Iterator[Daemon]:
    d = Daemon(engine, settings, clock=lambda: NOW)
    yield d
    d.close()


def expired(engine: sa.Engine, user: str) -> object:
    add(engine, user, "fresh", importance_assessed_at=NOW)
    return add(engine, user, "expired", expires_at=days_ago(1), importance_assessed_at=NOW)


def request_row(engine: sa.Engine, request_id: int) -> dict:
    row = sweeps.get_sweep(engine, request_id)
    assert row is not None
    return row


class TestRequestSweep:
    def test_unknown_user_is_refused(self, engine):
        """A user without memories cannot be swept (NotFoundError: exit 2)."""
        with pytest.raises(NotFoundError, match="nobody"):
            sweeps.request_sweep(engine, "nobody")

    def test_cli_exit_codes(self, engine, cli_env, capsys):
        """`memory-gc request-sweep` prints the queued id (exit 0), an unknown user exits 2."""
        expired(engine, "alice")
        assert cli.main(["request-sweep", "alice", "--dry-run"]) == 0
        assert "dry-run sweep request 1 queued for user alice" in capsys.readouterr().out
        assert request_row(engine, 1)["dry_run"] is True
        assert cli.main(["request-sweep", "bob"]) == 2
        assert "no memories for user 'bob'" in capsys.readouterr().err


class TestServeSweep:
    def test_sweep_runs_for_that_user_only(self, engine, daemon):
        """The sweep applies to the requested user; another user's expired row is untouched."""
        alice, bob = expired(engine, "alice"), expired(engine, "bob")
        request_id = sweeps.request_sweep(engine, "alice")
        assert daemon.sweep_next() is True and daemon.sweep_next() is False
        row = request_row(engine, request_id)
        assert (row["status"], row["attempts"], row["error"]) == ("done", 1, None)
        assert (status(engine, alice), status(engine, bob)) == ("deleted", "active")
        run = execute(engine, "SELECT * FROM gc_runs WHERE id = :r", r=row["run_id"]).one()
        assert (run.users, run.trigger, run.mode, run.status) == (
            ["alice"],
            "sweep",
            "apply",
            "completed",
        )

    def test_dry_run_sweep_changes_nothing(self, engine, daemon):
        """A dry-run request writes a plan for the user and leaves the rows."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice", dry_run=True)
        daemon.sweep_next()
        row = request_row(engine, request_id)
        mode = execute(engine, "SELECT mode FROM gc_runs WHERE id = :r", r=row["run_id"]).scalar()
        assert (row["status"], mode, status(engine, alice)) == ("done", "dry_run", "active")

    def test_application_inserted_row_is_served(self, engine, daemon):
        """A row the application inserts itself, with only user_id, is served like the CLI's."""
        alice = expired(engine, "alice")
        request_id = execute(
            engine, "INSERT INTO gc_sweep_requests (user_id) VALUES ('alice') RETURNING id"
        ).scalar()
        daemon.sweep_next()
        assert request_row(engine, request_id)["status"] == "done"
        assert status(engine, alice) == "deleted"

    def test_user_gone_since_the_request_fails_it(self, engine, daemon):
        """A request for a user with no memories left fails with the reason, and is not retried."""
        request_id = execute(
            engine, "INSERT INTO gc_sweep_requests (user_id) VALUES ('ghost') RETURNING id"
        ).scalar()
        assert daemon.sweep_next() is True and daemon.sweep_next() is False
        row = request_row(engine, request_id)
        assert row["status"] == "failed" and "no memories for user(s) 'ghost'" in row["error"]

    def test_requests_are_served_oldest_first(self, engine, daemon):
        """Two pending requests are served in the order they were made."""
        expired(engine, "alice"), expired(engine, "bob")
        first = sweeps.request_sweep(engine, "bob")
        second = sweeps.request_sweep(engine, "alice")
        daemon.sweep_next()
        assert request_row(engine, first)["status"] == "done"
        assert request_row(engine, second)["status"] == "pending"


class TestLease:
    def claim_and_die(self, engine, lease_age: float) -> sweeps.SweepClaim:
        """Claim a request as a daemon that then dies; its claim is lease_age seconds old."""
        claim = sweeps.claim_sweep(engine, worker="dead:1", lease_seconds=300)
        assert claim is not None
        execute(
            engine,
            "UPDATE gc_sweep_requests SET claimed_at = clock_timestamp()"
            " - make_interval(secs => :age) WHERE id = :id",
            age=lease_age,
            id=claim.id,
        )
        return claim

    def test_claim_just_inside_the_lease_is_left_alone(self, engine, daemon):
        """A claim younger than lease_seconds belongs to its daemon."""
        expired(engine, "alice")
        sweeps.request_sweep(engine, "alice")
        self.claim_and_die(engine, 290)
        assert daemon.sweep_next() is False

    def test_claim_past_the_lease_is_taken_over(self, engine, daemon):
        """A claim older than lease_seconds is claimed again and served."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        self.claim_and_die(engine, 301)
        assert daemon.sweep_next() is True
        row = request_row(engine, request_id)
        assert (row["status"], row["attempts"]) == ("done", 2)
        assert status(engine, alice) == "deleted"

    def test_takeover_joins_the_run_the_dead_daemon_started(self, engine, settings, daemon):
        """When the dead daemon had started the run, the new claimer finishes that run."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        claim = self.claim_and_die(engine, 301)
        first_run = daemon._sweep_run(claim)  # the dead daemon got this far
        daemon.sweep_next()
        row = request_row(engine, request_id)
        assert (row["status"], row["run_id"]) == ("done", first_run)
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 1

    def test_too_many_attempts_fail_the_request(self, engine, daemon):
        """A request whose daemons died MAX_ATTEMPTS times is failed, not retried forever."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        for _ in range(sweeps.MAX_ATTEMPTS):
            self.claim_and_die(engine, 301)
        daemon.sweep_next()
        row = request_row(engine, request_id)
        assert row["status"] == "failed" and "gave up after 3 attempts" in row["error"]

    def test_claim_past_the_lease_of_a_live_daemon_is_left_alone(self, engine, daemon):
        """A claim past its lease whose run a daemon still takes part in (its participation
        lock) is not taken over; once nobody holds the run, it is."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        claim = self.claim_and_die(engine, 301)
        run_id = daemon._sweep_run(claim)
        with participating(engine, run_id):  # its daemon is alive, working the run
            assert daemon.sweep_next() is False
            row = request_row(engine, request_id)
            assert (row["status"], row["claimed_by"], row["attempts"]) == ("running", "dead:1", 1)
        assert daemon.sweep_next() is True
        row = request_row(engine, request_id)
        assert (row["status"], row["attempts"], row["run_id"]) == ("done", 2, run_id)

    def test_only_the_holder_finishes_a_request(self, engine):
        """A daemon whose claim was taken over cannot close the request; its new holder can."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        self.claim_and_die(engine, 301)
        assert sweeps.claim_sweep(engine, worker="next:2", lease_seconds=300) is not None
        assert sweeps.finish_sweep(engine, request_id, worker="dead:1") is False
        row = request_row(engine, request_id)
        assert (row["status"], row["claimed_by"]) == ("running", "next:2")
        assert sweeps.finish_sweep(engine, request_id, worker="next:2") is True
        assert request_row(engine, request_id)["status"] == "done"

    def test_given_up_request_fails_its_run(self, engine, daemon):
        """A request given up after MAX_ATTEMPTS fails the run its dead daemons left running
        (a sweep run is never resumed otherwise)."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        run_id = daemon._sweep_run(self.claim_and_die(engine, 301))  # the first daemon's run
        for _ in range(sweeps.MAX_ATTEMPTS - 1):
            self.claim_and_die(engine, 301)
        assert daemon.sweep_next() is True
        row = request_row(engine, request_id)
        assert row["status"] == "failed" and row["run_id"] == run_id
        run = execute(engine, "SELECT status, error FROM gc_runs WHERE id = :r", r=run_id).one()
        assert run.status == "failed" and f"sweep request {request_id} gave up" in run.error

    def test_given_up_request_leaves_a_run_someone_works(self, engine, daemon):
        """A run a daemon still takes part in is not failed by a give-up."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        run_id = daemon._sweep_run(self.claim_and_die(engine, 301))
        for _ in range(sweeps.MAX_ATTEMPTS - 1):
            self.claim_and_die(engine, 301)
        claim = sweeps.claim_sweep(engine, worker=daemon.worker_id, lease_seconds=300)
        assert claim is not None and claim.attempts > sweeps.MAX_ATTEMPTS
        with participating(engine, run_id):
            daemon._serve_sweep(claim)
        assert request_row(engine, request_id)["status"] == "failed"
        assert execute(engine, "SELECT status FROM gc_runs WHERE id = :r", r=run_id).scalar() == (
            "running"
        )

    def test_a_waiting_sweep_renews_its_claim(self, engine, settings):
        """While its sweep moves (here: waits, second by second, for a user another batch
        holds) a daemon renews its claim's claimed_at."""
        short = settings.model_copy(update={"run": RunSettings(lease_seconds=10)})
        daemon = Daemon(engine, short, clock=lambda: NOW)
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        age = "SELECT clock_timestamp() - claimed_at FROM gc_sweep_requests WHERE id = :id"
        with engine.connect() as other_batch:
            other_batch.execute(q("lock_batch_users"), {"users": ["alice"]})
            other_batch.commit()
            thread = threading.Thread(target=daemon.sweep_next)
            thread.start()
            try:
                assert wait_for(lambda: request_row(engine, request_id)["run_id"] is not None, 10)
                execute(engine, "UPDATE gc_sweep_requests SET claimed_at = claimed_at"
                        " - interval '1 hour' WHERE id = :id", id=request_id)  # fmt: skip
                renewed = wait_for(
                    lambda: execute(engine, age, id=request_id).scalar().total_seconds() < 60, 10
                )
                assert renewed and thread.is_alive() and status(engine, alice) == "active"
            finally:
                other_batch.execute(q("unlock_claim"))
                thread.join(10)
                daemon.close()
        assert request_row(engine, request_id)["status"] == "done"

    def test_stopping_daemon_hands_the_request_back(self, engine, daemon):
        """A daemon told to stop before its sweep's batch releases the request as pending."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        daemon.request_stop()
        daemon.sweep_next()
        row = request_row(engine, request_id)
        assert (row["status"], row["claimed_by"], row["attempts"]) == ("pending", None, 0)
        assert row["run_id"] is not None  # the next daemon joins this run


class TestLongSweep:
    def test_long_sweep_is_not_taken_over_while_it_runs(
        self, engine, database_url, settings, monkeypatch
    ):
        """A sweep that outlasts three leases while other replicas poll the queue is left to
        its live daemon, which closes it done (the review's reproduction)."""
        alice = expired(engine, "alice")
        real, release, planning = ttl.plan, threading.Event(), threading.Event()

        def slow_plan(ctx):  # a sweep with many model calls: minutes
            planning.set()
            assert release.wait(30)
            return real(ctx)

        monkeypatch.setattr(ttl, "plan", slow_plan)
        other = db.make_engine(database_url)
        a = Daemon(engine, settings, clock=lambda: NOW)
        b = Daemon(other, settings, clock=lambda: NOW)
        request_id = sweeps.request_sweep(engine, "alice")
        thread = threading.Thread(target=a.sweep_next)
        thread.start()
        try:
            assert planning.wait(10)
            for _ in range(sweeps.MAX_ATTEMPTS):  # three leases pass
                execute(engine, "UPDATE gc_sweep_requests SET claimed_at = claimed_at"
                        " - interval '301 seconds' WHERE id = :id", id=request_id)  # fmt: skip
                assert b.sweep_next() is False
        finally:
            release.set()
            thread.join(30)
            other.dispose()
            a.close(), b.close()
        row = request_row(engine, request_id)
        run = execute(engine, "SELECT status FROM gc_runs WHERE id = :r", r=row["run_id"]).scalar()
        assert (row["status"], row["attempts"], run) == ("done", 1, "completed")
        assert status(engine, alice) == "deleted"
        assert a.metrics.sweeps.labels("done")._value.get() == 1
        assert b.metrics.sweeps.labels("failed")._value.get() == 0


class TestPickUp:
    def test_notify_wakes_the_listener(self, engine, daemon):
        """An inserted request wakes a LISTENing daemon well before a 10 s poll would."""
        expired(engine, "alice")
        listener = sweeps.SweepListener(listen_dsn(engine), daemon._wake_r)
        try:
            listener.wait(0)  # connected and listening
            timer = threading.Timer(0.2, lambda: sweeps.request_sweep(engine, "alice"))
            timer.start()
            started = time.monotonic()
            assert listener.wait(10) is True  # woken, not timed out: the poll would be 10 s
            assert time.monotonic() - started < 8  # (generous: a loaded CI machine)
            timer.join()  # its connection is back in the pool before the engine is disposed
        finally:
            listener.close()

    def test_stop_wakes_the_listener(self, engine, daemon):
        """request_stop interrupts the wait at once."""
        listener = sweeps.SweepListener(listen_dsn(engine), daemon._wake_r)
        try:
            threading.Timer(0.2, daemon.request_stop).start()
            started = time.monotonic()
            assert listener.wait(10) is False
            assert time.monotonic() - started < 8  # not the 10 s timeout (a loaded machine)
        finally:
            listener.close()

    def test_the_listen_connection_connects_as_the_engines_sessions_do(self, engine, database_url):
        """The LISTEN connection keeps the URL's options (`options=-c%20lock_timeout%3D2s`, as
        docs/operations.md suggests: a `+` for the space reached the server as "+lock_timeout")
        and a user and password with spaces (unencoded, libpq refused the string), and names
        itself memory-gc."""
        role = f"gc listen {os.getpid()}"
        execute(engine, f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'p w'")
        url = database_url.replace("postgres:@", f"{role.replace(' ', '%20')}:p%20w@", 1)
        url += ("&" if "?" in url else "?") + "options=-c%20lock_timeout%3D2s"
        worker = db.make_engine(url)
        try:
            with psycopg.connect(listen_dsn(worker), autocommit=True) as listening:
                seen = listening.execute(
                    "SELECT current_user, current_setting('lock_timeout'),"
                    " current_setting('application_name')"
                ).fetchone()
        finally:
            worker.dispose()
            execute(engine, f'DROP ROLE "{role}"')
        assert seen == (role, "2s", db.APPLICATION_NAME)

    def test_running_daemon_serves_a_request_within_seconds(self, engine, settings):
        """`serve` picks up a request by NOTIFY (poll 30 s) and returns promptly on stop."""
        slow_poll = settings.model_copy(update={"schedule": ScheduleSettings(poll_seconds=30)})
        daemon = Daemon(engine, slow_poll, clock=lambda: NOON)
        alice = expired(engine, "alice")
        thread = threading.Thread(target=daemon.serve)
        thread.start()
        try:
            # listening (a fixed sleep lost the race on a loaded machine: the request then
            # waited for the 30 s poll)
            assert wait_for(lambda: listening(engine), 10)
            request_id = sweeps.request_sweep(engine, "alice")
            assert wait_for(lambda: request_row(engine, request_id)["status"] == "done", 5)
            assert status(engine, alice) == "deleted"
        finally:
            stopped = time.monotonic()
            daemon.request_stop()
            thread.join(10)
            daemon.close()
        assert not thread.is_alive() and time.monotonic() - stopped < 5


class TestOneBatchPerUser:
    def test_sweep_waits_for_a_batch_holding_the_user(self, engine, daemon):
        """While another worker's batch holds a user, a sweep of that user waits for it."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        with engine.connect() as other_batch:
            other_batch.execute(q("lock_batch_users"), {"users": ["bob", "alice"]})
            other_batch.commit()  # the locks are the session's: they outlive its transactions
            thread = threading.Thread(target=daemon.sweep_next)
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive() and status(engine, alice) == "active"
            other_batch.execute(q("unlock_claim"))
        thread.join(10)
        assert request_row(engine, request_id)["status"] == "done"

    def test_waiting_for_a_held_user_keeps_the_daemon_healthy(self, engine, daemon):
        """Each second a sweep waits for a user another live worker's batch holds counts as
        progress: /healthz stays 200 however long that batch takes (BUSY_LIMIT_SECONDS)."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        with engine.connect() as other_batch:
            other_batch.execute(q("lock_batch_users"), {"users": ["alice"]})
            other_batch.commit()
            thread = threading.Thread(target=daemon._sweep_step)  # the sweep loop's unit
            thread.start()
            try:
                assert wait_for(lambda: request_row(engine, request_id)["run_id"] is not None, 10)
                for _ in range(2):  # the second time, only the wait itself can show progress
                    stale = time.monotonic() - BUSY_LIMIT_SECONDS - 1
                    daemon.last_loop = daemon.last_progress = stale
                    assert wait_for(lambda: daemon.health()[0], 10), daemon.health()
                    assert thread.is_alive() and status(engine, alice) == "active"
            finally:
                other_batch.execute(q("unlock_claim"))
                thread.join(10)
        assert request_row(engine, request_id)["status"] == "done"


def listening(engine: sa.Engine) -> bool:
    """A session of this database LISTENs on the sweep channel (its last statement)."""
    found = execute(
        engine,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND query = :listen",
        listen=f"LISTEN {sweeps.CHANNEL}",
    ).scalar_one()
    return found > 0


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
