-- set_run_slot --
-- Give a new run its unique slot (e.g. nightly:2026-11-30T03:00:00+00:00); a second replica's
-- attempt waits for the first one's commit, then fails on gc_runs_slot_key.
UPDATE gc_runs SET slot = :slot WHERE id = :run_id

-- lock_batch_users --
-- Per-user advisory locks for a claimed batch, on the claiming session (gc_worker.claims)
-- from before its plan to after its commit, taken in one sorted pass (no deadlock between
-- batches): a user is never in two batches at once (sweep vs nightly run). Released by
-- unlock_claim, or when the session ends.
SELECT count(*)
FROM (
    SELECT pg_advisory_lock(4242001, k)
    FROM (SELECT DISTINCT hashtext(u) AS k FROM unnest(CAST(:users AS text[])) AS u ORDER BY k) s
) locked

-- user_lock_slice --
-- lock_batch_users waits in slices of a second, so a worker asked to stop while another
-- worker's batch holds one of its users (e.g. a long plan that asks the model) notices it.
SET lock_timeout = '1s'

-- reset_lock_timeout --
-- Back to the session's own lock_timeout once the users are locked (or the wait given up).
RESET lock_timeout

-- pending_batches --
-- A run's batches not done yet, in order: the ones a worker may try to claim (none once the run
-- was marked failed or completed: its other participants stop too).
SELECT b.batch_no
FROM gc_run_batches b JOIN gc_runs r ON r.id = b.run_id
WHERE b.run_id = :run_id AND b.state = 'pending' AND r.status = 'running'
ORDER BY b.batch_no

-- try_claim_batch --
-- Claim one batch of a run for this session: a session-level advisory lock, so the claim holds
-- while the batch is planned with no transaction open (the model may take minutes to answer)
-- and ends with the session if the worker dies.
SELECT pg_try_advisory_lock(
    hashtextextended(CAST(:run_id AS text) || '/' || CAST(:batch_no AS text), 4242003))

-- claimed_batch --
-- The claimed batch, if it is still pending (another worker may have finished it between
-- pending_batches and the claim).
SELECT batch_no, users, work
FROM gc_run_batches
WHERE run_id = :run_id AND batch_no = :batch_no AND state = 'pending'

-- count_claim --
-- A claim of the batch begins: counted as lost until release_claim (the worker died inside the
-- batch if it never comes). Returns the claims lost before this one.
UPDATE gc_run_batches SET lost_claims = lost_claims + 1
WHERE run_id = :run_id AND batch_no = :batch_no AND state = 'pending'
RETURNING lost_claims - 1 AS lost

-- release_claim --
-- The claiming worker is alive at the end of its claim, whatever became of the batch.
UPDATE gc_run_batches SET lost_claims = greatest(lost_claims - 1, 0)
WHERE run_id = :run_id AND batch_no = :batch_no

-- fail_batch --
-- A batch given up: rolled back (its job raised) or lost too often (the worker died inside it).
-- It stays as it was in the store; the run goes on with its other batches and ends failed.
UPDATE gc_run_batches
SET state = 'failed', error = :error, worker = :worker, finished_at = clock_timestamp()
WHERE run_id = :run_id AND batch_no = :batch_no AND state = 'pending'

-- unlock_claim --
-- Release everything the claiming session holds: the batch claim and its users' locks.
SELECT pg_advisory_unlock_all()

-- keep_idle_session --
-- A session that holds locks while it sits idle (a claim, a participation) must not be ended
-- by the server's idle_session_timeout (PostgreSQL 14+): its locks would go with it.
SELECT set_config('idle_session_timeout', '0', false)
WHERE current_setting('server_version_num')::int >= 140000

-- reset_session --
-- What a claiming session changed for itself, undone before it goes back to the pool.
RESET plan_cache_mode

-- run_by_slot --
-- The run that holds a slot, if any.
SELECT id, status, mode FROM gc_runs WHERE slot = :slot

-- try_run_exclusive --
-- True when no worker participates in the run (nobody holds its shared advisory lock).
SELECT pg_try_advisory_lock(4242002, hashtext(CAST(:run_id AS text)))

-- unlock_run_exclusive --
-- Release the probe lock of try_run_exclusive.
SELECT pg_advisory_unlock(4242002, hashtext(CAST(:run_id AS text)))

