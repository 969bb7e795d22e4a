"""Tests for gc_worker.render: JSON, Markdown and HTML forms of a run report."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from gc_worker import render, render_banner
from gc_worker.render_html import render_html
from gc_worker.run_record import CANCELLED

RUN_ID = "run-2024-06-01-dry"
MERGED_ID = "7e1f3c2a-1111-4222-8333-444455556666"
HOSTILE = "<script>alert('pwned')</script> | line one\nline two"


def _action(job: str, action: str, n: int, user: str, reason: str, **details: Any) -> dict:
    memory_id = f"{n:08x}-aaaa-4bbb-8ccc-dddddddddddd"
    return {
        "job": job,
        "action": action,
        "memory_id": memory_id,
        "user_id": user,
        "reason": reason,
        "details": details,
    }


@pytest.fixture
def report() -> dict[str, Any]:
    """A dry-run report over two jobs, four users, a merge, a deferral and hostile content."""
    actions = [
        _action("ttl_expiry", "soft_delete", 1, "alice", "ttl_expired", content=HOSTILE),
        _action("ttl_expiry", "soft_delete", 2, "bob", "ttl_expired", content="x" * 300),
        _action("ttl_expiry", "soft_delete", 3, "alice", "ttl_expired", content=None),
        _action(
            "compaction", "merge", 4, "carol", "near_duplicate", content="likes tea", into=MERGED_ID
        ),
        _action("compaction", "merge", 5, "carol", "near_duplicate", into=MERGED_ID),
        _action(
            "compaction",
            "create_merged",
            6,
            "carol",
            "near_duplicate",
            content="likes tea and coffee",
        ),
        _action(
            "compaction",
            "deferred",
            7,
            "dave",
            "llm_unavailable",
            memory_ids=[f"{i:08x}-aaaa-4bbb-8ccc-dddddddddddd" for i in (8, 9, 10)],
        ),
    ]
    return {
        "report_version": 1,
        "run_id": RUN_ID,
        "mode": "dry_run",
        "status": "completed",
        "now": "2024-06-01T03:00:00+00:00",
        "started_at": "2024-06-01T03:00:00+00:00",
        "finished_at": "2024-06-01T03:00:02.500000+00:00",
        "scope": {"users": None, "jobs": ["ttl_expiry", "compaction"]},
        "totals": {
            "actions": 7,
            "by_action": {
                "soft_delete": 3,
                "merge": 2,
                "create_merged": 1,
                "deferred": 1,
                "hard_delete": 0,
            },
        },
        "jobs": {
            "ttl_expiry": {
                "actions": 3,
                "by_action": {"soft_delete": 3},
                "skipped": 1,
                "errors": 0,
                "llm_calls": 0,
            },
            "compaction": {
                "actions": 4,
                "by_action": {"merge": 2, "create_merged": 1, "deferred": 1},
                "skipped": 0,
                "errors": 2,
                "llm_calls": 5,
                "drifted": 3,
            },
        },
        "actions": actions,
        "llm": {"calls": 5, "input_tokens": 12345, "output_tokens": 678, "cache_hits": 2},
    }


@pytest.fixture
def empty_report(report: dict[str, Any]) -> dict[str, Any]:
    """The same run with nothing to do."""
    empty = copy.deepcopy(report)
    empty.update(actions=[], totals={"actions": 0, "by_action": {}})
    for job in empty["jobs"].values():
        job.update(actions=0, by_action={})
    return empty


def _applied(report: dict[str, Any]) -> dict[str, Any]:
    applied = copy.deepcopy(report)
    applied.update(mode="apply", run_id="run-apply", plan_run_id=RUN_ID, status="completed")
    return applied


def _md_row(md: str, first_cell: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")]


class TestFormatForPath:
    @pytest.mark.parametrize(
        ("path", "fmt"),
        [
            ("r.json", "json"),
            ("out/r.md", "md"),
            ("r.markdown", "md"),
            ("R.HTML", "html"),
            ("r.htm", "html"),
        ],
    )
    def test_known_suffixes(self, path: str, fmt: str) -> None:
        """Each supported suffix, in any case, maps to its format."""
        assert render.format_for_path(path) == fmt

    @pytest.mark.parametrize("path", ["report.txt", "report", "report.json.gz"])
    def test_unknown_suffix_is_rejected(self, path: str) -> None:
        """An unsupported suffix raises ValueError listing the valid suffixes."""
        with pytest.raises(ValueError, match=r"must end in \.json, \.md or \.html"):
            render.format_for_path(path)


class TestRender:
    @pytest.mark.parametrize("fmt", ["json", "md", "html"])
    def test_dispatches_to_the_format(self, report: dict[str, Any], fmt: str) -> None:
        """render() gives the same text as the format's own renderer."""
        own = {
            "json": render.render_json,
            "md": render.render_markdown,
            "html": render_html,
        }[fmt]
        assert render.render(report, fmt) == own(report)

    def test_unknown_format_names_the_valid_ones(self, report: dict[str, Any]) -> None:
        """An unknown format raises ValueError naming json, md and html."""
        with pytest.raises(ValueError, match="json, md, html"):
            render.render(report, "pdf")


