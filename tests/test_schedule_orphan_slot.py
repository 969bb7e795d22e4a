"""A nightly firing that comes while the upkeep resumes an orphaned run (holding the daemon's
one-nightly-run lock) is not dropped: the slot runs when the orphan is done, whatever the grace
(it used to be lost unless the orphan ended within the misfire grace). Found by a review."""

from __future__ import annotations

import threading
from datetime import timedelta

import jobs.ttl_expiry as ttl
from gc_worker import engine as gc_engine
from gc_worker import scheduler
from gc_worker.daemon import Daemon
from tests.test_schedule import GRACE, SLOT, runs, seed


def test_slot_due_while_upkeep_resumes_an_orphan_is_not_lost(engine, settings, monkeypatch):
    seed(engine, users=2)
    s1 = SLOT + timedelta(days=1)
    # yesterday's nightly run, left `running` by a daemon that died (an orphan)
    orphan = gc_engine.start_run(
        engine, settings,
        gc_engine.RunRequest(mode="apply", now=SLOT, jobs=gc_engine.resolve_jobs([], settings),
                             users=("user-001",), trigger="nightly"),
        slot=scheduler.slot_key(SLOT),
    )  # fmt: skip
    clock = {"now": s1 - timedelta(minutes=10)}
    daemon = Daemon(engine, settings, clock=lambda: clock["now"])
    real, in_orphan, release = ttl.plan, threading.Event(), threading.Event()

    def plan(ctx):
        if ctx.now == SLOT:  # the orphan's batch is long (a big user, a slow model)
            in_orphan.set()
            assert release.wait(30)
        return real(ctx)

    monkeypatch.setattr(ttl, "plan", plan)
    upkeep = threading.Thread(target=daemon.upkeep)
    upkeep.start()
    cron = None
    try:
        assert in_orphan.wait(10)
        clock["now"] = s1 + timedelta(minutes=1)  # 03:00: the cron job fires
        cron = threading.Thread(target=daemon.attempt, args=[daemon.nightly])
        cron.start()
        cron.join(3)
        clock["now"] = s1 + timedelta(seconds=GRACE + 600)  # the orphan ends after the grace
    finally:
        release.set()
        upkeep.join(30)
        if cron is not None:
            cron.join(30)
    try:
        daemon.upkeep()  # the next upkeeps (catch_up_slot) come
        daemon.upkeep()
    finally:
        daemon.close()
    slots = [r["slot"] for r in runs(engine)]
    assert gc_engine
    assert orphan
    assert scheduler.slot_key(s1) in slots, f"slot {scheduler.slot_key(s1)} never ran: {slots}"
