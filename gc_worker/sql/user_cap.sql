-- user_cap_counts --
-- Users of the batch with more active rows than the cap (pinned rows count, rows already acted on don't).
SELECT user_id, count(*) AS active
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT (id = ANY(:taken))
GROUP BY user_id
HAVING count(*) > :floor

-- user_cap_candidates --
-- The evictable (active, unpinned) rows of the over-cap users (metadata, for a summary's depth,
-- only when :with_metadata: evicting 100,000s of rows needs none of it).
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       importance, created_at, last_accessed_at, memory_type, source,
       CASE WHEN :with_metadata THEN metadata END AS metadata
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned AND NOT (id = ANY(:taken))
ORDER BY user_id, id

-- user_cap_fold_rows --
-- Full content, embedding (as text) and the columns a summary inherits, of the rows to fold.
SELECT id, content, embedding::text AS embedding, scope, confidence, last_accessed_at,
       expires_at
FROM memories
WHERE id = ANY(:ids)
ORDER BY id