class TestRenderJson:
    def test_round_trips(self, report: dict[str, Any]) -> None:
        """The JSON parses back to the same report."""
        assert json.loads(render.render_json(report)) == report

    def test_keeps_key_order_indent_and_unicode(self, report: dict[str, Any]) -> None:
        """Keys stay in report order, indented by two, non-ASCII kept as is."""
        report["actions"][0]["details"]["content"] = "café ☕"
        text = render.render_json(report)
        assert text.startswith('{\n  "report_version": 1,\n  "run_id"')
        assert "café ☕" in text


class TestBanner:
    """The banner suggests only a command that works for the run's mode and status (the
    operator walkthrough found an apply suggested for applied and rejected plans, and a
    restore of a restore run)."""

    @pytest.mark.parametrize(
        ("changes", "kind", "says", "suggests"),
        [
            ({}, "dry", "nothing was changed", f"memory-gc apply {RUN_ID}"),
            ({"applied_by": "run-9"}, "dry", "applied by run run-9", None),
            ({"status": "rejected"}, "dry", "rejected", None),
            ({"status": "stopped"}, "dry", "stopped, not complete", None),
            ({"mode": "apply", "run_id": "r1"}, "applied", "Applied.", "restore --run r1"),
            ({"mode": "apply", "run_id": "r1", "status": "stopped", "plan_run_id": "p1"},
             "incomplete", "Not complete — stopped.", "memory-gc apply p1"),
            ({"mode": "apply", "run_id": "r1", "status": "failed"}, "incomplete", "failed",
             "restore --run r1"),
            # `restore` refuses a run left running: it is cancelled first
            ({"mode": "apply", "run_id": "r1", "status": "stopped"}, "incomplete", "stopped",
             "cancel r1"),
            # `apply` refuses a cancelled plan, even with nothing pending
            ({"status": "failed", "pending_batches": 0, "error": CANCELLED,
              "failed_batches": [{"batch_no": 0, "users": ["u"]}]}, "dry", "cancelled", None),
            ({"mode": "apply", "run_id": "r1", "status": "failed",
              "failed_batches": [{"batch_no": 3, "users": ["u7", "u8"], "error": "E: x"}],
              "error": "1 batch(es) failed, the others were applied: batch 3 (2 users): E: x"},
             "incomplete", "2 users left as they were", "restore --run r1"),
            ({"mode": "apply", "run_id": "r1", "status": "failed", "plan_run_id": "p1",
              "pending_batches": 0, "failed_batches": [{"batch_no": 0, "users": ["u"]}]},
             "incomplete", "1 users left as they were", "restore --run r1"),
            ({"status": "failed", "pending_batches": 0,
              "failed_batches": [{"batch_no": 0, "users": ["u"]}]},
             "dry", "1 batch(es) failed", f"memory-gc apply {RUN_ID}"),
            ({"status": "failed", "pending_batches": 2}, "dry", "not complete", None),
            ({"mode": "restore"}, "applied", "Restore run.", None),
            ({"mode": "apply", "kind": "restore"}, "applied", "Restore run.", None),
            ({"mode": "apply", "trigger": "erasure"}, "applied", "never undone", None),
            ({"mode": "apply", "trigger": "erasure", "status": "failed"}, "incomplete",
             "request stays pending", None),
            ({"mode": "apply", "status": "running", "plan_run_id": "p1"}, "incomplete",
             "A process is working", None),
            # the demo's plan is in the demo's own database: `apply` there found no such run
            ({"trigger": "demo"}, "dry", "nothing was changed", "memory-gc demo --apply"),
            # …and `restore --run` would not find its apply run either
            ({"mode": "apply", "trigger": "demo"}, "applied", "demo's own database",
             "memory-gc demo"),
            # a plan the daemon holds for a person (schedule.hold_above_share)
            ({"held": f"retires 9 of 10 (90%): then `memory-gc apply {RUN_ID}` or `reject`"},
             "dry", "held for a person", f"memory-gc apply {RUN_ID}"),
            # …unless too old by now: `apply` would refuse it
            ({"held": "retires 9 of 10", "plan_age": {"hours": 80, "limit_hours": 72}}, "dry",
             "older than run.max_plan_age_hours", "memory-gc run --dry-run"),
            # `apply` refuses a plan for more than a day ahead (cli.not_ahead)
            ({"now": "2062-06-01T03:00:00+00:00"}, "dry", "more than a day ahead",
             "memory-gc run --dry-run"),
        ],
    )  # fmt: skip
    def test_banner(self, report, changes, kind, says, suggests) -> None:
        report.update(changes)
        got_kind, headline, rest = render_banner.banner(report)
        assert got_kind == kind and says in headline + " " + rest
        commands = re.findall(r"`([^`]*)`", rest)
        assert commands == [] if suggests is None else any(suggests in c for c in commands)
        md, html = render.render_markdown(report), render.render(report, "html")
        assert (f"memory-gc apply {RUN_ID}" in md) == (suggests == f"memory-gc apply {RUN_ID}")
        assert f'class="banner {kind}"' in html


