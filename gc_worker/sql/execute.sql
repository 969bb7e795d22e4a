-- lock_rows --
-- Lock the rows a batch's plan touches; their version (and, for the rows of :content_ids, their
-- content version: gc_worker.actions.CONTENT_VERSIONED) and prior state (PRIOR_FIELDS). A row a
-- request-path transaction holds is skipped, never waited for: the worker then waits on no row
-- lock at all, so it can be no party to a deadlock; the caller treats the row as drifted.
SELECT id, xmin::text::bigint AS row_version,
       CASE WHEN id = ANY(:content_ids) THEN memory_gc_content_version(m) END
           AS content_version,
       jsonb_build_object('status', status, 'status_reason', status_reason,
                          'status_changed_at', status_changed_at, 'superseded_by', superseded_by,
                          'deleted_at', deleted_at, 'valid_until', valid_until,
                          'importance', importance,
                          'importance_assessed_at', importance_assessed_at)::text AS prior
FROM memories m
WHERE id = ANY(:ids)
ORDER BY id
FOR UPDATE SKIP LOCKED

-- lock_dependencies --
-- The rows actions were decided against (details.depends_on) that they do not change: their
-- version, share-locked for the batch (an application transaction holding one: skipped, the
-- caller treats it as changed). Both versions: the premise is recorded as the deciding action's.
SELECT id, xmin::text::bigint AS row_version, memory_gc_content_version(m) AS content_version
FROM memories m
WHERE id = ANY(:ids)
ORDER BY id
FOR SHARE SKIP LOCKED

-- declared_superseded --
-- Merge members that an active or obsolete row of their users declares it supersedes now
-- (compaction_candidates leaves such rows out).
SELECT DISTINCT d.id
FROM memories o CROSS JOIN LATERAL unnest(o.supersedes) AS d(id)
WHERE o.user_id = ANY(:users) AND o.status IN ('active', 'obsolete')
  AND cardinality(o.supersedes) > 0 AND d.id = ANY(:ids)
-- (not `supersedes && :ids`: that compares each declaring row's array with every member, while
-- `d.id = ANY(:ids)` hashes the list: 18.6 s against 0.27 s for 100k members, 40k declarers)

-- purge_with_live_derived --
-- Rows a purge of erased rows would delete that have a derived record of the same user neither
-- erased nor erased by this batch (:erasing, the erasure soft deletes that apply).
SELECT DISTINCT l.source_id
FROM memory_lineage l
JOIN memories s ON s.id = l.source_id
JOIN memories d ON d.id = l.derived_id AND d.user_id = s.user_id
WHERE l.source_id = ANY(:ids) AND NOT (d.id = ANY(:erasing))
  AND NOT coalesce(d.status = 'deleted' AND d.status_reason = ANY(:erasure_reasons), false)

-- active_counts --
-- Active rows per user (user_cap's premise, details.user_active).
SELECT user_id, count(*) AS active
FROM memories
WHERE user_id = ANY(:users) AND status = 'active'
GROUP BY user_id

-- apply_status --
-- Retire rows (deleted / obsolete / merged); never a pinned row unless erasure asked for it.
UPDATE memories m
SET status = a.status,
    status_reason = a.reason,
    status_changed_at = :now,
    superseded_by = coalesce(a.superseded_by, m.superseded_by),
    deleted_at = CASE WHEN a.status = 'deleted' THEN :now ELSE m.deleted_at END,
    valid_until = coalesce(a.valid_until, m.valid_until)
FROM unnest(CAST(:ids AS uuid[]), CAST(:statuses AS text[]), CAST(:reasons AS text[]),
            CAST(:superseded AS uuid[]), CAST(:valid_until AS timestamptz[]))
     AS a(id, status, reason, superseded_by, valid_until)
WHERE m.id = a.id AND (NOT m.pinned OR a.reason = ANY(:erasure_reasons))
RETURNING m.id

-- apply_importance --
-- Write re-assessed importance scores.
UPDATE memories m
SET importance = a.importance, importance_assessed_at = :now
FROM unnest(CAST(:ids AS uuid[]), CAST(:importance AS smallint[])) AS a(id, importance)
WHERE m.id = a.id AND NOT m.pinned
RETURNING m.id

-- insert_records --
-- Insert records the worker creates (merges, summaries) from a JSON array of column values,
-- read as the contract's columns only (jsonb_to_recordset): populating a whole memories row
-- would run every column the JSON lacks through its type, and an application's NOT NULL
-- domain column refuses the NULL before its default applies. Assignment casts take each value
-- to the store's own column type (varchar, bigint, real, …; the embedding as real[], which
-- pgvector casts to vector on assignment: the type need not be on the search_path).
INSERT INTO memories (id, user_id, content, embedding, memory_type, source, scope, slot,
                      importance, importance_assessed_at, confidence, created_at, updated_at,
                      last_accessed_at, access_count, observed_at, valid_from, valid_until,
                      expires_at, metadata)
