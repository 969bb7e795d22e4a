"""What a job sees while planning one batch of users.

Jobs plan in DESIGN.md order against the stored rows; ``BatchContext`` carries what earlier
jobs of the same batch decided, so later jobs act on the state the plan will produce: rows
already retired are ``taken``, re-assessed importances are in ``importance`` (a lowered one
decides from the next run) and ``scored`` (as the rows will hold them: what a merged record or
summary made of them takes), records created by a merge count in ``created``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import TextClause
from sqlalchemy.engine import Connection

from gc_worker.actions import Action, Kind
from gc_worker.config import Settings
from gc_worker.errors import PlanAbandoned
from gc_worker.queries import q


@dataclass
class JobStats:
    """Per-job counters that are not actions (reported in ``jobs.<name>``)."""

    skipped: int = 0
    errors: int = 0
    llm_calls: int = 0
    refreshed: int = 0
    drifted: int = 0
    not_asked: int = 0  # candidate pairs a per-memory limit kept from the LLM (contradiction)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items()}


@dataclass
class BatchContext:
    conn: Connection
    users: list[str]
    settings: Settings
    now: datetime
    dry_run: bool
    llm: Any = None
    # False while the batch is planned before its transaction (the model is asked with no
    # transaction open, gc_worker.engine): every read is its own, no cursor stays open
    in_transaction: bool = True
    should_stop: Callable[[], bool] | None = None  # asked between users while planning early
    taken: set[UUID] = field(default_factory=set)
    importance: dict[UUID, int] = field(default_factory=dict)  # what this batch decides by
    scored: dict[UUID, int] = field(default_factory=dict)  # what the rows will hold (record)
    created: Counter[str] = field(default_factory=Counter)
    held: set[UUID] = field(default_factory=set)  # rows of a conflict this batch left open
    # job → users of the batch the run-start scan found work for (gc_worker.triage); a job
    # missing here reads every user
    work: dict[str, set[str]] = field(default_factory=dict)
    # job → the candidate rows the scan picked for the batch (read by id; see picked_ids)
    picked: dict[str, set[str]] = field(default_factory=dict)  # ids as text, as stored
    stats: dict[str, JobStats] = field(default_factory=dict)

    def stop_if_asked(self) -> None:
        """While the batch is planned before its transaction (nothing written yet, the model
        perhaps minutes from done), give it up at once when a stop was asked for."""
        if not self.in_transaction and self.should_stop is not None and self.should_stop():
            raise PlanAbandoned

    def job_stats(self, job: str) -> JobStats:
        return self.stats.setdefault(job, JobStats())

    def params(self, **extra: Any) -> dict[str, Any]:
        """Binds every batch query takes, plus the job's own."""
        return {
            "users": self.users,
            "now": self.now,
            "taken": list(self.taken),
            "reassessed": list(self.importance),
            **extra,
        }

    def users_for(self, job: str, acted_on: set[str]) -> list[str]:
        """The users ``job`` plans (or refreshes) for: those the scan found work for, and
        ``acted_on`` (when planning: users whose importance an earlier job re-assessed; when
        refreshing: users any applied action touched); every user when the job was not
        scanned."""
        if job not in self.work:
            return self.users
        return [u for u in self.users if u in self.work[job] or u in acted_on]

    @contextmanager
    def only(self, users: list[str]) -> Iterator[None]:
        """Narrow the batch to ``users`` (for one job)."""
        everyone, self.users = self.users, users
        try:
            yield
        finally:
            self.users = everyone

    def picked_ids(self, job: str) -> list[str] | None:
        """The rows ``job`` should read by id — those the scan picked, and any re-assessed
        earlier in this batch — or None: read every row of the batch's users (no scan).

        Planning writes no row, so between the scan and this read the only change a candidates
        query can see is what the batch holds in memory: re-assessed importance (added here)
        and rows already taken (excluded by the query)."""
        if job not in self.picked:
            return None
        return sorted(self.picked[job] | {str(i) for i in self.importance})

    def candidates_query(
        self, job: str, name: str, params: dict[str, Any]
    ) -> tuple[TextClause, dict[str, Any]]:
        """The job's candidates query ``name``, or its ``<name>_picked`` variant (rows read by
        id) when the scan picked the job's rows, with the binds it needs."""
        picked = self.picked_ids(job)
        if picked is None:
            return q(name), params
        return q(f"{name}_picked"), params | {"picked": picked}

    def effective_importance(self, row: Any) -> int:
        return self.importance.get(row.id, row.importance)

    def record(self, actions: Iterable[Action]) -> list[Action]:
        """Fold a job's actions into what later jobs of this batch see."""
        actions = list(actions)
        for action in actions:
            if action.retires and action.memory_id is not None:
                self.taken.add(action.memory_id)
            if action.action is Kind.SET_IMPORTANCE and action.memory_id is not None:
                # a score the model lowered decides nothing in the run that assigned it (the
                # next run sees it): one answer cannot retire rows within the hour it was given
                new, before = action.details["importance"], action.details.get("previous")
                self.importance[action.memory_id] = max(int(new), int(before or new))
                # … but a record made of it in this batch holds the score the row will hold:
                # marked assessed, it is never asked about again
                self.scored[action.memory_id] = int(new)
            if action.action is Kind.CREATE_MERGED:
                self.created[action.user_id] += 1
            if action.action is Kind.REVIEW or (
                action.action is Kind.DEFERRED
                and action.job == "contradiction"
                and action.details.get("facts_differ", True)
            ):
                # a conflict a person or the model has yet to judge: merging one side first
                # would decide it (a merged record takes its earliest member's start, so a
                # fact restated after a conflicting one would then count as the older). A
                # deferred pair no verdict could obsolete (no differing fact: a paraphrase)
                # holds nothing: offline, its exact duplicates still merge
                self.held.update(UUID(str(m)) for m in action.details.get("memory_ids", ()))
        return actions
