-- run_users --
-- Every user with at least one memory, by a loose index scan over memories_user_status_idx.
WITH RECURSIVE u AS (
    (SELECT user_id FROM memories ORDER BY user_id LIMIT 1)
    UNION ALL
    SELECT (SELECT m.user_id FROM memories m WHERE m.user_id > u.user_id
            ORDER BY m.user_id LIMIT 1)
    FROM u WHERE u.user_id IS NOT NULL
)
SELECT user_id FROM u WHERE user_id IS NOT NULL

-- known_users --
-- Which of the given users have any memory.
SELECT DISTINCT user_id FROM memories WHERE user_id = ANY(:users)

-- insert_run --
-- Record a new run.
INSERT INTO gc_runs (id, mode, trigger, now, users, jobs, settings, plan_run_id)
VALUES (:id, :mode, :trigger, :now, :users, :jobs, CAST(:settings AS jsonb), :plan_run_id)

-- local_lock_timeout --
-- For the rest of this transaction, wait at most :ms milliseconds for any lock (each caller
-- names its bound and why).
SELECT set_config('lock_timeout', CAST(:ms AS text), true)

-- lock_batch --
-- The batch row of a claimed batch (gc_worker.claims), locked for the transaction that
-- applies it; nothing if it is no longer pending. Another transaction holds it only if that
-- worker's claim was lost (its claiming session was ended) while its batch transaction runs:
-- wait for it (batch_run.BATCH_LOCK_TIMEOUT_MS), then the row is done and this worker moves
-- on.
SELECT batch_no, users, work
FROM gc_run_batches
WHERE run_id = :run_id AND batch_no = :batch_no AND state = 'pending'
FOR UPDATE

-- custom_plans --
-- Plan every statement of the batch transaction for its actual arrays (see batch_run.py).
SET LOCAL plan_cache_mode = force_custom_plan

-- custom_plans_session --
-- The same for a claiming session that plans before the batch transaction.
SET plan_cache_mode = force_custom_plan

-- finish_batch --
-- Mark a claimed batch done with its per-job counters (keeping the model usage of earlier
-- attempts that wrote nothing, note_unapplied_llm). The candidate ids the scan picked for it
-- (work.ids) served its plan and go; work.users stays (an apply of this plan reads it).
UPDATE gc_run_batches
SET state = 'done', worker = :worker, finished_at = clock_timestamp(), work = work - 'ids',
    stats = CAST(:stats AS jsonb)
            || CASE WHEN stats ? '_llm_unapplied'
                    THEN jsonb_build_object('_llm_unapplied', stats -> '_llm_unapplied')
                    ELSE '{}' END
WHERE run_id = :run_id AND batch_no = :batch_no AND state = 'pending'

-- note_unapplied_llm --
-- The model usage of a batch attempt that wrote nothing (given up at a stop, failed and rolled
-- back, or finished meanwhile by another worker): paid for all the same, so the run's report
-- counts it. One entry per attempt.
UPDATE gc_run_batches
SET stats = stats || jsonb_build_object('_llm_unapplied',
        coalesce(stats -> '_llm_unapplied', '[]') || jsonb_build_array(CAST(:usage AS jsonb)))
WHERE run_id = :run_id AND batch_no = :batch_no

-- complete_run --
-- Close a run once no batch is pending: completed, or failed if a batch failed (its error
-- names the first five; their users were left as they were and the next run takes them).
WITH lines AS (
    SELECT batch_no, row_number() OVER (ORDER BY batch_no) AS rn,
           'batch ' || batch_no || ' (' || cardinality(users) || ' users): ' || error AS line
    FROM gc_run_batches WHERE run_id = :run_id AND state = 'failed'
), failed AS (
    SELECT count(*) AS n,
           string_agg(line, '; ' ORDER BY batch_no) FILTER (WHERE rn <= 5)
           || CASE WHEN count(*) > 5 THEN '; …' ELSE '' END AS errors
    FROM lines
)
UPDATE gc_runs
SET status = CASE WHEN failed.n > 0 THEN 'failed' ELSE 'completed' END,
    error = CASE WHEN failed.n > 0
                 THEN failed.n || ' batch(es) failed and were left as they were (the others '
                      || 'were done): ' || failed.errors
            END,
    finished_at = clock_timestamp()
