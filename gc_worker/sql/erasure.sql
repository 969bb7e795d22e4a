-- erasure_scope --
-- Users of the batch the erasure job must read: a pending request, or a tombstone to enforce.
SELECT user_id FROM gc_erasure_requests WHERE status = 'pending' AND user_id = ANY(:users)
UNION
SELECT DISTINCT user_id FROM gc_erasure_tombstones WHERE user_id = ANY(:users)

-- erasure_requests --
-- Pending erasure requests of the users in scope, oldest first.
SELECT id, kind, user_id, memory_id, purge_now
FROM gc_erasure_requests
WHERE status = 'pending' AND user_id = ANY(:scope)
ORDER BY requested_at, id

-- erasure_rows --
-- Every memory of the users in scope, with its content (hashed in memory, never kept). The row
-- version is the content version (gc_worker.actions.CONTENT_VERSIONED).
SELECT id, user_id, memory_gc_content_version(m) AS row_version, status, status_reason,
       superseded_by, content
FROM memories m
WHERE user_id = ANY(:scope) AND NOT (id = ANY(:taken))
ORDER BY user_id, id

-- erasure_lineage --
-- Lineage edges (derived_id, source_id) whose source belongs to a user in scope.
SELECT l.derived_id, l.source_id
FROM memory_lineage l JOIN memories m ON m.id = l.source_id
WHERE m.user_id = ANY(:scope)

-- erasure_audited_derived --
-- For requested memories: the records the worker made from them, found in its audit
-- (create_merged details.sources, which every scrub keeps; GIN-indexed, migration 0009),
-- transitively, within the user — also through records the application deleted, whose lineage
-- went with them (the requested memory itself, or a record between it and a summary made of
-- its merge). (target_id, derived_id).
WITH RECURSIVE d (target_id, user_id, id) AS (
    SELECT t.target_id, t.user_id, t.target_id
    FROM unnest(CAST(:targets AS uuid[]), CAST(:owners AS text[])) AS t(target_id, user_id)
    UNION
    SELECT d.target_id, d.user_id, a.memory_id
    FROM d JOIN gc_actions a
      ON a.action = 'create_merged' AND a.outcome IN ('applied', 'restored')
     AND a.details -> 'sources' ? CAST(d.id AS text) AND a.user_id = d.user_id
)
SELECT target_id, id AS derived_id FROM d WHERE id <> target_id

-- erasure_audited_sources --
-- For requested memories the worker made (a merged record, a summary): the rows it made them
-- from, in its audit (the create_merged row of the record, details.sources), transitively,
-- within the user — also through records the application deleted. (target_id, source_id).
WITH RECURSIVE s (target_id, user_id, id) AS (
    SELECT t.target_id, t.user_id, t.target_id
    FROM unnest(CAST(:targets AS uuid[]), CAST(:owners AS text[])) AS t(target_id, user_id)
    UNION
    SELECT s.target_id, s.user_id, CAST(src.value AS uuid)
    FROM s JOIN gc_actions a
      ON a.memory_id = s.id AND a.action = 'create_merged'
     AND a.outcome IN ('applied', 'restored') AND a.user_id = s.user_id
    CROSS JOIN LATERAL jsonb_array_elements_text(a.details -> 'sources') AS src(value)
)
SELECT target_id, id AS source_id FROM s WHERE id <> target_id

-- erasure_tombstones --
-- Tombstones of the users in scope: (user_id, memory_id, content_hash).
SELECT user_id, memory_id, content_hash FROM gc_erasure_tombstones WHERE user_id = ANY(:scope)

-- erasure_reactivate --
-- Put back on the read path the rows an erased derived record had absorbed.
UPDATE memories
SET status = 'active', status_reason = 'erasure_reactivated', status_changed_at = :now,
    superseded_by = NULL, deleted_at = NULL
WHERE id = ANY(:ids) AND status <> 'active'
RETURNING id

