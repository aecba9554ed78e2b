"""`loop-governor replay`: real trajectories through pruning policies, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from loop_governor.cli.common import usage_error
from loop_governor.context.replay import POLICY_NOTES, default_policies, load_runs, provider_calibration, replay
from loop_governor.terminal import cell, printable


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


_EXPECTED = "expected recorded agent runs (.json or .json.gz files of OpenAI-style messages) or directories of them"


def replay_command(
    paths: Annotated[list[Path], typer.Argument(help="Run files (.json, .json.gz) or directories.")],
    cache_price: Annotated[float, typer.Option(help="Price of a cached prompt token (uncached = 1).")] = 0.1,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures to this file.")] = None,
) -> None:
    """Replay agent runs through raw, LangChain ClearToolUsesEdit, seed head/tail and ours."""
    for p in paths:
        if not p.exists():
            usage_error(f"{printable(p)} does not exist: {_EXPECTED}")
    unreadable: list[Path] = []
    runs = load_runs(paths, unreadable)
    if unreadable:
        Console(stderr=True).print(f"skipped {len(unreadable)} unreadable file(s), first: {cell(unreadable[0])}")
    if not runs:
        usage_error(f"no runs found in {', '.join(printable(p) for p in paths)}: {_EXPECTED}")
    rows = replay(runs, default_policies(), cache_price)
    console = Console(width=max(140, Console().width))
    table = Table(title=f"{len(runs)} runs, {rows[0]['requests']} requests, cache price {cache_price}")
    for col in (
        "policy",
        "tokens/request",
        "vs raw",
        "tokens @ turn 30",
        "bill",
        "bill vs raw",
        "p50 ms",
        "p99 ms",
        "p50 cpu ms",
        "p99 cpu ms",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        change = r.get("token_change")
        table.add_row(
            r["policy"],
            _fmt(r["tokens_per_request"]),
            f"{change:+.1%}" if change is not None else "-",
            _fmt(r["tokens_at_turn_30"]),
            _fmt(r["bill"]),
            _fmt(r.get("bill_vs_raw")),
            _fmt(r["p50_ms"]),
            _fmt(r["p99_ms"]),
            _fmt(r["p50_cpu_ms"]),
            _fmt(r["p99_cpu_ms"]),
        )
    console.print(table)
    for r in rows:
        failed = f" ({r['failed_runs']} run(s) failed and left out)" if r.get("failed_runs") else ""
        console.print(f"  {r['policy']}: {POLICY_NOTES.get(r['policy'], '')}{failed}")
    calib = provider_calibration(runs)
    if calib:
        console.print(
            f"token estimate vs provider-reported prompt_tokens (raw): {calib['estimated']:,.0f} vs "
            f"{calib['provider_prompt_tokens']:,.0f} (ratio {calib['ratio']})"
        )
    if json_out is not None:
        payload = {"runs": len(runs), "cache_price": cache_price, "policies": rows, "calibration": calib}
        json_out.write_text(json.dumps(payload, indent=2))


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_command)
