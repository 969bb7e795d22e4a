-- compaction_candidates --
-- Active, unpinned, embedded, open-ended rows compaction may merge, streamed user by user. The
-- row version is the content version (gc_worker.actions.CONTENT_VERSIONED).
WITH declared AS (
    SELECT DISTINCT unnest(supersedes) AS id
    FROM memories
    WHERE user_id = ANY(:users) AND status IN ('active', 'obsolete') AND cardinality(supersedes) > 0
)
SELECT m.id, m.user_id, memory_gc_content_version(m) AS row_version,
       left(m.content, 200) AS preview, m.content, m.embedding,
       m.memory_type, m.source, m.scope, m.slot, m.importance, m.importance_assessed_at,
       m.confidence, m.created_at, m.last_accessed_at, m.access_count, m.observed_at, m.valid_from,
       m.expires_at, m.metadata,
       memory_gc_trust(m.source, m.metadata) AS trust
FROM memories m
WHERE m.user_id = ANY(:users) AND m.status = 'active' AND NOT m.pinned
  AND m.embedding IS NOT NULL AND m.valid_until IS NULL AND cardinality(m.supersedes) = 0
  AND (m.expires_at IS NULL OR m.expires_at > :now)
  AND NOT (m.id = ANY(:taken)) AND NOT (m.id = ANY(:held))
  AND NOT EXISTS (SELECT 1 FROM declared d WHERE d.id = m.id)
  AND NOT EXISTS (SELECT 1 FROM gc_review_items r
                  WHERE r.status = 'open' AND r.memory_ids @> ARRAY[m.id])
ORDER BY m.user_id, m.id

