"""Generate a synthetic memory store with set-based SQL (``generate_series``, no Python row loop).

The store is what the worker meets on a night with a backlog: written by an application over two
years, scores last refreshed the night before (``now - 1 day``), and a realistic share of rows due
for a status change. Everything derives from a seeded ``random()``, so the same arguments give
the same store (ids are ``md5('bench:' || i)``).

Per user: sizes are log-normal (sigma 1, every user has at least one row), which puts about 2 %
of users over the default cap of 500 at 1,000,000 rows / 10,000 users. Per row:

- age: 730 × r² days (recent rows are commoner); 15 % were updated after creation;
- last access: 10 % never, else an exponential with a 25-day mean (never before creation);
- importance 1..5 in 10/20/40/20/10 %; confidence 1.0 for 70 %, else 0.4..1.0;
- TTL on 10 % of rows, a quarter of them already expired; 2 % pinned;
- status: 5 % deleted (deleted 0..60 days ago, 2 % of those erased on request), 1.5 % obsolete
  and 0.5 % merged (retired 0..500 days ago, with superseded_by and lineage to the user's
  first row); the rest active;
- embeddings (``dim``) for every row of a share of users, drawn from a pool of 256 random vectors
  (the deterministic jobs never read them; they are there for the row width and TOAST).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gc_worker.config import Settings

VECTOR_POOL = 256


@dataclass(frozen=True)
class Scale:
    memories: int
    users: int
    embedded_share: float = 0.0
    dim: int = 1536
    seed: float = 0.42

    @property
    def embedded_stride(self) -> int:
        """Every n-th user has embeddings (0 = nobody)."""
        return 0 if self.embedded_share <= 0 else max(1, round(1 / self.embedded_share))


USERS = """
CREATE TEMP TABLE bench_users AS
WITH w AS (
    SELECT j, exp(sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())) AS w
    FROM generate_series(0, :users - 1) AS j
), c AS (
    SELECT j, w, sum(w) OVER (ORDER BY j) / sum(w) OVER () AS share FROM w
), a AS (
    SELECT j, CASE WHEN j = :users - 1 THEN :spare
                   ELSE least(floor(:spare * share)::bigint, :spare) END AS upto
    FROM c
), n AS (
    SELECT j, 1 + upto - coalesce(lag(upto) OVER (ORDER BY j), 0) AS n FROM a
)
SELECT j, 'user-' || lpad(j::text, 6, '0') AS user_id, n,
       sum(n) OVER (ORDER BY j) - n AS start
FROM n
"""

VECTORS = """
CREATE TEMP TABLE bench_vectors AS
SELECT p.n, (SELECT array_agg(random()::real) FROM generate_series(1, :dim) AS d
             WHERE p.n IS NOT NULL)::vector AS embedding
FROM generate_series(0, :pool - 1) AS p(n)
"""

# Raw uniforms per row are drawn once (MATERIALIZED), then shaped into columns.
MEMORIES = """
INSERT INTO memories (id, user_id, content, embedding, memory_type, source, importance,
                      importance_assessed_at, confidence, decayed_confidence, pinned, created_at,
                      updated_at, last_accessed_at, access_count, observed_at, expires_at,
                      status, status_reason, status_changed_at, superseded_by, deleted_at,
                      metadata)
