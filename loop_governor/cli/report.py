"""``loop-governor report TRACE -o report.html``: render a JSONL trace as one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from loop_governor.cli.common import usage_error
from loop_governor.terminal import cell, printable
from loop_governor.trace.reading import task_names
from loop_governor.trace.report import render_report, runs_apart, skipped_note
from loop_governor.trace.store import Trace, load_trace

_EXPECTED = "expected a JSONL trace written by loop-governor (GovernorConfig(trace_path=...))"


def _load(trace: Path) -> Trace:
    """The trace at ``trace``, or a usage error (exit 2) saying what was expected: a path
    that is no file, or a file that holds no trace (no header, no event), must not give
    an empty report and exit 0."""
    if not trace.is_file():
        usage_error(f"{printable(trace)} {'is a directory' if trace.is_dir() else 'does not exist'}: {_EXPECTED}")
    try:
        loaded = load_trace(trace)
    except OSError as exc:
        usage_error(f"cannot read {printable(trace)} ({exc.strerror or type(exc).__name__}): {_EXPECTED}")
    if not loaded.header and not loaded.events:
        found = f"{loaded.skipped_lines} line(s), none of them a trace record" if loaded.skipped_lines else "empty"
        usage_error(f"{printable(trace)} is not a trace ({found}): {_EXPECTED}")
    return loaded


def report(
    trace: Annotated[Path, typer.Argument(help="JSONL trace written by the Lens.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")] = Path("report.html"),
) -> None:
    """Write a self-contained HTML report (token chart, tool timeline, anomalies, prompts)."""
    loaded = _load(trace)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_report(loaded), encoding="utf-8")
    console = Console(stderr=True)
    console.print(
        f"[bold]{cell(output)}[/bold]: {len(loaded.model_calls)} model calls, {len(loaded.tool_calls)} tool calls, "
        f"{len(loaded.anomalies)} anomalies"
        + (f", {skipped_note(loaded)}" if loaded.skipped_lines or loaded.skipped_snapshot_lines else "")
    )
    apart = runs_apart(loaded)
    names = task_names(apart.events)
    for end in apart.of("task_end"):
        if end.get("outcome") not in (None, "completed"):
            # how a task ended, on the terminal too: a stop must not hide behind the counts
            console.print(
                f"task {cell(names.get(end.get('task_id'), end.get('task_id')))} {cell(end.get('outcome'))}: "
                f"{cell(end.get('error_class') or '')} {cell(end.get('reason') or '')}"
            )


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the ``loop-governor`` CLI."""
    app.command("report")(report)
