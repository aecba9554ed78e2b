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

from loop_governor.bench.model_bench import DEFAULT_RUNS as DEFAULT_MODEL_RUNS
from loop_governor.bench.model_bench import ERROR_FORMAT_CHOICES, Plan, arms_for, parse_tiers, select
from loop_governor.bench.policy import POLICY_NAMES
from loop_governor.bench.real_model import (
    DEFAULT_TEMPERATURE,
    PROVIDERS,
    ModelSettings,
    check_endpoint,
    redact_url,
)
from loop_governor.bench.runner import FRAMEWORKS, total_steps
from loop_governor.bench.tiers import DEFAULT_TIERS
from loop_governor.cli.common import flag, usage_error

DEFAULT_RUNS = 2
DEFAULT_JSON = "loop-governor-bench.json"
DEFAULT_HTML = "loop-governor-bench.html"


def _policies(value: str) -> list[str]:
    chosen = list(POLICY_NAMES) if value.strip() == "all" else [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POLICY_NAMES]
    if unknown or not chosen:
        usage_error(f"--model-policy: unknown model policy {unknown}; choose from {', '.join(POLICY_NAMES)} or all")
    return list(dict.fromkeys(chosen))


def _console() -> Console:
    console = Console()
    if not console.is_terminal and console.width < 120:
        console = Console(width=120)  # the tables are unreadable folded at 80 columns
    return console


def _progress() -> Progress:
    # on stderr: stdout is muted while crewAI runs (it prints event-bus warnings)
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )


def _scripted(
    seed: int,
    runs: int | None,
    frameworks: list[str],
    policies: list[str],
    names: list[str] | None,
    calibration: Path | None,
    json_path: Path,
    html_path: Path,
    full: bool,
) -> None:
    """The scripted bench: every model policy through every arm."""
    from loop_governor.bench.policy import load_calibration
    from loop_governor.bench.report import html_report, print_summary, print_table
    from loop_governor.bench.runner import run_bench, select_scenarios

    try:
        picked = select_scenarios(names)
    except ValueError as exc:
        usage_error(f"--scenarios: {exc}")
    try:
        params = load_calibration(calibration)
    except (OSError, ValueError) as exc:
        usage_error(f"--calibration: {exc}")
    passes = runs if runs is not None else DEFAULT_RUNS
    console = _console()
    with _progress() as progress:
        task = progress.add_task("bench", total=total_steps(passes, frameworks, len(policies), len(picked)))
        result = run_bench(
            seed=seed,
            runs=passes,
            frameworks=frameworks,
            policies=policies,
            calibration=params,
            progress=lambda label: progress.update(task, advance=1, description=label),
            scenarios=[s.name for s in picked],
        )
    json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    html_path.write_text(html_report(result), encoding="utf-8")
    if full:
        print_table(result, console)
    print_summary(result, console, json_path=json_path, html_path=html_path)


def _model_plan(
    settings: ModelSettings,
    seed: int,
    runs: int | None,
    frameworks: list[str],
    tier: str | None,
    names: list[str] | None,
    error_format: str | None,
) -> Plan:
    """What ``--model`` runs; each bad option is named."""
    try:
        tiers = parse_tiers(tier)
    except ValueError as exc:
        usage_error(f"--tier: {exc}")
    try:
        picked = select(tiers, names)
    except ValueError as exc:
        usage_error(f"--scenarios: {exc}")
    formats = ERROR_FORMAT_CHOICES.get(error_format or "text")
    if formats is None:
        usage_error(f"--error-format: choose from {', '.join(ERROR_FORMAT_CHOICES)}, got {error_format!r}")
    try:
        return Plan(
            settings,
            tuple(picked),
            tuple(arms_for(formats)),
            tuple(frameworks),
            runs if runs is not None else DEFAULT_MODEL_RUNS,
            seed,
        )
    except ValueError as exc:
        usage_error(f"--temperature: {exc}")


