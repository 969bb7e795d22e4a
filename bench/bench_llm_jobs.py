"""LLM cost and clustering time of compaction and contradiction, against a local fake server.

Starts the embedded PostgreSQL in a temporary directory, a fake OpenAI-compatible server on
127.0.0.1 (stdlib http.server in a thread; merges every group, judges every pair compatible,
embeds by hashing the text), seeds one user with 500 memories of 1536 dimensions (60 clusters of
noisy copies at cosine ~0.92 plus singletons), then prints:

- LLM calls per candidate group (compaction) and per candidate pair (contradiction): <= 1;
- calls on a re-run with no new memories: 0 (the decision and embedding caches);
- clustering time for that user (find_groups, median of 5) and the wall time of each run.

Dry runs only, so every run sees the same memories. Prints figures; asserts nothing on time.

    .venv/bin/python -m bench.bench_llm_jobs
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from gc_worker import db, logs, schema
from gc_worker import engine as gc_engine
from gc_worker.batch import BatchContext
from gc_worker.config import EmbeddingSettings, LLMSettings, Runtime, Settings
from gc_worker.llm_store import open_run_llm
from gc_worker.report import build_report
from jobs.compaction import find_groups
from jobs.llm_support import rows_by_user

USER = "bench-user"
N_MEMORIES, DIM, N_CLUSTERS, N_CLUSTERED, NOISE = 500, 1536, 60, 380, 0.0075
RUNS = 5
MAX_BODY = 16 * 1024 * 1024
NOW = datetime.now(UTC)


class FakeOpenAI(BaseHTTPRequestHandler):
    """/v1/chat/completions and /v1/embeddings, counted per kind in ``server.counts``."""

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", "0"))
        if not 0 < length <= MAX_BODY:
            self.send_error(413)
            return
        body = json.loads(self.rfile.read(length))
        if self.path.endswith("/embeddings"):
            self.server.counts["embeddings"] += 1  # type: ignore[attr-defined]
            self._send(embeddings(body["input"]))
            return
        name = body["response_format"]["json_schema"]["name"]
        self.server.counts[name] += 1  # type: ignore[attr-defined]
        payload = data_block(body["messages"][1]["content"])
        self._send(chat(merge_answer(payload) if name == "MergeAnswer" else judge(payload)))

    def _send(self, value: dict[str, Any]) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


def data_block(text: str) -> Any:
    start, end = text.index("<memories>\n"), text.index("\n</memories>")
    return json.loads(text[start + len("<memories>\n") : end])


def merge_answer(payload: list[dict[str, str]]) -> dict[str, Any]:
    ids = [member["id"] for member in payload]
    return {"is_duplicate_set": True, "member_ids": ids, "merged_text": payload[0]["content"],
            "reason": None}  # fmt: skip


def judge(payload: dict[str, Any]) -> dict[str, Any]:
    return {"older_id": payload["older"]["id"], "newer_id": payload["newer"]["id"],
            "verdict": "compatible", "reason": "bench"}  # fmt: skip


def chat(answer: dict[str, Any]) -> dict[str, Any]:
    message = {"role": "assistant", "content": json.dumps(answer), "refusal": None}
    return {"id": "bench", "object": "chat.completion", "created": 0, "model": "bench",
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                         "message": message}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 30,
                      "total_tokens": 230}}  # fmt: skip


def embeddings(texts: list[str]) -> dict[str, Any]:
    data = []
    for index, text in enumerate(texts):
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
        vector = np.random.default_rng(seed).normal(size=DIM)
        data.append({"object": "embedding", "index": index,
                     "embedding": (vector / np.linalg.norm(vector)).tolist()})  # fmt: skip
    return {"object": "list", "data": data, "model": "bench",
            "usage": {"prompt_tokens": 10, "total_tokens": 10}}  # fmt: skip


@contextmanager
def fake_server() -> Iterator[tuple[str, Counter]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    server.daemon_threads = True
    server.counts = Counter()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", server.counts  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _letters(j: int) -> str:
    """a, b, …, z, ba, bb, …: a count written without digits."""
    return ("" if j < 26 else _letters(j // 26)) + chr(97 + j % 26)


def seed(engine: sa.Engine, rng: np.random.Generator) -> None:
    """One user: clusters of noisy copies (distinct texts) plus singletons."""
    sizes = 2 + rng.multinomial(N_CLUSTERED - 2 * N_CLUSTERS, [1 / N_CLUSTERS] * N_CLUSTERS)
    centres = rng.normal(size=(N_CLUSTERS, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    vectors = np.repeat(centres, sizes, axis=0) + rng.normal(scale=NOISE, size=(N_CLUSTERED, DIM))
    vectors = np.vstack([vectors, rng.normal(size=(N_MEMORIES - N_CLUSTERED, DIM))])
    # copies of one topic differ in wording, not in a number (a differing number is a near
    # miss, which compaction never puts to the model)
    labels = [f"topic {k} in wording {_letters(j)}" for k, n in enumerate(sizes) for j in range(n)]
    labels += [f"singleton {i}" for i in range(N_MEMORIES - N_CLUSTERED)]
    rows = [{"user_id": USER, "content": f"The user mentioned {label}.",
             "embedding": "[" + ",".join(f"{x:.6f}" for x in vector) + "]"}
            for label, vector in zip(labels, vectors, strict=True)]  # fmt: skip
    insert = sa.text("INSERT INTO memories (user_id, content, embedding) "
                     "VALUES (:user_id, :content, CAST(:embedding AS vector))")  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert, rows)


def clustering_seconds(engine: sa.Engine, settings: Settings) -> tuple[float, int]:
    """Median time of find_groups over the user's stored candidates, and the group count."""
    with engine.begin() as conn:
        ctx = BatchContext(conn=conn, users=[USER], settings=settings, now=NOW, dry_run=True)
        [(_, rows)] = list(rows_by_user(ctx, "compaction_candidates", held=[]))
    policy = settings.compaction
    times, groups = [], []
    for _ in range(RUNS):
        start = time.perf_counter()
        groups, _ = find_groups(rows, similarity=policy.similarity, dim=DIM,
                                max_group_size=policy.max_group_size,
                                max_merge_depth=policy.max_merge_depth)  # fmt: skip
        times.append(time.perf_counter() - start)
    return statistics.median(times), len(groups)