-- erasure_insert_tombstones --
-- Remember what was erased: ids and content hashes, never content; request_id is the first of
-- the erasing requests, request_ids all of them (:request_lists, one '{…}' per row). A row
-- tombstoned before gains the requests it lacks.
INSERT INTO gc_erasure_tombstones AS t (user_id, memory_id, content_hash, preview_hash,
                                        request_id, reason, request_ids)
SELECT o, i, h, p, r, w, CAST(l AS uuid[])
FROM unnest(CAST(:owners AS text[]), CAST(:ids AS uuid[]), CAST(:hashes AS text[]),
            CAST(:previews AS text[]), CAST(:requests AS uuid[]), CAST(:reasons AS text[]),
            CAST(:request_lists AS text[])) AS n(o, i, h, p, r, w, l)
ON CONFLICT (user_id, memory_id, content_hash) DO UPDATE
SET request_ids = ARRAY(SELECT DISTINCT u FROM unnest(t.request_ids || EXCLUDED.request_ids) AS u
                        ORDER BY u)
WHERE NOT t.request_ids @> EXCLUDED.request_ids

-- erasure_gone --
-- Of :ids, those no longer stored or erased: what is recorded about them goes from every
-- user's rows (a row the application moved kept its earlier user's audit). A memory still on
-- the read path (a request the application misfiled under another user) keeps its own.
SELECT i.id FROM unnest(CAST(:ids AS uuid[])) AS i(id)
WHERE NOT EXISTS (SELECT 1 FROM memories m
                  WHERE m.id = i.id
                    AND NOT coalesce(m.status = 'deleted' AND m.status_reason = ANY(:erasure_reasons),
                                  false))

-- erasure_erased_ids --
-- Of :ids, those an erasure reached: erased and still stored, or purged with a tombstone.
SELECT i.id FROM unnest(CAST(:ids AS uuid[])) AS i(id)
WHERE EXISTS (SELECT 1 FROM gc_erasure_tombstones t WHERE t.memory_id = i.id)
   OR EXISTS (SELECT 1 FROM memories m
              WHERE m.id = i.id AND m.status = 'deleted'
                AND m.status_reason = ANY(:erasure_reasons))

-- erasure_scrub_actions --
-- Strip content from the audit and plans of erased memories; ids, action and reason stay. Every
-- row that names an erased memory loses its preview: a deferred group's preview (no memory_id)
-- is one of its members' text, whichever member is erased. A forgotten user (:whole_users)
-- loses it from every row, including rows about memories already gone (purged by retention,
-- deleted by the application) or never created (a dry run's merged record). Rows of other
-- users lose what they recorded about a memory erased or gone (:gone): it was theirs before
-- the application moved it — its own rows, the deferred groups and merges naming it.
WITH hit AS (
    SELECT a.id FROM gc_actions a
    WHERE a.user_id = ANY(:owners)
      AND (a.user_id = ANY(:whole_users) OR a.memory_id = ANY(:ids)
           OR EXISTS (SELECT 1 FROM unnest(CAST(:id_texts AS text[])) AS i(t)
                      WHERE strpos(CAST(a.details AS text), i.t) > 0)
           -- a preview or merged text stating erased content, which no id names (an exact
           -- twin the application deleted: its row is gone): its hash is a new tombstone's,
           -- which only rows of the tombstone's user can match. A stored row's own audit stays
           -- as it is (it is erased by id if it states the content; restore reads its record)
           OR (a.user_id = ANY(:hash_owners)
               AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = a.memory_id)
               AND (memory_gc_content_hash(a.user_id, a.content_preview) = ANY(:hashes)
                    OR memory_gc_content_hash(a.user_id, a.details -> 'record' ->> 'content')
                       = ANY(:hashes))))
    UNION
    SELECT a.id FROM gc_actions a WHERE a.memory_id = ANY(:gone)  -- gc_actions_memory_idx
    UNION  -- gc_actions_group_members_idx (migration 0007)
    SELECT a.id FROM gc_actions a
    WHERE a.memory_id IS NULL AND a.content_preview IS NOT NULL
      AND a.details -> 'memory_ids' ?| CAST(:gone_texts AS text[])
    UNION  -- gc_actions_created_sources_idx (migration 0009)
    SELECT a.id FROM gc_actions a
    WHERE a.action = 'create_merged' AND a.details -> 'sources' ?| CAST(:gone_texts AS text[])
)
UPDATE gc_actions a
SET content_preview = NULL,
    details = coalesce((SELECT jsonb_object_agg(d.key, d.value)
                        FROM jsonb_each(CASE WHEN jsonb_typeof(a.details) = 'object'
                                             THEN a.details END) AS d
                        WHERE d.key = ANY(:keep_details)), CAST('{}' AS jsonb))
              || jsonb_build_object('scrubbed', true),
    prior = CASE WHEN jsonb_typeof(a.prior) = 'object'
                 THEN (SELECT jsonb_object_agg(p.key, p.value) FROM jsonb_each(a.prior) AS p
                       WHERE p.key = ANY(:keep_prior))
            END
