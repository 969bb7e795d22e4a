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
        assert "second run right after: 0 changes" in capsys.readouterr().out


def report_actions(out_dir) -> list[dict]:
    return json.loads((out_dir / "dry-run.json").read_text())["actions"]