def dry_run(engine: sa.Engine, settings: Settings, port: Any, job: str) -> tuple[dict, float]:
    request = gc_engine.RunRequest(mode="dry_run", now=NOW, jobs=(job,))
    start = time.perf_counter()
    run_id = gc_engine.run_once(engine, settings, request, llm=port)
    seconds = time.perf_counter() - start
    with engine.connect() as conn:
        return build_report(conn, run_id), seconds


def contradiction_pairs(engine: sa.Engine, similarity: float) -> int:
    sql = ("SELECT count(*) FROM memories a JOIN memories b ON a.user_id = b.user_id "
           "AND a.id < b.id WHERE 1 - (a.embedding <=> b.embedding) >= :s")  # fmt: skip
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), {"s": similarity}).scalar_one()


def main() -> None:
    logs.configure("warning")
    settings = Settings(
        embeddings=EmbeddingSettings(dim=DIM), llm=LLMSettings(max_calls_per_run=5000)
    )
    with tempfile.TemporaryDirectory() as tmp, fake_server() as (base_url, counts):
        engine = db.make_engine(db.embedded_url(Path(tmp)))
        schema.migrate(engine, embedding_dim=DIM)
        seed(engine, np.random.default_rng(42))
        cluster_time, groups = clustering_seconds(engine, settings)
        runtime = Runtime(data_dir=Path(tmp), openai_base_url=base_url, openai_api_key="bench")
        port = open_run_llm(settings, runtime, engine)
        print(f"one user, {N_MEMORIES} memories x {DIM} dims ({N_CLUSTERS} planted clusters)")
        print(f"clustering (find_groups): median {cluster_time * 1000:.1f} ms over {RUNS} runs, "
              f"{groups} candidate groups")  # fmt: skip
        report, seconds = dry_run(engine, settings, port, "compaction")
        merges = counts["MergeAnswer"]
        print(f"compaction: {merges} merge calls for {groups} groups = "
              f"{merges / max(groups, 1):.2f} per group; {counts['embeddings']} embeddings "
              f"call(s) for the batch; {report['llm']['calls']} calls in all; "
              f"run {seconds:.2f} s")  # fmt: skip
        again, seconds = dry_run(engine, settings, port, "compaction")
        print(f"compaction re-run, no new memories: {again['llm']['calls']} calls "
              f"({again['llm']['cache_hits']} cache hits); run {seconds:.2f} s")  # fmt: skip
        pairs = contradiction_pairs(engine, settings.contradiction.similarity)
        report, seconds = dry_run(engine, settings, port, "contradiction")
        judged = counts["ContradictionAnswer"]
        print(f"contradiction: {judged} judge calls for {pairs} candidate pairs = "
              f"{judged / max(pairs, 1):.2f} per pair; run {seconds:.2f} s")  # fmt: skip
        again, seconds = dry_run(engine, settings, port, "contradiction")
        print(f"contradiction re-run, no new memories: {again['llm']['calls']} calls; "
              f"run {seconds:.2f} s")  # fmt: skip
        port.close()
        engine.dispose()


if __name__ == "__main__":
    main()
