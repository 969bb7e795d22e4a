"""A run's model spend, shared by every process working it (``gc_run_llm_spend``, migration
0013): calls are taken from it one statement at a time, so callers asking at once get at most
the limit between them; a refusal names the limit that was reached."""

from __future__ import annotations

import threading

import pytest

from gc_worker.config import Settings
from gc_worker.engine import RunRequest, resolve_jobs, start_run
from gc_worker.llm.budget import LLMBudget
from gc_worker.llm.errors import LLMBudgetExhausted
from gc_worker.llm_store import RunSpend
from tests.store import NOW


@pytest.fixture
def run_id(engine, settings: Settings):
    request = RunRequest(mode="dry_run", now=NOW, users=None, jobs=resolve_jobs([], settings))
    return start_run(engine, settings, request)


def test_callers_asking_at_once_get_the_limit_between_them(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=5, max_tokens=None)
    assert spend.open(0, 0) == (0, 0)
    start = threading.Barrier(8)
    answers: list[tuple[str, int, int] | None] = []

    def ask() -> None:
        start.wait()
        answers.append(spend.take_call())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert answers.count(None) == 5
    assert sorted(a for a in answers if a is not None) == [("calls", 5, 5)] * 3
    assert spend.open(0, 0) == (5, 0)


def test_the_token_limit_refuses_once_reached_and_names_itself(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=None, max_tokens=100)
    spend.open(0, 0)
    assert spend.take_call() is None
    spend.add_tokens(60)
    assert spend.take_call() is None  # 60 < 100: a call in flight may then pass the limit
    spend.add_tokens(60)
    assert spend.take_call() == ("tokens", 120, 100)
    assert spend.open(0, 0) == (2, 120)


def test_joining_keeps_the_larger_of_the_ledger_and_the_batches_records(engine, run_id):
    """A run begun before the ledger existed starts it from what its batches recorded; a
    process joining later sees calls of batches still being worked elsewhere."""
    spend = RunSpend(engine, run_id, max_calls=10, max_tokens=1000)
    assert spend.open(3, 200) == (3, 200)
    assert spend.take_call() is None
    assert spend.open(2, 100) == (4, 200)


def test_a_budget_refused_by_the_run_counts_the_deferral_and_no_call(engine, run_id):
    spend = RunSpend(engine, run_id, max_calls=1, max_tokens=None)
    spend.open(0, 0)
    first, second = LLMBudget(max_calls=1), LLMBudget(max_calls=1)  # two replicas, each at 0
    first.shared = second.shared = spend
    first.reserve_call()
    with pytest.raises(LLMBudgetExhausted) as refused:
        second.reserve_call()
    assert (refused.value.limit, refused.value.used, refused.value.maximum) == ("calls", 1, 1)
    assert (second.calls, second.deferred_by_budget) == (0, 1)


def test_once_the_run_refused_a_call_it_is_not_asked_again():
    """Its counts only grow: after one refusal every later question is refused without a
    transaction (there can be one per group or pair left in the run)."""

    class Spent:
        asked = 0

        def take_call(self):
            self.asked += 1
            return ("calls", 3, 3)

        def add_tokens(self, tokens: int) -> None:
            pass

    spent = Spent()
    budget = LLMBudget(max_calls=10, shared=spent)
    for _ in range(5):
        with pytest.raises(LLMBudgetExhausted):
            budget.reserve_call()
    assert spent.asked == 1 and budget.deferred_by_budget == 5
