"""``loop-governor bench``: the chaos benchmark as a command.

LangChain and crewAI are imported only when the command runs (inside ``run_bench``),
so ``import loop_governor`` and every other command stay framework-free.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loop_governor.bench.runner import FRAMEWORKS, total_steps

DEFAULT_RUNS = 2


def register(app: typer.Typer) -> None:
    @app.command()
    def bench(
        seed: Annotated[int, typer.Option(help="seed of the fault schedule and model latencies")] = 0,
        runs: Annotated[int, typer.Option(min=1, help="passes over all scenarios (12 tasks each)")] = DEFAULT_RUNS,
        frameworks: Annotated[str, typer.Option(help="comma-separated: langchain,crewai")] = ",".join(FRAMEWORKS),
        json_path: Annotated[Path | None, typer.Option("--json", help="write the results as JSON here")] = None,
        html_path: Annotated[Path | None, typer.Option("--html", help="write a self-contained HTML report")] = None,
    ) -> None:
        """Baseline vs framework built-ins vs governed, through real LangChain and crewAI agents.

        A simulation on virtual time: a scripted model policy against seeded faults. It
        measures the system around a model, not a real model.
        """
        from loop_governor.bench.report import html_report, print_table
        from loop_governor.bench.runner import run_bench

        chosen = [f.strip() for f in frameworks.split(",") if f.strip()]
        unknown = [f for f in chosen if f not in FRAMEWORKS]
        if unknown or not chosen:
            raise typer.BadParameter(f"unknown framework(s) {unknown}; choose from {', '.join(FRAMEWORKS)}")
        console = Console()
        if not console.is_terminal and console.width < 110:
            console = Console(width=110)  # the comparison table is unreadable folded at 80 columns
        # Progress on stderr: stdout is muted while crewAI runs (it prints event-bus warnings).
        bar_console = Console(file=sys.stderr)
        started = time.perf_counter()
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=bar_console,
            transient=True,
        ) as progress:
            task = progress.add_task("bench", total=total_steps(runs, chosen))

            def advance(label: str) -> None:
                progress.update(task, advance=1, description=label)

            result = run_bench(seed=seed, runs=runs, frameworks=chosen, progress=advance)
        print_table(result, console)
        console.print(f"[dim]{time.perf_counter() - started:.1f} s of real time[/dim]")
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            console.print(f"JSON written to {json_path}")
        if html_path is not None:
            html_path.write_text(html_report(result), encoding="utf-8")
            console.print(f"HTML report written to {html_path}")
