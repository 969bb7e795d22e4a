-- restore_hold_filing --
-- A restore brings back no row a pending erasure request names (restore_in_place); one filed
-- while the restore is under way (its check already made) would be carried out by
-- `forget --purge-now` from rows read before the restore commits: the rows the restore holds
-- skipped, the request left pending, the rows back on the read path. Filing a request waits
-- for the restores under way (erasure_wait_for_restores): shared here, one lock per restore.
SELECT pg_advisory_xact_lock_shared(4242005, 0)

-- restorable_actions --
-- Applied, still-restorable actions of a run (optionally of some memories), newest first.
SELECT a.id AS action_id, a.run_id, a.job, a.action, a.memory_id, a.user_id, a.reason,
       a.details, a.prior, r.now AS run_now
FROM gc_actions a JOIN gc_runs r ON r.id = a.run_id
WHERE a.run_id = :run_id AND a.outcome = 'applied'
  AND a.action IN ('soft_delete', 'obsolete', 'merge', 'create_merged', 'set_importance')
  AND a.reason NOT LIKE 'erasure%'  -- an erasure is never undone
  AND (CAST(:memory_ids AS uuid[]) IS NULL OR a.memory_id = ANY(CAST(:memory_ids AS uuid[])))
ORDER BY a.batch_no DESC, a.seq DESC

-- run_unrestorable --
-- What a restore of the run cannot bring back, by kind: rows it purged, rows it erased, and
-- actions already restored by an earlier restore.
-- Rows, not actions: an erased row also purged counts as purged only; reactivations (reason
-- erasure_reactivated) brought rows back and are not counted.
WITH acted AS (
    SELECT memory_id,
           bool_or(action = 'hard_delete' AND outcome = 'applied') AS purged,
           bool_or(action = 'soft_delete' AND outcome = 'applied'
                   AND reason IN ('erasure', 'erasure_tombstone')) AS erased,
           bool_or(outcome = 'restored') AS restored
    FROM gc_actions WHERE run_id = :run_id
    GROUP BY memory_id
)
SELECT count(*) FILTER (WHERE purged) AS purged,
       count(*) FILTER (WHERE erased AND NOT purged) AS erased,
       count(*) FILTER (WHERE restored) AS restored_before
FROM acted

-- latest_action_for_memory --
-- The worker's most recent applied restorable action on one memory.
SELECT a.run_id, a.action, a.details ->> 'group' AS grp
FROM gc_actions a
WHERE a.memory_id = :memory_id AND a.outcome = 'applied'
  AND a.action IN ('soft_delete', 'obsolete', 'merge', 'create_merged', 'set_importance')
  AND a.reason NOT LIKE 'erasure%'  -- an erasure is never undone
ORDER BY a.recorded_at DESC, a.id DESC
LIMIT 1

-- group_members --
-- Memories of one action group of a run.
SELECT memory_id FROM gc_actions
WHERE run_id = :run_id AND outcome = 'applied' AND details ->> 'group' = :grp

-- restore_in_place --
-- Of the rows a run retired, those on which everything the worker wrote is still in place: the
-- status, reason and instant, and the valid_until, superseded_by and deleted_at the action left
-- (its own value where it wrote one, the prior one where it did not; apply_status's coalesce).
-- A row the application changed since keeps the application's write (a user's own delete of
-- a row the worker had retired stamps deleted_at; a row moved to another user stays retired:
-- no restore spans two users). A later run's change still applied to the row is the one in
-- place, even where it wrote the very same fields (a run with the same `--now`): only its own
-- restore undoes it. Locked until the restore commits, so nothing changes between this check
-- and restore_status.
SELECT m.id
FROM memories m
JOIN unnest(CAST(:ids AS uuid[]), CAST(:expect_status AS text[]), CAST(:expect_reason AS text[]),
            CAST(:closed_valid_until AS timestamptz[]), CAST(:set_superseded AS uuid[]),
            CAST(:priors AS jsonb[]), CAST(:users AS text[]), CAST(:action_ids AS bigint[]))
     AS a(id, expect_status, expect_reason, closed_valid_until, set_superseded, prior, user_id,
          action_id)
  ON m.id = a.id AND m.user_id = a.user_id