FROM failed
WHERE id = :run_id AND status = 'running'
  AND NOT EXISTS (SELECT 1 FROM gc_run_batches b WHERE b.run_id = :run_id AND b.state = 'pending')
RETURNING id, status

-- fail_run --
-- Record why a run stopped; its finished batches stay applied, the rest never started.
UPDATE gc_runs SET status = 'failed', finished_at = clock_timestamp(), error = :error
WHERE id = :run_id AND status = 'running'

-- lock_run_row --
-- Hold a run's row for the transaction: starting or taking up the apply of a plan is one
-- process at a time.
SELECT id FROM gc_runs WHERE id = :run_id FOR UPDATE

-- resume_run --
-- Take up a stopped run again (killed, or the database lost): its pending batches get worked.
-- Failed batches stay failed (their users are the next run's).
UPDATE gc_runs SET status = 'running', finished_at = NULL, error = NULL
WHERE id = :run_id AND status IN ('running', 'failed')

-- get_run --
-- One run.
SELECT * FROM gc_runs WHERE id = :run_id

-- claim_plan --
-- Mark a completed dry run (or one failed only by failed batches: engine._check_plan) as being
-- applied by a new run (at most once).
UPDATE gc_runs SET applied_by = :apply_run_id
WHERE id = :plan_run_id AND mode = 'dry_run' AND status IN ('completed', 'failed')
  AND applied_by IS NULL
RETURNING id

-- copy_batches --
-- An apply run walks the same user batches as its plan; a batch the plan failed to plan has
-- nothing to apply and stays failed (its users were left as they were).
INSERT INTO gc_run_batches (run_id, batch_no, users, work, state, error, finished_at)
SELECT :run_id, batch_no, users, work,
       CASE WHEN state = 'failed' THEN 'failed' ELSE 'pending' END,
       CASE WHEN state = 'failed' THEN 'not planned: ' || error END,
       CASE WHEN state = 'failed' THEN clock_timestamp() END
FROM gc_run_batches WHERE run_id = :plan_run_id

-- pending_batch_count --
-- How many of a run's batches are still pending.
SELECT count(*) FROM gc_run_batches WHERE run_id = :run_id AND state = 'pending'

-- planned_actions --
-- The stored plan of one batch, in plan order.
SELECT job, action, memory_id, user_id, reason, details, row_version, content_preview
FROM gc_actions
WHERE run_id = :run_id AND batch_no = :batch_no AND outcome = 'planned'
ORDER BY seq

-- run_actions --
-- A run's actions in order, for its report.
SELECT job, action, memory_id, user_id, reason, details, outcome, content_preview
FROM gc_actions
WHERE run_id = :run_id
ORDER BY batch_no, seq

-- run_batch_stats --
-- Per-batch job counters of a run.
SELECT stats FROM gc_run_batches WHERE run_id = :run_id AND state = 'done'

-- run_llm_usage --
-- Every batch's model usage, done or not: what was applied (_llm) and what attempts that wrote
-- nothing spent (_llm_unapplied).
SELECT stats -> '_llm' AS applied, stats -> '_llm_unapplied' AS unapplied
FROM gc_run_batches
WHERE run_id = :run_id AND (stats ? '_llm' OR stats ? '_llm_unapplied')

-- recent_runs --
-- The latest runs (or the one :run_id), newest first. A run still 'running' that no process
-- works (nobody holds its participation lock, lock_run_shared: it was killed) shows as
-- 'stopped'. `held`: why the daemon holds the plan for a person (schedule.sql hold_plan).
SELECT id, mode, trigger, now, started_at, finished_at, plan_run_id, applied_by, held,
       CASE WHEN status = 'running' AND NOT EXISTS (
                SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'advisory' AND l.granted
                  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  AND l.classid = 4242002 AND l.objsubid = 2
                  AND l.objid = CAST(hashtext(CAST(r.id AS text)) AS oid))
            THEN 'stopped' ELSE status END AS status
FROM gc_runs r
WHERE CAST(:run_id AS uuid) IS NULL OR r.id = :run_id
ORDER BY started_at DESC LIMIT :limit

-- complete_restore_run --
-- A restore run has no batches; it is complete when its transaction commits.
UPDATE gc_runs SET status = 'completed', finished_at = clock_timestamp() WHERE id = :run_id

-- plan_age_hours --
-- How long ago (server clock) a run finished, in hours (the review window counts from the end
-- too; a plan a daemon stopped is resumed only while its instant is recent: close_unresumable).
SELECT extract(epoch FROM clock_timestamp() - finished_at) / 3600 FROM gc_runs WHERE id = :run_id

-- run_failed_batches --
-- A run's failed batches (gc_worker.report).
SELECT batch_no, users, error FROM gc_run_batches
WHERE run_id = :run_id AND state = 'failed'
ORDER BY batch_no

-- fail_run_if_alone --
-- fail_run, unless another process participates in the run: a session other than this
-- process's own (:own_pids, whether still alive or not) holds its shared advisory lock
-- (lock_run_shared). That process goes on with it.
UPDATE gc_runs SET status = 'failed', finished_at = clock_timestamp(), error = :error
WHERE id = :run_id AND status = 'running'
  AND NOT EXISTS (
      SELECT 1 FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = 4242002
        AND l.objid = CAST(hashtext(CAST(:run_id AS text)) AS oid)
        AND l.pid <> ALL(CAST(:own_pids AS int[])))
RETURNING id

-- set_score_pass --
-- Whether a run refreshes decay scores in one pass over the table after its batches
-- (gc_worker.score_pass) instead of batch by batch: an apply over every user, decay among its
-- jobs, more than one batch (one batch reads only its own users' rows: cheaper than the table),
-- and run.score_pass (:enabled) on; memories a plain table without children (a partitioned or
-- inheriting one has rows outside the pages the pass walks) on PostgreSQL 14+ (a scan by tid
-- range; before, each range would read it all).
UPDATE gc_runs SET score_pass = 'due'
WHERE id = :run_id AND :enabled AND mode = 'apply' AND users IS NULL AND 'decay' = ANY(jobs)
  AND (SELECT count(*) FROM gc_run_batches b WHERE b.run_id = :run_id) > 1
  AND (SELECT relkind FROM pg_class WHERE oid = CAST('memories' AS regclass)) = 'r'
  AND NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = CAST('memories' AS regclass))
  AND current_setting('server_version_num')::int >= 140000

-- score_pass_pages --
-- The pages of memories now (a score pass covers them in ranges; the last range is open), and
-- how many users the run's done batches hold (what each range's hashed user set must hold).
SELECT pg_relation_size('memories') / current_setting('block_size')::bigint AS pages,
       (SELECT coalesce(sum(cardinality(b.users)), 0) FROM gc_run_batches b
        WHERE b.run_id = :run_id AND b.state = 'done') AS users