-- lock_run_shared --
-- Mark this session as a participant of the run until unlock_run_shared (or disconnect).
SELECT pg_advisory_lock_shared(4242002, hashtext(CAST(:run_id AS text)))

-- unlock_run_shared --
-- This session no longer participates in the run.
SELECT pg_advisory_unlock_shared(4242002, hashtext(CAST(:run_id AS text)))

-- running_runs --
-- Runs still open for the given triggers, oldest first (candidates for resuming).
SELECT id FROM gc_runs
WHERE status = 'running' AND trigger = ANY(CAST(:triggers AS text[]))
ORDER BY started_at

-- due_plans --
-- Completed nightly plans (plan_then_apply) not applied nor rejected whose review delay is over.
-- finished_at is the server's clock; a daemon run with a clock ahead of it (--now in the
-- future) measures the delay from the plan's end on its own clock (its `now` + its duration),
-- so the review window is never skipped.
-- A plan that ended failed only because some batches failed (none pending) applies the rest;
-- one an operator cancelled (:cancelled, gc_worker.cancel) never does, even once the batch in
-- flight at the cancel committed and left none pending.
-- A held plan (too large to apply unattended, hold_plan) waits for a person.
SELECT id FROM gc_runs
WHERE slot IS NOT NULL AND mode = 'dry_run' AND applied_by IS NULL AND held IS NULL
  AND (status = 'completed'
       OR (status = 'failed' AND error IS DISTINCT FROM :cancelled AND NOT EXISTS (
               SELECT 1 FROM gc_run_batches b WHERE b.run_id = gc_runs.id AND b.state = 'pending')))
  AND greatest(finished_at, now + (finished_at - started_at)) <= :cutoff
ORDER BY finished_at

-- plan_size --
-- How many active memories the plan retires (soft delete, obsolete, merge; an erasure's are not
-- counted: a user asked for them), and how many memories are active now. A row the plan names
-- that is gone or no longer active is not counted: applied, it would drift (and the share could
-- pass 1, holding a plan although hold_above_share = 1 never holds).
SELECT (SELECT count(DISTINCT a.memory_id) FROM gc_actions a
        JOIN memories m ON m.id = a.memory_id AND m.status = 'active'
        WHERE a.run_id = :run_id AND a.outcome = 'planned' AND a.job <> 'erasure'
          AND a.action IN ('soft_delete', 'obsolete', 'merge')) AS retiring,
       (SELECT count(*) FROM memories WHERE status = 'active') AS active

-- hold_plan --
-- Hold a nightly plan for a person: the daemon will not apply it. Only a plan still waiting
-- (not applied, rejected or held meanwhile by another replica).
UPDATE gc_runs SET held = :reason
WHERE id = :run_id AND mode = 'dry_run' AND applied_by IS NULL AND held IS NULL
  AND status IN ('completed', 'failed')
RETURNING id

