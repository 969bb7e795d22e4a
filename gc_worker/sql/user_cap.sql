-- user_cap_counts --
-- Users of the batch with more active rows than the cap (pinned rows count, rows already acted on don't).
-- present: every active row, the premise the evictions are applied under (details.user_active).
SELECT user_id, count(*) FILTER (WHERE NOT (id = ANY(:taken))) AS active, count(*) AS present
FROM memories
WHERE user_id = ANY(:users) AND status = 'active'
GROUP BY user_id
HAVING count(*) FILTER (WHERE NOT (id = ANY(:taken))) > :floor

-- user_cap_candidates --
-- The evictable (active, unpinned) rows of the over-cap users that could be taken: per user the
-- first :take (excess + 1: summarize mode takes one more) in eviction order (jobs/user_cap.py
-- eviction_key: effective importance, least recently used, oldest, id; re-assessed importance
-- comes in :reassessed / :reassessed_importance). Ranking here sends only those rows to the
-- worker (an over-cap user of thousands of rows loses a few hundred). Only :with_metadata
-- (summarize mode): metadata, for a summary's depth, and why a taken row may not be folded
-- (unfoldable; jobs/user_cap.py fold_blocker): the summary is open-ended, has no slot and
-- declares nothing, so a row the read path does not show as is (its validity ended or not
-- begun, its TTL passed, hidden by a declaration), a slot's value, a declarer, or a row of a
-- conflict a person or the model has yet to judge (an open review, :held) would read
-- differently inside it.
WITH declared AS (
    SELECT DISTINCT unnest(supersedes) AS id
    FROM memories
    WHERE user_id = ANY(:users) AND status IN ('active', 'obsolete') AND cardinality(supersedes) > 0
)
SELECT id, user_id, row_version, preview, importance, created_at, last_accessed_at, memory_type,
       source, metadata, rank,
       CASE WHEN NOT :with_metadata THEN NULL
            WHEN valid_until IS NOT NULL THEN 'bounded'
            WHEN expires_at <= :now THEN 'expired'
            WHEN valid_from > :now THEN 'not_yet_valid'
            WHEN slot IS NOT NULL THEN 'slot'
            WHEN declares THEN 'declares_supersedes'
            WHEN id IN (SELECT id FROM declared) THEN 'superseded_by_declaration'
            WHEN id = ANY(:held) OR EXISTS (
                SELECT 1 FROM gc_review_items r
                WHERE r.status = 'open' AND r.memory_ids @> ARRAY[ranked.id]) THEN 'in_review'
       END AS unfoldable
FROM (
    SELECT m.id, m.user_id, m.xmin::text::bigint AS row_version, left(m.content, 200) AS preview,
           m.importance, m.created_at, m.last_accessed_at, m.memory_type, m.source,
           CASE WHEN :with_metadata THEN m.metadata END AS metadata, w.take,
           m.valid_from, m.valid_until, m.expires_at, m.slot,
           cardinality(m.supersedes) > 0 AS declares,
           row_number() OVER (
               PARTITION BY m.user_id
               ORDER BY coalesce(r.importance, m.importance),
                        coalesce(m.last_accessed_at, m.created_at), m.created_at, m.id) AS rank
    FROM memories m
    JOIN unnest(CAST(:users AS text[]), CAST(:take AS integer[])) AS w (user_id, take)
      ON w.user_id = m.user_id
    LEFT JOIN unnest(CAST(:reassessed AS uuid[]), CAST(:reassessed_importance AS integer[]))
      AS r (id, importance) ON r.id = m.id
    WHERE m.user_id = ANY(:users) AND m.status = 'active' AND NOT m.pinned
      AND NOT (m.id = ANY(:taken))
) ranked
WHERE rank <= take
ORDER BY user_id, id

-- user_cap_fold_rows --
-- Full content, embedding (as text) and the columns a summary inherits, of the rows to fold.
SELECT id, user_id, content, embedding::text AS embedding, scope, confidence, last_accessed_at,
       expires_at, importance_assessed_at, memory_gc_trust(source, metadata) AS trust
FROM memories
WHERE id = ANY(:ids)
ORDER BY id