FROM hit
WHERE a.id = hit.id
RETURNING a.id

-- erasure_drop_llm_cache --
-- Forget cached LLM decisions taken on erased memories, and every one of a forgotten user: the
-- erasing users' own, and any user's about a memory erased or gone (:gone).
DELETE FROM gc_llm_cache
WHERE key IN (SELECT key FROM gc_llm_cache  -- gc_llm_cache_user_idx, gc_llm_cache_memories_idx
              WHERE user_id = ANY(:owners)
                AND (memory_ids && CAST(:ids AS uuid[]) OR user_id = ANY(:whole_users))
              UNION
              SELECT key FROM gc_llm_cache WHERE memory_ids && CAST(:gone AS uuid[]))
RETURNING key

-- erasure_drop_llm_cache_by_content --
-- Of the users whose rows were just erased, the cached decisions no id of an erased row names
-- that still hold erased content: a string in the decision hashing to a new tombstone's, or a
-- decision about rows no longer stored (an exact twin the application deleted, merged before).
DELETE FROM gc_llm_cache c
WHERE c.user_id = ANY(:hash_owners)
  AND (EXISTS (SELECT 1 FROM unnest(c.memory_ids) AS i(id)
               WHERE NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = i.id))
       OR EXISTS (SELECT 1 FROM jsonb_path_query(c.value, 'strict $.**') AS v(j)
                  WHERE jsonb_typeof(v.j) = 'string'
                    AND memory_gc_content_hash(c.user_id, v.j #>> '{}') = ANY(:hashes)))
RETURNING key

-- erasure_trim_dismissals --
-- A merge a restore undid keeps its other members apart, and restored scores keep the other
-- rows unscored: the erased ids leave the set, which stays while two or more remain (one, for
-- scores; erasure_drop_reviews drops the others). Another user's set (the application moved a
-- row after the restore) loses the ids of memories erased or gone (:gone).
UPDATE gc_review_items r
SET memory_ids = ARRAY(SELECT unnest(r.memory_ids) EXCEPT SELECT unnest(e.ids))
FROM (SELECT r2.id, CAST(:ids AS uuid[]) AS ids  -- gc_review_items_memories_idx
      FROM gc_review_items r2
      WHERE r2.memory_ids && CAST(:ids AS uuid[]) AND r2.user_id = ANY(:owners)
      UNION ALL
      SELECT r2.id, CAST(:gone AS uuid[])
      FROM gc_review_items r2
      WHERE r2.memory_ids && CAST(:gone AS uuid[]) AND NOT r2.user_id = ANY(:owners)) AS e
WHERE r.id = e.id AND NOT r.user_id = ANY(:whole_users)
  AND r.kind IN ('compaction', 'importance') AND r.status = 'resolved'
  AND r.reason = 'restored' AND r.memory_ids && e.ids
  AND cardinality(ARRAY(SELECT unnest(r.memory_ids) EXCEPT SELECT unnest(e.ids)))
      >= CASE r.kind WHEN 'importance' THEN 1 ELSE 2 END
RETURNING r.id

-- erasure_drop_reviews --
-- Drop review items that name an erased memory (the question is moot, the content must go),
-- and every one of a forgotten user: the erasing users' own, and any user's naming a memory
-- erased or gone (:gone).
DELETE FROM gc_review_items
WHERE id IN (SELECT id FROM gc_review_items  -- by user, and by gc_review_items_memories_idx
             WHERE user_id = ANY(:owners)
               AND (memory_ids && CAST(:ids AS uuid[]) OR user_id = ANY(:whole_users))
             UNION
             SELECT id FROM gc_review_items WHERE memory_ids && CAST(:gone AS uuid[]))
RETURNING id

-- erasure_complete_requests --
-- Complete the batch's pending requests none of whose targets (with the records a requested
-- memory was made from, and the records derived from any of them) is still unerased; targets
-- that drifted keep their request pending for the next run.
WITH RECURSIVE pending AS (
    SELECT id, kind, user_id, memory_id FROM gc_erasure_requests
    WHERE status = 'pending' AND user_id = ANY(:users)
), audited (request_id, user_id, id) AS (  -- erasure_audited_derived
    SELECT p.id, p.user_id, p.memory_id FROM pending p WHERE p.kind = 'memory'
    UNION
    SELECT d.request_id, d.user_id, a.memory_id
    FROM audited d JOIN gc_actions a
      ON a.action = 'create_merged' AND a.outcome IN ('applied', 'restored')
     AND a.details -> 'sources' ? CAST(d.id AS text) AND a.user_id = d.user_id
), audited_sources (request_id, user_id, id) AS (  -- erasure_audited_sources
    SELECT p.id, p.user_id, p.memory_id FROM pending p WHERE p.kind = 'memory'
    UNION
    SELECT d.request_id, d.user_id, CAST(src.value AS uuid)
    FROM audited_sources d JOIN gc_actions a
      ON a.memory_id = d.id AND a.action = 'create_merged'
     AND a.outcome IN ('applied', 'restored') AND a.user_id = d.user_id
    CROSS JOIN LATERAL jsonb_array_elements_text(a.details -> 'sources') AS src(value)
), made_from (request_id, memory_id, user_id) AS (
    SELECT p.id, m.id, m.user_id
    FROM pending p JOIN memories m
      ON m.user_id = p.user_id AND (p.kind = 'user' OR m.id = p.memory_id)
    UNION
    SELECT a.request_id, m.id, m.user_id
    FROM audited_sources a JOIN memories m ON m.id = a.id AND m.user_id = a.user_id
    UNION
    SELECT f.request_id, s.id, s.user_id
    FROM made_from f JOIN memory_lineage l ON l.derived_id = f.memory_id
         JOIN memories s ON s.id = l.source_id AND s.user_id = f.user_id
), reach (request_id, memory_id, user_id) AS (
    SELECT request_id, memory_id, user_id FROM made_from
    UNION
    SELECT a.request_id, m.id, m.user_id
    FROM audited a JOIN memories m ON m.id = a.id AND m.user_id = a.user_id
    UNION  -- every row erased for the request (a twin of the same text, a tombstone's match):
    -- what was made from it goes too
    SELECT p.id, m.id, m.user_id
    FROM pending p JOIN gc_erasure_tombstones t  -- gc_erasure_tombstones_requests_idx
      ON t.request_ids @> ARRAY[p.id] AND t.user_id = p.user_id
         JOIN memories m ON m.id = t.memory_id AND m.user_id = t.user_id
    UNION
    SELECT r.request_id, d.id, d.user_id
    FROM reach r JOIN memory_lineage l ON l.source_id = r.memory_id
         JOIN memories d ON d.id = l.derived_id AND d.user_id = r.user_id  -- within the user
), still_open AS (
    SELECT r.request_id
    FROM reach r JOIN memories m ON m.id = r.memory_id
    WHERE NOT coalesce(m.status = 'deleted' AND m.status_reason = ANY(:erasure_reasons), false)
    UNION  -- misfiled: the memory is another user's; left pending for the operator
    SELECT p.id
    FROM pending p JOIN memories m ON m.id = p.memory_id AND m.user_id <> p.user_id
    WHERE p.kind = 'memory'
), linked AS (  -- every tombstone of a row a completed memory request reached, erased by it
    -- or by another request before: verify-erasure --memory hashes for its content too (a user
    -- request's verification reads every tombstone of the user already)
    UPDATE gc_erasure_tombstones t
    SET request_ids = ARRAY(SELECT DISTINCT u FROM unnest(t.request_ids || l.ids) AS u ORDER BY u)
    FROM (SELECT x.user_id, x.memory_id, array_agg(DISTINCT x.request_id) AS ids
          FROM (SELECT request_id, memory_id, user_id FROM reach
                UNION
                SELECT request_id, id, user_id FROM audited
                UNION
                SELECT request_id, id, user_id FROM audited_sources) AS x
          WHERE NOT EXISTS (SELECT 1 FROM still_open o WHERE o.request_id = x.request_id)
            AND EXISTS (SELECT 1 FROM pending p WHERE p.id = x.request_id AND p.kind = 'memory')
          GROUP BY x.user_id, x.memory_id) AS l
    WHERE t.memory_id = l.memory_id AND t.user_id = l.user_id
      AND NOT t.request_ids @> l.ids
    RETURNING 1
)
UPDATE gc_erasure_requests q
SET status = 'completed', completed_at = :now, run_id = :run_id,
    result = q.result || coalesce(CAST(:results AS jsonb) -> CAST(q.id AS text),
                                  CAST(:empty_result AS jsonb))
             || jsonb_build_object('scrubbed_at', clock_timestamp())
FROM pending p
WHERE q.id = p.id AND NOT EXISTS (SELECT 1 FROM still_open o WHERE o.request_id = p.id)
RETURNING q.id, q.kind, q.user_id, q.memory_id

-- erasure_file_request --
-- File an erasure request; a pending one for the same target is returned (purge_now sticks).
INSERT INTO gc_erasure_requests (kind, user_id, memory_id, purge_now, requested_by)
VALUES (:kind, :user_id, :memory_id, :purge_now, :requested_by)
ON CONFLICT (kind, user_id, coalesce(memory_id, '00000000-0000-0000-0000-000000000000'))
    WHERE status = 'pending'
DO UPDATE SET purge_now = gc_erasure_requests.purge_now OR EXCLUDED.purge_now
RETURNING id, kind, user_id, memory_id, status, purge_now, requested_at, (xmax = 0) AS created

-- erasure_completed_for --
-- The latest completed request that erased this user (a user request) or this memory (named by
-- the request, or tombstoned by it), for a target no longer in memories.
SELECT r.id, r.kind, r.user_id, r.memory_id, r.status, r.purge_now, r.requested_at
FROM gc_erasure_requests r
WHERE r.status = 'completed'
  AND ((CAST(:user_id AS text) IS NOT NULL AND r.kind = 'user' AND r.user_id = :user_id)
    OR (CAST(:memory_id AS uuid) IS NOT NULL
        AND (r.memory_id = :memory_id
             OR EXISTS (SELECT 1 FROM gc_erasure_tombstones t
                        WHERE t.memory_id = :memory_id AND r.id = ANY(t.request_ids)))))
ORDER BY r.completed_at DESC
LIMIT 1

-- erasure_memory_owner --
-- The owner and state of one memory.
SELECT user_id, status, status_reason FROM memories WHERE id = :memory_id

-- erasure_audited_owner --
-- The user of a memory no longer stored, from the worker's own tables: an audit or plan row
-- about it (the row an action changed, a source of a record the worker made, a member of a
-- deferred group), else a review item or a cached decision naming it. The latest audit row
-- wins: a row the application moved to another user is asked about for the user who held it
-- last. NULL: the worker never saw the id.
SELECT user_id FROM (
    SELECT 1 AS tier, a.id AS seq, a.user_id FROM gc_actions a
    WHERE a.memory_id = :memory_id
      -- a restore's note of a change it kept names the user of that change, not the holder
      AND NOT (a.action = 'restore' AND a.outcome = 'drifted')
    UNION ALL
    SELECT 1, a.id, a.user_id FROM gc_actions a
    WHERE a.action = 'create_merged' AND a.details -> 'sources' ? CAST(:memory_id AS text)
    UNION ALL  -- gc_actions_group_members_idx (migration 0007)
    SELECT 1, a.id, a.user_id FROM gc_actions a
    WHERE a.memory_id IS NULL AND a.content_preview IS NOT NULL
      AND a.details -> 'memory_ids' ? CAST(:memory_id AS text)
    UNION ALL
    SELECT 2, r.id, r.user_id FROM gc_review_items r
    WHERE r.memory_ids @> ARRAY[CAST(:memory_id AS uuid)]
    UNION ALL
    SELECT 3, 0, c.user_id FROM gc_llm_cache c WHERE c.memory_ids @> ARRAY[CAST(:memory_id AS uuid)]
) named
ORDER BY tier, seq DESC
LIMIT 1

-- erasure_get_request --
-- One erasure request.
SELECT * FROM gc_erasure_requests WHERE id = :id

-- erasure_requests_for --
-- Erasure requests of a user, or naming a memory (directly or through a tombstone), oldest first.
SELECT * FROM gc_erasure_requests r
WHERE (CAST(:user_id AS text) IS NOT NULL AND r.user_id = :user_id)
   OR (CAST(:memory_id AS uuid) IS NOT NULL
       AND (r.memory_id = :memory_id
            OR r.id IN (SELECT unnest(t.request_ids) FROM gc_erasure_tombstones t
                        WHERE t.memory_id = :memory_id)))
ORDER BY r.requested_at, r.id

-- erasure_tombstones_for --
-- Tombstones a verification checks: a user's, or those of some requests plus one memory's.
SELECT user_id, memory_id, content_hash, preview_hash FROM gc_erasure_tombstones
WHERE (CAST(:user_id AS text) IS NOT NULL AND user_id = :user_id)
   OR request_ids && CAST(:request_ids AS uuid[])  -- gc_erasure_tombstones_requests_idx
   OR memory_id = CAST(:memory_id AS uuid)

-- erasure_record_verification --
-- Record a verification on the requests it covered; a clean one sets verified_at.
UPDATE gc_erasure_requests
SET result = result || jsonb_build_object('verification', CAST(:verification AS jsonb)),
    verified_at = CASE WHEN CAST(:clean AS boolean) THEN :now ELSE verified_at END
WHERE id = ANY(CAST(:ids AS uuid[]))

-- erasure_scanned_columns --
-- Text-like and id-like columns of the tables a verification scans (discovered, so new tables
-- are covered without code changes).
SELECT c.table_name, c.column_name, c.data_type, c.udt_name
FROM information_schema.columns c
JOIN information_schema.tables t
  ON t.table_schema = c.table_schema AND t.table_name = c.table_name
WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
  AND (CAST(:all_tables AS boolean) OR c.table_name IN ('memories', 'memory_lineage')
       OR c.table_name LIKE 'gc\_%' OR c.table_name LIKE 'memory\_gc\_%')
  AND (c.data_type IN ('text', 'character varying', 'character', 'json', 'jsonb', 'uuid')
       OR c.udt_name IN ('_text', '_varchar', '_uuid', '_json', '_jsonb'))
ORDER BY c.table_name, c.ordinal_position

-- erasure_user_leftovers --
-- What completing a forget-user removes from the worker's own tables, found again: the user's
-- cached decisions, review items, and audit rows not scrubbed, from before the last completed
-- request's scrub (result.scrubbed_at; what came later is the user's new activity).
WITH done AS (
    SELECT max(CAST(result ->> 'scrubbed_at' AS timestamptz)) AS at
    FROM gc_erasure_requests
    WHERE user_id = :user_id AND kind = 'user' AND status = 'completed'
)
SELECT 'gc_llm_cache' AS table_name, 'user_id' AS column_name, c.key AS row_key
FROM gc_llm_cache c, done
WHERE c.user_id = :user_id AND c.created_at <= done.at
UNION ALL
SELECT 'gc_review_items', 'user_id', CAST(r.id AS text)
FROM gc_review_items r, done
WHERE r.user_id = :user_id AND r.created_at <= done.at
UNION ALL
SELECT 'gc_actions', 'details', CAST(a.id AS text)
FROM gc_actions a, done
WHERE a.user_id = :user_id AND a.recorded_at <= done.at
  AND (a.content_preview IS NOT NULL OR NOT (a.details ? 'scrubbed'))

-- erasure_audit_kept --
-- What the worker's tables, of any user, still hold about a memory erased or gone (:gone), as
-- the scrub reaches it (erasure_scrub_actions, erasure_drop_*): an audit or plan row about it,
-- a deferred group or a merge naming it, with a preview or details beyond ids and codes; a
-- cached decision or a review item naming it (a restore's dismissal keeps only ids). Under
-- another user than the request's the content hash (salted with the user) cannot recognise
-- the text: the application moved the memory.
SELECT 'gc_actions' AS table_name, CAST(a.id AS text) AS row_key,
       CASE WHEN a.content_preview IS NOT NULL THEN 'content_preview' ELSE 'details' END
           AS column_name
FROM gc_actions a
WHERE (a.memory_id = ANY(:gone)
       OR (a.memory_id IS NULL AND a.details -> 'memory_ids' ?| CAST(:gone_texts AS text[]))
       OR (a.action = 'create_merged'
           AND a.details -> 'sources' ?| CAST(:gone_texts AS text[])))
  AND (a.content_preview IS NOT NULL
       OR (jsonb_typeof(a.details) = 'object'
           AND EXISTS (SELECT 1 FROM jsonb_object_keys(a.details) AS k
                       WHERE k <> ALL(:keep_details) AND k <> 'scrubbed')))
UNION ALL
SELECT 'gc_llm_cache', c.key, 'memory_ids'
FROM gc_llm_cache c WHERE c.memory_ids && CAST(:gone AS uuid[])
UNION ALL
SELECT 'gc_review_items', CAST(r.id AS text), 'memory_ids'
FROM gc_review_items r WHERE r.memory_ids && CAST(:gone AS uuid[])

-- erasure_user_traces --
-- Whether the worker's own tables still hold anything a whole-user scrub would remove (for a
-- user who may have no memory rows left: the application deleted them): an audit row with a
-- preview or details beyond ids and codes, a cached decision, a review item, a sweep error.
SELECT EXISTS (SELECT 1 FROM gc_actions a
               WHERE a.user_id = :user_id
                 AND (a.content_preview IS NOT NULL
                      OR (jsonb_typeof(a.details) = 'object'
                          AND EXISTS (SELECT 1 FROM jsonb_object_keys(a.details) AS k
                                      WHERE k <> ALL(:keep_details) AND k <> 'scrubbed'))))
    OR EXISTS (SELECT 1 FROM gc_llm_cache WHERE user_id = :user_id)
    OR EXISTS (SELECT 1 FROM gc_review_items WHERE user_id = :user_id)
    OR EXISTS (SELECT 1 FROM gc_sweep_requests
               WHERE user_id = :user_id AND error IS NOT NULL AND error <> 'removed by erasure')

-- erasure_complete_at_once --
-- Complete a request that has no memory rows to erase: only the worker's tables held
-- anything, and they were scrubbed in this transaction (run_id: the run that did it, if any).
UPDATE gc_erasure_requests
SET status = 'completed', completed_at = :now, run_id = :run_id,
    result = result || CAST(:empty_result AS jsonb)
             || jsonb_build_object('scrubbed_at', clock_timestamp())
WHERE id = :id AND status = 'pending'
RETURNING id, kind, user_id, memory_id, status, purge_now, requested_at

-- erasure_link_tombstones --
-- A request completed without a batch (its user has no memory rows): the tombstones of the
-- rows it reached (:ids, erased by other requests before) belong to it too.
UPDATE gc_erasure_tombstones
SET request_ids = ARRAY(SELECT DISTINCT u FROM unnest(request_ids || ARRAY[CAST(:id AS uuid)]) AS u
                        ORDER BY u)
WHERE user_id = :user_id AND memory_id = ANY(CAST(:ids AS uuid[]))
  AND NOT request_ids @> ARRAY[CAST(:id AS uuid)]

-- erasure_scrub_sweep_errors --
-- A forgotten user's failed sweep requests keep their status, not their error text.
UPDATE gc_sweep_requests SET error = 'removed by erasure'
WHERE user_id = ANY(:whole_users) AND error IS NOT NULL AND error <> 'removed by erasure'
RETURNING id

-- erasure_wait_for_restores --
-- A request is filed once no restore is under way (restore_hold_filing), so that a restore
-- never brings back a row a request it did not see names.
SELECT pg_advisory_xact_lock(4242005, 0)

-- lock_user_xact --
-- Wait for any batch holding this user (lock_batch_users, same key) and keep the user for the
-- rest of this transaction.
SELECT pg_advisory_xact_lock(4242001, hashtext(:user_id))

-- erasure_rowless_users --
-- Users (of the run's :users; NULL: all) with a pending request and no memory row.
SELECT DISTINCT r.user_id
FROM gc_erasure_requests r
WHERE r.status = 'pending'
  AND (CAST(:users AS text[]) IS NULL OR r.user_id = ANY(CAST(:users AS text[])))
  AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.user_id = r.user_id)
  AND (r.memory_id IS NULL OR NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = r.memory_id))
