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
from rich.table import Table

from loop_governor.bench.policy import POLICY_NAMES
from loop_governor.bench.runner import FRAMEWORKS, total_steps

DEFAULT_RUNS = 2


def _policies(value: str) -> list[str]:
    chosen = list(POLICY_NAMES) if value.strip() == "all" else [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POLICY_NAMES]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown model policy {unknown}; choose from {', '.join(POLICY_NAMES)} or all")
    return list(dict.fromkeys(chosen))


def _console() -> Console:
    console = Console()
    if not console.is_terminal and console.width < 120:
        console = Console(width=120)  # the tables are unreadable folded at 80 columns
    return console


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(
        invoke_without_command=True,
        add_completion=False,
        help="Baseline vs framework built-ins vs governed, through real LangChain and crewAI agents.",
    )
    app.add_typer(bench_app, name="bench")

    @bench_app.callback()
    def bench(
        ctx: typer.Context,
        seed: Annotated[int, typer.Option(help="seed of the fault schedule and model latencies")] = 0,
        runs: Annotated[int, typer.Option(min=1, help="passes over all scenarios (19 tasks each)")] = DEFAULT_RUNS,
        frameworks: Annotated[str, typer.Option(help="comma-separated: langchain,crewai")] = ",".join(FRAMEWORKS),
        model_policy: Annotated[
            str, typer.Option(help="obedient, stubborn, calibrated (comma-separated) or all")
        ] = "all",
        calibration: Annotated[
            Path | None, typer.Option(help="calibration JSON for the calibrated policy (default: the shipped one)")
        ] = None,
        json_path: Annotated[Path | None, typer.Option("--json", help="write the results as JSON here")] = None,
        html_path: Annotated[Path | None, typer.Option("--html", help="write a self-contained HTML report")] = None,
    ) -> None:
        """Baseline vs framework built-ins vs governed, through real LangChain and crewAI agents.

        A simulation on virtual time: scripted model policies against seeded faults. It
        measures the system around a model, not a real model.
        """
        if ctx.invoked_subcommand is not None:
            return
        from loop_governor.bench.policy import load_calibration
        from loop_governor.bench.report import html_report, print_table
        from loop_governor.bench.runner import run_bench

        chosen = [f.strip() for f in frameworks.split(",") if f.strip()]
        unknown = [f for f in chosen if f not in FRAMEWORKS]
        if unknown or not chosen:
            raise typer.BadParameter(f"unknown framework(s) {unknown}; choose from {', '.join(FRAMEWORKS)}")
        policies = _policies(model_policy)
        try:
            params = load_calibration(calibration)
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--calibration") from None
        console = _console()
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
            task = progress.add_task("bench", total=total_steps(runs, chosen, len(policies)))

            def advance(label: str) -> None:
                progress.update(task, advance=1, description=label)

            result = run_bench(
                seed=seed, runs=runs, frameworks=chosen, policies=policies, calibration=params, progress=advance
            )
        print_table(result, console)
        console.print(f"[dim]{time.perf_counter() - started:.1f} s of real time[/dim]")
        if json_path is not None:
            json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            console.print(f"JSON written to {json_path}")
        if html_path is not None:
            html_path.write_text(html_report(result), encoding="utf-8")
            console.print(f"HTML report written to {html_path}")

    @bench_app.command()
    def calibrate(
        corpus: Annotated[Path, typer.Argument(help="directory of recorded runs; each sub-directory is a source")],
        out: Annotated[Path, typer.Option(help="where to write the parameters")] = Path("calibration.json"),
    ) -> None:
        """Measure how real agents react to a failed tool call; write the calibrated policy's parameters."""
        from loop_governor.bench import calibrate as cal

        try:
            params = cal.calibrate(corpus)
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(str(exc), param_hint="CORPUS") from None
        cal.write(params, out)
        console = _console()
        table = Table(title=f"failures and the next move, {corpus.name}")
        for column in ("source", "runs", "failures", "identical next call", *cal.MOVES, "streak lengths (calls: n)"):
            table.add_column(column, justify="left" if column in ("source", "streak lengths (calls: n)") else "right")
        for name, src in params["sources"].items():
            followed = src["failures_followed_by_a_call"]
            table.add_row(
                name,
                str(src["runs"]),
                str(src["failures"]),
                f"{src['identical_next_rate']:.1%} ({src['identical_next']}/{followed})",
                *(str(src["moves"][m]) for m in cal.MOVES),
                ", ".join(f"{k}: {v}" for k, v in src["streak_lengths"].items()),
            )
        console.print(table)
        console.print(f"parameters written to {out}")