class TestRenderMarkdown:
    def test_dry_run_says_nothing_changed_and_how_to_apply(self, report: dict[str, Any]) -> None:
        """A dry run opens with a nothing-changed banner and the apply command."""
        md = render.render_markdown(report)
        banner = md.index("nothing was changed")
        assert banner < md.index("## Totals")
        assert f"memory-gc apply {RUN_ID}" in md

    def test_applied_run_has_no_apply_command(self, report: dict[str, Any]) -> None:
        """An applied run shows its plan run and status, and no apply command."""
        md = render.render_markdown(_applied(report))
        assert "memory-gc apply" not in md
        assert "nothing was changed" not in md
        assert f"**Plan run:** {RUN_ID}" in md and "**Status:** completed" in md

    def test_header_totals_and_jobs(self, report: dict[str, Any]) -> None:
        """Header, totals per action and each job's numbers appear; an unreported drift shows —."""
        md = render.render_markdown(report)
        assert "**Duration:** 2.5 s" in md and "**Users:** all" in md
        assert "**7 actions**" in md and _md_row(md, "soft_delete") == ["soft_delete", "3"]
        assert "hard_delete" not in md
        assert _md_row(md, "ttl_expiry") == ["ttl_expiry", "3", "soft_delete 3", "1", "0", "0", "—"]
        assert _md_row(md, "compaction") == [
            "compaction",
            "4",
            "merge 2, create_merged 1, deferred 1",
            "0",
            "2",
            "5",
            "3",
        ]
        assert "| drifted |" in md and "refreshed" not in md

    def test_per_user_reasons_and_llm(self, report: dict[str, Any]) -> None:
        """Users are ranked by action count; reasons and LLM usage are counted."""
        md = render.render_markdown(report)
        users = md[md.index("## Per user") : md.index("## Reasons")]
        assert users.index("| carol | 3 |") < users.index("| alice | 2 |") < users.index("| bob |")
        assert "| ttl_expiry | soft_delete | ttl_expired | 3 |" in md
        assert "| input tokens | 12,345 |" in md

    def test_samples_show_short_ids_into_and_previews(self, report: dict[str, Any]) -> None:
        """Samples use short memory ids, show merge targets and cut content at 120 chars."""
        md = render.render_markdown(report)
        assert "### compaction — merge (2 of 2)" in md
        assert "| 00000004 | carol | near_duplicate | likes tea | into=7e1f3c2a |" in md
        assert "x" * 119 + "…" in md and "x" * 120 not in md

    def test_escapes_pipes_newlines_and_tags(self, report: dict[str, Any]) -> None:
        """Hostile content cannot break a table row or inject HTML."""
        md = render.render_markdown(report)
        row = next(ln for ln in md.splitlines() if "00000001" in ln)
        assert "\\| line one line two" in row
        assert "<script>" not in md and "&lt;script&gt;" in row

    def test_deferred_groups(self, report: dict[str, Any]) -> None:
        """Deferred groups list their candidate memories and stay out of the samples."""
        md = render.render_markdown(report)
        assert "| compaction | dave | llm_unavailable | 3: 00000008, 00000009, 0000000a |" in md
        assert "— deferred (" not in md

    def test_long_lists_are_cut_with_a_count(self, report: dict[str, Any]) -> None:
        """Past 50 users and 10 samples per kind, the rest is summarised."""
        report["actions"] += [
            _action("usage_prune", "soft_delete", 100 + i, f"user{i:03}", "unused")
            for i in range(60)
        ]
        md = render.render_markdown(report)
        assert "… and 14 more users" in md
        assert "### usage_prune — soft_delete (10 of 60)" in md
        assert (
            "| user010 |" in md.split("## Reasons")[0]
            and "user049" not in md.split("## Reasons")[0]
        )

    def test_per_user_key_wins_over_actions(self, report: dict[str, Any]) -> None:
        """A per_user map from the engine is rendered instead of counting actions."""
        report["per_user"] = {"zed": {"actions": 99, "by_action": {"obsolete": 99}}}
        md = render.render_markdown(report)
        assert "| zed | 99 | obsolete 99 |" in md and "| carol | 3 |" not in md

    def test_an_apply_that_changed_nothing_does_not_blame_purges(self, empty_report) -> None:
        """An apply with no action (nothing to do, or every row drifted) was said to have done
        only what cannot be undone: "Nothing it did can be undone (purges and erasures are
        not)"."""
        applied = _applied(empty_report)
        applied.update(restorable=0, restored=0)
        for drifted in ([], [_action("ttl_expiry", "soft_delete", 1, "u", "ttl_expired")]):
            applied["drifted"] = drifted
            _, _, rest = render_banner.banner(applied)
            assert "purges" not in rest and "changed nothing" in rest, rest

    def test_empty_run_says_nothing_to_do(self, empty_report: dict[str, Any]) -> None:
        """A run with zero actions says so and skips the empty sections."""
        md = render.render_markdown(empty_report)
        assert "Nothing to do" in md
        assert "## Per user" not in md and "## Samples" not in md
        assert "## LLM usage" in md


