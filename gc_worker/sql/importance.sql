-- importance_candidates --
-- Active, unpinned rows of a user batch whose importance was never assessed (oldest first per user).
SELECT id, user_id, xmin::text::bigint AS row_version, left(content, 200) AS preview,
       content, importance
FROM memories
WHERE user_id = ANY(:users) AND status = 'active' AND NOT pinned
  AND importance_assessed_at IS NULL AND NOT (id = ANY(:taken))
ORDER BY user_id, created_at, id
