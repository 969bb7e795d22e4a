"""The run's shared model budget (``gc_run_llm_spend``) while another session holds its row: an
application's long transaction, an operator's `SELECT … FOR UPDATE`, a stuck replica. The
statements that join, take from and add to it used to wait for the row without bound (the
worker hung, every thread of it behind the budget's lock); they wait at most
``SPEND_LOCK_TIMEOUT_MS``, then: a call not yet made is not made (its group is deferred, an
`LLMUnavailable` naming the row), tokens already paid for are kept and added with the next
statement that gets the row, and a process that cannot join the run says so (WriteConflict)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa

from gc_worker import llm_store
from gc_worker.config import Settings
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.errors import WriteConflict
from gc_worker.llm.budget import LLMBudget
from gc_worker.llm.errors import LLMUnavailable
from gc_worker.llm_store import RunSpend
from tests.fake_model import FakeModel
from tests.store import NOW, execute, run, status
from tests.test_llm_jobs_http import seed_tea

BOUND_MS = 300  # the tests' lock wait; the worker's default is longer
PATIENCE = 20  # seconds a test waits for a call that should give up after BOUND_MS


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_store, "SPEND_LOCK_TIMEOUT_MS", BOUND_MS, raising=False)


@pytest.fixture
def run_id(engine, settings: Settings) -> UUID:
    request = RunRequest(mode="dry_run", now=NOW, users=None, jobs=resolve_jobs([], settings))
    return start_run(engine, settings, request)


class Holder:
    """Another session holding the run's spend row, until released."""

    def __init__(self, engine: sa.Engine, run_id: UUID) -> None:
        self.conn = engine.connect()
        self.tx = self.conn.begin()
        held = self.conn.execute(
            sa.text("SELECT run_id FROM gc_run_llm_spend WHERE run_id = :r FOR UPDATE"),
            {"r": run_id},
        ).all()
        assert held, "no spend row to hold"

    def release(self) -> None:
        if self.conn is not None:
            self.tx.rollback()
            self.conn.close()
            self.conn = None


@contextlib.contextmanager
def held(engine: sa.Engine, run_id: UUID) -> Iterator[Holder]:
    holder = Holder(engine, run_id)
    try:
        yield holder
    finally:
        holder.release()


def bounded(work: Callable[[], Any], holder: Holder) -> Any:
    """``work()``'s result (or exception), asserting it came back while the row was held."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(PATIENCE)
    came_back = not thread.is_alive()
    holder.release()  # (an unbounded wait ends here, so the test ends)
    thread.join(PATIENCE)
    assert came_back, "waited for the held spend row without bound"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_a_call_is_not_taken_while_the_row_is_held(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=10, max_tokens=None)
    spend.open(0, 0)
    with held(engine, run_id) as holder, pytest.raises(LLMUnavailable) as failed:
        bounded(spend.take_call, holder)
    assert "gc_run_llm_spend" in str(failed.value) and str(run_id) in str(failed.value)
    assert not failed.value.refused  # the job stops asking for this batch
    assert spend.open(0, 0) == (0, 0), "a call was counted that was never made"


def test_a_held_row_defers_the_call_and_counts_it_as_no_call(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=10, max_tokens=None)
    spend.open(0, 0)
    budget = LLMBudget(max_calls=10, shared=spend)
    with held(engine, run_id) as holder, pytest.raises(LLMUnavailable):
        bounded(budget.reserve_call, holder)
    assert budget.calls == 0
    budget.reserve_call()  # released: the next call is taken as usual
    assert (budget.calls, spend.open(0, 0)) == (1, (1, 0))


def test_tokens_paid_for_while_the_row_is_held_are_kept_and_added_later(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=None, max_tokens=1000)
    spend.open(0, 0)
    budget = LLMBudget(max_tokens=1000, shared=spend)
    with held(engine, run_id) as holder:
        bounded(lambda: budget.record_usage(100, 20), holder)
    assert budget.tokens == 120  # this process counts them at once
    assert spend.open(0, 0) == (0, 0)  # the ledger is behind until it gets the row again
    budget.record_usage(5, 0)
    assert spend.open(0, 0) == (0, 125)


def test_tokens_owed_are_added_when_the_next_call_is_taken(engine, run_id):
    """The owed tokens count towards the limit the next call is checked against."""
    spend = RunSpend(engine, run_id, max_calls=None, max_tokens=100)
    spend.open(0, 0)
    with held(engine, run_id) as holder:
        bounded(lambda: spend.add_tokens(150), holder)
    assert spend.take_call() == ("tokens", 150, 100)
    assert spend.open(0, 0) == (0, 150)


def test_joining_a_run_whose_row_is_held_fails_clearly(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=10, max_tokens=None)
    spend.open(0, 0)
    with held(engine, run_id) as holder, pytest.raises(WriteConflict) as failed:
        bounded(lambda: RunSpend(engine, run_id, 10, None).open(0, 0), holder)
    message = str(failed.value)
    assert "gc_run_llm_spend" in message and str(run_id) in message and "retry" in message


class LockingModel(FakeModel):
    """A good model whose first answer comes while another session takes the run's spend
    row (held until the test releases it)."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__("good")
        self.engine, self.holder = engine, None

    def __call__(self, request: Any) -> Any:
        if self.holder is None:
            [run_id] = execute(self.engine, "SELECT run_id FROM gc_run_llm_spend").scalars()
            self.holder = Holder(self.engine, run_id)
        return super().__call__(request)


def test_a_run_with_its_spend_row_held_finishes_and_keeps_the_paid_answer(
    engine, settings, make_llm
):
    """The merge answer came back while the row was held: the run does not hang, the answer
    is applied (its tokens counted in the report), and the embedding call, which could not be
    taken, is not made (the record takes its sources' centroid, as when the model is down)."""
    a, b, _ = seed_tea(engine)
    model = LockingModel(engine)
    outcome: dict[str, Any] = {}

    def work() -> None:
        outcome["report"] = run(engine, settings, jobs=["compaction"], llm=make_llm(model))

    thread = threading.Thread(target=work)
    try:
        thread.start()
        thread.join(PATIENCE)
        finished = not thread.is_alive()
    finally:
        if model.holder is not None:
            model.holder.release()
    thread.join(PATIENCE)
    assert finished, "the run waited for the held spend row without bound"
    report = outcome["report"]
    assert (model.calls["MergeAnswer"], model.calls["embed"]) == (1, 0)
    [created] = [x for x in report["actions"] if x["action"] == "create_merged"]
    assert created["details"]["record"]["metadata"]["embedding_source"] == "centroid"
    assert status(engine, a) == status(engine, b) == "merged"
    assert report["llm"]["calls"] == 1 and report["llm"]["input_tokens"] == 100