ORDER BY r.user_id

-- erasure_rowless_requests --
-- The user's pending requests, if the user still has no memory row (under lock_user_xact, so
-- no batch holds the user; a row the application inserted since makes it a batch's work again).
SELECT r.id, r.kind, r.user_id, r.memory_id
FROM gc_erasure_requests r
WHERE r.status = 'pending' AND r.user_id = :user_id
  AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.user_id = :user_id)
  AND (r.memory_id IS NULL OR NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = r.memory_id))
ORDER BY r.requested_at
FOR UPDATE OF r

-- erasure_scrub_error_ids --
-- Erased memories' ids out of the stored errors (a failed run's, batch's, sweep request's: an
-- application's RAISE naming the row, a CHECK's failing row): the failure stays recorded.
WITH named AS (
    SELECT 'gc_runs' AS tbl, CAST(id AS text) AS run, NULL::integer AS batch_no, error
    FROM gc_runs WHERE error ~* '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
    UNION ALL
    SELECT 'gc_run_batches', CAST(run_id AS text), batch_no, error
    FROM gc_run_batches
    WHERE error ~* '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
    UNION ALL
    SELECT 'gc_sweep_requests', CAST(id AS text), NULL, error
    FROM gc_sweep_requests
    WHERE error ~* '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'
), scrubbed AS (
    SELECT n.tbl, n.run, n.batch_no,
           regexp_replace(n.error, e.pattern, 'an erased memory', 'gi') AS error
    FROM named n
    CROSS JOIN LATERAL (
        SELECT string_agg(DISTINCT m[1], '|') AS pattern
        FROM regexp_matches(n.error, '([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})',
                            'gi') AS m
        WHERE lower(m[1]) = ANY(:id_texts)
    ) e
    WHERE e.pattern IS NOT NULL
), runs AS (
    UPDATE gc_runs r SET error = s.error FROM scrubbed s
    WHERE s.tbl = 'gc_runs' AND r.id = CAST(s.run AS uuid) RETURNING 1
), batches AS (
    UPDATE gc_run_batches b SET error = s.error FROM scrubbed s
    WHERE s.tbl = 'gc_run_batches' AND b.run_id = CAST(s.run AS uuid) AND b.batch_no = s.batch_no
    RETURNING 1
), sweeps AS (
    UPDATE gc_sweep_requests w SET error = s.error FROM scrubbed s
    WHERE s.tbl = 'gc_sweep_requests' AND w.id = CAST(s.run AS bigint) RETURNING 1
)
SELECT (SELECT count(*) FROM runs) + (SELECT count(*) FROM batches) + (SELECT count(*) FROM sweeps)