SELECT r.id, r.user_id, r.content, r.embedding, coalesce(r.memory_type, 'semantic'),
       coalesce(r.source, 'gc_merge'), r.scope, r.slot, coalesce(r.importance, 3),
       r.importance_assessed_at, coalesce(r.confidence, 1.0), coalesce(r.created_at, :now),
       coalesce(r.updated_at, :now), r.last_accessed_at, coalesce(r.access_count, 0),
       coalesce(r.observed_at, :now), r.valid_from, r.valid_until, r.expires_at,
       coalesce(r.metadata, '{}')
FROM jsonb_to_recordset(CAST(:records AS jsonb))
     AS r(id uuid, user_id text, content text, embedding real[], memory_type text, source text,
          scope text, slot text, importance integer, importance_assessed_at timestamptz,
          confidence double precision, created_at timestamptz, updated_at timestamptz,
          last_accessed_at timestamptz, access_count bigint, observed_at timestamptz,
          valid_from timestamptz, valid_until timestamptz, expires_at timestamptz,
          metadata jsonb)
RETURNING id

-- insert_lineage --
-- Record which rows a created record was made from (and a purge's splice_edges).
INSERT INTO memory_lineage (derived_id, source_id)
SELECT * FROM unnest(CAST(:derived AS uuid[]), CAST(:sources AS uuid[]))
ON CONFLICT DO NOTHING

-- merged_access --
-- Merged records' access bookkeeping from their members as they are now (locked, not yet
-- retired): the latest use (last_accessed_at, else created_at: a record dated by its earliest
-- member is used as recently as a member restated since) and the sum of uses, as compaction
-- plans them (held to the column's range: an integer column — bigint in an adopted store —
-- overflowing would fail the batch).
UPDATE memories r
SET last_accessed_at = s.last_accessed_at,
    access_count = least(s.access_count,
                         CASE WHEN pg_typeof(r.access_count) = 'integer'::regtype
                              THEN 2147483647 ELSE 9223372036854775807 END)
FROM (SELECT l.derived_id, max(coalesce(m.last_accessed_at, m.created_at)) AS last_accessed_at,
             sum(m.access_count) AS access_count
      FROM memory_lineage l JOIN memories m ON m.id = l.source_id
      WHERE l.derived_id = ANY(:ids)
      GROUP BY l.derived_id) s
WHERE r.id = s.derived_id

