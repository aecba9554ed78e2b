"""``loop-governor report TRACE -o report.html``: render a JSONL trace as one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from loop_governor.terminal import cell
from loop_governor.trace.report import render_report, runs_apart, skipped_note
from loop_governor.trace.store import load_trace


def report(
    trace: Annotated[
        Path,
        typer.Argument(exists=True, dir_okay=False, readable=True, help="JSONL trace written by the Lens."),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="HTML file to write.")] = Path("report.html"),
) -> None:
    """Write a self-contained HTML report (token chart, tool timeline, anomalies, prompts)."""
    loaded = load_trace(trace)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_report(loaded), encoding="utf-8")
    console = Console(stderr=True)
    console.print(
        f"[bold]{cell(output)}[/bold]: {len(loaded.model_calls)} model calls, {len(loaded.tool_calls)} tool calls, "
        f"{len(loaded.anomalies)} anomalies"
        + (f", {skipped_note(loaded)}" if loaded.skipped_lines or loaded.skipped_snapshot_lines else "")
    )
    for end in runs_apart(loaded).of("task_end"):
        if end.get("outcome") not in (None, "completed"):
            # how a task ended, on the terminal too: a stop must not hide behind the counts
            console.print(
                f"task {cell(end.get('task_id'))} {cell(end.get('outcome'))}: "
                f"{cell(end.get('error_class') or '')} {cell(end.get('reason') or '')}"
            )


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the ``loop-governor`` CLI."""
    app.command("report")(report)