WITH r AS MATERIALIZED (
    SELECT u.j, u.user_id, u.start, k, u.start + k AS i,
           random() AS st, random() AS retired, random() AS age, random() AS upd,
           random() AS acc, random() AS acc2, random() AS imp, random() AS conf,
           random() AS conf2, random() AS ttl, random() AS ttl2, random() AS pin,
           random() AS kind, random() AS why, random() AS assessed, random() AS meta
    FROM bench_users u CROSS JOIN LATERAL generate_series(0, u.n - 1) AS k
), s AS (
    SELECT r.*,
           CASE WHEN st < 0.05 THEN 'deleted' WHEN st < 0.065 THEN 'obsolete'
                WHEN st < 0.07 THEN 'merged' ELSE 'active' END AS status,
           CASE WHEN st < 0.05 THEN 60 * retired WHEN st < 0.07 THEN 500 * retired
                ELSE 0 END AS retired_days,
           CASE WHEN imp < 0.1 THEN 1 WHEN imp < 0.3 THEN 2 WHEN imp < 0.7 THEN 3
                WHEN imp < 0.9 THEN 4 ELSE 5 END::smallint AS importance,
           CASE WHEN conf < 0.7 THEN 1.0 ELSE 0.4 + 0.6 * conf2 END::real AS confidence
    FROM r
), t AS (
    SELECT s.*,
           CAST(:now AS timestamptz)
             - make_interval(secs => 86400 * greatest(730 * age * age, retired_days + 1))
             AS created_at
    FROM s
), v AS (
    SELECT t.*,
           CASE WHEN upd < 0.15 THEN created_at + (:now - created_at) * (upd / 0.15)
                ELSE created_at END AS updated_at,
           CASE WHEN acc < 0.1 THEN NULL
                ELSE greatest(created_at, :now - make_interval(secs => 86400 * least(
                     extract(epoch FROM :now - created_at) / 86400, -25 * ln(1 - acc2))))
           END AS last_accessed_at
    FROM t
)
SELECT md5('bench:' || i)::uuid, user_id,
       format('fact %s of %s: %s', k, user_id, repeat(md5(i::text), 1 + (i % 3)::int)),
       b.embedding,
       CASE WHEN kind < 0.6 THEN 'semantic' WHEN kind < 0.9 THEN 'episodic'
            ELSE 'procedural' END,
       CASE WHEN why < 0.6 THEN 'explicit_user_statement' WHEN why < 0.95 THEN 'model_inference'
            ELSE 'external' END,
       importance, CASE WHEN assessed < 0.8 THEN created_at END, confidence,
       CASE WHEN pin >= 0.02 AND created_at < :now - interval '1 day'
            THEN memory_gc_decayed(confidence, importance,
                   greatest(created_at, updated_at, last_accessed_at),
                   :now - interval '1 day', :half_life_days, :multipliers) END,
       pin < 0.02, created_at, updated_at, last_accessed_at,
       CASE WHEN last_accessed_at IS NULL THEN 0 ELSE 1 + floor(-10 * ln(1 - acc))::int END,
       created_at,
       CASE WHEN ttl < 0.1 THEN :now + make_interval(secs => 86400 * 40 * (ttl2 - 0.25)) END,
       status,
       CASE status WHEN 'active' THEN NULL
                   WHEN 'deleted' THEN CASE WHEN why < 0.02 THEN 'erasure'
                                            WHEN why < 0.5 THEN 'user_request'
                                            ELSE 'ttl_expired' END
                   WHEN 'obsolete' THEN 'slot_superseded' ELSE 'merged_duplicate' END,
       CASE WHEN status <> 'active' THEN :now - make_interval(secs => 86400 * retired_days) END,
       CASE WHEN status IN ('obsolete', 'merged') AND k > 0
            THEN md5('bench:' || start)::uuid END,
       CASE WHEN status = 'deleted' THEN :now - make_interval(secs => 86400 * retired_days) END,
       CASE WHEN meta < 0.5 THEN jsonb_build_object('conversation', i / 7) ELSE '{}'::jsonb END
FROM v LEFT JOIN bench_vectors b ON :stride > 0 AND v.j % greatest(:stride, 1) = 0
                                AND b.n = v.i % :pool
ORDER BY created_at
"""

LINEAGE = """
INSERT INTO memory_lineage (derived_id, source_id)
SELECT superseded_by, id FROM memories WHERE status = 'merged' AND superseded_by IS NOT NULL
"""


def generate(engine: Engine, scale: Scale, settings: Settings, *, now: datetime) -> int:
    """Fill an empty, migrated store; returns the number of memories written."""
    policy = settings.decay
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT setseed(:seed)"), {"seed": scale.seed})
        conn.execute(sa.text("SET LOCAL work_mem = '256MB'"))
        conn.execute(sa.text(USERS), {"users": scale.users, "spare": scale.memories - scale.users})
        if scale.embedded_stride:
            conn.execute(sa.text(VECTORS), {"dim": scale.dim, "pool": VECTOR_POOL})
        else:
            conn.execute(sa.text("CREATE TEMP TABLE bench_vectors (n int, embedding vector)"))
        written = conn.execute(
            sa.text(MEMORIES),
            {
                "now": now,
                "stride": scale.embedded_stride,
                "pool": VECTOR_POOL,
                "half_life_days": policy.half_life_days,
                "multipliers": list(policy.importance_multipliers),
            },
        ).rowcount
        conn.execute(sa.text(LINEAGE))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) memories"))
        conn.execute(sa.text("VACUUM (ANALYZE) memory_lineage"))
    return written