-- score_pass_count --
-- Add one page range's rewritten scores to the run's count (in that range's transaction).
UPDATE gc_runs
SET scores_refreshed = coalesce(scores_refreshed, 0) + :refreshed,
    finished_at = greatest(finished_at, clock_timestamp())
WHERE id = :run_id

-- score_pass_end --
-- The pass is over: done, or stopped early (the scores it did not reach are the next run's).
UPDATE gc_runs SET score_pass = :state, scores_refreshed = coalesce(scores_refreshed, 0)
WHERE id = :run_id AND score_pass IS NOT NULL

-- held_user_keys --
-- The users some batch holds right now (claims' per-user advisory locks, sql/schedule.sql
-- lock_batch_users; a forget request's transaction lock): a range of the score pass leaves their
-- rows alone, so a concurrent run over them does not see its planned rows drift under it.
SELECT coalesce(array_agg(DISTINCT CAST(CAST(CAST(objid AS bigint) AS bit(32)) AS integer)), '{}')
FROM pg_locks
WHERE locktype = 'advisory' AND classid = 4242001 AND objsubid = 2 AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())

-- run_batch_count --
-- How many batch rows a run has (none once prune-history took them, gc_worker.report).
SELECT count(*) FROM gc_run_batches WHERE run_id = :run_id
