"""Ctrl-C for tests: SIGINT sent to the main thread from another thread, taken for certain.

CPython 3.11 can leave a signal that reaches the main thread while it runs Python code pending
until the main thread wakes on its own: another thread recomputing the eval breaker clears the
main thread's flag, and a main thread that then blocks (on a lock, an Event) sleeps through it. A
test that sends SIGINT as the main thread is about to block would see the interrupt land late,
after what it meant to interrupt (seen on a loaded machine: 30 s late). ``CtrlC.send`` sends it
again until the Python handler has run; the handler raises KeyboardInterrupt once, however many
copies arrive: one Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

RESEND_SECONDS = 0.05


class CtrlC:
    def __init__(self) -> None:
        self.taken = threading.Event()  # the main thread raised the KeyboardInterrupt

    def send(self, timeout: float = 30) -> bool:
        """From another thread: SIGINT to the main thread until it takes it; whether it did."""
        main, deadline = threading.main_thread().ident, time.monotonic() + timeout
        while not self.taken.is_set() and time.monotonic() < deadline:
            signal.pthread_kill(main, signal.SIGINT)
            self.taken.wait(RESEND_SECONDS)
        return self.taken.is_set()

    def _handler(self, *_: Any) -> None:
        if not self.taken.is_set():  # (runs in the main thread only: no race with itself)
            self.taken.set()
            raise KeyboardInterrupt


@contextmanager
def ctrl_c() -> Iterator[CtrlC]:
    """A ``CtrlC`` whose handler is SIGINT's for the block (entered in the main thread)."""
    sender = CtrlC()
    previous = signal.signal(signal.SIGINT, sender._handler)
    try:
        yield sender
    finally:
        signal.signal(signal.SIGINT, previous)
