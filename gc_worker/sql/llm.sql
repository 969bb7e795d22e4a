-- llm_cache_get --
-- A cached, validated LLM decision.
SELECT value FROM gc_llm_cache WHERE key = :key

-- llm_cache_put --
-- Keep a validated LLM decision. A key is asked again only when its entry was missing or no
-- longer passed the checks (a stricter rule since, a damaged entry): the new answer replaces
-- it, else the question would be paid for at every run. Two workers asking at once both
-- validated theirs; the later one stays.
INSERT INTO gc_llm_cache (key, kind, user_id, memory_ids, value)
VALUES (:key, :kind, :user_id, CAST(:memory_ids AS uuid[]), CAST(:value AS jsonb))
ON CONFLICT (key) DO UPDATE
SET kind = excluded.kind, user_id = excluded.user_id, memory_ids = excluded.memory_ids,
    value = excluded.value, created_at = clock_timestamp()

-- insert_reviews --
-- Queue review items for decisions the worker must not take alone.
INSERT INTO gc_review_items (run_id, user_id, kind, memory_ids, reason, details)
SELECT :run_id, r.user_id, r.kind, ARRAY(SELECT jsonb_array_elements_text(r.memory_ids))::uuid[],
       r.reason, r.details
FROM jsonb_to_recordset(CAST(:items AS jsonb))
     AS r(user_id text, kind text, memory_ids jsonb, reason text, details jsonb)
RETURNING id

-- run_llm_spend_open --
-- A process joins a run's model budget: what the run's batches recorded (:calls, :tokens) is
-- spent at least (a run begun before migration 0013, or whose ledger lags behind them); the
-- ledger's figures, which also count calls of batches still being worked elsewhere, are returned.
INSERT INTO gc_run_llm_spend AS s (run_id, calls, tokens) VALUES (:run_id, :calls, :tokens)
ON CONFLICT (run_id) DO UPDATE
SET calls = greatest(s.calls, excluded.calls), tokens = greatest(s.tokens, excluded.tokens)
RETURNING calls, tokens

-- run_llm_take_call --
-- Take one model call from the run's budget, if both limits (NULL: none) still allow one.
UPDATE gc_run_llm_spend SET calls = calls + 1
WHERE run_id = :run_id
  AND (CAST(:max_calls AS bigint) IS NULL OR calls < :max_calls)
  AND (CAST(:max_tokens AS bigint) IS NULL OR tokens < :max_tokens)
RETURNING calls

-- run_llm_spent --
-- What the run has spent on the model, by every process working it.
SELECT calls, tokens FROM gc_run_llm_spend WHERE run_id = :run_id

-- run_llm_add_tokens --
-- Add a call's tokens to the run's spend (saturating: the column is a bigint).
UPDATE gc_run_llm_spend
SET tokens = CASE WHEN tokens > 9223372036854775807 - :tokens THEN 9223372036854775807
                  ELSE tokens + :tokens END
WHERE run_id = :run_id
