-- Per-job "has work" tests for gc_worker.triage: each pick_ block is a row predicate, the rows
-- a job's candidates query returns, whose ids the batch then reads by id; each work_ block is
-- one aggregate over a user's rows in memories, true when the job (beyond its picked rows, if
-- it picks) has work for that user. Binds are the job's, prefixed `<job>__`.
-- tests/test_properties.py checks that a run with the scan plans exactly what one without does.

-- scan_settings --
-- For the rest of the run-start transaction: the scan's grouping by hash, not by sorting a
-- million rows (external merge) first. The planner takes the aggregates' states for large and
-- plans the hash table in spilled partitions under the default work_mem; its real use is small
-- (about 1.3 MB at 10k users; bounded by work_mem × hash_mem_multiplier with many more users).
-- Measured at 1M rows / 10k users on 2 cores: 1.0 s by sort, 0.75–0.83 s by hash.
SELECT set_config('work_mem', '64MB', true), set_config('enable_sort', 'off', true)

-- work_ttl_expiry --
-- ttl_expiry_candidates.
bool_or(status = 'active' AND NOT pinned AND expires_at <= :now)

-- work_decay --
-- decay_refresh (decay's other work, its candidates, is what pick_decay picks: the score
-- function is evaluated once per row for each, not again here).
bool_or(status = 'active' AND NOT pinned AND (
    decayed_confidence IS NULL
    OR abs(decayed_confidence - memory_gc_decayed(confidence, importance,
           greatest(created_at, updated_at, last_accessed_at), :now,
           :decay__half_life_days, :decay__multipliers)) > :decay__epsilon))

-- pick_decay --
-- The rows decay_candidates returns (before the batch's own exclusions): their ids are kept per
-- batch, so the batch reads those rows by id instead of every active row of its users.
status = 'active' AND NOT pinned AND created_at <= :decay__grace_cutoff
AND importance <= :decay__max_importance
AND memory_gc_decayed(confidence, importance, greatest(created_at, updated_at, last_accessed_at),
                      :now, :decay__half_life_days, :decay__multipliers) < :decay__forget_below

-- pick_usage_prune --
-- The rows usage_prune_candidates returns (before the batch's own exclusions).
status = 'active' AND NOT pinned
AND coalesce(last_accessed_at, created_at) <= :usage_prune__unused_cutoff
AND created_at <= :usage_prune__grace_cutoff AND importance <= :usage_prune__max_importance

-- work_user_cap --
-- user_cap_counts (pinned rows count).
count(*) FILTER (WHERE status = 'active') > :user_cap__max_memories

-- work_hard_delete --
-- hard_delete_candidates, less the pinned rows its purge_reason keeps (all but erased ones,
-- which either window purges: the deleted rows' too, when it is the shorter).
bool_or((status = 'deleted'
         AND (NOT pinned OR status_reason = ANY(:hard_delete__erasure_reasons))
         AND coalesce(deleted_at, status_changed_at) <= :hard_delete__deleted_cutoff)
     OR (status = 'deleted' AND status_reason = ANY(:hard_delete__erasure_reasons)
         AND coalesce(deleted_at, status_changed_at) <= :hard_delete__erasure_cutoff)
     OR (status IN ('obsolete', 'merged') AND NOT pinned
         AND coalesce(status_changed_at, updated_at) <= :hard_delete__history_cutoff))
