-- importance_candidates --
-- Active, unpinned rows of a user batch whose importance was never assessed (oldest first per user).
-- The row version is the content version (gc_worker.actions.CONTENT_VERSIONED). Rows whose TTL
-- has passed are not worth a model call.
SELECT id, user_id, memory_gc_content_version(m) AS row_version, left(content, 200) AS preview,
       content, importance
FROM memories m
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND importance_assessed_at IS NULL AND NOT (id = ANY(:taken))
  AND (expires_at IS NULL OR expires_at > :now)
ORDER BY user_id, created_at, id
