"""Properties over generated stores and policies (hypothesis), through the real engine and
database, with every registered and enabled job, offline or with a well-behaved fake model.

Invariants: pinned rows are never touched (byte for byte, row version included); nothing is
purged unless it was retired at least its retention window before the run; no action and no
link spans two users; application-owned columns are never written; every change is audited;
a dry run writes no memory and its apply executes exactly its plan, and a read of planned rows
in between drifts exactly the actions that decide on use (with their groups); a second run
right after changes nothing beyond what the first made new (records it created; rows it retired
under a zero retention window; users whose rows a job after contradiction retired) and a
fixpoint comes within four runs; restoring the runs, newest first, brings every row back.

``RELIABILITY_EXAMPLES`` (default 60) sets the examples per property, ``RELIABILITY_NO_SHRINK``
skips shrinking (long soak runs).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

from gc_worker import engine as gc_engine
from gc_worker.actions import CONTENT_VERSIONED, ERASURE_REASONS, Kind
from gc_worker.config import Settings
from gc_worker.restore import restore_run
from tests.fake_model import FakeModel, fake_port
from tests.seeding import Reusable, end_state, full_snapshot, reusable_database
from tests.store import NOW, run
from tests.strategies import APP_COLUMNS, scenarios

EXAMPLES = int(os.environ.get("RELIABILITY_EXAMPLES", "60"))
PHASES = (
    (Phase.explicit, Phase.generate) if os.environ.get("RELIABILITY_NO_SHRINK") else tuple(Phase)
)
PROPERTY = settings(
    max_examples=EXAMPLES,
    phases=PHASES,
    deadline=None,
    derandomize=True,  # the same cases on every machine: CI is deterministic
    database=None,
    print_blob=False,
    # the database is module-scoped and emptied per example, so per-test fixtures are harmless
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
STATUS_FIELDS = (
    "status",
    "status_reason",
    "status_changed_at",
    "superseded_by",
    "deleted_at",
    "valid_until",
    "importance",
    "importance_assessed_at",
)
Rows = dict[UUID, dict[str, Any]]


@pytest.fixture(scope="module")
def store(pg_server, template_db) -> Iterator[Reusable]:
    with reusable_database(pg_server, template_db, "properties") as database:
        yield database


def run_with(engine: sa.Engine, policy: Settings, use_llm: bool, **kw: Any) -> dict[str, Any]:
    if not use_llm:
        return run(engine, policy, **kw)
    with fake_port(engine, policy, FakeModel("good")) as llm:
        return run(engine, policy, llm=llm, **kw)


# --- the invariants --------------------------------------------------------------------------


def since(row: dict[str, Any], *columns: str) -> Any:
    return next((row[c] for c in columns if row[c] is not None), None)


def purge_allowed(row: dict[str, Any], policy: Settings) -> bool:
    """Whether ``row`` (as it was before the run) was retired at least its window before NOW."""
    if row["status"] == "deleted":
        at = since(row, "deleted_at", "status_changed_at")
        if at is None:
            return False
        erased = row["status_reason"] in ERASURE_REASONS  # overrides the pin; either window
        if erased and NOW - at >= timedelta(days=policy.erasure.retention_days):
            return True
        window = timedelta(days=policy.hard_delete.retention_days)
        return (erased or not row["pinned"]) and NOW - at >= window
    if row["status"] in ("obsolete", "merged"):
        at = since(row, "status_changed_at", "updated_at")
        window = timedelta(days=policy.hard_delete.history_retention_days)
        return not row["pinned"] and NOW - at >= window
    return False


def applied(report: dict[str, Any], *kinds: str) -> set[UUID]:
    return {
        UUID(a["memory_id"])
        for a in report["actions"]
        if a["memory_id"] and (not kinds or a["action"] in kinds)
    }


def check_pinned_untouched(before: Rows, after: Rows) -> None:
    for memory_id, row in before.items():
        if not row["pinned"]:
            continue
        erased = row["status"] == "deleted" and row["status_reason"] in ERASURE_REASONS
        if erased and memory_id not in after:
            continue  # erased rows are purged, pinned or not
        assert after.get(memory_id) == row, f"pinned row {memory_id} changed"


def check_purges(before: Rows, after: Rows, report: dict[str, Any], policy: Settings) -> None:
    for memory_id in set(before) - set(after):
        row = before[memory_id]
        assert purge_allowed(row, policy), f"{memory_id} purged too early: {row}"
    assert set(before) - set(after) == applied(report, "hard_delete") & set(before)
    assert set(after) - set(before) == applied(report, "create_merged") - applied(
        report, "hard_delete"
    )


def linked_ids(action: dict[str, Any]) -> list[str]:
    details = action["details"]
    ids = [action["memory_id"], details.get("superseded_by"), details.get("into")]
    return [
        str(i) for i in [*ids, *details.get("memory_ids", []), *details.get("sources", [])] if i
    ]


def check_one_user(before: Rows, after: Rows, report: dict[str, Any], engine: sa.Engine) -> None:
    owner = {str(k): r["user_id"] for k, r in (before | after).items()}
    for action in report["actions"] + report["drifted"]:
        for memory_id in linked_ids(action):
            assert owner.get(memory_id, action["user_id"]) == action["user_id"], action
    for memory_id, row in after.items():
        link = row["superseded_by"]
        if link != before.get(memory_id, {}).get("superseded_by") and str(link) in owner:
            assert owner[str(link)] == row["user_id"], f"{memory_id} superseded across users"
    with engine.connect() as conn:
        crossing = conn.execute(
            sa.text(
                "SELECT count(*) FROM memory_lineage l JOIN memories d ON d.id = l.derived_id"
                " JOIN memories s ON s.id = l.source_id WHERE d.user_id <> s.user_id"
            )
        ).scalar()
    assert crossing == 0


def check_changes_audited(before: Rows, after: Rows, report: dict[str, Any]) -> None:
    """Only worker-owned columns change, only on audited rows, in the audited way."""
    retired = applied(report, "soft_delete", "obsolete", "merge")
    for memory_id, row in before.items():
        new = after.get(memory_id)
        if new is None:
            continue
        assert {c: new[c] for c in APP_COLUMNS} == {c: row[c] for c in APP_COLUMNS}, memory_id
        if new["status"] != row["status"]:
            assert memory_id in retired and row["status"] == "active", memory_id
            assert new["status_changed_at"] == NOW
        elif memory_id not in retired:
            assert all(new[c] == row[c] for c in STATUS_FIELDS[:6]), memory_id
        if new["importance"] != row["importance"]:
            assert memory_id in applied(report, "set_importance")
    targets = {"soft_delete": "deleted", "obsolete": "obsolete", "merge": "merged"}
    for action in report["actions"]:
        if action["action"] in targets:
            row = after[UUID(action["memory_id"])]
            assert (row["status"], row["status_reason"]) == (
                targets[action["action"]],
                action["reason"],
            )


def check_run(before: Rows, engine: sa.Engine, report: dict[str, Any], policy: Settings) -> Rows:
    assert report["status"] == "completed"
    for kind in report["totals"]["by_action"]:
        event(f"run does {kind}")  # coverage figures: --hypothesis-show-statistics
    after = full_snapshot(engine)
    check_pinned_untouched(before, after)
    check_purges(before, after, report, policy)
    check_one_user(before, after, report, engine)
    check_changes_audited(before, after, report)
    return after


def action_keys(report: dict[str, Any]) -> Counter:
    return Counter((a["job"], a["action"], a["memory_id"], a["reason"]) for a in report["actions"])


def changes(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in report["actions"] if a["action"] != "deferred"]


# --- the properties ----------------------------------------------------------------------------


class TestOneRun:
    @PROPERTY
    @given(case=scenarios(), use_llm=st.booleans())
    def test_a_run_keeps_every_invariant(self, store, case, use_llm):
        """Pinned rows, retention windows, user boundaries and app columns hold after any run."""
        policy, engine = case.policy, store.fresh(case.rows)
        note(case.table())
        before = full_snapshot(engine)
        report = run_with(engine, policy, use_llm)
        check_run(before, engine, report, policy)


class TestRerunAndRestore:
    @PROPERTY
    @given(case=scenarios(), use_llm=st.booleans())
    def test_second_run_changes_nothing_and_restore_undoes_the_first(self, store, case, use_llm):
        """Right after a run the next changes nothing, except what the first run itself made
        new (see ``explained``) and then only until a fixpoint a few runs later; restoring
        every run, newest first, brings every surviving row back."""
        policy = unbounded(case.policy)
        engine = store.fresh(case.rows)
        note(case.table())
        before = full_snapshot(engine)
        runs = [run_with(engine, policy, use_llm)]
        after_first = check_run(before, engine, runs[0], policy)
        while True:
            previous = full_snapshot(engine)
            runs.append(run_with(engine, policy, use_llm))
            check_run(previous, engine, runs[-1], policy)
            assert all(job.get("refreshed", 0) == 0 for job in runs[-1]["jobs"].values())
            assert explained(runs[:-1], runs[-1], policy)[1] == []
            if not changes(runs[-1]):
                break
            assert len(runs) < FIXPOINT_RUNS, "no fixpoint"
        if len(runs) == 2:
            assert full_snapshot(engine) == after_first
        else:
            event(f"quiet from run {len(runs)} on")
        not_restorable = set()
        for report in reversed(runs):
            not_restorable |= set(
                restore_run(engine, UUID(report["run_id"]), now=NOW).not_restorable
            )
        # what a later run purged, and the records made from it (a merge whose members were
        # purged stays: it alone holds what they said)
        purged = set().union(*(applied(r, "hard_delete") for r in runs[1:]))
        made_from_purged = {
            UUID(a["memory_id"])
            for r in runs
            for a in r["actions"]
            if a["action"] == "create_merged"
            and purged & {UUID(str(s)) for s in (a.get("details") or {}).get("sources") or ()}
        }
        assert not_restorable <= purged | made_from_purged
        check_restored(before, full_snapshot(engine), runs, made_from_purged)


FIXPOINT_RUNS = 4
# jobs that run after contradiction: what they retire, contradiction only sees next run
AFTER_CONTRADICTION = ("compaction", "usage_prune", "user_cap")


def unbounded(policy: Settings) -> Settings:
    """``policy`` without the per-run work bounds (LLM budget, pairs per memory), which leave
    work for the next run on purpose."""
    return Settings.model_validate(
        policy.model_dump()
        | {"llm": {**policy.llm.model_dump(), "max_calls_per_run": 500}}
        | {"contradiction": {**policy.contradiction.model_dump(), "max_pairs_per_memory": 100}}
    )


def explained(earlier: list[dict], report: dict, policy: Settings) -> tuple[list, list]:
    """``report``'s changes split into those the earlier runs explain and the rest: purges of
    rows they retired under a zero window, judgements of records they created,
    contradiction re-judging users whose rows a later job retired after it had judged them, and
    retirements of rows whose importance the model lowered (a lowered score decides from the
    next run on: gc_worker.batch.BatchContext.record)."""
    last = earlier[-1]
    purgeable = zero_window_retired(earlier, policy)
    lowered = {
        a["memory_id"]
        for r in earlier
        for a in r["actions"]
        if a["action"] == "set_importance"
        and a["details"].get("importance", 0) < a["details"].get("previous", 0)
    }
    created = {str(i) for r in earlier for i in applied(r, "create_merged")}
    moved = {
        a["user_id"]
        for a in last["actions"]
        if a["job"] in AFTER_CONTRADICTION and a["action"] in ("soft_delete", "merge")
    }
    ok, unexpected = [], []
    for action in changes(report):
        if (
            (action["action"] == "hard_delete" and UUID(action["memory_id"]) in purgeable)
            or created & set(linked_ids(action))
            or (action["job"] == "contradiction" and action["user_id"] in moved)
            or (action["action"] == "soft_delete" and action["memory_id"] in lowered)
        ):
            ok.append(action)
        else:
            unexpected.append(action)
    return ok, unexpected


def zero_window_retired(runs: list[dict], policy: Settings) -> set[UUID]:
    """Rows ``runs`` retired whose retention window is zero (the next run may purge them)."""
    windows = {
        "soft_delete": policy.hard_delete.retention_days,
        "obsolete": policy.hard_delete.history_retention_days,
        "merge": policy.hard_delete.history_retention_days,
    }
    return {
        UUID(a["memory_id"])
        for report in runs
        for a in report["actions"]
        if a["action"] in windows and timedelta(days=windows[a["action"]]) == timedelta(0)
    }


def check_restored(
    before: Rows, after: Rows, runs: list[dict[str, Any]], kept: set[UUID] = frozenset()
) -> None:
    """Every surviving row is back as it was, and every created record is off the read path —
    but ``kept``: records made from rows a later run purged, which rightly stay."""
    for memory_id, row in before.items():
        if memory_id in after:
            restored = {c: after[memory_id][c] for c in STATUS_FIELDS}
            assert restored == {c: row[c] for c in STATUS_FIELDS}, memory_id
    for report in runs:
        for memory_id in applied(report, "create_merged"):
            if memory_id in after and memory_id not in kept:
                created = after[memory_id]
                assert (created["status"], created["status_reason"]) == ("deleted", "restored")


class TestPlanThenApply:
    @PROPERTY
    @given(case=scenarios(), use_llm=st.booleans())
    def test_apply_executes_exactly_the_dry_run_plan(self, store, case, use_llm):
        """A dry run writes no memory; applying it does exactly what it planned, nothing else."""
        policy, engine = case.policy, store.fresh(case.rows)
        note(case.table())
        before = full_snapshot(engine)
        plan = run_with(engine, policy, use_llm, dry_run=True)
        assert plan["status"] == "completed" and full_snapshot(engine) == before
        with engine.connect() as conn:
            from gc_worker.report import build_report

            apply_id = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
            report = build_report(conn, apply_id)
        assert action_keys(report) == action_keys(plan) and report["drifted"] == []
        check_run(before, engine, report, policy)

    @PROPERTY
    @given(case=scenarios(), use_llm=st.booleans(), data=st.data())
    def test_a_read_drifts_only_what_decides_on_use(self, store, case, use_llm, data):
        """Between a dry run and its apply the application reads some of the rows the plan
        names (last_accessed_at, access_count): exactly the actions that compare ``xmin`` on
        those rows drift, with their groups; merges, contradictions, scores and erasures
        (content versions, premises included) apply as planned."""
        policy, engine = case.policy, store.fresh(case.rows)
        note(case.table())
        before = full_snapshot(engine)
        plan = run_with(engine, policy, use_llm, dry_run=True)
        named = {UUID(a["memory_id"]) for a in changes(plan) if a["memory_id"]}
        named |= {UUID(d) for a in changes(plan) for d in a["details"].get("depends_on", {})}
        named = sorted(named & set(before))  # rows acted on, and rows decisions rest on
        subsets = st.sets(st.sampled_from(named)) if named else st.just(set())
        read = data.draw(st.one_of(st.just(set(named)), subsets), label="read")  # all, or some
        if read:
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE memories SET last_accessed_at = :at,"
                        " access_count = access_count + 1 WHERE id = ANY(:ids)"
                    ),
                    {"ids": list(read), "at": NOW},
                )
        apply_id = gc_engine.apply_plan(engine, UUID(plan["run_id"]))
        with engine.connect() as conn:
            from gc_worker.report import build_report

            report = build_report(conn, apply_id)
        versioned = {"review", "deferred", "create_merged"}  # kinds that record no row version
        hit = [
            a
            for a in changes(plan)
            if a["action"] not in versioned
            and UUID(a["memory_id"]) in read
            and (a["job"], Kind(a["action"])) not in CONTENT_VERSIONED
        ]
        groups = {a["details"].get("group") for a in hit} - {None}
        expected = {_key(a) for a in hit} | {
            _key(a) for a in changes(plan) if a["details"].get("group") in groups
        }
        event(f"read {len(read)} rows, {len(expected)} actions expected to drift")
        for a in changes(plan):
            on_read = a["memory_id"] is not None and UUID(a["memory_id"]) in read
            if on_read and (a["job"], Kind(a["action"])) in CONTENT_VERSIONED:
                event(f"a read row's {a['job']} {a['action']} must apply")
            if any(UUID(d) in read for d in a["details"].get("depends_on", {})):
                event(f"a read premise's {a['job']} {a['action']} must apply")
        assert {_key(a) for a in report["drifted"]} == expected


def _key(action: dict[str, Any]) -> tuple[str, str, str | None]:
    return action["job"], action["action"], action["memory_id"]  # an apply keeps created ids


def one_worker(policy: Settings) -> Settings:
    dump = policy.model_dump()
    return Settings.model_validate(dump | {"run": dump["run"] | {"workers": 1}})


def without_scan(policy: Settings) -> Settings:
    dump = policy.model_dump()
    return Settings.model_validate(dump | {"run": dump["run"] | {"skip_idle_users": False}})


def outline(report: dict[str, Any]) -> Counter:
    """What a run did, comparable across two runs (a created record's id is new each run)."""
    return Counter(
        (a["job"], a["action"], None if a["action"] == "create_merged" else a["memory_id"],
         a["reason"])
        for a in report["actions"]
    ) + Counter((job, "refreshed", n) for job, s in report["jobs"].items()
                for n in [s.get("refreshed", 0)] if n)  # fmt: skip


class TestRunStartScan:
    @PROPERTY
    @given(case=scenarios(), use_llm=st.booleans())
    def test_the_scan_changes_nothing_but_what_is_read(self, store, case, use_llm):
        """A run that plans each job only for the users the run-start scan found work for
        (gc_worker.triage) does exactly what a run reading every user does: same actions,
        same score refreshes, same end state."""
        note(case.table())
        ids = {r["id"] for r in case.rows}
        # one worker each: with several, which batch spends a small model budget first is a race
        policy = one_worker(case.policy)
        engine = store.fresh(case.rows)
        scanned = run_with(engine, policy, use_llm)
        scanned_state = end_state(engine, ids)
        engine = store.fresh(case.rows)
        full = run_with(engine, without_scan(policy), use_llm)
        assert outline(scanned) == outline(full)
        assert scanned_state == end_state(engine, ids)