CROSS JOIN LATERAL jsonb_to_record(a.prior)
     AS p(superseded_by uuid, valid_until timestamptz, deleted_at timestamptz)
WHERE m.status = a.expect_status AND m.status_reason = a.expect_reason
  AND m.status_changed_at = :run_now
  AND m.valid_until IS NOT DISTINCT FROM coalesce(a.closed_valid_until, p.valid_until)
  AND m.superseded_by IS NOT DISTINCT FROM coalesce(a.set_superseded, p.superseded_by)
  AND m.deleted_at IS NOT DISTINCT FROM
      CASE WHEN a.expect_status = 'deleted' THEN CAST(:run_now AS timestamptz) ELSE p.deleted_at END
  AND NOT EXISTS (  -- a pending erasure request names it (its user's, or the memory's own):
      SELECT 1 FROM gc_erasure_requests r  -- not back on the read path until the request is done
      WHERE r.status = 'pending' AND r.user_id = m.user_id
        AND (r.kind = 'user' OR r.memory_id = m.id))
  AND NOT EXISTS (SELECT 1 FROM gc_actions g
                  WHERE g.memory_id = m.id AND g.id > a.action_id AND g.run_id <> :run_id
                    AND g.outcome = 'applied' AND g.action IN ('soft_delete', 'obsolete', 'merge'))
FOR UPDATE OF m

-- restore_status --
-- Put retired rows (found and locked by restore_in_place) back to their prior status fields;
-- valid_until only where the action closed it (elsewhere it is still the prior value).
UPDATE memories m
SET status = p.status, status_reason = p.status_reason, status_changed_at = p.status_changed_at,
    superseded_by = p.superseded_by, deleted_at = p.deleted_at,
    valid_until = CASE WHEN a.closed_valid_until IS NULL THEN m.valid_until ELSE p.valid_until END
FROM unnest(CAST(:ids AS uuid[]), CAST(:closed_valid_until AS timestamptz[]),
            CAST(:priors AS jsonb[])) AS a(id, closed_valid_until, prior),
     jsonb_to_record(a.prior) AS p(status text, status_reason text, status_changed_at timestamptz,
                                   superseded_by uuid, deleted_at timestamptz, valid_until timestamptz)
WHERE m.id = a.id
RETURNING m.id

-- restore_importance --
-- Put re-assessed importance back, only where the worker's score is still in place (and no
-- later run's score, applied since, is: restore_in_place), on a row still the same user's
-- (no restore spans two users) and not erased (an erasure is never undone, in any column).
UPDATE memories m
SET importance = (a.prior ->> 'importance')::smallint,
    importance_assessed_at = (a.prior ->> 'importance_assessed_at')::timestamptz
FROM unnest(CAST(:ids AS uuid[]), CAST(:expect AS smallint[]), CAST(:priors AS jsonb[]),
            CAST(:action_ids AS bigint[]), CAST(:users AS text[]))
     AS a(id, expect, prior, action_id, user_id)
WHERE m.id = a.id AND m.user_id = a.user_id
  AND m.importance = a.expect AND m.importance_assessed_at = :run_now
  AND NOT coalesce(m.status = 'deleted' AND m.status_reason IN ('erasure', 'erasure_tombstone'),
                   false)
  AND NOT EXISTS (SELECT 1 FROM gc_actions g
                  WHERE g.memory_id = m.id AND g.id > a.action_id AND g.run_id <> :run_id
                    AND g.outcome = 'applied' AND g.action = 'set_importance')
RETURNING m.id

