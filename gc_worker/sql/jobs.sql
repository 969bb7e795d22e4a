-- ttl_expiry_candidates --
-- Active, unpinned rows of a user batch whose TTL has passed at :now.
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       expires_at
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND expires_at <= :now AND NOT (id = ANY(:taken))
ORDER BY user_id, id

-- decay_candidates --
-- Active, unpinned rows past the grace period whose decayed confidence is under the floor
-- (rows re-assessed earlier in this batch are included so the plan can use their new importance).
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       importance, confidence, created_at, updated_at, last_accessed_at
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND created_at <= :grace_cutoff AND NOT (id = ANY(:taken))
  AND (id = ANY(:reassessed) OR (
        importance <= :max_importance
        AND memory_gc_decayed(confidence, importance,
              greatest(created_at, updated_at, last_accessed_at), :now,
              :half_life_days, :multipliers) < :forget_below))
ORDER BY user_id, id

-- decay_candidates_picked --
-- decay_candidates, reading by id the rows the run-start scan picked and the rows re-assessed
-- earlier in this batch (planning changes no row, so nothing else can have become a candidate
-- since the scan; an application write since is served by the next run).
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       importance, confidence, created_at, updated_at, last_accessed_at
FROM memories
WHERE id = ANY(CAST(:picked AS uuid[])) AND user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND created_at <= :grace_cutoff AND NOT (id = ANY(:taken))
  AND (id = ANY(:reassessed) OR (
        importance <= :max_importance
        AND memory_gc_decayed(confidence, importance,
              greatest(created_at, updated_at, last_accessed_at), :now,
              :half_life_days, :multipliers) < :forget_below))
ORDER BY user_id, id

-- decay_refresh --
-- Rewrite decayed_confidence where it moved by more than :epsilon (never on pinned rows). Rows
-- a request-path transaction holds are skipped (SKIP LOCKED, as in lock_rows): the next run
-- refreshes them, and the worker never waits on, or deadlocks with, the application. The outer
-- scope repeats the batch's filter so the locked ids are joined to the batch's rows, not to a
-- scan of the whole table.
UPDATE memories
SET decayed_confidence = memory_gc_decayed(confidence, importance,
        greatest(created_at, updated_at, last_accessed_at), :now, :half_life_days, :multipliers)
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND id IN (
    SELECT id FROM memories
    WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
      AND (decayed_confidence IS NULL
           OR abs(decayed_confidence - memory_gc_decayed(confidence, importance,
                  greatest(created_at, updated_at, last_accessed_at), :now,
                  :half_life_days, :multipliers)) > :epsilon)
    FOR UPDATE SKIP LOCKED)

-- decay_refresh_pages --
-- decay_refresh over one range of the table's pages [:lo, :hi) (a run's score pass,
-- gc_worker.score_pass), for the users of the run's done batches (as the batches would have:
-- not a user the run did not take, nor one of a failed batch) but those whose per-user lock a
-- batch holds right now (:held, their hashtext keys). Rows an application transaction holds are
-- skipped, as in decay_refresh. Each locked row is fetched again by its tuple id (score_pass_plan
-- makes that a nested loop: ~7 % faster per range than a hash join of the range with itself);
-- ONLY: tuple ids name rows of this table, not of a child table (set_score_pass gives a table
-- with children no pass). The done batches' users are a hashed subplan (IS TRUE keeps the
-- planner from making it a join, which with hash joins off would compare every row with every
-- user: 10 s instead of 0.3 s per range at 10k users). The planner hashes it only if it expects
-- the set to fit in work_mem x hash_mem_multiplier: score_pass_plan raises work_mem for the
-- range to fit the run's users (past ~150k users at 4 MB it stopped hashing: 4 ms per row). A
-- row updated by another transaction between the statement's snapshot and its lock is left to
-- the next run.
UPDATE ONLY memories m
SET decayed_confidence = memory_gc_decayed(m.confidence, m.importance,
        greatest(m.created_at, m.updated_at, m.last_accessed_at), :now, :half_life_days,
        :multipliers)
FROM (
    SELECT ctid AS tid FROM ONLY memories
    WHERE ctid >= CAST(:lo AS tid) AND ctid < CAST(:hi AS tid) AND status = 'active'
      AND NOT pinned AND NOT (hashtext(user_id) = ANY(:held))
      AND (user_id IN (SELECT unnest(b.users) FROM gc_run_batches b
                       WHERE b.run_id = :run_id AND b.state = 'done')) IS TRUE
      AND (decayed_confidence IS NULL
           OR abs(decayed_confidence - memory_gc_decayed(confidence, importance,
                  greatest(created_at, updated_at, last_accessed_at), :now,
                  :half_life_days, :multipliers)) > :epsilon)
    FOR UPDATE SKIP LOCKED
) locked
WHERE m.ctid = locked.tid

-- score_pass_plan --
-- For decay_refresh_pages, in its transaction only: fetch each locked row by its tuple id, and
-- give the done users' hashed set room (:work_mem_kb, never less than the server's setting).
SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
       set_config('work_mem', greatest(
           (SELECT setting::bigint FROM pg_settings WHERE name = 'work_mem'),
           CAST(:work_mem_kb AS bigint))::text || 'kB', true)

-- decay_refresh_count --
-- How many rows decay_refresh would rewrite after the batch's planned actions (dry runs).
SELECT count(*)
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned AND NOT (id = ANY(:taken))
  AND (decayed_confidence IS NULL
       OR abs(decayed_confidence - memory_gc_decayed(confidence, importance,
              greatest(created_at, updated_at, last_accessed_at), :now,
              :half_life_days, :multipliers)) > :epsilon)

-- usage_prune_candidates --
-- Active, unpinned rows not used since :unused_cutoff and created before :grace_cutoff.
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       importance, created_at, last_accessed_at
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND coalesce(last_accessed_at, created_at) <= :unused_cutoff
  AND created_at <= :grace_cutoff AND NOT (id = ANY(:taken))
  AND (importance <= :max_importance OR id = ANY(:reassessed))
ORDER BY user_id, id

-- usage_prune_candidates_picked --
-- usage_prune_candidates, reading picked rows by id (see decay_candidates_picked).
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       importance, created_at, last_accessed_at
FROM memories
WHERE id = ANY(CAST(:picked AS uuid[])) AND user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND coalesce(last_accessed_at, created_at) <= :unused_cutoff
  AND created_at <= :grace_cutoff AND NOT (id = ANY(:taken))
  AND (importance <= :max_importance OR id = ANY(:reassessed))
ORDER BY user_id, id

-- hard_delete_candidates --
-- Soft-deleted / obsolete / merged rows whose retention has run out at :now.
SELECT id, user_id, xmin::text::bigint AS row_version, status, status_reason, pinned,
       coalesce(deleted_at, status_changed_at) AS deleted_since,
       coalesce(status_changed_at, updated_at) AS retired_since
FROM memories
WHERE user_id = ANY(:users) AND NOT (id = ANY(:taken))
  AND ((status = 'deleted' AND coalesce(deleted_at, status_changed_at) <= :deleted_cutoff)
    OR (status = 'deleted' AND status_reason = ANY(:erasure_reasons)
        AND coalesce(deleted_at, status_changed_at) <= :erasure_cutoff)
    OR (status IN ('obsolete', 'merged')
        AND coalesce(status_changed_at, updated_at) <= :history_cutoff))
ORDER BY user_id, id
