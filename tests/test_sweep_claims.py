"""Two claimers of one sweep request: a daemon that stalled past its lease before recording its
run lost the request to another daemon, and must not sweep the user a second time."""

from __future__ import annotations

from contextlib import closing

from gc_worker import sweeps
from gc_worker.daemon import Daemon
from tests.store import execute, status
from tests.test_schedule_sweeps import NOON, expired, request_row
from tests.test_sweep_failures import unrecorded_run


def claim_and_stall(engine) -> sweeps.SweepClaim:
    """Claim a request as a daemon that then stalls past its lease (a long pause)."""
    claim = sweeps.claim_sweep(engine, worker="slow:1", lease_seconds=300)
    assert claim is not None
    execute(engine, "UPDATE gc_sweep_requests SET claimed_at = claimed_at"
            " - interval '301 seconds' WHERE id = :id", id=claim.id)  # fmt: skip
    return claim


class TestLostClaim:
    def test_a_claim_lost_while_stalled_does_not_sweep_again(self, engine, settings):
        """Another daemon claimed the stalled one's request and swept it; the stalled one then
        recorded its own run over the first and swept the user again (the model asked twice).
        Its run is refused and failed, nothing of it worked; the request keeps the run that
        swept."""
        alice = expired(engine, "alice")
        request_id = sweeps.request_sweep(engine, "alice")
        stalled = claim_and_stall(engine)
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as daemon:
            assert daemon.sweep_next() is True  # the next claimer sweeps alice
        swept = request_row(engine, request_id)
        assert swept["status"] == "done" and status(engine, alice) == "deleted"
        with closing(Daemon(engine, settings, clock=lambda: NOON)) as late:
            late.worker_id = stalled.worker
            late._serve_sweep(stalled)  # the stalled daemon goes on
        row = request_row(engine, request_id)
        assert (row["status"], row["run_id"]) == ("done", swept["run_id"])
        runs = execute(engine, "SELECT id, status FROM gc_runs ORDER BY started_at").all()
        assert [r.status for r in runs] == ["completed", "failed"]
        query = "SELECT count(*) FROM gc_run_batches WHERE run_id = :r AND state = 'done'"
        assert execute(engine, query, r=runs[1].id).scalar() == 0  # nothing of it was worked

    def test_only_the_holder_records_a_run(self, engine, settings):
        """The claimer whose claim was taken over cannot record its run; the holder can."""
        expired(engine, "alice")
        sweeps.request_sweep(engine, "alice")
        first = claim_and_stall(engine)
        second = sweeps.claim_sweep(engine, worker="next:2", lease_seconds=300)
        assert second is not None and second.id == first.id
        late = unrecorded_run(engine, settings, "alice", age_seconds=0)
        assert sweeps.attach_run(engine, first, late) is False
        own = unrecorded_run(engine, settings, "alice", age_seconds=0)
        assert sweeps.attach_run(engine, second, own) is True
        assert request_row(engine, first.id)["run_id"] == own
