"""A run's score pass: decay scores refreshed in one pass over the table, after the batches.

A batch refreshes its users' scores where their rows lie, and a user's rows are spread over the
whole table: in a run over every user, each batch reads and rewrites most of the table's pages,
so each page is read, dirtied and written once per batch. A run over every user with more than
one batch (``gc_runs.score_pass``, set when the run starts: sql/runs.sql ``set_score_pass``)
therefore leaves the refresh to this pass, which walks the table's pages in physical order in
ranges of ``PAGES`` pages, each range one short transaction (``decay_refresh_pages``), ``workers``
ranges at a time. It runs once the run is closed: every batch's retirements are applied, so
only rows still active are refreshed, exactly as the batches would have.

The pass writes only ``decayed_confidence``, the worker's own column, which no decision reads
back (decay computes the score itself, and content versions leave the column out). As
everywhere, a row the application holds is skipped (``SKIP LOCKED``), never waited for; so are
the users some batch holds at the range's start (their per-user advisory locks). A sweep of one
user that takes the user after a range started can still find a row the range rewrote at a new
version and skip that action as drifted: harmless, its next run does it. Only the users of the
run's done batches are refreshed, as the batches would have: not a user of a failed batch, nor
one the run (or the plan it applies) did not take. A pass that stops (a stop request, an
interrupt, a database error) leaves the rest to the next run, which finds them still due; it
does not fail the run, whose actions are all applied (gc_worker.engine ``_score_pass``). The
count of rewritten scores is added to ``gc_runs.scores_refreshed`` in each range's transaction
and ``gc_runs.score_pass`` ends ``done`` or ``stopped`` (a process killed in the pass leaves it
``due``): the run's report shows both.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy.engine import Engine

from gc_worker.config import Settings
from gc_worker.db import describe_error, retrying, transaction
from gc_worker.queries import q
from jobs import decay

log = structlog.get_logger("memory_gc")

PAGES = 1024  # pages per range: 8 MiB, a few hundred milliseconds of work at most
# work_mem per user of the run for each range's hashed set of users: the planner reckons about
# 53 bytes an entry (a short id) and hashes only what it expects to fit; room for 4x that
BYTES_PER_USER = 256
LAST_PAGE = 4294967295  # the largest block number a tid can name: the last range is open
ATTEMPTS = 3


def ranges(pages: int, size: int = PAGES) -> list[tuple[int, int]]:
    """[lo, hi) page ranges covering ``pages`` pages; the last one open-ended (rows written
    past the end meanwhile are included)."""
    return list(itertools.pairwise([*range(0, max(pages, 1), size), LAST_PAGE]))


def refresh_scores(
    engine: Engine,
    run: dict[str, Any],
    settings: Settings,
    *,
    workers: int,
    should_stop: Callable[[], bool] | None = None,
) -> int:
    """Run ``run``'s score pass with up to ``workers`` threads; the scores it rewrote."""
    with transaction(engine) as conn:
        sizes = conn.execute(q("score_pass_pages"), {"run_id": run["id"]}).one()
    pages = int(sizes.pages)
    params = decay.rule_params(settings.decay, run["now"]) | {
        "now": run["now"],
        "run_id": run["id"],
        "work_mem_kb": work_mem_kb(int(sizes.users)),
    }
    todo = iter(ranges(pages, PAGES))
    taken = threading.Lock()
    stop = threading.Event()
    counts: list[int] = []
    errors: list[Exception] = []
    halted: list[str] = []

    def next_range() -> tuple[int, int] | None:
        with taken:
            if should_stop is not None and should_stop():
                halted.append("stop requested")
            if stop.is_set() or halted:
                return None
            return next(todo, None)

    def work() -> None:
        try:
            while (pages_ := next_range()) is not None:
                counts.append(
                    retrying(ATTEMPTS, lambda r=pages_: _refresh_range(engine, r, params))
                )
        except Exception as exc:  # the others finish their range and stop
            errors.append(exc)
            stop.set()

    def helper(done: threading.Event) -> None:
        try:
            work()
        finally:
            done.set()

    dones = [threading.Event() for _ in range(max(1, workers) - 1)]
    helpers = [(threading.Thread(target=helper, args=(done,), daemon=True,
                                 name=f"memory-gc-scores-{i + 1}"), done)
               for i, done in enumerate(dones)]  # fmt: skip
    for thread, _ in helpers:
        thread.start()
    try:
        work()
        for thread, done in helpers:  # a Ctrl-C while waiting for them is an interrupt too
            _join(thread, done, stop)
    except BaseException:  # interrupted (Ctrl-C): the helpers finish their range and stop
        stop.set()
        for thread, done in helpers:
            _join(thread, done, stop)
        with contextlib.suppress(Exception):  # said if the database lets us; the interrupt goes on
            _end(engine, run["id"], "stopped")
        raise
    refreshed = sum(counts)
    _end(engine, run["id"], "stopped" if errors or halted else "done")
    if errors:
        log.error("gc.score_pass_stopped", run_id=str(run["id"]), refreshed=refreshed,
                  error=describe_error(errors[0]))  # fmt: skip
    elif halted:
        log.info("gc.score_pass_stopped", run_id=str(run["id"]), refreshed=refreshed,
                 reason=halted[0])  # fmt: skip
    else:
        log.info("gc.score_pass_done", run_id=str(run["id"]), refreshed=refreshed, pages=pages)
    return refreshed


def work_mem_kb(users: int) -> int:
    """The work_mem a range asks for (score_pass_plan; the server's own if larger)."""
    return -(-users * BYTES_PER_USER // 1024)


def _end(engine: Engine, run_id: Any, state: str) -> None:
    with transaction(engine) as conn:
        conn.execute(q("score_pass_end"), {"run_id": run_id, "state": state})


def _refresh_range(engine: Engine, pages: tuple[int, int], params: dict[str, Any]) -> int:
    lo, hi = pages
    with transaction(engine) as conn:
        held = list(conn.execute(q("held_user_keys")).scalar_one())
        conn.execute(q("score_pass_plan"), {"work_mem_kb": params["work_mem_kb"]})
        refreshed = conn.execute(
            q("decay_refresh_pages"),
            params | {"lo": f"({lo},0)", "hi": f"({hi},0)", "held": held},
        ).rowcount
        conn.execute(q("score_pass_count"), {"run_id": params["run_id"], "refreshed": refreshed})
    return refreshed


def _join(thread: threading.Thread, done: threading.Event, stop: threading.Event) -> None:
    """Wait for a helper (``done``: its work is over); interrupted (Ctrl-C), tell the helpers to
    stop after their range and wait for them, then let the interrupt go on. Not on
    ``thread.join()`` alone: interrupted, Python 3.11 marks the thread stopped while it runs,
    and a second join returns at once."""
    try:
        done.wait()
    except BaseException:
        stop.set()
        done.wait()
        raise
    finally:
        if done.is_set():
            thread.join()