-- active_among --
-- Which of these memories are active (share-locked: they stay so until the restore commits).
SELECT id FROM memories WHERE id = ANY(:ids) AND status = 'active' FOR SHARE

-- created_unchanged --
-- Of the records a run created (merges, summaries), those still as the run made them: active,
-- not pinned, the same user, content and updated_at (the application sets updated_at when it
-- edits a memory, the worker never does; the content is compared too, for writers that do
-- not), and the columns the run gave it that only the application changes afterwards: scope,
-- slot, validity, TTL, metadata, type, source, confidence, declared supersedes (none at
-- creation, and no row of the user declaring it), importance (unless the worker's own
-- importance job wrote it).
-- A record the application edited, pinned, moved or retired since is its own. Locked until
-- the restore commits. The record's fields are read in the store's own column types over the
-- row itself (its other columns, an application's NOT NULL domain among them, keep their
-- values: a NULL base row would run them through their types and fail), every compared field
-- NULL unless the record states it.
SELECT m.id
FROM memories m
JOIN unnest(CAST(:ids AS uuid[]), CAST(:users AS text[]), CAST(:records AS jsonb[]),
            CAST(:contents AS text[]), CAST(:updated AS timestamptz[]))
     AS a(id, user_id, record, content, updated_at)
  ON m.id = a.id
CROSS JOIN LATERAL jsonb_populate_record(
    m, jsonb_build_object('scope', NULL, 'slot', NULL, 'valid_from', NULL, 'valid_until', NULL,
                          'expires_at', NULL, 'metadata', NULL, 'memory_type', NULL,
                          'source', NULL, 'confidence', NULL, 'importance', NULL)
       || a.record) AS r
WHERE m.status = 'active' AND NOT m.pinned AND m.user_id = a.user_id
  AND m.content = a.content AND m.updated_at = a.updated_at
  AND m.scope IS NOT DISTINCT FROM r.scope AND m.slot IS NOT DISTINCT FROM r.slot
  AND m.valid_from IS NOT DISTINCT FROM r.valid_from
  AND m.valid_until IS NOT DISTINCT FROM r.valid_until
  AND m.expires_at IS NOT DISTINCT FROM r.expires_at
  AND m.metadata = coalesce(r.metadata, CAST('{}' AS jsonb))
  AND m.memory_type = coalesce(r.memory_type, 'semantic')
  AND m.source = coalesce(r.source, 'gc_merge')
  AND m.confidence = coalesce(r.confidence, 1.0)
  AND cardinality(m.supersedes) = 0
  -- a row of the user declares it supersedes the record (a correction): bringing the members
  -- back, undeclared, would make the stale fact current again beside it
  AND NOT EXISTS (SELECT 1 FROM memories o
                  WHERE o.user_id = m.user_id AND o.status IN ('active', 'obsolete')
                    AND m.id = ANY(o.supersedes))
  -- a pending request to forget the record (or its user): its sources state what the user
  -- asked to forget, and the erasure takes them with it; they stay merged until then
  AND NOT EXISTS (SELECT 1 FROM gc_erasure_requests r
                  WHERE r.status = 'pending' AND r.user_id = m.user_id
                    AND (r.kind = 'user' OR r.memory_id = m.id))
  AND (m.importance = coalesce(r.importance, 3)
       OR EXISTS (SELECT 1 FROM gc_actions g
                  WHERE g.memory_id = m.id AND g.action = 'set_importance'
                    AND g.outcome = 'applied' AND g.details ->> 'importance' = m.importance::text))
FOR UPDATE OF m

-- retire_created --
-- Take records a run created (merges, summaries) off the read path again.
UPDATE memories m
SET status = 'deleted', status_reason = 'restored', status_changed_at = :now, deleted_at = :now
WHERE m.id = ANY(:ids) AND m.status = 'active'
RETURNING m.id

-- mark_restored --
-- Mark audit rows whose change was undone.
UPDATE gc_actions SET outcome = 'restored' WHERE id = ANY(:ids)