class TestRenderHtml:
    def test_is_one_self_contained_page(self, report: dict[str, Any]) -> None:
        """The page has inline CSS and no scripts, links or external assets."""
        page = render_html(report)
        assert page.startswith("<!DOCTYPE html>") and "<style>" in page
        assert not re.search(r"<script|<link|src=|@import|url\(|https?://", page)

    def test_escapes_hostile_strings(self, report: dict[str, Any]) -> None:
        """Script tags in content, user ids and reasons come out escaped."""
        report["actions"][1].update(user_id='<img onerror="x">', reason="<b>why</b>")
        page = render_html(report)
        assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
        assert "&lt;img onerror=&quot;x&quot;&gt;" in page and "&lt;b&gt;why&lt;/b&gt;" in page
        assert "<script" not in page and "<img" not in page and "<b>" not in page

    def test_dry_run_banner_and_apply_command(self, report: dict[str, Any]) -> None:
        """A dry run says nothing changed, and shows the apply command, before the totals."""
        page = render_html(report)
        assert page.index("nothing was changed") < page.index("<h2>Totals</h2>")
        assert f"<code>memory-gc apply {RUN_ID}</code>" in page

    def test_banner_keeps_the_spaces_around_commands(self, report: dict[str, Any]) -> None:
        """The banner's text beside a command keeps its edge spaces: each piece went through
        `printable`, which strips them, and the page read "…run<code>memory-gc apply …"."""
        assert f"run <code>memory-gc apply {RUN_ID}</code></p>" in render_html(report)
        report.update(mode="apply", run_id="r1", status="failed", plan_run_id="p1")
        page = render_html(report)
        assert "stays; <code>memory-gc restore --run r1</code> undoes it; <code>" in page
        assert "</code> finishes it.</p>" in page

    def test_applied_run_has_no_apply_command(self, report: dict[str, Any]) -> None:
        """An applied run shows no apply command."""
        page = render_html(_applied(report))
        assert "memory-gc apply" not in page and "memory-gc restore --run run-apply" in page

    def test_cards_jobs_and_bars(self, report: dict[str, Any]) -> None:
        """Totals become cards; each job row has its numbers and a proportional bar."""
        page = render_html(report)
        assert '<span class="n">7</span><span class="l">actions in all</span>' in page
        assert '<span class="n">3</span><span class="l">soft_delete</span>' in page
        assert (
            '<td>compaction</td><td class="num">4</td><td>merge 2, create_merged 1, deferred 1</td>'
        ) in page
        assert 'style="width:75.0%"' in page and 'style="width:100.0%"' in page

    def test_samples_in_details_per_job(self, report: dict[str, Any]) -> None:
        """Each job's samples sit in a details block, with merge targets shown."""
        page = render_html(report)
        assert page.count("<details>") == 2
        assert "<summary>compaction <small>3 actions</small></summary>" in page
        assert "into=7e1f3c2a" in page

    def test_empty_run_says_nothing_to_do(self, empty_report: dict[str, Any]) -> None:
        """A run with zero actions renders with a Nothing to do message and no samples."""
        page = render_html(empty_report)
        assert "Nothing to do" in page and "<details>" not in page
        assert 'style="width:0.0%"' in page

    def test_says_the_same_as_markdown(self, report: dict[str, Any]) -> None:
        """Markdown and HTML carry the same section titles."""
        md = render.render_markdown(report)
        page = render_html(report)
        for title in re.findall(r"^## (.+)$", md, flags=re.M):
            assert f"<h2>{title}</h2>" in page
