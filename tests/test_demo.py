"""`memory-gc demo` on the embedded server: seeds, dry-runs, writes the three reports."""

from __future__ import annotations

import json

from gc_worker.cli import main


class TestDemo:
    def test_demo_prints_plan_and_writes_reports(
        self, pg_server, pg_data_dir, monkeypatch, capsys, tmp_path
    ):
        """The demo plans work for every deterministic job and writes JSON, Markdown and HTML."""
        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(pg_data_dir))
        assert main(["demo", "--output-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "nothing was changed" in out
        # offline, the importance job's deferred list is shown, not just counted
        importance = [a for a in report_actions(tmp_path) if a["job"] == "importance"]
        assert importance and all(a["action"] == "deferred" for a in importance)
        assert f"  importance: {len(importance)} groups" in out
        assert f"{importance[0]['user_id']:<8}" in out.split("  importance:")[1]
        report = json.loads((tmp_path / "dry-run.json").read_text())
        assert report["mode"] == "dry_run"
        for job in ("ttl_expiry", "decay", "usage_prune", "user_cap", "hard_delete"):
            assert report["jobs"][job]["actions"] > 0, job
        assert "bob" in {a["user_id"] for a in report["actions"] if a["job"] == "user_cap"}
        assert (tmp_path / "dry-run.md").exists() and (tmp_path / "dry-run.html").exists()

    def test_demo_apply_leaves_nothing_to_change(
        self, pg_server, pg_data_dir, monkeypatch, capsys, tmp_path
    ):
        """demo --apply applies the plan and a second run right after changes nothing."""
        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(pg_data_dir))
        assert main(["demo", "--apply", "--output-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "second run right after: 0 changes" in out
        assert "memory-gc demo --apply" not in out  # not suggested when it is what ran

    def test_demo_apply_report_suggests_no_restore(
        self, pg_server, pg_data_dir, monkeypatch, capsys, tmp_path
    ):
        """The applied report of `demo --apply` suggested `memory-gc restore --run RUN`, which
        looks for the run in the configured store, not in the demo's own database: its apply
        run is recorded with trigger `demo` and its banner suggests only `memory-gc demo`."""
        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(pg_data_dir))
        assert main(["demo", "--apply", "--output-dir", str(tmp_path)]) == 0
        capsys.readouterr()
        page = (tmp_path / "applied.html").read_text()
        banner = page[page.index('class="banner') : page.index("</p>", page.index('class="banner'))]
        assert "<dt>Mode</dt><dd>apply</dd>" in page
        assert "memory-gc restore" not in banner and "<code>memory-gc demo</code>" in banner

    def test_the_demos_override_is_one(self, pg_server, pg_data_dir, monkeypatch, tmp_path):
        """ "Evening meetings are fine this week" overrides "no evening meetings" for its week
        (it names it in `supersedes`): the read rule shows the override alone, and the banner
        of the demo's plan points at `demo --apply`, which works, not `apply RUN`, which
        would not find the demo's database."""
        import sqlalchemy as sa

        from gc_worker import db
        from gc_worker.demo import DEMO_DB, DEMO_NOW

        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(pg_data_dir))
        assert main(["demo", "--output-dir", str(tmp_path)]) == 0
        assert "`memory-gc demo --apply`" in (tmp_path / "dry-run.md").read_text()
        engine = db.make_engine(db.embedded_url(pg_data_dir, DEMO_DB))
        try:
            with engine.connect() as conn:
                current = conn.execute(
                    sa.text("SELECT content FROM memory_gc_current('alice', 'scheduling', :at)"),
                    {"at": DEMO_NOW},
                ).scalars().all()  # fmt: skip
        finally:
            engine.dispose()
        assert current == ["Evening meetings are fine for Alice this week"]

    def test_every_job_acts_and_the_hint_runs_from_a_clone(
        self, pg_server, pg_data_dir, monkeypatch, capsys, tmp_path
    ):
        """The demo is what shows a newcomer the product: its plan had no erasure at all (no
        forget-me request in the sample), and it ended with "memory-gc demo --apply", which is
        not on PATH after the README's `scripts/demo` (the script runs .venv's)."""
        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(pg_data_dir))
        assert main(["demo", "--output-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        report = json.loads((tmp_path / "dry-run.json").read_text())
        assert all(row["actions"] > 0 for row in report["jobs"].values()), report["jobs"]
        [erased] = [a for a in report["actions"] if a["job"] == "erasure"]
        assert (erased["action"], erased["reason"]) == ("soft_delete", "erasure")
        assert "scripts/demo --apply" in out

    def test_apply_counts_what_it_changed(
        self, pg_server, pg_data_dir, monkeypatch, capsys, tmp_path
    ):
        """`demo --apply` said "applied: 1553 actions", counting the groups deferred for want
        of an LLM (which nothing applied) as applied; the forget-me request is completed."""
        import sqlalchemy as sa

        from gc_worker import db
        from gc_worker.demo import DEMO_DB

        monkeypatch.setenv("MEMORY_GC_DATA_DIR", str(pg_data_dir))
        assert main(["demo", "--apply", "--output-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        by_action = json.loads((tmp_path / "dry-run.json").read_text())["totals"]["by_action"]
        deferred = by_action["deferred"]
        changed = sum(by_action.values()) - deferred
        assert f"applied: {changed} changes ({deferred} deferred groups left as they are" in out
        engine = db.make_engine(db.embedded_url(pg_data_dir, DEMO_DB))
        try:
            with engine.connect() as conn:
                status = conn.execute(sa.text("SELECT status FROM gc_erasure_requests")).all()
        finally:
            engine.dispose()
        assert [s for (s,) in status] == ["completed"]


def report_actions(out_dir) -> list[dict]:
    return json.loads((out_dir / "dry-run.json").read_text())["actions"]