-- held_plan_count --
-- Held plans still waiting for a person (the daemon's memory_gc_plans_held gauge).
SELECT count(*) FROM gc_runs
WHERE held IS NOT NULL AND mode = 'dry_run' AND applied_by IS NULL
  AND status IN ('completed', 'failed')

-- erasure_pending_users --
-- Users with a pending erasure request that no erasure run has tried since it was filed and
-- since the latest held plan was made (one that ended: a run a stopped daemon left running
-- tried nothing). A request such a run left pending (drifted, misfiled, the run failed) is
-- tried again with the next night's held plan, not by a run at every upkeep.
WITH since AS (
    SELECT max(finished_at) AS plan_at FROM gc_runs
    WHERE held IS NOT NULL AND mode = 'dry_run' AND applied_by IS NULL
      AND status IN ('completed', 'failed')
)
SELECT DISTINCT e.user_id FROM gc_erasure_requests e, since
WHERE e.status = 'pending'
  AND NOT EXISTS (SELECT 1 FROM gc_runs r
                  WHERE r.trigger = 'erasure' AND r.mode = 'apply'
                    AND r.status IN ('completed', 'failed')
                    AND r.started_at >= greatest(e.requested_at, since.plan_at)
                    AND (r.users IS NULL OR e.user_id = ANY(r.users)))
ORDER BY e.user_id

-- reject_stale_plans --
-- Nightly plans older than run.max_plan_age_hours that nobody applied: never to be applied.
UPDATE gc_runs
SET status = 'rejected',
    error = coalesce(error || '; ', '')
            || 'not applied within run.max_plan_age_hours (' || :max_age_hours || ') of being made'
WHERE slot IS NOT NULL AND mode = 'dry_run' AND applied_by IS NULL
  AND (status = 'completed'
       OR (status = 'failed' AND NOT EXISTS (
               SELECT 1 FROM gc_run_batches b WHERE b.run_id = gc_runs.id AND b.state = 'pending')))
  AND finished_at < clock_timestamp() - make_interval(secs => :max_age_hours * 3600)
RETURNING id

-- reject_plan --
-- Reject a completed dry run that was not applied: it will never be applied.
UPDATE gc_runs
SET status = 'rejected', error = coalesce(error, 'rejected by ' || :who)
WHERE id = :run_id AND mode = 'dry_run' AND applied_by IS NULL
  AND (status = 'completed'
       OR (status = 'failed' AND NOT EXISTS (
               SELECT 1 FROM gc_run_batches b WHERE b.run_id = :run_id AND b.state = 'pending')))
RETURNING id

-- last_successes --
-- When the last run of each trigger completed, whichever replica ran it (a daemon's gauge
-- starts from it: a freshly started replica exported no series, and a staleness alert saw
-- nothing to compare until the next success).
SELECT trigger, max(finished_at) AS finished_at FROM gc_runs
WHERE status = 'completed' AND trigger = ANY(CAST(:triggers AS text[])) AND finished_at IS NOT NULL
GROUP BY trigger

-- run_outcome --
-- A finished run's status, kind and duration, for the metrics.
SELECT status, mode, trigger, finished_at,
       extract(epoch FROM (finished_at - started_at)) AS seconds
FROM gc_runs WHERE id = :run_id

-- batch_action_counts --
-- Actions of the run's batches this daemon committed (:batches, gc_worker.batch_run
-- .take_committed), except batches already counted.
SELECT b.batch_no, a.job, a.action, a.outcome, count(a.id) AS n
FROM gc_run_batches b
LEFT JOIN gc_actions a ON a.run_id = b.run_id AND a.batch_no = b.batch_no
WHERE b.run_id = :run_id AND b.state = 'done'
  AND b.batch_no = ANY(CAST(:batches AS integer[]))
  AND NOT (b.batch_no = ANY(CAST(:seen AS integer[])))
GROUP BY b.batch_no, a.job, a.action, a.outcome

-- insert_sweep_request --
-- Queue an on-demand single-user sweep (an application may insert the same row itself).
INSERT INTO gc_sweep_requests (user_id, dry_run, requested_by)
VALUES (:user_id, :dry_run, :requested_by)
RETURNING id

-- pending_sweep_of --
-- A request of this user and kind no daemon has taken yet: it sweeps what is there when it is
-- claimed, so it answers for a new one. Not one handed back with its run, whose instant is
-- that of its first claim.
SELECT id FROM gc_sweep_requests
WHERE user_id = :user_id AND dry_run = :dry_run AND status = 'pending' AND run_id IS NULL
ORDER BY requested_at, id
LIMIT 1

-- claim_sweep_request --
-- Take the oldest pending request, or one whose claim outlived the lease and whose run no
-- daemon takes part in (its daemon died: a live one holds the run's lock_run_shared, read
-- here without taking anything); a request another daemon is claiming right now is skipped.
UPDATE gc_sweep_requests r
SET status = 'running', claimed_at = clock_timestamp(), claimed_by = :worker,
    attempts = r.attempts + 1
