"""On-demand sweeps that go wrong: a failing sweep among others, a database lost mid-sweep, a
daemon that dies between creating a sweep's run and recording it. Found by a review; each test
failed before its fix."""

from __future__ import annotations

import os
import threading
import time
from contextlib import closing
from uuid import UUID

import pytest

import jobs.ttl_expiry as ttl
from gc_worker import batch_run, cli, db, erasure, sweeps
from gc_worker.claims import participating
from gc_worker.daemon import SWEEP_TRIGGER, Daemon, listen_dsn
from gc_worker.engine import RunRequest, resolve_jobs, run_once, start_run
from gc_worker.errors import DatabaseUnavailable
from tests.store import add, execute, status
from tests.test_schedule_sweeps import NOON, expired, request_row

LOST = "connection lost: terminating connection due to administrator command (57P01)"


def failing_for(monkeypatch, user: str) -> None:
    """The TTL job raises while planning ``user`` (a row it cannot handle): that run fails."""
    real = ttl.plan

    def plan(ctx):
        if user in ctx.users:
            raise RuntimeError("a row the job cannot handle")
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)


def losing_the_database(monkeypatch, times: int) -> list[int]:
    """The first ``times`` batch commits lose the connection (a server restart, a failover)."""
    real, lost = batch_run._commit_batch, []

    def commit(*args, **kwargs):
        if len(lost) < times:
            lost.append(1)
            raise DatabaseUnavailable(LOST)
        return real(*args, **kwargs)

    monkeypatch.setattr(batch_run, "_commit_batch", commit)
    return lost


def run_of(engine, run_id: UUID):
    return execute(engine, "SELECT status, error FROM gc_runs WHERE id = :r", r=run_id).one()


class TestAFailedSweepDoesNotHoldUpTheQueue:
    def test_a_once_due_pass_serves_the_requests_after_a_failed_one(
        self, engine, settings, monkeypatch
    ):
        """`schedule --once-due` stopped serving the queue at the first sweep that failed: the
        requests after it waited for the next pass (cron: maybe the next day)."""
        expired(engine, "alice")
        bob = expired(engine, "bob")
        failing_for(monkeypatch, "alice")
        first = sweeps.request_sweep(engine, "alice")
        second = sweeps.request_sweep(engine, "bob")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.run_once() == 1  # the failed sweep is a failed unit, counted once
            assert daemon.metrics.unit_failures.labels("sweep_next")._value.get() == 1
        assert request_row(engine, first)["status"] == "failed"
        assert "a row the job cannot handle" in request_row(engine, first)["error"]
        assert request_row(engine, second)["status"] == "done"
        assert status(engine, bob) == "deleted"

    def test_the_sweep_loop_goes_on_after_a_failed_sweep(self, engine, settings, monkeypatch):
        """The daemon's loop (`_sweep_step`) reports a served request even when it failed, so it
        goes on with the queue instead of waiting `poll_seconds` first."""
        expired(engine, "alice")
        failing_for(monkeypatch, "alice")
        sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon._sweep_step() is True
            assert daemon.failures == 1
            assert daemon._sweep_step() is False  # the failed request is not taken again


