"""The docs an operator reads name what the code has: metrics, commands and their options,
the [schedule] table, the status reasons adoption probes, and the module map."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gc_worker.adoption_probes import STATUS_WRITES
from gc_worker.cli import build_parser
from gc_worker.config import ScheduleSettings
from gc_worker.metrics import UNITS, Metrics
from tests.store import add, days_ago, run

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
DOCS = [README, *(path.read_text() for path in sorted((ROOT / "docs").glob("*.md")))]


def table_rows(text: str, header: str) -> dict[str, list[str]]:
    """The rows of the Markdown table whose header line starts ``header``: first cell (its
    code span) → the other cells."""
    lines = text.split(f"\n{header}", 1)[1].split("\n")[2:]
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def documented_metrics() -> dict[str, set[str]]:
    rows = table_rows(OPERATIONS, "| metric | labels | meaning |")
    return {name: set(re.findall(r"[a-z_]+", cells[0])) for name, cells in rows.items()}


def exported_metrics() -> dict[str, set[str]]:
    """Each metric the daemon registers, under the name /metrics shows it, with its labels."""
    metrics = Metrics()
    exported = {}
    for metric in vars(metrics).values():
        name = getattr(metric, "_name", None)  # prometheus_client's wrappers keep these
        if name is None:
            continue
        suffix = "_total" if metric._type == "counter" else ""
        exported[name + suffix] = set(metric._labelnames)
    return exported


class TestMetricsTable:
    def test_every_metric_is_in_the_table_with_its_labels(self):
        """docs/operations.md's metrics table lists exactly the metrics the daemon exports,
        each with the labels it has."""
        assert documented_metrics() == exported_metrics()

    def test_every_unit_of_work_is_named(self):
        """Each unit label of memory_gc_unit_failures_total is named in its row."""
        meaning = table_rows(OPERATIONS, "| metric | labels | meaning |")
        row = meaning["memory_gc_unit_failures_total"][1]
        assert [unit for unit in UNITS if f"`{unit}`" not in row] == []


def commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(command, option) for every long option of every (sub)command; ('', option) for the
    options given before the command."""
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (f"{prefix} {name}".strip(), "")
                yield from commands(sub, f"{prefix} {name}".strip())
        else:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    yield prefix, option


class TestCommandLine:
    def test_every_command_is_in_the_readme_table(self):
        """README.md's command table names every command and subcommand."""
        rows = "\n".join(line for line in README.split("\n") if line.startswith("| `"))
        missing = [
            cmd for cmd, option in commands(build_parser()) if not option and f"`{cmd}" not in rows
        ]
        assert missing == []

    def test_every_option_is_documented_with_its_command(self):
        """Each option appears on a line that names its command (a README row or a doc's
        synopsis); the options before the command, in README.md."""
        missing = []
        for cmd, option in commands(build_parser()):
            if not option:
                continue
            if not cmd:
                found = f"memory-gc {option}" in README
            else:
                line = re.compile(rf"(`|memory-gc ){re.escape(cmd)}\b[^\n]*{re.escape(option)}\b")
                found = any(line.search(text) for text in DOCS)
            if not found:
                missing.append(f"{cmd} {option}".strip())
        assert missing == []


class TestScheduleTable:
    def test_keys_and_defaults(self):
        """docs/operations.md's [schedule] table has every option, with the code's default."""
        rows = table_rows(OPERATIONS, "| option | default | meaning |")
        documented = {key: cells[0].strip("`").strip('"') for key, cells in rows.items()}
        built_in = {key: str(value) for key, value in ScheduleSettings().model_dump().items()}
        assert documented == built_in


class TestStatusReasons:
    @pytest.mark.parametrize(("status", "reason"), STATUS_WRITES)
    def test_every_status_change_is_listed_for_adopters(self, status, reason):
        """The reasons a CHECK of an adopted store must let through (docs/operations.md)."""
        adoption = OPERATIONS.split("a CHECK of yours on `memories` refuses a row", 1)[1]
        assert f"`{reason}`" in adoption.split("\n- ", 1)[0]


def modules() -> list[str]:
    found = [*(ROOT / "gc_worker").glob("*.py"), *(ROOT / "gc_worker" / "llm").glob("*.py"),
             *(ROOT / "jobs").glob("*.py")]  # fmt: skip
    return sorted(str(p.relative_to(ROOT)) for p in found if p.name != "__init__.py")


class TestModuleMap:
    def test_every_module_is_in_where_the_code_is(self):
        """docs/architecture.md's "Where the code is" names every module of the worker."""
        section = ARCHITECTURE.split("## Where the code is", 1)[1].split("\n## ", 1)[0]
        named = set()
        for cell in re.findall(r"^\| ([^|]+) \|", section, re.MULTILINE):
            spans = re.findall(r"`([^`]+)`", cell)
            folder = spans[0].rsplit("/", 1)[0] if spans and "/" in spans[0] else ""
            named |= {span if "/" in span else f"{folder}/{span}" for span in spans}
        assert [module for module in modules() if module not in named] == []


def columns(engine, table: str) -> set[str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
            (table,),
        )
        return {row.column_name for row in rows}


def documented_columns(text: str, header: str) -> set[str]:
    """The column names a doc's table lists: every code span, or bare name, of its first cells
    (``a, b`` and ``a / b`` name two)."""
    names = set()
    for cell in table_rows(text, header):
        names |= set(re.findall(r"[a-z_]+", cell))
    return names


class TestTables:
    def test_the_contract_columns_of_memories(self, engine):
        """DESIGN.md section 2 lists every column `migrate` gives `memories`."""
        design = (ROOT / "docs" / "design.md").read_text()
        assert documented_columns(design, "| column | type | meaning |") == columns(
            engine, "memories"
        )

    def test_the_sweep_request_columns(self, engine):
        """docs/operations.md's gc_sweep_requests table lists every column it has."""
        sweeps = OPERATIONS.split("INSERT INTO gc_sweep_requests", 1)[1]
        assert documented_columns(sweeps, "| column | meaning |") == columns(
            engine, "gc_sweep_requests"
        )

    def test_the_erasure_request_columns(self, engine):
        """docs/erasure.md's gc_erasure_requests table lists every column it has."""
        erasure = (ROOT / "docs" / "erasure.md").read_text()
        assert documented_columns(erasure, "| column | meaning |") == columns(
            engine, "gc_erasure_requests"
        )


class TestReportKeys:
    def test_every_key_of_the_json_report_is_named_in_the_readme(self, engine, settings):
        """Each top-level key of a run's JSON report, and each job counter, is named in
        README.md's account of the report (beyond DESIGN.md section 5's)."""
        add(engine, "u1", "expired", expires_at=days_ago(1))
        report = run(engine, settings, jobs=["ttl_expiry", "decay"])
        design = (ROOT / "docs" / "design.md").read_text().split("## 5.", 1)[1].split("## 6.")[0]
        readme = README.split("**Reports.**", 1)[1].split("\n\n", 1)[0]
        named = set(re.findall(r'"([a-z_]+)":', design)) | set(re.findall(r"`([a-z_]+)`", readme))
        assert [key for key in [*report, *report["jobs"]["decay"]] if key not in named] == []