-- splice_edges --
-- The lineage a purge of :ids must add first (their lineage goes by ON DELETE CASCADE): every
-- record derived from a purged row linked to what that row was made from — through other rows
-- purged with it, every step within the user — so that forgetting a source still reaches the
-- records stating its fact (A, B merged into M, M summarised into S, M purged: S <- A stays).
-- (root, derived_id, source_id): root is the purged row the derived record lost. Rows are read
-- by primary key (a join on the user's rows made it 50 s for 4,000 edges of a 200k-row user).
WITH RECURSIVE up (root, derived_id, source_id, user_id) AS (
    SELECT l.source_id, l.derived_id, l.source_id,
           (SELECT d.user_id FROM memories d WHERE d.id = l.derived_id)
    FROM memory_lineage l
    WHERE l.source_id = ANY(:ids) AND NOT (l.derived_id = ANY(:ids))
    UNION
    SELECT u.root, u.derived_id, l.source_id, u.user_id
    FROM up u JOIN memory_lineage l ON l.derived_id = u.source_id
    WHERE u.source_id = ANY(:ids)
      AND (SELECT s.user_id FROM memories s WHERE s.id = u.source_id) = u.user_id
)
SELECT DISTINCT root, derived_id, source_id FROM up
WHERE NOT (source_id = ANY(:ids)) AND derived_id <> source_id
  AND (SELECT s.user_id FROM memories s WHERE s.id = up.source_id) = up.user_id

-- lock_splice_ends --
-- Key-share the rows new lineage will name (its foreign keys' checks would take that lock and
-- wait on an application transaction holding one FOR UPDATE); a row held is skipped, never
-- waited for, and the purge that needs it is held back (gc_worker.purge_holds).
SELECT id FROM memories WHERE id = ANY(:ids) FOR KEY SHARE SKIP LOCKED

-- purge_lineage --
-- The lineage rows a purge of :ids deletes by cascade.
SELECT derived_id, source_id FROM memory_lineage
WHERE source_id = ANY(:ids) OR derived_id = ANY(:ids)

-- lock_purge_lineage --
-- The same rows, locked now; a row an application transaction holds (its own delete of a record
-- cascading over it) is skipped, never waited for, and the purge is held back.
SELECT derived_id, source_id FROM memory_lineage
WHERE source_id = ANY(:ids) OR derived_id = ANY(:ids)
FOR UPDATE SKIP LOCKED

-- purge_of_pending_targets --
-- Rows a purge by another job than erasure would delete that a pending erasure request names:
-- a memory request's target, or any row of a user with a pending user request. Purged first
-- (a stale plan, a run without the erasure job, a batch planned before the request came), the
-- target would take its lineage and its tombstone's content with it, and the request would
-- complete with nothing erased while the records derived from it stay active.
SELECT m.id FROM memories m
WHERE m.id = ANY(:ids) AND EXISTS (
    SELECT 1 FROM gc_erasure_requests r
    WHERE r.status = 'pending' AND r.user_id = m.user_id
      AND (r.kind = 'user' OR r.memory_id = m.id))

-- named_rows_state --
-- The rows reviews and deferred groups name: their owner and status now (NULL: gone) and
-- whether they were erased since planning, purged or not (a tombstone).
SELECT t.id, m.user_id, m.status,
       coalesce(m.status = 'deleted' AND m.status_reason = ANY(:erasure_reasons), false)
       OR EXISTS (SELECT 1 FROM gc_erasure_tombstones g WHERE g.memory_id = t.id) AS erased
FROM unnest(CAST(:ids AS uuid[])) AS t(id) LEFT JOIN memories m ON m.id = t.id

-- purge_rows --
-- Physically delete rows (their lineage goes by ON DELETE CASCADE).
DELETE FROM memories WHERE id = ANY(:ids) RETURNING id

-- scrub_audit --
-- Remove purged rows' content from the audit and plans: their own actions, and the preview of a
-- deferred group (no memory_id; details.memory_ids) that one of them is a member of.
UPDATE gc_actions
SET content_preview = NULL, details = details - 'record' - 'content'
WHERE (memory_id = ANY(:ids)
       AND (content_preview IS NOT NULL OR details ?| array['record', 'content']))
   OR (memory_id IS NULL AND content_preview IS NOT NULL
       AND details -> 'memory_ids' ?| CAST(:id_texts AS text[]))

-- scrub_created_from_purged --
-- Remove purged rows' content from the records merged or summarised from them, in plans and in
-- the audit (create_merged rows whose details.sources name one; a dry run's record never
-- existed, so no purge of its own would reach it): the preview goes and details are cut to ids
-- and codes (:keep_details, as an erasure scrubs) and marked scrubbed. Can use the partial GIN
-- index on (details -> 'sources') WHERE action = 'create_merged'; rows already scrubbed are
-- left alone.
UPDATE gc_actions a
SET content_preview = NULL,
    details = coalesce((SELECT jsonb_object_agg(d.key, d.value)
                        FROM jsonb_each(a.details) AS d
                        WHERE d.key = ANY(:keep_details)), CAST('{}' AS jsonb))
              || jsonb_build_object('scrubbed', true)
WHERE a.action = 'create_merged'
  AND a.details -> 'sources' ?| CAST(:id_texts AS text[])
  AND (a.content_preview IS NOT NULL OR NOT (a.details ? 'scrubbed'))
RETURNING a.id

-- drop_llm_cache_of_purged --
-- Forget cached model decisions taken on purged rows (a merge or summary text quotes them); by
-- the GIN index on memory_ids.
DELETE FROM gc_llm_cache WHERE memory_ids && CAST(:ids AS uuid[])
RETURNING key

-- dismissed_among --
-- Dismissed reviews (a person's `resolve --dismiss`, a restore of the model's decision) naming
-- any of :ids: a planned merge, verdict or score they keep apart was dismissed after planning.
SELECT kind, user_id, memory_ids
FROM gc_review_items
WHERE user_id = ANY(:users) AND kind IN ('compaction', 'contradiction', 'importance')
  AND resolution ->> 'decision' = 'dismiss' AND memory_ids && CAST(:ids AS uuid[])
