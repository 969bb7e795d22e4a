"""Handlers of the ``memory-gc`` subcommands; each maps arguments onto the engine."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gc_worker import engine as gc_engine
from gc_worker import render, schema
from gc_worker.apply_start import applying
from gc_worker.cli import (
    Context,
    not_ahead,
    parse_now,
    parse_uuid,
    positive_int,
    progress,
    user_id_arg,
    write_reports,
)
from gc_worker.errors import MemoryGCError, RunFailed, UsageError
from gc_worker.render_facts import drifted_total
from gc_worker.report import build_report
from gc_worker.run_record import load_run, settings_of

# Subcommands that live with their capability (each module has ``register(sub)``).
EXTENSIONS = (
    "gc_worker.cli_reviews",
    "gc_worker.cli_erasure",
    "gc_worker.cli_schedule",
    "gc_worker.cli_history",
    "gc_worker.cli_cancel",
)


def register(sub: Any) -> None:
    import importlib

    for name in EXTENSIONS:
        importlib.import_module(name).register(sub)
    _add(sub, "migrate", cmd_migrate, "create or upgrade the schema")
    run = _add(sub, "run", cmd_run, "one GC run now (plan and apply, or --dry-run)")
    run.add_argument(
        "--user", action="append", dest="users", metavar="ID", type=user_id_arg,
        help="only this user (repeatable)",
    )  # fmt: skip
    run.add_argument(
        "--job", action="append", dest="jobs", metavar="NAME", help="only this job (repeatable)"
    )
    run.add_argument(
        "--dry-run", action="store_true", help="write the plan and report; change nothing"
    )
    run.add_argument("--now", help="fix the clock (ISO 8601 with timezone)")
    run.add_argument("--report", type=Path, action="append", metavar="PATH",
                     help="write the report here (.json, .md or .html; repeatable)")  # fmt: skip
    apply = _add(sub, "apply", cmd_apply, "execute a dry run's plan exactly")
    apply.add_argument("run_id")
    apply.add_argument("--report", type=Path, action="append", metavar="PATH")
    report = _add(sub, "report", cmd_report, "render a run's report")
    report.add_argument("run_id")
    report.add_argument("--format", choices=render.FORMATS)
    report.add_argument("--output", type=Path)
    restore = _add(
        sub, "restore", cmd_restore, "undo what a run (or the worker, for one memory) did"
    )
    target = restore.add_mutually_exclusive_group(required=True)
    target.add_argument("--run", dest="run_id")
    target.add_argument("--memory", dest="memory_id")
    runs = _add(sub, "runs", cmd_runs, "list recent runs")
    runs.add_argument("--limit", type=positive_int, default=20)
    demo = _add(
        sub, "demo", cmd_demo, "seed a sample store in the embedded database and dry-run it"
    )
    demo.add_argument("--output-dir", type=Path, help="where to write the reports")
    demo.add_argument("--apply", action="store_true", help="then apply the plan and run again")


def _add(sub: Any, name: str, handler: Callable, help_text: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(handler=handler)
    return parser


def cmd_migrate(args: argparse.Namespace, ctx: Context) -> int:
    before, after = schema.migrate(
        ctx.engine(check_schema=False), embedding_dim=ctx.settings.embeddings.dim
    )
    print(
        f"schema: {before or 'empty'} -> {after}"
        if before != after
        else f"schema is current ({after})"
    )
    return 0


def cmd_run(args: argparse.Namespace, ctx: Context) -> int:
    paths = args.report or []
    for path in paths:
        _check_report_path(path)
    request = gc_engine.RunRequest(
        mode="dry_run" if args.dry_run else "apply",
        now=parse_now(args.now),
        users=tuple(args.users) if args.users else None,
        jobs=gc_engine.resolve_jobs(args.jobs or [], ctx.settings),
    )
    if request.mode == "apply":
        not_ahead(request.now, f"--now {args.now!r}", "Use --dry-run to preview a later date.")
    engine = ctx.engine()
    with gc_engine.started(engine, ctx.settings, request) as run_id:
        failed = _process(engine, run_id, ctx)
    return _finish_or_fail(engine, run_id, paths, failed)


def cmd_apply(args: argparse.Namespace, ctx: Context) -> int:
    for path in args.report or []:
        _check_report_path(path)
    plan_id = parse_uuid(args.run_id, "run id")  # bad input is refused before connecting
    engine = ctx.engine()
    with engine.connect() as conn:
        planned_for = load_run(conn, plan_id)["now"]
    not_ahead(planned_for, f"run {plan_id} was planned for {planned_for.isoformat()}, which",
              "Apply it once that time has come, or make a plan without --now.")  # fmt: skip
    max_age = ctx.settings.plan_age_limit_hours  # this environment's limit, not the plan's
    with applying(engine, plan_id, max_age_hours=max_age) as run_id:
        with engine.connect() as conn:
            settings = settings_of(load_run(conn, run_id))
        failed = _process(engine, run_id, ctx, settings=settings)
    return _finish_or_fail(engine, run_id, args.report or [], failed)


def _process(engine: Any, run_id: Any, ctx: Context, settings: Any = None) -> RunFailed | None:
    """Work the run; a RunFailed that closed it (some batches failed, the others were done) is
    returned, so that its summary and reports are still written before the command fails."""
    with engine.connect() as conn:
        total = conn.exec_driver_sql(
            "SELECT count(*) FROM gc_run_batches WHERE run_id = %(r)s", {"r": run_id}
        ).scalar_one()
    with progress(total) as bar:
        try:
            gc_engine.process_run(
                engine, run_id, settings or ctx.settings, llm=ctx.llm(), on_batch=bar.update,
                workers=ctx.settings.run.workers,  # this process's, not the plan's
            )  # fmt: skip
        except RunFailed as exc:
            with engine.connect() as conn:
                if load_run(conn, run_id)["status"] != "failed":
                    raise
            return exc
    with engine.connect() as conn:  # closed by someone else meanwhile: `memory-gc cancel`
        run = load_run(conn, run_id)
    if run["status"] == "failed":
        return RunFailed(f"run {run_id}: {run['error']}")
    return None


def _finish_or_fail(engine: Any, run_id: Any, paths: list[Path], failed: RunFailed | None) -> int:
    code = _finish(engine, run_id, paths)
    if failed is not None:
        print(f"memory-gc: error: {failed}", file=sys.stderr)
        return 1
    return code


def _finish(engine: Any, run_id: Any, paths: list[Path]) -> int:
    with engine.connect() as conn:  # the summary line needs counts only, not every action
        report = build_report(conn, run_id, actions=bool(paths))
    print(summary_line(report))
    try:
        for path in write_reports(report, paths):
            print(f"report: {path}")
    except OSError as exc:  # checked before the run; the disk may still fill up or vanish
        print(
            f"memory-gc: error: the run is done but its report could not be written "
            f"({exc}); render it again with `memory-gc report {run_id} --output PATH`",
            file=sys.stderr,
        )
        return 1
    return 0


def _check_report_path(path: Path, option: str = "--report") -> None:
    """Refuse, before anything runs, a report path that could not be written afterwards (an
    unknown suffix, a directory, a place that cannot be created or written)."""
    try:
        render.format_for_path(path)
    except ValueError as exc:
        raise UsageError(f"{option} {path}: {exc}") from None
    try:
        if path.is_dir():  # (OSError for a name the file system cannot hold: too long)
            example = path / "report.json"
            raise UsageError(f"{option} {path} is a directory; name a file, e.g. {example}")
        # probe without side effects: a temporary file in the nearest existing folder (the
        # report's own folders are created when it is written), and the file itself if it exists
        folder = path.absolute().parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError("the file is not writable")
        if not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a folder")
        with tempfile.TemporaryFile(dir=folder):  # a report is written beside, then renamed
            pass
    except OSError as exc:
        raise UsageError(
            f"{option} {path} cannot be written ({exc.strerror or exc}); "
            "choose a writable place (nothing was run)"
        ) from None


def summary_line(report: dict[str, Any]) -> str:
    drifted = drifted_total(report)
    # an apply whose every action drifted had work to do: it was skipped, not absent
    empty = "nothing applied" if drifted else "nothing to do"
    by_action = ", ".join(f"{k} {v}" for k, v in report["totals"]["by_action"].items()) or empty
    tail = f"; {drifted} drifted (skipped)" if drifted else ""
    return f"run {report['run_id']} ({report['mode']}, {report['status']}): {by_action}{tail}"


def cmd_report(args: argparse.Namespace, ctx: Context) -> int:
    run_id = parse_uuid(args.run_id, "run id")
    if args.output:
        _check_report_path(args.output, "--output")
        implied = render.format_for_path(args.output)
        if args.format and args.format != implied:
            raise UsageError(
                f"--format {args.format} does not match --output {args.output} ({implied}); "
                f"drop --format or name the file with .{args.format}"
            )
    fmt = args.format or (render.format_for_path(args.output) if args.output else "json")
    with ctx.engine().connect() as conn:
        report = build_report(conn, run_id, plan_age_limit_hours=ctx.settings.plan_age_limit_hours)
        text = render.render(report, fmt)
    if args.output:
        from gc_worker.report import write_whole

        try:
            write_whole(args.output, text)
        except OSError as exc:  # checked before; the disk may still fill up or vanish
            raise MemoryGCError(
                f"could not write --output {args.output} ({exc.strerror or exc}); "
                "nothing was changed there"
            ) from None
        print(f"report: {args.output}")
    else:
        sys.stdout.write(text + "\n")
    return 0


def cmd_restore(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker import restore

    if args.run_id:
        run_id = parse_uuid(args.run_id, "run id")
        result = restore.restore_run(ctx.engine(), run_id)
    else:
        memory_id = parse_uuid(args.memory_id, "memory id")
        result = restore.restore_memory(ctx.engine(), memory_id)
    gone = [f"{n} {what}" for n, what in ((result.purged, "purged by the run"),
                                          (result.erased, "erased by the run")) if n]  # fmt: skip
    print(f"restore run {result.run_id}: {len(result.restored)} restored, "
          f"{len(result.not_restorable)} not restorable"
          + (f"; cannot be brought back: {', '.join(gone)}" if gone else ""))  # fmt: skip
    kept = result.why_not
    for memory_id, action, why in kept[:SHOWN_KEPT]:
        later = result.later_runs.get((memory_id, action))
        first = f"; restore run {later} first" if later else ""
        print(f"  {memory_id}  {why}  (its {action} kept{first})")
    if kept:
        more = f"{len(kept) - SHOWN_KEPT:,} more and " if len(kept) > SHOWN_KEPT else ""
        print(f"  ({more}why: `memory-gc report {result.run_id}`, section Not restorable)")
    return 0


SHOWN_KEPT = 20  # rows a restore could not undo, listed on the terminal (the report has all)


def cmd_runs(args: argparse.Namespace, ctx: Context) -> int:
    from gc_worker.queries import q

    with ctx.engine().connect() as conn:
        for row in conn.execute(q("recent_runs"), {"limit": args.limit, "run_id": None}):
            waiting = row.held is not None and row.applied_by is None
            status = "held" if waiting and row.status in ("completed", "failed") else row.status
            print(
                f"{row.id}  {row.mode:<8} {status:<10} {row.trigger:<13} "
                f"now={row.now.isoformat()} started={row.started_at:%Y-%m-%d %H:%M:%S}"
                + (f"\n    held: {row.held}" if status == "held" else "")
            )
    return 0


def cmd_demo(args: argparse.Namespace, ctx: Context) -> int:
    import os

    from gc_worker import demo, logs

    logs.configure(os.environ.get("MEMORY_GC_LOG_LEVEL") or "warning")  # a person is reading
    if args.output_dir is not None:  # checked before the demo database is dropped and seeded
        try:
            is_file = args.output_dir.exists() and not args.output_dir.is_dir()
        except OSError as exc:  # a name the file system cannot hold (too long)
            raise UsageError(
                f"--output-dir {args.output_dir} cannot be used ({exc.strerror or exc}); "
                "choose a writable folder (nothing was run)"
            ) from None
        if is_file:
            raise UsageError(f"--output-dir {args.output_dir} is a file; name a folder")
        _check_report_path(args.output_dir / "dry-run.json", "--output-dir")
    return demo.run_demo(ctx, output_dir=args.output_dir, apply=args.apply)