-- restore_left_state --
-- Why a restore could not undo a change, per action (of the run's user): the row is gone
-- (erased, purged by the worker past retention, else deleted by the application), moved to
-- another user, erased, named by a pending erasure request (of its user, or of the memory);
-- for a created record, a row it was made from was purged (it holds what that row said, for
-- good); a later run's change is what the row holds now (`later_run`, that run's id: restore
-- it first); else the application changed it since (gc_worker.restore._why_left refines that
-- for a merge kept whole).
SELECT s.action_id,
       CASE WHEN m.id IS NULL AND gone.erased THEN 'erased'
            WHEN m.id IS NULL AND gone.purged THEN 'purged'
            WHEN m.id IS NULL THEN 'no_longer_stored'
            WHEN m.user_id <> s.user_id THEN 'moved_to_another_user'
            WHEN m.status = 'deleted' AND m.status_reason IN ('erasure', 'erasure_tombstone')
                THEN 'erased'
            WHEN EXISTS (SELECT 1 FROM gc_erasure_requests r
                         WHERE r.status = 'pending' AND r.user_id = s.user_id
                           AND (r.kind = 'user' OR r.memory_id = s.id))
                THEN 'erasure_pending'
            WHEN s.action = 'create_merged' AND EXISTS (
                     SELECT 1
                     FROM gc_actions c
                     CROSS JOIN LATERAL jsonb_array_elements_text(
                         CASE WHEN jsonb_typeof(c.details -> 'sources') = 'array'
                              THEN c.details -> 'sources' ELSE CAST('[]' AS jsonb) END) AS src(id)
                     JOIN gc_actions h ON h.memory_id = CAST(src.id AS uuid)
                     WHERE c.id = s.action_id
                       AND h.action = 'hard_delete' AND h.outcome = 'applied'
                       AND NOT EXISTS (SELECT 1 FROM memories g WHERE g.id = h.memory_id))
                THEN 'source_purged'
            WHEN later.run_id IS NOT NULL THEN 'later_run'
            ELSE 'changed_since'
       END AS why,
       later.run_id AS later_run
FROM unnest(CAST(:ids AS uuid[]), CAST(:users AS text[]), CAST(:action_ids AS bigint[]),
            CAST(:actions AS text[])) AS s(id, user_id, action_id, action)
LEFT JOIN memories m ON m.id = s.id
CROSS JOIN LATERAL (
    -- purged as erased: by an erasure, or by hard_delete under either window (an erased row
    -- the deleted rows' shorter window took reads retention_deleted; its details say erased)
    SELECT coalesce(bool_or(h.reason LIKE '%erasure%'
                            OR h.details ->> 'status_reason' IN ('erasure', 'erasure_tombstone')),
                    false) AS erased,
           count(*) > 0 AS purged
    FROM gc_actions h
    WHERE h.memory_id = s.id AND h.action = 'hard_delete' AND h.outcome = 'applied') AS gone
LEFT JOIN LATERAL (  -- the latest change of another run, later than this one, still in place
    SELECT g.run_id
    FROM gc_actions g JOIN gc_runs gr ON gr.id = g.run_id
    WHERE g.memory_id = s.id AND g.id > s.action_id AND g.run_id <> :run_id
      AND g.outcome = 'applied'
      AND CASE WHEN s.action = 'set_importance'
               THEN g.action = 'set_importance' AND m.importance_assessed_at = gr.now
                    AND m.importance::text = g.details ->> 'importance'
               ELSE g.action IN ('soft_delete', 'obsolete', 'merge')
                    AND m.status = CASE g.action WHEN 'soft_delete' THEN 'deleted'
                                                 WHEN 'obsolete' THEN 'obsolete'
                                                 ELSE 'merged' END
                    AND m.status_reason = g.reason AND m.status_changed_at = gr.now
          END
    ORDER BY g.id DESC
    LIMIT 1) AS later ON true