WHERE r.id = (
    SELECT id FROM gc_sweep_requests s
    WHERE status = 'pending'
       OR (status = 'running' AND claimed_at < clock_timestamp() - make_interval(secs => :lease)
           AND NOT EXISTS (
               SELECT FROM pg_locks l
               WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                 AND l.classid = 4242002
                 AND l.objid = CAST(hashtext(CAST(s.run_id AS text)) AS oid)))
    ORDER BY requested_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING r.id, r.user_id, r.dry_run, r.run_id, r.attempts

-- sweep_run_status --
-- The status of a request's run, if it is a sweep of the request's user and kind; none for a
-- run an application named there that is not (another user's, a dry run for an apply, a
-- nightly run): the request is swept with a run of its own.
SELECT status FROM gc_runs
WHERE id = :run_id AND trigger = 'sweep' AND users = CAST(ARRAY[:user_id] AS text[])
  AND (mode = 'dry_run') = :dry_run

-- attach_sweep_run --
-- Record which run serves a claimed request (a retry joins it instead of starting another):
-- only its holder does (a daemon whose claim was taken over while it stalled must not record,
-- nor work, a second run of the user).
UPDATE gc_sweep_requests SET run_id = :run_id
WHERE id = :id AND status = 'running' AND claimed_by = :worker

-- finish_sweep_request --
-- Close a request as done or failed: only its holder does (a daemon whose claim was taken
-- over leaves it to the new holder).
UPDATE gc_sweep_requests
SET status = :status, finished_at = clock_timestamp(), error = :error
WHERE id = :id AND status = 'running' AND claimed_by = :worker

-- renew_sweep_request --
-- The holder's sweep moved on: its lease starts again.
UPDATE gc_sweep_requests SET claimed_at = clock_timestamp()
WHERE id = :id AND status = 'running' AND claimed_by = :worker

-- release_sweep_request --
-- Hand a request back to the queue; its run, if any, is kept. A stopping daemon's claim is not
-- an attempt (:refund 1); one that lost the database mid-sweep keeps it counted (:refund 0),
-- so a sweep that brings the server down every time fails after MAX_ATTEMPTS.
UPDATE gc_sweep_requests
SET status = 'pending', claimed_at = NULL, claimed_by = NULL,
    attempts = greatest(attempts - CAST(:refund AS integer), 0)
WHERE id = :id AND status = 'running' AND claimed_by = :worker

-- unrecorded_sweep_runs --
-- Sweep runs still running that no open request names, started more than a lease ago: their
-- daemon died (or lost the database) between creating the run and recording it on the request
-- (two commits), and the request's next claimer swept with a run of its own; or the request
-- was closed (given up) while a daemon still worked the run, and that daemon died. Nothing
-- resumes a sweep run; fail_abandoned_run leaves one somebody works.
SELECT r.id FROM gc_runs r
WHERE r.status = 'running' AND r.trigger = 'sweep'
  AND r.started_at < clock_timestamp() - make_interval(secs => :lease)
  AND NOT EXISTS (SELECT FROM gc_sweep_requests s
                  WHERE s.run_id = r.id AND s.status IN ('pending', 'running'))
ORDER BY r.started_at

-- fail_unrecorded_sweep_run --
-- fail_run for one of unrecorded_sweep_runs, unless a request came to name it meanwhile.
UPDATE gc_runs r SET status = 'failed', finished_at = clock_timestamp(), error = :error
WHERE r.id = :run_id AND r.status = 'running'
  AND NOT EXISTS (SELECT FROM gc_sweep_requests s
                  WHERE s.run_id = r.id AND s.status IN ('pending', 'running'))

-- close_stopped_runs --
-- Fail the runs nothing resumes (a `run`, an `apply`, a `forget --now`: not the daemon's, which
-- it resumes, nor a sweep's, unrecorded_sweep_runs) that are still running, started more than a
-- lease ago (their process has long taken part: lock_run_shared, taken before the run's row
-- committed, engine.started / apply_start.applying), and that nobody works: their
-- process was killed or lost the database. Otherwise they stayed running for ever, and history
-- retention, which prunes only runs that ended, kept them for ever too. An apply closed so is
-- still taken up again by `apply` of its plan (start_apply: its pending batches).
UPDATE gc_runs r SET status = 'failed', finished_at = clock_timestamp(), error = :error
WHERE r.status = 'running' AND NOT (r.trigger = ANY(CAST(:kept AS text[])))
  AND r.started_at < clock_timestamp() - make_interval(secs => :lease)
  AND NOT EXISTS (
      SELECT 1 FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = 4242002
        AND l.objid = CAST(hashtext(CAST(r.id AS text)) AS oid))
RETURNING r.id

-- get_sweep_request --
-- One request.
SELECT * FROM gc_sweep_requests WHERE id = :id

-- pending_sweep_count --
-- Requests waiting for a daemon.
SELECT count(*) FROM gc_sweep_requests WHERE status = 'pending'

-- backend_pid --
-- This session's server process (a participation session: claims.own_participation_pids).
SELECT pg_backend_pid()
