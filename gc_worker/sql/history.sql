-- history_try_lock --
-- One process prunes at a time (every replica's nightly run ends with a prune): session-level.
SELECT pg_try_advisory_lock(4242003, 0)

-- history_unlock --
-- Let the next prune in.
SELECT pg_advisory_unlock(4242003, 0)

-- history_runs --
-- Runs whose history may go: ended (not running) before :cutoff, and so did the plan they
-- applied and the run that applied them (the pair goes together; a plan whose applier a
-- prune took while the plan was busy goes at the next one); none a pending erasure
-- request, an open sweep request or an open review item names (those keep the whole run).
-- `held`: what else names the run (an erasure request of any status, any review item, a run
-- kept): its gc_runs row stays, only its audit rows no longer needed go. Oldest first.
-- Each table that names runs is read once per prune (hashed), never once per run: sweep
-- requests, review items and erasure requests are never pruned, and grow.
WITH named AS (  -- runs review items name, and whether an open one does
    SELECT CAST(run_id AS text) AS id, status = 'open' AS open FROM gc_review_items
    WHERE run_id IS NOT NULL
    UNION ALL
    SELECT resolution ->> 'run_id', status = 'open' FROM gc_review_items
    WHERE resolution ->> 'run_id' IS NOT NULL
), old AS (
    SELECT r.id FROM gc_runs r
    WHERE r.status <> 'running' AND r.finished_at < :cutoff
      AND NOT EXISTS (SELECT 1 FROM gc_erasure_requests e
                      WHERE e.run_id = r.id AND e.status = 'pending')
      AND NOT EXISTS (SELECT 1 FROM gc_sweep_requests s
                      WHERE s.run_id = r.id AND s.status IN ('pending', 'running'))
      AND CAST(r.id AS text) NOT IN (SELECT id FROM named WHERE open)
)
SELECT r.id, r.finished_at, r.plan_run_id,
       r.id IN (SELECT run_id FROM gc_erasure_requests WHERE run_id IS NOT NULL)
       OR CAST(r.id AS text) IN (SELECT id FROM named)
       AS held
FROM gc_runs r JOIN old o ON o.id = r.id
WHERE (r.plan_run_id IS NULL OR r.plan_run_id IN (SELECT id FROM old))
  AND (r.applied_by IS NULL OR r.applied_by IN (SELECT id FROM old)
       OR NOT EXISTS (SELECT 1 FROM gc_runs a WHERE a.id = r.applied_by))
ORDER BY r.finished_at, r.id

-- history_lock_run --
-- The run's row for this transaction, unless another transaction holds it (then it is left).
SELECT id FROM gc_runs WHERE id = :run_id AND status <> 'running' FOR UPDATE SKIP LOCKED

-- history_prune_actions --
-- One bounded slice of a run's audit rows after (:batch_no, :seq, :id), in index order: those
-- still needed stay, the rest go (only counted when :apply is false). Still needed:
-- - a record the worker made (create_merged, applied or restored) while the record, one of its
--   sources, or a record made from it is named anywhere: erasure follows these rows from a
--   source to what was made of it once lineage is gone (sql/erasure.sql erasure_audited_*,
--   erasure_audited_owner); the read rule dates a record by its first one;
-- - a retirement (obsolete, merge) of a row still stored: the read rule reads its prior
--   valid_until;
-- - a soft delete still in place, a score still the row's: restore would undo them;
-- - the latest restorable change of a row still stored: what `restore --memory` undoes.
WITH slice AS (
    SELECT a.id, a.batch_no, a.seq,
        (a.action = 'create_merged' AND a.outcome IN ('applied', 'restored')
         AND (EXISTS (SELECT 1 FROM memories m WHERE m.id = a.memory_id)
              OR EXISTS (SELECT 1 FROM jsonb_array_elements_text(
                                     CASE WHEN jsonb_typeof(a.details -> 'sources') = 'array'
                                          THEN a.details -> 'sources' END) AS s(v)
                         JOIN memories m
                           ON m.id = CAST(CASE WHEN s.v ~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'
                                               THEN s.v END AS uuid))
              OR EXISTS (SELECT 1 FROM gc_actions c  -- gc_actions_created_sources_idx
                         WHERE c.action = 'create_merged' AND c.outcome IN ('applied', 'restored')
                           AND c.details -> 'sources' ? CAST(a.memory_id AS text))))
        OR (a.outcome = 'applied'
            AND a.action IN ('soft_delete', 'obsolete', 'merge', 'set_importance')
            AND EXISTS (
                SELECT 1 FROM memories m
                WHERE m.id = a.memory_id
                  AND ((a.action IN ('obsolete', 'merge') AND a.prior IS NOT NULL)
                       OR (a.action = 'soft_delete' AND m.status = 'deleted'
                           AND m.status_changed_at = r.now)
                       OR (a.action = 'set_importance'
                           AND CAST(m.importance AS text) = a.details ->> 'importance')
                       OR (a.reason NOT LIKE 'erasure%'
                           AND NOT EXISTS (
                               SELECT 1 FROM gc_actions g  -- gc_actions_memory_idx
                               WHERE g.memory_id = a.memory_id AND g.outcome = 'applied'
                                 AND g.action IN ('soft_delete', 'obsolete', 'merge',
                                                  'create_merged', 'set_importance')
                                 AND g.reason NOT LIKE 'erasure%'
                                 AND (g.recorded_at, g.id) > (a.recorded_at, a.id))))))
        AS needed
    FROM gc_actions a JOIN gc_runs r ON r.id = a.run_id
    WHERE a.run_id = :run_id AND (a.batch_no, a.seq, a.id) > (:batch_no, :seq, :id)
    ORDER BY a.batch_no, a.seq, a.id
    LIMIT :limit
), gone AS (
    DELETE FROM gc_actions d USING slice s
    WHERE d.id = s.id AND NOT s.needed AND :apply
    RETURNING d.id
)
SELECT (SELECT count(*) FROM slice) AS scanned,
       (SELECT count(*) FROM slice WHERE NOT needed) AS prunable,
       (SELECT count(*) FROM slice WHERE needed) AS kept,
       (SELECT count(*) FROM gone) AS deleted,
       last.batch_no, last.seq, last.id
FROM (SELECT batch_no, seq, id FROM slice ORDER BY batch_no DESC, seq DESC, id DESC LIMIT 1)
     AS last
RIGHT JOIN (SELECT 1) AS one ON true

-- history_prune_batches --
-- One bounded slice of a run's batch rows after :after (only counted when :apply is false).
WITH slice AS (
    SELECT run_id, batch_no FROM gc_run_batches WHERE run_id = :run_id AND batch_no > :after
    ORDER BY batch_no LIMIT :limit
), gone AS (
    DELETE FROM gc_run_batches b USING slice s
    WHERE b.run_id = s.run_id AND b.batch_no = s.batch_no AND :apply
    RETURNING b.batch_no
)
SELECT (SELECT count(*) FROM slice) AS scanned, (SELECT count(*) FROM gone) AS deleted,
       (SELECT max(batch_no) FROM slice) AS last

-- history_prune_spend --
-- A run's model spend row (only counted when :apply is false).
WITH gone AS (DELETE FROM gc_run_llm_spend WHERE run_id = :run_id AND :apply RETURNING run_id)
SELECT (SELECT count(*) FROM gc_run_llm_spend WHERE run_id = :run_id) AS found,
       (SELECT count(*) FROM gone) AS deleted

-- history_run_left --
-- Whether the run's row must stay: audit rows of it were kept, or a run still stored applied
-- its plan (appliers are pruned before their plans).
SELECT EXISTS (SELECT 1 FROM gc_actions WHERE run_id = :run_id)
    OR EXISTS (SELECT 1 FROM gc_runs c WHERE c.plan_run_id = :run_id)

-- history_delete_run --
-- The run's row (its batches, spend and audit rows are gone already).
DELETE FROM gc_runs WHERE id = :run_id RETURNING id

-- history_figures_recorded --
-- Whether a prune already recorded the run's figures (gc_runs.pruned_figures, migration 0016).
SELECT pruned_figures IS NOT NULL FROM gc_runs WHERE id = :run_id

-- history_record_figures --
-- The run's report figures as they were before its first prune (totals, job counters, LLM
-- usage, failed batches, drifted count): its batches and most of its audit rows go, the report
-- still shows the whole run's figures and says that the listed actions are what is left.
-- Written once.
UPDATE gc_runs
SET pruned_figures = CAST(:figures AS jsonb) || jsonb_build_object('pruned_at', clock_timestamp())
WHERE id = :run_id AND pruned_figures IS NULL