class TestALostDatabaseGivesTheSweepBack:
    def test_a_restart_mid_sweep_hands_the_request_back_and_it_is_done(
        self, engine, settings, monkeypatch
    ):
        """A database restart during the sweep's batch (rolled back whole) failed the request
        for good, as if the user's data were the trouble: the application had to ask again.
        It goes back to the queue, keeping its attempt, and the next claim sweeps the user."""
        alice = expired(engine, "alice")
        losing_the_database(monkeypatch, times=1)
        request_id = sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.attempt(daemon.sweep_next) is True
            row = request_row(engine, request_id)
            assert (row["status"], row["claimed_by"], row["error"]) == ("pending", None, None)
            assert status(engine, alice) == "active"  # nothing of the lost batch was applied
            assert daemon.sweep_next() is True
            assert daemon.metrics.sweeps.labels("failed")._value.get() == 0
        row = request_row(engine, request_id)
        assert (row["status"], row["attempts"]) == ("done", 2)
        assert status(engine, alice) == "deleted"

    def test_a_sweep_that_always_loses_the_database_fails_after_the_attempts(
        self, engine, settings, monkeypatch
    ):
        """A sweep whose batch brings the server down every time is not retried for ever: after
        MAX_ATTEMPTS it fails, with the error of the last attempt."""
        alice = expired(engine, "alice")
        lost = losing_the_database(monkeypatch, times=100)
        request_id = sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.run_once() == sweeps.MAX_ATTEMPTS
        row = request_row(engine, request_id)
        assert (row["status"], row["attempts"]) == ("failed", sweeps.MAX_ATTEMPTS)
        assert "connection lost" in row["error"] and len(lost) == sweeps.MAX_ATTEMPTS
        assert status(engine, alice) == "active"

    def test_an_error_the_server_answered_still_fails_the_request(
        self, engine, settings, monkeypatch
    ):
        """Only a lost connection is given back: an error that would come back fails at once."""
        expired(engine, "alice")
        failing_for(monkeypatch, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            daemon.run_once()
        assert (
            request_row(engine, request_id)["status"],
            request_row(engine, request_id)["attempts"],
        ) == ("failed", 1)


def unrecorded_run(engine, settings, user: str, *, age_seconds: float) -> UUID:
    """The run a daemon created for a sweep of ``user`` before it died, ``age_seconds`` ago,
    without having recorded it on the request (start_run and attach_run are two commits)."""
    request = RunRequest(
        mode="apply", now=NOON, users=(user,), jobs=resolve_jobs([], settings),
        trigger=SWEEP_TRIGGER,
    )  # fmt: skip
    run_id = start_run(engine, settings, request)
    execute(engine, "UPDATE gc_runs SET started_at = started_at - make_interval(secs => :age)"
            " WHERE id = :r", age=age_seconds, r=run_id)  # fmt: skip
    return run_id


class TestARunNoRequestNamesIsClosed:
    def test_a_run_whose_daemon_died_before_recording_it_is_failed(self, engine, settings):
        """A daemon that died (or lost the database) between creating its sweep's run and
        recording it on the request left that run `running` for ever (`memory-gc runs`: stopped;
        nothing resumes a sweep run), while the retry swept with a second run. The upkeep now
        closes it as failed, saying why; the run that did the sweep is untouched."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        assert sweeps.claim_sweep(engine, worker="dead:1", lease_seconds=300) is not None
        lost = unrecorded_run(engine, settings, "alice", age_seconds=301)
        execute(engine, "UPDATE gc_sweep_requests SET claimed_at = claimed_at"
                " - interval '301 seconds' WHERE id = :id", id=request_id)  # fmt: skip
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.sweep_next() is True
            done = request_row(engine, request_id)
            assert done["status"] == "done" and done["run_id"] != lost
            daemon.upkeep()
            assert daemon.failures == 0
        closed = run_of(engine, lost)
        assert closed.status == "failed" and "no sweep request names it" in closed.error
        assert run_of(engine, done["run_id"]).status == "completed"
        assert status(engine, alice) == "deleted"

    def test_a_recorded_run_a_fresh_one_or_one_being_worked_is_left_alone(self, engine, settings):
        """Only a run no open request names, older than a lease, that nobody works is closed: a
        run just created (its request is about to name it), one a request handed back names,
        one a daemon works."""
        expired(engine, "alice")
        fresh = unrecorded_run(engine, settings, "alice", age_seconds=10)
        worked = unrecorded_run(engine, settings, "alice", age_seconds=301)
        request_id = sweeps.request_sweep(engine, "alice")
        named = unrecorded_run(engine, settings, "alice", age_seconds=301)
        execute(engine, "UPDATE gc_sweep_requests SET run_id = :r WHERE id = :id", r=named,
                id=request_id)  # a stopped daemon handed it back with it  # fmt: skip
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            with participating(engine, worked):
                daemon.upkeep()
            assert daemon.failures == 0
        for run_id in (fresh, worked, named):
            assert run_of(engine, run_id).status == "running"

    @pytest.mark.parametrize("lost", [True, False], ids=["connection-lost", "other-error"])
    def test_a_run_not_recorded_because_the_database_blinked(
        self, engine, settings, monkeypatch, lost
    ):
        """Recording the run failed (the database blinked after the run's commit): the request
        goes back (a lost connection) or fails, and the run is closed by a later upkeep."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        real = sweeps.attach_run

        def blink(*args, **kwargs):
            raise DatabaseUnavailable(LOST) if lost else RuntimeError("a bug")

        monkeypatch.setattr(sweeps, "attach_run", blink)
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.attempt(daemon.sweep_next) is True
            assert request_row(engine, request_id)["status"] == ("pending" if lost else "failed")
            monkeypatch.setattr(sweeps, "attach_run", real)
            (orphan,) = execute(engine, "SELECT id FROM gc_runs").scalars().all()
            execute(engine, "UPDATE gc_runs SET started_at = started_at - interval '1 hour'")
            daemon.upkeep()
        assert run_of(engine, orphan).status == "failed"

    def test_a_run_left_by_the_worker_of_a_given_up_request_is_failed(self, engine, settings):
        """A request given up while a daemon still worked its run leaves that run to it; when
        that daemon dies too, nothing else closes the run: the upkeep does."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        run_id = unrecorded_run(engine, settings, "alice", age_seconds=301)
        execute(engine, "UPDATE gc_sweep_requests SET status = 'failed', run_id = :r"
                " WHERE id = :id", r=run_id, id=request_id)  # fmt: skip
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            with participating(engine, run_id):  # its last worker, still alive
                daemon.upkeep()
                assert run_of(engine, run_id).status == "running"
            daemon.upkeep()  # it died
        assert run_of(engine, run_id).status == "failed"


class TestASweepOfAForgottenUser:
    def test_a_sweep_left_pending_by_forget_user_keeps_no_trace(self, engine, settings, capsys):
        """`forget-user alice --purge-now` with alice's sweep still queued: the sweep then
        failed with "no memories for user(s) 'alice'; check the id", an error text the erasure
        had promised to clear (and told the operator to check a right id). The erasure's
        `erasure_user_traces` saw it as something kept about alice: a second `forget-user alice`
        filed a new request instead of answering with the completed one."""
        expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        forgotten, _ = erasure.forget(engine, settings, now=NOON, user_id="alice", purge_now=True)
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.sweep_next() is True
        row = request_row(engine, request_id)
        assert (row["status"], row["error"]) == ("failed", "removed by erasure")
        again, run_id = erasure.forget(engine, settings, now=NOON, user_id="alice")
        assert (again.id, again.created, run_id) == (forgotten.id, False, None)

    def test_request_sweep_of_a_forgotten_user_says_so(self, engine, settings, cli_env, capsys):
        """`memory-gc request-sweep` of a forgotten user exits 2 naming the erasure, not "check
        the id"; an id never seen still says to check it."""
        expired(engine, "alice")
        forgotten, _ = erasure.forget(engine, settings, now=NOON, user_id="alice", purge_now=True)
        assert cli.main(["request-sweep", "alice"]) == 2
        err = capsys.readouterr().err
        assert f"erasure request {forgotten.id}" in err and "check the id" not in err
        assert cli.main(["request-sweep", "alicia"]) == 2
        assert "no memories for user 'alicia'; check the id" in capsys.readouterr().err
        assert execute(engine, "SELECT count(*) FROM gc_sweep_requests").scalar() == 0


class TestASecondRequestWhileOneIsPending:
    def test_it_answers_with_the_pending_request(self, engine, settings, cli_env, capsys):
        """`request-sweep alice` twice before a daemon took the first queued two requests, and
        the second swept again what the first had just swept (another run, the model asked
        again). A pending request sweeps what is there when it is claimed, so the second is
        answered with it; a dry run and a sweep are not the same request."""
        alice = expired(engine, "alice")
        assert cli.main(["request-sweep", "alice"]) == 0
        assert "sweep request 1 queued for user alice" in capsys.readouterr().out
        assert cli.main(["request-sweep", "alice"]) == 0
        assert "sweep request 1 already pending for user alice" in capsys.readouterr().out
        assert cli.main(["request-sweep", "alice", "--dry-run"]) == 0
        assert "dry-run sweep request 2 queued" in capsys.readouterr().out
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            while daemon.sweep_next():
                pass
        assert execute(engine, "SELECT count(*) FROM gc_sweep_requests").scalar() == 2
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == 2
        assert status(engine, alice) == "deleted"

    def test_a_request_claimed_or_handed_back_is_not_joined(self, engine, settings):
        """A request already claimed, or handed back with its run (whose instant is that of its
        first claim, before this request), does not answer for a new one."""
        expired(engine, "alice")
        handed_back = sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as stopped:
            stopped.request_stop()
            stopped.sweep_next()
        assert request_row(engine, handed_back)["run_id"] is not None
        second = sweeps.request_sweep(engine, "alice")
        assert second != handed_back
        assert sweeps.claim_sweep(engine, worker="other:1", lease_seconds=300).id == handed_back
        assert sweeps.request_sweep(engine, "alice") == second
        assert sweeps.claim_sweep(engine, worker="other:1", lease_seconds=300).id == second
        assert sweeps.request_sweep(engine, "alice") not in (handed_back, second)


class TestAGivenUpRequestWhoseRunCompleted:
    def test_it_is_done_not_failed(self, engine, settings):
        """The last allowed holder completed the sweep's run, then died (or lost the database)
        before closing the request: the next claim gave it up as failed ("gave up after 3
        attempts") although the user was swept. A request whose run completed is done."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            for attempt in range(sweeps.MAX_ATTEMPTS):
                claim = sweeps.claim_sweep(engine, worker=f"dead:{attempt}", lease_seconds=300)
                assert claim is not None
                execute(engine, "UPDATE gc_sweep_requests SET claimed_at = claimed_at"
                        " - interval '301 seconds' WHERE id = :id", id=request_id)  # fmt: skip
            run_id = daemon._sweep_run(claim)
            assert daemon.work(run_id) is True  # the third holder swept alice, then died
            assert daemon.sweep_next() is True
            assert daemon.metrics.sweeps.labels("done")._value.get() == 1
        row = request_row(engine, request_id)
        assert (row["status"], row["error"], row["run_id"]) == ("done", None, run_id)
        assert run_of(engine, run_id).status == "completed" and status(engine, alice) == "deleted"


class TestWhatRequestSweepPrints:
    def test_a_user_id_with_control_characters_is_shown_not_obeyed(self, engine, cli_env, capsys):
        """A stored user id is the application's (its users may choose it): `request-sweep`
        printed it raw, so an id holding a terminal escape (here OSC 0, which retitles the
        window; OSC 52 writes the clipboard) reached the operator's terminal. It is shown as
        `reviews list` shows ids: controls as �, on one line."""
        hostile = "eve\x1b]0;owned\x07\nnext"
        add(engine, hostile, "a memory")
        assert cli.main(["request-sweep", hostile]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and out.count("\n") == 1
        assert "user eve\ufffd]0;owned\ufffd next;" in out
        assert request_row(engine, 1)["user_id"] == hostile  # the request names the real id


class TestARunTheRequestDoesNotOwn:
    @pytest.mark.parametrize("kind", ["dry-run-of-the-user", "run-of-another-user"])
    def test_a_request_naming_another_run_is_swept_with_its_own(self, engine, settings, kind):
        """An application inserts the row itself, and may fill `run_id` (copying a row, or to
        sweep "again"): a request naming a completed run was closed done at once. Naming a dry
        run of the user, an apply request applied nothing; naming another user's run, the user
        was not swept. The run a request joins must be a sweep of its user and kind."""
        alice = expired(engine, "alice")
        bob = expired(engine, "bob")
        mode, user = ("dry_run", "alice") if kind == "dry-run-of-the-user" else ("apply", "bob")
        request = RunRequest(mode=mode, now=NOON, users=(user,), jobs=resolve_jobs([], settings))
        other = run_once(engine, settings, request)
        request_id = execute(
            engine, "INSERT INTO gc_sweep_requests (user_id, run_id) VALUES ('alice', :r)"
            " RETURNING id", r=other,
        ).scalar()  # fmt: skip
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.sweep_next() is True
        row = request_row(engine, request_id)
        assert row["status"] == "done" and row["run_id"] != other
        assert status(engine, alice) == "deleted"
        assert status(engine, bob) == ("active" if user == "alice" else "deleted")

    def test_a_request_given_up_leaves_a_run_it_does_not_own(self, engine, settings):
        """Giving a request up fails the run its dead holders left: not a run the application
        named that is no sweep of its user (here a nightly-like run nobody works right now)."""
        expired(engine, "alice")
        request = RunRequest(mode="apply", now=NOON, users=("alice",), jobs=("ttl_expiry",))
        other = start_run(engine, settings, request)  # left running, nobody working it
        request_id = execute(
            engine, "INSERT INTO gc_sweep_requests (user_id, run_id, attempts) VALUES"
            " ('alice', :r, :n) RETURNING id", r=other, n=sweeps.MAX_ATTEMPTS,
        ).scalar()  # fmt: skip
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.sweep_next() is True
        assert request_row(engine, request_id)["status"] == "failed"
        assert run_of(engine, other).status == "running"


class TestTwoDaemonsAndTheListener:
    def test_two_daemons_draining_the_queue_serve_each_request_once(
        self, engine, settings, database_url
    ):
        """Two replicas claiming at once (SKIP LOCKED) take each request once: one claim, one
        run each, every user swept; two rows for one user (an application's) are two sweeps."""
        users = [f"u{i}" for i in range(6)]
        rows = {user: expired(engine, user) for user in users}
        for user in [*users, "u0"]:
            execute(engine, "INSERT INTO gc_sweep_requests (user_id) VALUES (:u)", u=user)
        other = db.make_engine(database_url)
        daemons = [Daemon(e, settings, clock=lambda: NOON) for e in (engine, other)]

        def drain(daemon: Daemon) -> None:
            while daemon.attempt(daemon.sweep_next):
                pass

        threads = [threading.Thread(target=drain, args=(d,)) for d in daemons]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        finally:
            other.dispose()
            for daemon in daemons:
                daemon.close()
        served = execute(engine, "SELECT status, attempts, run_id FROM gc_sweep_requests").all()
        assert [(r.status, r.attempts) for r in served] == [("done", 1)] * (len(users) + 1)
        assert len({r.run_id for r in served}) == len(users) + 1
        assert execute(engine, "SELECT count(*) FROM gc_runs").scalar() == len(users) + 1
        assert {status(engine, row) for row in rows.values()} == {"deleted"}
        assert sum(d.failures for d in daemons) == 0

    def test_a_listen_session_the_server_ended_is_replaced(self, engine):
        """The LISTEN session ended by the server (a restart, idle_session_timeout, a reaper)
        is noticed and replaced: a request made afterwards wakes the daemon again, at once."""
        expired(engine, "alice")
        wake_r, wake_w = os.pipe()
        listener = sweeps.SweepListener(listen_dsn(engine), wake_r)
        try:
            listener.wait(0)
            ended = listener._conn.info.backend_pid
            execute(engine, "SELECT pg_terminate_backend(:pid)", pid=ended)
            waits = 0  # it notices the end (reads the server's goodbye, then the closed socket)
            while listener._conn is None or listener._conn.info.backend_pid == ended:
                assert waits < 10
                listener.wait(0.5)
                waits += 1
            timer = threading.Timer(0.2, lambda: sweeps.request_sweep(engine, "alice"))
            timer.start()
            started = time.monotonic()
            assert listener.wait(10) is True
            assert time.monotonic() - started < 2
            timer.join()
        finally:
            listener.close()
            os.close(wake_r), os.close(wake_w)


def test_forget_shows_a_stored_user_id_as_request_sweep_does(engine, cli_env, capsys):
    """`forget MEMORY_ID` files the request for the memory's user, an id from the store,
    and printed it raw (as the verify-erasure command it suggested, and verify-erasure's
    summary line): the same terminal escape reached the operator."""
    hostile = "eve\x1b]0;owned\x07\nnext"
    memory = add(engine, hostile, "a memory")
    assert cli.main(["forget", str(memory), "--purge-now"]) == 0
    assert cli.main(["verify-erasure", "--memory", str(memory)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "for memory" in out and "verify-erasure --memory" in out
    assert cli.main(["verify-erasure", hostile]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "user eve\ufffd]0;owned\ufffd next:" in out, out
