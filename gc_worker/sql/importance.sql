-- importance_candidates --
-- Active, unpinned rows of a user batch whose importance was never assessed (oldest first per user).
-- The row version is the content version (gc_worker.actions.CONTENT_VERSIONED). Rows whose TTL
-- has passed are not worth a model call. Rows whose model score a restore undid (a dismissed
-- importance review names them) are a person's decision: never asked about again.
SELECT id, user_id, memory_gc_content_version(m) AS row_version, left(content, 200) AS preview,
       content, importance
FROM memories m
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND importance_assessed_at IS NULL AND NOT (id = ANY(:taken))
  AND (expires_at IS NULL OR expires_at > :now)
  AND NOT EXISTS (SELECT 1 FROM gc_review_items r
                  WHERE r.memory_ids @> ARRAY[m.id] AND r.user_id = m.user_id
                    AND r.kind = 'importance' AND r.resolution ->> 'decision' = 'dismiss')
ORDER BY user_id, created_at, id
