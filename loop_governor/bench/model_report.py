"""The real-model bench's tables (``loop-governor bench --model``): terminal and HTML.

One row per tier and agent: the success rate with its 95% interval, tool executions,
model calls, identical repeats and what a failed task kept; under the table, what each
tier's figures say ([`loop_governor.bench.model_bench.verdict`][loop_governor.bench.model_bench.verdict]). No cell is
coloured by rank: a lead smaller than the interval is noise, and the verdict line says which
differences are not.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

Cell = Callable[[dict[str, Any]], str]


def _finished(f: dict[str, Any]) -> str:
    low, high = f["success_ci95"]
    return f"{f['successes']}/{f['tasks']} {f['success_rate']:.0%} [{100 * low:.0f}-{100 * high:.0f}%]"


def _kept(f: dict[str, Any]) -> str:
    if not f["failed_tasks"]:
        return "-"
    return f"{f['subtasks_delivered_on_failure']:.1f} ({f['delivered_share_on_failure']:.0%})"


def _reasons(f: dict[str, Any]) -> str:
    reasons = sorted(f["failure_reasons"].items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {v}" for k, v in reasons) or "-"


COLUMNS: tuple[tuple[str, Cell], ...] = (
    ("finished\n[95% interval]", _finished),
    ("tool\ncalls", lambda f: f"{f['tool_calls_per_task']:.1f}"),
    ("model\ncalls", lambda f: f"{f['model_calls_per_task']:.1f}"),
    ("identical\nrepeats", lambda f: f"{f['identical_repeats_per_task']:.1f}"),
    ("kept when\nfailed", _kept),
    ("model\ns/call", lambda f: f"{f['model_wall_s_per_call']:.1f}"),
    ("empty /\nmalformed", lambda f: f"{f['empty_replies']} / {f['malformed_replies']}"),
)


def _finished_short(f: dict[str, Any]) -> str:
    low, high = f["success_ci95"]
    return f"{f['successes']}/{f['tasks']} [{100 * low:.0f}-{100 * high:.0f}%]"


DETAIL: tuple[tuple[str, Cell], ...] = (
    ("finished\n[95% interval]", _finished_short),
    *COLUMNS[1:5],
    ("how failed\ntasks ended", _reasons),
)

VERDICT_WORDS = {
    "too_weak": "model too weak",
    "differ": "arms differ",
    "no_difference": "no difference",
    "no_tasks": "-",
}


def _title(result: dict[str, Any]) -> str:
    tiers = ", ".join(str(t) for t in result["tiers_run"])
    return (
        f"loop-governor bench: {result['model']['model']}, tier {tiers}, {' + '.join(result['frameworks'])}, "
        f"{result['runs']} run(s) at temperature {result['model']['temperature']:g}"
    )


def print_model_summary(result: dict[str, Any], console: Console, *, json_path: Any, html_path: Any) -> None:
    """The summary table and each tier's verdict."""
    table = Table(
        title=_title(result),
        caption="calls and repeats: means per task; kept when failed: sub-results (share of the required)",
    )
    table.add_column("tier", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    for label, _ in COLUMNS:
        table.add_column(label, justify="right", no_wrap=True)
    for number, tier in result["tiers"].items():
        for i, arm in enumerate(result["arms"]):
            first = number if i == 0 else ""
            table.add_row(first, result["arm_labels"][arm], *(cell(tier["arms"][arm]) for _, cell in COLUMNS))
        table.add_section()
    console.print(table)
    for number, tier in result["tiers"].items():
        console.print(f"[bold]tier {number}[/bold] ({tier['title']}): {tier['verdict']['text']}.", highlight=False)
    console.print(result["note"], highlight=False)
    console.print(
        f"Full tables (per scenario, per framework, every task): {html_path} and {json_path}", highlight=False
    )


def print_model_tables(result: dict[str, Any], console: Console) -> None:
    """Per tier: every scenario, then every framework, each with its verdict under its
    name (``--full``)."""
    for number, tier in result["tiers"].items():
        for part, title in (("per_scenario", "scenario"), ("per_framework", "framework")):
            if part == "per_framework" and len(tier[part]) < 2:
                continue
            table = Table(title=f"tier {number}, by {title}")
            table.add_column(title, overflow="fold")
            table.add_column("agent", no_wrap=True)
            for label, _ in DETAIL[:-1]:
                table.add_column(label, justify="right", no_wrap=True)
            table.add_column(DETAIL[-1][0], overflow="fold")
            for name, rows in tier[part].items():
                for i, arm in enumerate(result["arms"]):
                    first = {0: name, 1: f"[dim]{VERDICT_WORDS[rows['verdict']['kind']]}[/dim]"}.get(i, "")
                    table.add_row(first, result["arm_labels"][arm], *(cell(rows["arms"][arm]) for _, cell in DETAIL))
                table.add_section()
            console.print(table)


# What each column of the page holds, in the line under each table (issue 35: nothing on a
# page the CLI writes is a header the reader has to guess).
EXPLAINED: dict[str, str] = {
    "tier": "tier 1: one goal and one fault per task; tier 2: multi-step plans",
    "scenario": "the simulated service fault the tasks meet",
    "framework": "langchain or crewai",
    "agent": "the plain agent as the framework ships it, the framework's own remedies switched on, or the same "
    "agent with loop-governor",
    "finished [95% interval]": "tasks that delivered every required result, of all run, with the 95% Wilson "
    "interval of that rate",
    "tool calls": "requests that reached the simulated services, per task (retries included)",
    "model calls": "requests that reached the model, per task",
    "identical repeats": "requests re-sending exactly (same tool, same arguments) a call whose last answer was a "
    "failure, whoever re-sent it (the model, a framework's retry or the governor), per task",
    "kept when failed": "results a failed task still delivered, on average (share of the required ones)",
    "model s/call": "real seconds per model call",
    "empty / malformed": "model replies with no text and no valid tool call / with a tool call that could not run",
    "how failed tasks ended": "incomplete (the model stopped without the goal), the task's model-call or time cap, "
    "or the error that ended the run, with how many tasks each",
    "verdict": "too weak: no agent finished any task; differ: some agents' success rates differ beyond the 95% "
    "interval of the difference; no difference: none do",
}


def _explained(labels: list[str]) -> str:
    return (
        '<p class="cols">Columns — '
        + "; ".join(f"<b>{html.escape(c)}</b>: {html.escape(EXPLAINED[c])}" for c in labels)
        + ".</p>"
    )


def model_html(result: dict[str, Any]) -> str:
    """One self-contained page: the summary, each tier's verdict, the tables per scenario and
    framework, and the settings."""

    def rows(parts: dict[str, Any], columns: tuple[tuple[str, Cell], ...], verdicts: bool) -> str:
        out = ""
        for name, part in parts.items():
            for i, arm in enumerate(result["arms"]):
                cells = [name if i == 0 else "", result["arm_labels"][arm]]
                cells += [cell(part["arms"][arm]) for _, cell in columns]
                if verdicts:
                    cells.append(VERDICT_WORDS[part["verdict"]["kind"]] if i == 0 else "")
                out += "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        return out

    def labels_of(first: str, columns: tuple[tuple[str, Cell], ...], verdicts: bool) -> list[str]:
        labels = [first, "agent", *(label.replace("\n", " ") for label, _ in columns)]
        return labels + (["verdict"] if verdicts else [])

    def head(first: str, columns: tuple[tuple[str, Cell], ...], verdicts: bool) -> str:
        return "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in labels_of(first, columns, verdicts)) + "</tr>"

    def table(first: str, parts: dict[str, Any], columns: tuple[tuple[str, Cell], ...], verdicts: bool) -> str:
        return (
            f"<table>{head(first, columns, verdicts)}{rows(parts, columns, verdicts)}</table>"
            + _explained(labels_of(first, columns, verdicts))
        )

    tiers = result["tiers"]
    summary = {f"{n}: {t['title']}": t for n, t in tiers.items()}
    body = table("tier", summary, COLUMNS, False)
    verdicts = (
        f"<li><strong>tier {html.escape(n)}</strong>: {html.escape(t['verdict']['text'])}.</li>"
        for n, t in tiers.items()
    )
    body += "<ul>" + "".join(verdicts) + "</ul>"
    for n, t in tiers.items():
        body += f"<h2>Tier {html.escape(n)}, by scenario</h2>"
        body += table("scenario", t["per_scenario"], DETAIL, True)
        if len(t["per_framework"]) > 1:
            body += f"<h2>Tier {html.escape(n)}, by framework</h2>"
            body += table("framework", t["per_framework"], DETAIL, True)
    settings = html.escape(json.dumps({"model": result["model"], **result["settings"]}, indent=2, sort_keys=True))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>loop-governor bench --model</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,td:nth-child(2){text-align:left}"
        "pre{background:#f6f6f6;padding:1em;white-space:pre-wrap}p.cols{font-size:13px;color:#555}</style></head><body>"
        f"<h1>{html.escape(_title(result))}</h1><p><strong>{html.escape(result['note'])}</strong></p>"
        f"<p>model at {html.escape(str(result['model']['endpoint']))}; scenarios: "
        f"{html.escape(', '.join(result['scenarios']))}</p>"
        f"{body}<h2>Settings</h2><pre>{settings}</pre></body></html>"
    )
