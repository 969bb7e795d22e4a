"""Peak memory of compaction's candidate read plus grouping: one user, 10,000 rows x 1536.

    python -m bench.bench_candidate_fetch                 # 10,000 rows
    python -m bench.bench_candidate_fetch --rows 20000

Starts the embedded PostgreSQL in a temporary directory, seeds one user with the partition of
bench.bench_cluster_memory (float4 embeddings, vector(1536)), then, in a fresh child process,
reads the user's candidates as compaction plans them (``rows_by_user(…,
"compaction_candidates")``, planned before the batch transaction) and groups them
(``find_groups``). Prints peak RSS (VmHWM) after the imports, after the read and after the
grouping, and the seconds of each. Figures only; no assertion on time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.bench_cluster_memory import DIM, MAX_GROUP_SIZE, SIMILARITY, START, partition
from bench.worker import peak_rss_mb
from gc_worker import db, logs, schema
from gc_worker.config import EmbeddingSettings, Settings


def seed(engine: Any, rows: int) -> None:
    """One user's rows, created a minute apart, embeddings as pgvector text."""
    vectors = partition(rows)
    with engine.begin() as conn:
        cursor = conn.connection.dbapi_connection.cursor()
        copy = "COPY memories (user_id, content, embedding, created_at, observed_at) FROM STDIN"
        with cursor.copy(copy) as out:
            for i, vector in enumerate(vectors):
                when = START + timedelta(minutes=i)
                text = "[" + ",".join(map(repr, vector.tolist())) + "]"
                out.write_row(("u1", f"memory {i}", text, when, when))
        conn.exec_driver_sql("ANALYZE memories")


def measure(url: str) -> dict[str, Any]:
    """In this process: read the candidates, group them, report peaks."""
    import sklearn.cluster  # noqa: F401  (imports are not the read's cost)

    from gc_worker.batch import BatchContext
    from jobs.compaction import find_groups
    from jobs.llm_support import rows_by_user

    settings = Settings(embeddings=EmbeddingSettings(dim=DIM))
    engine = db.make_engine(url)
    result: dict[str, Any] = {"rss_start_mb": round(peak_rss_mb())}
    with engine.connect() as conn:
        ctx = BatchContext(conn=conn, users=["u1"], settings=settings, now=datetime.now(UTC),
                           dry_run=True, in_transaction=False)  # fmt: skip
        started = time.perf_counter()
        (_, rows), *_ = list(rows_by_user(ctx, "compaction_candidates", held=[]))
        result["read_seconds"] = round(time.perf_counter() - started, 2)
        result["rss_read_mb"] = round(peak_rss_mb())
        started = time.perf_counter()
        groups, skipped = find_groups(rows, similarity=SIMILARITY, max_group_size=MAX_GROUP_SIZE,
                                      max_merge_depth=1, dim=DIM)  # fmt: skip
        result["group_seconds"] = round(time.perf_counter() - started, 2)
    engine.dispose()
    ids = [sorted(str(row.content) for row in group) for group in groups]
    result |= {"rows": len(rows), "groups": len(groups), "skipped": skipped,
               "digest": hashlib.sha256(json.dumps(sorted(ids)).encode()).hexdigest()[:12],
               "peak_rss_mb": round(peak_rss_mb())}  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child)))
        return
    logs.configure("warning")
    with tempfile.TemporaryDirectory() as tmp:
        server = db.embedded_server(Path(tmp))
        url = db.embedded_url(Path(tmp))
        engine = db.make_engine(url)
        try:
            schema.migrate(engine, embedding_dim=DIM)
            seed(engine, args.rows)
            engine.dispose()
            command = [sys.executable, "-m", "bench.bench_candidate_fetch", "--child", url]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            print(done.stdout.splitlines()[-1])
        finally:
            engine.dispose()
            server.cleanup()


if __name__ == "__main__":
    main()
