"""A deadline on each whole request to the model, not only on each read.

httpx's timeouts bound one connect, one write, one read: a server (or a proxy in front of it)
that sends its answer a few bytes at a time, each read inside ``timeout_seconds``, held the
call — and the batch, and every thread waiting on the budget's lock — for as long as it kept
sending. ``with_deadline(client, seconds)`` adds two event hooks to the HTTP client: the request
hook notes when the request was sent, the response hook wraps the body so that reading it past
``seconds`` since then raises ``httpx2.ReadTimeout``, which the openai client reports as a
timeout (retried like any other). A read already waiting ends by the read timeout, so a request
is given up within about twice ``seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx2

DEADLINE = "memory_gc.deadline"  # the request extension holding its monotonic deadline


class _BoundedBody(httpx2.SyncByteStream):
    """A response body whose chunks stop coming once the request's deadline has passed."""

    def __init__(self, inner: httpx2.SyncByteStream, request: httpx2.Request, deadline: float):
        self._inner, self._request, self._deadline = inner, request, deadline

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            _check(self._request, self._deadline)
            yield chunk

    def close(self) -> None:
        self._inner.close()


def _check(request: httpx2.Request, deadline: float) -> None:
    if time.monotonic() > deadline:
        raise httpx2.ReadTimeout("the whole request took longer than its timeout", request=request)


def with_deadline(client: httpx2.Client, seconds: float) -> httpx2.Client:
    """``client`` with every request given up ``seconds`` after it was sent (module docstring)."""

    def sent(request: httpx2.Request) -> None:
        request.extensions[DEADLINE] = time.monotonic() + seconds

    def answered(response: httpx2.Response) -> None:
        deadline = response.request.extensions.get(DEADLINE)
        if deadline is None or not isinstance(response.stream, httpx2.SyncByteStream):
            return
        _check(response.request, deadline)
        response.stream = _BoundedBody(response.stream, response.request, deadline)

    hooks = client.event_hooks
    client.event_hooks = {
        "request": [*hooks.get("request", []), sent],
        "response": [*hooks.get("response", []), answered],
    }
    return client