-- contradiction_candidates --
-- Active rows of some users with what the contradiction rules read, streamed user by user. The
-- row version is the content version (gc_worker.actions.CONTENT_VERSIONED). A row whose TTL has
-- passed is off the read path already (ttl_expiry's): it neither wins nor loses. `summary`: a
-- summary user_cap folded (its times are its writing's, not its facts').
SELECT id, user_id, memory_gc_content_version(m) AS row_version, left(content, 200) AS preview,
       content, embedding, slot, scope, supersedes, pinned, source,
       memory_gc_trust(source, metadata) AS trust, valid_from, valid_until, observed_at,
       created_at, left(source, 3) = 'gc_' AND metadata ? 'summary_depth' AS summary
FROM memories m
WHERE user_id = ANY(:users) AND status = 'active' AND NOT (id = ANY(:taken))
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY user_id, id

-- contradiction_blocked_pairs --
-- Memory sets a person is looking at (open reviews) or already judged compatible (dismissed).
SELECT user_id, memory_ids
FROM gc_review_items
WHERE user_id = ANY(:users) AND kind = 'contradiction'
  AND (status = 'open' OR resolution ->> 'decision' = 'dismiss')

-- compaction_dismissed_sets --
-- Memory sets a person kept apart: a merge `restore` undid (a dismissed compaction review);
-- no two rows of one set are merged together again. A merged record of a set stands for its
-- sources (and theirs, through memory_lineage): they are in the set too, so undoing "record +
-- C" keeps C apart from the record's sources once that merge is undone as well.
WITH RECURSIVE dismissed AS (
    SELECT id AS item, user_id, memory_ids
    FROM gc_review_items
    WHERE user_id = ANY(:users) AND kind = 'compaction' AND resolution ->> 'decision' = 'dismiss'
), member(item, id) AS (
    SELECT d.item, m.id FROM dismissed d CROSS JOIN LATERAL unnest(d.memory_ids) AS m(id)
    UNION
    SELECT member.item, l.source_id FROM member JOIN memory_lineage l ON l.derived_id = member.id
)
SELECT d.user_id, array_agg(member.id ORDER BY member.id) AS memory_ids
FROM dismissed d JOIN member ON member.item = d.item
GROUP BY d.item, d.user_id
ORDER BY d.item

-- insert_restore_dismissals --
-- What a restore undid of a model's merge (its sources) or verdict (the pair), recorded as a
-- review a person dismissed, so that the jobs do not make the same change again. Never for a
-- set naming an erased memory (a tombstone, or a row erased and not yet purged): the id would
-- be a residue of the erasure.
INSERT INTO gc_review_items (run_id, user_id, kind, memory_ids, reason, details, status,
                             resolution, resolved_at)
SELECT :run_id, r.user_id, r.kind, ARRAY(SELECT jsonb_array_elements_text(r.memory_ids))::uuid[],
       'restored', jsonb_build_object('undid_run', CAST(:undid_run AS text)), 'resolved',
       '{"decision": "dismiss", "by": "restore"}'::jsonb, clock_timestamp()
FROM jsonb_to_recordset(CAST(:items AS jsonb)) AS r(user_id text, kind text, memory_ids jsonb)
WHERE NOT EXISTS (
    SELECT 1 FROM jsonb_array_elements_text(r.memory_ids) AS i(id)
    WHERE EXISTS (SELECT 1 FROM gc_erasure_tombstones t
                  WHERE t.user_id = r.user_id AND t.memory_id = CAST(i.id AS uuid))
       OR EXISTS (SELECT 1 FROM memories m
                  WHERE m.id = CAST(i.id AS uuid) AND m.status = 'deleted'
                    AND m.status_reason IN ('erasure', 'erasure_tombstone')))

-- review_list --
-- Review items, newest first, optionally of one user and one status.
SELECT r.id, r.run_id, r.user_id, r.kind, r.memory_ids, r.reason, r.details, r.status,
       r.resolution, r.created_at, r.resolved_at
FROM gc_review_items r
WHERE (CAST(:user_id AS text) IS NULL OR r.user_id = :user_id)
  AND (CAST(:status AS text) IS NULL OR r.status = :status)
ORDER BY r.created_at DESC, r.id DESC
LIMIT :limit

-- review_lock --
-- One review item, locked while it is resolved.
SELECT id, run_id, user_id, kind, memory_ids, reason, details, status, resolution
FROM gc_review_items
WHERE id = :id
FOR UPDATE

-- review_members --
-- The memories a review item names, with what resolving it needs.
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview, status,
       pinned, valid_from, valid_until, expires_at, observed_at, created_at
FROM memories
WHERE id = ANY(:ids)
ORDER BY id

-- review_lift --
-- Take back a dismissal (locked by review_lock): decision `lifted`, the earlier resolution
-- kept under `lifted`; no query that honours dismissals matches it any more.
UPDATE gc_review_items
SET resolution = jsonb_build_object('decision', 'lifted', 'lifted_at', CAST(:now AS timestamptz),
                                    'lifted', resolution)
WHERE id = :id AND status = 'resolved' AND resolution ->> 'decision' = 'dismiss'
RETURNING id, run_id, user_id, kind, memory_ids, reason, details, status, resolution,
          created_at, resolved_at

-- review_close --
-- Mark a review item resolved with its decision.
UPDATE gc_review_items
SET status = 'resolved', resolution = CAST(:resolution AS jsonb), resolved_at = :now
WHERE id = :id AND status = 'open'
RETURNING id

-- review_run_complete --
-- A review resolution run has no batches; it is complete when its transaction commits.
UPDATE gc_runs SET status = 'completed', finished_at = clock_timestamp() WHERE id = :run_id

-- read_current --
-- The read rule (memory_gc_current) for one user, scope and instant, without the embedding.
SELECT id, user_id, content, memory_type, source, scope, slot, supersedes, importance,
       confidence, pinned, created_at, observed_at, valid_from, valid_until, expires_at, status,
       status_reason, superseded_by, metadata
FROM memory_gc_current(CAST(:user_id AS text), CAST(:scope AS text), CAST(:at AS timestamptz),
                       CAST(:known_at AS timestamptz))

-- compaction_ancestor_embeddings --
-- Every row a merged record stands for (its sources, and theirs, through memory_lineage) that is
-- still stored with an embedding: a row joining the record must be like each of them, not only
-- like the record (whose embedding may be their centroid). Rows of the record's own user only.
WITH RECURSIVE up(record, id) AS (
    SELECT l.derived_id, l.source_id FROM memory_lineage l WHERE l.derived_id = ANY(:ids)
    UNION
    SELECT up.record, l.source_id FROM up JOIN memory_lineage l ON l.derived_id = up.id
)
SELECT up.record AS memory_id, m.embedding
FROM up
JOIN memories r ON r.id = up.record
JOIN memories m ON m.id = up.id AND m.user_id = r.user_id
WHERE m.embedding IS NOT NULL
ORDER BY up.record, m.id
