-- llm_cache_get --
-- A cached, validated LLM decision.
SELECT value FROM gc_llm_cache WHERE key = :key

-- llm_cache_put --
-- Keep a validated LLM decision (first writer wins).
INSERT INTO gc_llm_cache (key, kind, user_id, memory_ids, value)
VALUES (:key, :kind, :user_id, CAST(:memory_ids AS uuid[]), CAST(:value AS jsonb))
ON CONFLICT (key) DO NOTHING

-- insert_reviews --
-- Queue review items for decisions the worker must not take alone.
INSERT INTO gc_review_items (run_id, user_id, kind, memory_ids, reason, details)
SELECT :run_id, r.user_id, r.kind, ARRAY(SELECT jsonb_array_elements_text(r.memory_ids))::uuid[],
       r.reason, r.details
FROM jsonb_to_recordset(CAST(:items AS jsonb))
     AS r(user_id text, kind text, memory_ids jsonb, reason text, details jsonb)
RETURNING id