def _real(plan: Plan, console: Console, json_path: Path, html_path: Path, full: bool) -> None:
    """A real model through every arm, tier by tier."""
    from loop_governor.bench.model_bench import run_model_bench
    from loop_governor.bench.model_report import model_html, print_model_summary, print_model_tables

    settings = plan.settings
    expected, most = plan.calls()
    tiers = list({t.number: t for t, _ in plan.chosen}.values())
    caps = "; ".join(
        f"tier {t.number}: {plan.tier_settings(t).calls_cap} calls or {plan.tier_settings(t).seconds_cap:g} s a task"
        for t in tiers
    )
    console.print(
        f"{settings.label} at {redact_url(settings.base_url) or 'the provider default'}: {plan.tasks()} tasks "
        f"({len(plan.chosen)} scenarios of tier {', '.join(str(t.number) for t in tiers)} x {len(plan.arms)} agents "
        f"x {len(plan.frameworks)} framework(s) x {plan.runs} run(s), temperature {settings.temperature:g}, "
        f"a seed per run); about {expected} model calls (what each task needs), at most {most} ({caps})",
        highlight=False,
    )
    with _progress() as progress:
        task = progress.add_task("bench", total=plan.steps)
        result = run_model_bench(plan, progress=lambda label: progress.update(task, advance=1, description=label))
    json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    html_path.write_text(model_html(result), encoding="utf-8")
    if full:
        print_model_tables(result, console)
    print_model_summary(result, console, json_path=json_path, html_path=html_path)


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
        runs: Annotated[
            int | None,
            typer.Option(
                min=1,
                help=f"passes over the scenarios (default {DEFAULT_RUNS}; with --model {DEFAULT_MODEL_RUNS}, "
                "each sampling the model with its own seed)",
            ),
        ] = None,
        frameworks: Annotated[str, typer.Option(help="comma-separated: langchain,crewai")] = ",".join(FRAMEWORKS),
        model_policy: Annotated[
            str, typer.Option(help="obedient, stubborn, calibrated (comma-separated) or all")
        ] = "all",
        scenarios: Annotated[
            str | None,
            typer.Option(help="comma-separated scenario names (default: all; with --model those of --tier)"),
        ] = None,
        model: Annotated[
            str | None,
            typer.Option(
                help="a real chat model instead of the scripted policies: PROVIDER:NAME, PROVIDER one of "
                f"{', '.join(PROVIDERS)} (any OpenAI-compatible endpoint), e.g. ollama:qwen2.5:1.5b"
            ),
        ] = None,
        tier: Annotated[
            str | None,
            typer.Option(
                help="with --model: 1 (one goal, one fault), 2 (multi-step plans), 1,2 or all "
                f"(default {','.join(map(str, DEFAULT_TIERS))}, what a 1-3B model can finish)"
            ),
        ] = None,
        temperature: Annotated[
            float | None,
            typer.Option(help=f"with --model: the sampling temperature (default {DEFAULT_TEMPERATURE:g})"),
        ] = None,
        error_format: Annotated[
            str | None,
            typer.Option(
                help="with --model: how the governed agent's model reads a failure: text (the default), json, "
                "or both (the governed agent runs once with each, side by side)"
            ),
        ] = None,
        base_url: Annotated[
            str | None, typer.Option(help="the model's OpenAI-compatible endpoint (default: the provider's)")
        ] = None,
        api_key_env: Annotated[
            str | None, typer.Option(help="environment variable holding the API key (default: a dummy key)")
        ] = None,
        max_model_calls: Annotated[
            int | None,
            typer.Option(
                min=1, help="with --model: model calls a task may make before it is stopped (default: the tier's)"
            ),
        ] = None,
        task_seconds: Annotated[
            float | None,
            typer.Option(
                min=1,
                help="with --model: real seconds a task may run, from its first model call (default: the tier's)",
            ),
        ] = None,
        calibration: Annotated[
            Path | None, typer.Option(help="calibration JSON for the calibrated policy (default: the shipped one)")
        ] = None,
        json_path: Annotated[Path, typer.Option("--json", help="where the results are written as JSON")] = Path(
            DEFAULT_JSON
        ),
        html_path: Annotated[Path, typer.Option("--html", help="where the HTML report is written")] = Path(
            DEFAULT_HTML
        ),
        full: Annotated[bool, flag("full", "print every table, not only the summary")] = False,
    ) -> None:
        """Baseline vs framework built-ins vs governed, through real LangChain and crewAI agents.

        By default a simulation on virtual time: scripted model policies against seeded
        faults, measuring the system around a model. With --model, a real chat model
        meets simulated services, tier by tier, over several sampled runs. Prints a
        summary; the full tables go to the HTML report and the JSON.
        """
        if ctx.invoked_subcommand is not None:
            return
        chosen = [f.strip() for f in frameworks.split(",") if f.strip()]
        unknown = [f for f in chosen if f not in FRAMEWORKS]
        if unknown or not chosen:
            usage_error(f"--frameworks: unknown framework(s) {unknown}; choose from {', '.join(FRAMEWORKS)}")
        names = [n.strip() for n in scenarios.split(",") if n.strip()] if scenarios else None
        console = _console()
        started = time.perf_counter()
        if model is None:
            given = {
                "--base-url": base_url,
                "--api-key-env": api_key_env,
                "--tier": tier,
                "--temperature": temperature,
                "--error-format": error_format,
                "--max-model-calls": max_model_calls,
                "--task-seconds": task_seconds,
            }
            needless = [name for name, value in given.items() if value is not None]
            if needless:
                usage_error(f"{', '.join(needless)} need(s) --model")
            _scripted(seed, runs, chosen, _policies(model_policy), names, calibration, json_path, html_path, full)
        else:
            try:
                settings = ModelSettings.parse(
                    model,
                    base_url=base_url,
                    api_key_env=api_key_env,
                    max_model_calls=max_model_calls,
                    task_seconds=task_seconds,
                    temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
                )
            except ValueError as exc:
                usage_error(f"--model: {exc}")
            plan = _model_plan(settings, seed, runs, chosen, tier, names, error_format)
            try:
                check_endpoint(settings)
            except ValueError as exc:
                usage_error(f"--base-url: {exc}")
            _real(plan, console, json_path, html_path, full)
        console.print(f"[dim]{time.perf_counter() - started:.1f} s of real time[/dim]")

    @bench_app.command()
    def prompts() -> None:
        """Print what a real model (--model) is told in each scenario."""
        from loop_governor.bench.prompts import SYSTEM_PROMPT, scenario_prompts

        console = _console()
        console.print(f"[bold]system prompt[/bold]\n{SYSTEM_PROMPT}\n", markup=True, highlight=False)
        for name, item in scenario_prompts().items():
            console.print(
                f"[bold]{name}[/bold] (tier {item['tier']}: {item['title']}; {item['tasks']} task(s))", highlight=False
            )
            console.print(item["prompt"] + "\n", markup=False, highlight=False)

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
            usage_error(f"CORPUS: {exc}")
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
