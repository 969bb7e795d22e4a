"""The score pass (gc_worker.score_pass) interrupted at each point it can be: the pass is left
``stopped`` (its scores the next run's), never ``due`` as if the process had been killed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gc_worker import score_pass
from tests.interrupts import ctrl_c
from tests.seeding import seed
from tests.store import execute, run
from tests.test_score_pass import SETTINGS, store


class TestInterrupts:
    def test_a_ctrl_c_while_the_caller_waits_for_a_helper_marks_the_pass_stopped(
        self, engine, monkeypatch
    ):
        """The caller has run out of ranges and waits for a helper still in its range when
        Ctrl-C lands: the helper finishes its range, the pass is marked stopped, the interrupt
        goes on (it was left `due`: the join was outside the interrupt's handling)."""
        seed(engine, store(padding=6))
        monkeypatch.setattr(score_pass, "PAGES", 1)
        main = threading.main_thread()
        in_range, waiting = threading.Event(), threading.Event()
        real_range, real_join, stops = score_pass._refresh_range, score_pass._join, []

        def slow_helper(*args: Any) -> int:
            if threading.current_thread() is main:
                # a loaded machine may start the helper late: the caller would take every range
                assert in_range.wait(30)
            elif not in_range.is_set():
                in_range.set()  # the helper's first range: held until the caller waits for it
                assert waiting.wait(30)
                assert interrupt.send()
                assert stops[0].wait(30)  # the caller took the interrupt: it stops the helpers
            return real_range(*args)

        def join(*args: Any) -> None:
            stops.append(args[2])  # (thread, done, stop)
            waiting.set()
            real_join(*args)

        monkeypatch.setattr(score_pass, "_refresh_range", slow_helper)
        monkeypatch.setattr(score_pass, "_join", join)
        with ctrl_c() as interrupt, pytest.raises(KeyboardInterrupt):
            run(engine, SETTINGS)
        alive = [t.name for t in threading.enumerate() if t.name.startswith("memory-gc-scores")]
        assert alive == []
        row_ = execute(engine, "SELECT status, score_pass FROM gc_runs").one()
        assert tuple(row_) == ("completed", "stopped")
