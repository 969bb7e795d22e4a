"""The daemon's reviewed plans: ``DuePlans``, the part of ``Daemon`` that applies them.

With ``schedule.mode = "plan_then_apply"`` the nightly run only plans; the upkeep then applies
each plan whose review delay (``schedule.apply_delay_minutes``) is over and that nobody
rejected, after rejecting those older than the daemon's plan age limit. A plan too large to
apply unattended (``scheduler.hold_if_large``) is held for a person instead; meanwhile the
erasures users asked for are carried out by a run of the erasure job alone.

``DuePlans`` is a mixin of ``gc_worker.daemon.Daemon``: it uses the daemon's engine, settings,
clock, ``work`` and ``stopping``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from uuid import UUID

import structlog
from sqlalchemy.engine import Engine

from gc_worker import scheduler
from gc_worker.config import Settings
from gc_worker.engine import RunRequest, resolve_jobs, started
from gc_worker.errors import RunFailed

log = structlog.get_logger("memory_gc")


class DuePlans:
    """Applying the reviewed nightly plans (``apply_due_plans``), erasing while one is held."""

    # the daemon's (gc_worker.daemon.Daemon sets them)
    engine: Engine
    settings: Settings
    clock: Callable[[], datetime]

    def apply_due_plans(self) -> list[UUID]:
        """plan_then_apply: apply every nightly plan whose review delay is over (not rejected),
        except one too large to apply unattended (``scheduler.hold_if_large``): that one waits
        for a person, and the erasures users asked for are carried out meanwhile."""
        applied, failed = [], []
        delay = self.settings.schedule.apply_delay_minutes
        max_age = self.settings.plan_age_limit_hours  # this daemon's limit, as for the CLI
        scheduler.reject_stale_plans(self.engine, max_age)
        for plan_id in scheduler.due_plans(self.engine, self.clock(), delay):
            if self.stopping():
                break
            if scheduler.hold_if_large(self.engine, plan_id, self.settings.schedule):
                continue
            with scheduler.apply_run_of(self.engine, plan_id, max_age_hours=max_age) as apply_id:
                if apply_id is not None:
                    try:
                        self.work(apply_id)
                    except RunFailed as exc:  # some batches failed: the other plans still apply
                        failed.append(exc)
                    applied.append(apply_id)
        # a plan held at this pass or an earlier one (by any replica, which may have stopped
        # before erasing): requests filed since are not left waiting for the person either
        if not self.stopping() and scheduler.held_plan_count(self.engine):
            self.erase_meanwhile()
        if failed:
            raise failed[0]
        return applied

    def erase_meanwhile(self) -> UUID | None:
        """Apply the erasure job alone for the users with a pending erasure request no erasure
        run tried yet: a held plan carries their requests too, and a person may take days to
        look at it. Returns the run, if there was anything to erase. The held plan's erasure
        actions then drift."""
        if "erasure" not in resolve_jobs([], self.settings):
            return None
        users = scheduler.erasure_pending_users(self.engine)
        if not users:
            return None
        request = RunRequest(
            mode="apply", now=self.clock(), users=tuple(users), jobs=("erasure",),
            trigger="erasure",
        )  # fmt: skip
        with started(self.engine, self.settings, request) as run_id:  # (close_stopped_runs)
            log.info("gc.schedule.erasures_while_held", run_id=str(run_id), users=len(users))
            self.work(run_id)
        return run_id
