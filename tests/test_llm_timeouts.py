"""A slow model, over a real socket: ``llm.timeout_seconds`` is enforced by the real openai
client and its HTTP transport (a ``MockTransport`` answers in-process and cannot be slow in that
sense), so these tests serve OpenAI-compatible answers from a loopback HTTP server that takes
its time. Still faked only at the HTTP boundary."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gc_worker.llm import LLMOptions, LLMUnavailable, open_llm

DIM = 8


def slow_server(delay: float) -> tuple[ThreadingHTTPServer, list[float]]:
    """An embeddings endpoint that answers after ``delay`` seconds; records each request."""
    seen: list[float] = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(time.monotonic())
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay)
            data = [{"object": "embedding", "index": i, "embedding": [1.0] + [0.0] * (DIM - 1)}
                    for i, _ in enumerate(body["input"])]  # fmt: skip
            usage = {"prompt_tokens": 1, "total_tokens": 1}
            payload = json.dumps({"object": "list", "data": data, "model": "m", "usage": usage})
            payload = payload.encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:  # the client gave up (timeout) and closed the socket
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def port_for() -> Iterator[Any]:
    opened: list[tuple[Any, ThreadingHTTPServer]] = []

    def make(delay: float, **options: Any) -> tuple[Any, list[float]]:
        server, seen = slow_server(delay)
        values = {"api_key": "k", "base_url": f"http://127.0.0.1:{server.server_port}/v1",
                  "embedding_dim": DIM, "backoff_base_seconds": 0} | options  # fmt: skip
        port = open_llm(LLMOptions(**values))
        opened.append((port, server))
        return port, seen

    yield make
    for port, server in opened:
        port.close()
        server.shutdown()
        server.server_close()


def test_a_model_slower_than_the_timeout_is_given_up_and_retried(port_for):
    """An answer that takes 3 s against a 0.3 s timeout: every attempt (1 + max_retries) times
    out, the call fails as LLMUnavailable (the job then defers), and the port did not sit out
    the slow answers."""
    port, seen = port_for(3.0, timeout_seconds=0.3, max_retries=1)
    started = time.monotonic()
    with pytest.raises(LLMUnavailable):
        port.embed(["a text"])
    waited = time.monotonic() - started
    assert len(seen) == 2
    assert waited < 3.0  # neither attempt waited for the 3 s answer
    assert port.usage()["errors"] == 1 and port.usage()["retries"] == 1


def test_a_slow_model_within_the_timeout_is_simply_waited_for(port_for):
    """An answer that takes 0.5 s against a 5 s timeout is used, with no retry."""
    port, seen = port_for(0.5, timeout_seconds=5.0, max_retries=2)
    assert port.embed(["a text"]) == [[1.0] + [0.0] * (DIM - 1)]
    assert len(seen) == 1 and port.usage()["retries"] == 0


def dripping_server(chunk_delay: float) -> ThreadingHTTPServer:
    """An embeddings endpoint that sends its headers at once, then its body 8 bytes at a time,
    ``chunk_delay`` apart: every read is quick, the whole answer is not."""

    class Drip(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            data = [{"object": "embedding", "index": 0, "embedding": [1.0] + [0.0] * (DIM - 1)}]
            usage = {"prompt_tokens": 1, "total_tokens": 1}
            payload = json.dumps({"object": "list", "data": data, "model": "m", "usage": usage})
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                for start in range(0, len(payload), 8):
                    self.wfile.write(payload[start : start + 8].encode())
                    self.wfile.flush()
                    time.sleep(chunk_delay)
            except OSError:  # the client gave up and closed the socket
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_an_answer_sent_a_few_bytes_at_a_time_is_given_up_at_the_timeout():
    """``timeout_seconds`` bounds the whole request, not each read: a server (or proxy) that
    sends its answer a few bytes every 0.2 s — each read well inside a 0.6 s timeout, the body
    taking ~6 s — is given up after about the timeout, as a slow answer is. Before, the call
    took as long as the server kept sending, the batch (and every thread behind the budget)
    with it."""
    server = dripping_server(0.2)
    base_url = f"http://127.0.0.1:{server.server_port}/v1"
    port = open_llm(LLMOptions(api_key="k", base_url=base_url, embedding_dim=DIM,
                               timeout_seconds=0.6, max_retries=0))  # fmt: skip
    try:
        started = time.monotonic()
        with pytest.raises(LLMUnavailable):
            port.embed(["a text"])
        # the body takes 4.6 s (23 chunks); a loaded machine can add a second to the 0.6 s
        assert time.monotonic() - started < 3.5
    finally:
        port.close()
        server.shutdown()
        server.server_close()
