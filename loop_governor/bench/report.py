"""Present benchmark results: a rich table beside the seed's column, and an HTML page.

The HTML page is one self-contained file: inline SVG bar charts, no script, no CDN,
so it opens offline and can be attached to a ticket. The SVG is written by hand (a few
rectangles per chart) because a plotting library would be a heavy dependency for that.
"""

from __future__ import annotations

import html
from typing import Any

from rich.console import Console
from rich.table import Table

from loop_governor.bench.harness import ARMS


def _minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if s else f"{m} min"


_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("tool calls per task", "tool_calls_per_task", lambda v: f"{v:.1f}"),
    ("mean task duration", "mean_duration_s", _minutes),
    ("failed tasks", "failed_tasks", None),
    ("failed-task duration", "failed_duration_s", _minutes),
    ("sub-results delivered on failure", "subtasks_delivered_on_failure", lambda v: f"{v:.1f}"),
    ("peak downstream concurrency", "peak_downstream_concurrency", str),
    ("peak retries per second", "peak_retry_rate_per_s", str),
)
_PER_FRAMEWORK_ROWS = (*_ROWS[:5], _ROWS[6])


def _cell(summary: dict[str, Any], key: str, fmt: Any) -> str:
    if key == "failed_tasks":
        return f"{summary['failed_tasks']}/{summary['tasks']} ({summary['failure_rate']:.0%})"
    value = summary[key]
    return fmt(value) if fmt is not None else str(value)


def _seed_cell(column: dict[str, Any], key: str, fmt: Any) -> str:
    if key not in column:
        return "-"
    value = column[key]
    return value if isinstance(value, str) else (fmt(value) if fmt is not None else str(value))


_POLICY_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("tool calls per task", "tool_calls_per_task", lambda v: f"{v:.1f}"),
    ("model calls per task", "model_calls_per_task", lambda v: f"{v:.1f}"),
    ("prompt tokens per task", "prompt_tokens_per_task", lambda v: f"{v:,.0f}"),
    ("mean task duration", "mean_duration_s", _minutes),
    ("failed tasks", "failed_tasks", None),
    ("sub-results kept on failure", "subtasks_delivered_on_failure", lambda v: f"{v:.1f}"),
)
_COMPARED = {"tool_calls_per_task", "model_calls_per_task", "prompt_tokens_per_task", "failed_tasks"}


def _governed_cell(arms: dict[str, Any], key: str, fmt: Any) -> str:
    """The governed figure, red where another arm did better on a compared metric."""
    text = _cell(arms["governed"], key, fmt)
    if key not in _COMPARED:
        return text
    metric = "failure_rate" if key == "failed_tasks" else key
    worse = arms["governed"][metric] > min(arms["baseline"][metric], arms["builtins"][metric])
    return f"[red]{text}[/red]" if worse else f"[green]{text}[/green]"


def _policy_rows(arms: dict[str, Any], scope: str) -> list[tuple[str, list[str]]]:
    """The rows of one policy (and framework): each metric per arm, then the failure rate
    of the seed's incidents (tool faults) and of the provider faults apart."""
    rows = [
        (label, [_cell(arms["baseline"], key, fmt), _cell(arms["builtins"], key, fmt), _governed_cell(arms, key, fmt)])
        for label, key, fmt in _POLICY_ROWS
    ]
    for fault, label in (("tool", "failed: tool-fault scenarios"), ("provider", "failed: provider-fault scenarios")):
        part = arms["by_fault"][fault][scope]
        rows.append(
            (
                label,
                [_cell(part[a], "failed_tasks", None) for a in ARMS[:2]] + [_governed_cell(part, "failed_tasks", None)],
            )
        )
    return rows


def print_policies(result: dict[str, Any], console: Console) -> None:
    """Per model policy: every scenario (provider faults included), both frameworks, then each."""
    policies = result.get("model_policies", {})
    if not policies:
        return
    scenarios = len(next(iter(policies.values()))["per_scenario"])
    table = Table(
        title=f"by model policy: all {scenarios} scenarios, {' + '.join(result['frameworks'])} "
        "(red: another arm did better)",
    )
    table.add_column("policy")
    table.add_column("metric")
    for arm in ARMS:
        table.add_column(arm, justify="right")
    for name in result["model_policies_run"]:
        for label, cells in _policy_rows(policies[name], "all"):
            table.add_row(name, label, *cells)
        table.add_section()
    console.print(table)
    for framework in result["frameworks"] if len(result["frameworks"]) > 1 else ():
        per = Table(title=f"by model policy: {framework}")
        per.add_column("policy")
        per.add_column("metric")
        for arm in ARMS:
            per.add_column(arm, justify="right")
        for name in result["model_policies_run"]:
            arms = {**policies[name]["per_framework"][framework], "by_fault": policies[name]["by_fault"]}
            for label, cells in _policy_rows(arms, framework):
                per.add_row(name, label, *cells)
            per.add_section()
        console.print(per)
    losses = Table(title="where governance does not win: the governed arm above the better other arm")
    for column in ("policy", "framework", "scenario", "metric", "governed", "better arm"):
        losses.add_column(column, justify="right" if column in ("governed", "better arm") else "left")
    for name in result["model_policies_run"]:
        for loss in policies[name]["governed_not_best"]:
            other = "baseline" if "baseline" in loss else "builtins"
            losses.add_row(
                name,
                loss["framework"],
                loss["scenario"],
                loss["metric"],
                f"{loss['governed']:g}",
                f"{other} {loss[other]:g}",
            )
    console.print(losses)


def print_jitter(result: dict[str, Any], console: Console) -> None:
    ablation = result.get("jitter_ablation")
    if not ablation:
        return
    table = Table(
        title=f"jitter ablation: {ablation['tasks']} tasks fail at the same instant, governed retries, "
        f"{ablation['runs']} worlds",
        caption="peak concurrent retries at the service: mean (max) over worlds",
    )
    for column in ("setting", "error latency", "retry_jitter=0.5", "retry_jitter=0", "mean peak cut"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for name in ("fast_errors", "default_breaker", "slow_errors"):
        row = ablation[name]
        cells = [
            f"{row[k]['mean_peak_concurrent_retries']:g} ({row[k]['peak_concurrent_retries']})"
            for k in ("with_jitter", "without_jitter")
        ]
        table.add_row(name, f"{row['error_latency_s']:g} s", *cells, f"{row['mean_peak_reduction']:.0%}")
    console.print(table)


_SUMMARY: tuple[tuple[str, str, Any], ...] = (
    ("tool calls\n/ task", "tool_calls_per_task", lambda v: f"{v:.1f}"),
    ("model calls\n/ task", "model_calls_per_task", lambda v: f"{v:.1f}"),
    ("failed\ntasks", "failed_tasks", None),
    ("results kept\nwhen failed", "subtasks_delivered_on_failure", lambda v: f"{v:.1f}"),
)


def print_summary(result: dict[str, Any], console: Console, *, json_path: Any, html_path: Any) -> None:
    """The short account ``loop-governor bench`` prints: per model policy, each arm's
    headline figures over every scenario run, and where the full tables are (a real
    model's: [`loop_governor.bench.model_report`][loop_governor.bench.model_report])."""
    table = Table(
        title=f"loop-governor bench: {len(result.get('scenarios') or ())} scenarios, "
        f"{' + '.join(result['frameworks'])}, {result['runs']} run(s)",
    )
    table.add_column("model policy", no_wrap=True)
    table.add_column("agent", no_wrap=True)
    rows = _SUMMARY
    for label, _, _ in rows:
        table.add_column(label, justify="right", no_wrap=True)
    policies = result["model_policies"]
    for name in result["model_policies_run"]:
        arms = policies[name]
        for arm in ARMS:
            cells = []
            for _, key, fmt in rows:
                if arm == "governed":
                    cells.append(_governed_cell(arms, key, fmt))
                else:
                    cells.append(_cell(arms[arm], key, fmt))
            table.add_row(name if arm == ARMS[0] else "", _ARM_LABEL[arm], *cells)
        table.add_section()
    console.print(table)
    console.print(result["note"], highlight=False)
    console.print(_POLICY_LEGEND, highlight=False)
    console.print(
        "Green/red: loop-governor did better/worse than the better of the other two agents.",
        highlight=False,
    )
    console.print(f"Full tables (per framework, per scenario, settings): {html_path} and {json_path}", highlight=False)


_POLICY_LEGEND = (
    "Scripted models: obedient repeats a failing call but follows loop-governor's advice; stubborn "
    "ignores every warning; calibrated reacts to errors as recorded real agents did."
)

_ARM_LABEL = {
    "baseline": "plain agent",
    "builtins": "framework built-ins",
    "governed": "loop-governor",
}


def print_table(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"loop-governor bench: random seed {result['seed']}, {result['runs']} run(s), "
        f"frameworks: {', '.join(result['frameworks'])}; tool-fault scenarios, "
        f"{result.get('headline_policy', 'obedient')} model",
        caption=result["note"],
    )
    table.add_column("metric")
    table.add_column("incident report:\nno governor", justify="right", style="dim")
    table.add_column("incident report:\ngoverned", justify="right", style="dim")
    for arm in ARMS:
        table.add_column(arm, justify="right", style="bold green" if arm == "governed" else None)
    seed = result["seed_published"]
    for label, key, fmt in _ROWS:
        table.add_row(
            label,
            _seed_cell(seed["ungoverned"], key, fmt),
            _seed_cell(seed["governed"], key, fmt),
            *(_cell(result[arm], key, fmt) for arm in ARMS),
        )
    console.print(table)
    per = Table(title="per framework")
    per.add_column("framework")
    per.add_column("metric")
    for arm in ARMS:
        per.add_column(arm, justify="right")
    for framework, arms in result["per_framework"].items():
        for label, key, fmt in _PER_FRAMEWORK_ROWS:
            per.add_row(framework, label, *(_cell(arms[arm], key, fmt) for arm in ARMS))
    console.print(per)
    print_policies(result, console)
    print_jitter(result, console)


# -- HTML --------------------------------------------------------------------------------

_INCIDENT = (
    "figures published in the incident report these tool-fault scenarios reproduce (20 controlled runs of "
    "real agents)"
)
_ARMS_EXPLAINED = {
    "baseline": "the agent as the framework ships it (a bare create_agent, a plain crew)",
    "builtins": "the framework's own remedies switched on (LangChain's ToolRetryMiddleware, ToolErrorMiddleware, "
    "ToolCallLimitMiddleware and ModelRetryMiddleware; crewAI's ToolFailure returns and max_iter)",
    "governed": "the same agent with loop-governor (GovernorMiddleware / govern_tools and install)",
}
_SUMMARY_EXPLAINED = {
    "tool_calls_per_task": "requests that reached the simulated services, per task (retries included)",
    "model_calls_per_task": "requests that reached the model provider, per task (retries included)",
    "failed_tasks": "tasks that did not deliver every required sub-result, of all tasks run",
    "subtasks_delivered_on_failure": "sub-results a failed task still delivered, on average",
}


def _columns(pairs: list[tuple[str, str]]) -> str:
    """The line under a table that explains each of its columns."""
    explained = "; ".join(f"<b>{html.escape(name)}</b>: {html.escape(why)}" for name, why in pairs)
    return f'<p class="cols">Columns — {explained}.</p>'


def _arm_columns() -> list[tuple[str, str]]:
    return [(arm, _ARMS_EXPLAINED[arm]) for arm in ARMS]


def _metrics_note(keys: list[tuple[str, str]]) -> str:
    """What each metric row measures (the runner's own definitions)."""
    from loop_governor.bench.runner import METRIC_DEFINITIONS

    found = [(label, METRIC_DEFINITIONS.get(key) or _SUMMARY_EXPLAINED.get(key)) for label, key in keys]
    explained = "; ".join(f"<b>{html.escape(label)}</b>: {html.escape(why)}" for label, why in found if why)
    return f'<p class="cols">Rows — {explained}.</p>' if explained else ""


_COLORS = {"baseline": "#c0392b", "builtins": "#e67e22", "governed": "#27ae60"}


def _bar_chart(title: str, groups: list[tuple[str, dict[str, float]]], unit: str = "") -> str:
    """A grouped bar chart: one group per label, one bar per arm."""
    width, height, pad, top = 640, 260, 40, 30
    peak = max((v for _, values in groups for v in values.values()), default=0.0) or 1.0
    group_w = (width - 2 * pad) / max(len(groups), 1)
    bar_w = group_w / (len(ARMS) + 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 40}" role="img">',
        f'<text x="{pad}" y="18" font-weight="bold">{html.escape(title)}</text>',
        f'<line x1="{pad}" y1="{top + height - pad}" x2="{width - pad}" y2="{top + height - pad}" stroke="#888"/>',
    ]
    plot_h = height - pad - top
    for gi, (label, values) in enumerate(groups):
        x0 = pad + gi * group_w + bar_w / 2
        for ai, arm in enumerate(ARMS):
            value = values.get(arm, 0.0)
            h = plot_h * value / peak
            x = x0 + ai * bar_w
            y = top + height - pad - h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w * 0.9:.1f}" height="{h:.1f}" fill="{_COLORS[arm]}">'
                f"<title>{html.escape(f'{label} {arm}: {value:g}{unit}')}</title></rect>"
            )
            parts.append(
                f'<text x="{x + bar_w * 0.45:.1f}" y="{y - 3:.1f}" font-size="10" '
                f'text-anchor="middle">{value:.3g}</text>'
            )
        parts.append(
            f'<text x="{x0 + bar_w * 1.5:.1f}" y="{top + height - pad + 14}" font-size="11" '
            f'text-anchor="middle">{html.escape(label)}</text>'
        )
    for ai, arm in enumerate(ARMS):
        parts.append(f'<rect x="{pad + ai * 110}" y="{height + 18}" width="10" height="10" fill="{_COLORS[arm]}"/>')
        parts.append(f'<text x="{pad + ai * 110 + 14}" y="{height + 27}" font-size="11">{arm}</text>')
    parts.append("</svg>")
    return "".join(parts)


def html_report(result: dict[str, Any]) -> str:
    frameworks = result["frameworks"]
    per = result["per_framework"]

    def groups(key: str, scale: float = 1.0) -> list[tuple[str, dict[str, float]]]:
        out = [("all", {arm: result[arm][key] * scale for arm in ARMS})]
        out += [(f, {arm: per[f][arm][key] * scale for arm in ARMS}) for f in frameworks]
        return out

    scen = [
        (name.replace("_", " "), {arm: arms[arm]["tool_calls_per_task"] for arm in ARMS})
        for name, arms in result["per_scenario"].items()
    ]
    charts = [
        _bar_chart("Tool calls per task", groups("tool_calls_per_task")),
        _bar_chart("Failed tasks (%)", groups("failure_rate", 100.0), "%"),
        _bar_chart("Mean task duration (virtual minutes)", groups("mean_duration_s", 1 / 60)),
        _bar_chart("Failed-task duration (virtual minutes)", groups("failed_duration_s", 1 / 60)),
        _bar_chart("Sub-results delivered when a task fails", groups("subtasks_delivered_on_failure")),
        _bar_chart("Tool calls per task, by scenario", scen),
        _bar_chart(
            "Peak retries per second at one service (concurrent scenario, mean over worlds)",
            groups("mean_peak_retry_rate_per_s"),
        ),
    ]
    rows = "".join(
        f"<tr><td>{html.escape(label)}</td>"
        + f"<td>{html.escape(_seed_cell(result['seed_published']['ungoverned'], key, fmt))}</td>"
        + f"<td>{html.escape(_seed_cell(result['seed_published']['governed'], key, fmt))}</td>"
        + "".join(f"<td>{html.escape(_cell(result[arm], key, fmt))}</td>" for arm in ARMS)
        + "</tr>"
        for label, key, fmt in _ROWS
    )
    settings = html.escape(_pretty(result["settings"]))
    policies = result.get("model_policies", {})
    order = [p for p in result.get("model_policies_run", []) if p in policies]

    def by_policy(key: str, scale: float = 1.0) -> list[tuple[str, dict[str, float]]]:
        return [(p, {arm: policies[p][arm][key] * scale for arm in ARMS}) for p in order]

    if order:
        charts += [
            _bar_chart("Tool calls per task, by model policy (all scenarios)", by_policy("tool_calls_per_task")),
            _bar_chart("Model calls per task, by model policy (all scenarios)", by_policy("model_calls_per_task")),
            _bar_chart("Failed tasks (%), by model policy (all scenarios)", by_policy("failure_rate", 100.0), "%"),
        ]
    losses = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(str(v))}</td>" for v in (p, loss["framework"], loss["scenario"], loss["metric"]))
        + f"<td>{loss['governed']:g}</td>"
        + "".join(f"<td>{html.escape(a)} {loss[a]:g}</td>" for a in ("baseline", "builtins") if a in loss)
        + "</tr>"
        for p in order
        for loss in policies[p]["governed_not_best"]
    )
    ablation = result.get("jitter_ablation") or {}
    jitter_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{row['error_latency_s']:g} s</td>"
        + "".join(
            f"<td>{row[k]['mean_peak_concurrent_retries']:g} ({row[k]['peak_concurrent_retries']})</td>"
            for k in ("with_jitter", "without_jitter")
        )
        + f"<td>{row['mean_peak_reduction']:.0%}</td></tr>"
        for name, row in ablation.items()
        if isinstance(row, dict) and "mean_peak_reduction" in row
    )
    extra = ""
    if losses:
        extra += (
            "<h2>Where governance does not win</h2><table><tr><th>policy</th><th>framework</th><th>scenario</th>"
            f"<th>metric</th><th>governed</th><th>better arm</th></tr>{losses}</table>"
            + _columns(
                [
                    ("policy", "the scripted model's behaviour (obedient, stubborn, calibrated)"),
                    ("framework", "langchain or crewai"),
                    ("scenario", "the simulated fault"),
                    ("metric", "the figure on which the governed agent did worse"),
                    ("governed", "the governed agent's figure"),
                    ("better arm", "the agent that did better, and its figure"),
                ]
            )
        )
    if jitter_rows:
        extra += (
            "<h2>Jitter ablation: peak concurrent retries, mean (max) over worlds</h2><table><tr><th>setting</th>"
            "<th>error latency</th><th>retry_jitter=0.5</th><th>retry_jitter=0</th><th>mean peak cut</th></tr>"
            f"{jitter_rows}</table>"
            + _columns(
                [
                    ("setting", "the failing service's behaviour (fast errors, the default breaker, slow errors)"),
                    ("error latency", "how long the service takes to fail"),
                    ("retry_jitter=0.5", "peak concurrent retries at the service with the default jitter"),
                    ("retry_jitter=0", "the same without jitter (retries in lock-step)"),
                    ("mean peak cut", "how much lower the mean peak is with jitter"),
                ]
            )
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>loop-governor bench</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        "svg{display:block;margin:1em 0}pre{background:#f6f6f6;padding:1em;white-space:pre-wrap}"
        "p.cols{font-size:13px;color:#555}</style></head><body>"
        f"<h1>loop-governor bench</h1><p><strong>{html.escape(result['note'])}</strong></p>"
        f"<p>random seed {result['seed']}, {result['runs']} run(s), "
        f"frameworks: {html.escape(', '.join(frameworks))}, scenarios: "
        f"{html.escape(', '.join(result.get('scenarios') or []))}</p>"
        + _policy_html(result)
        + "<h2>Tool-fault scenarios, first model</h2>"
        "<table><tr><th>metric</th><th>incident report: no governor</th>"
        "<th>incident report: governed</th>"
        + "".join(f"<th>{arm}</th>" for arm in ARMS)
        + f"</tr>{rows}</table>"
        + _columns(
            [
                ("metric", "what is measured, per task of the tool-fault scenarios (the rows below)"),
                ("incident report: no governor", f"{_INCIDENT}, without a governor ('-': not reported)"),
                ("incident report: governed", f"{_INCIDENT}, with one ('-': not reported)"),
                *_arm_columns(),
            ]
        )
        + _metrics_note([(label, key) for label, key, _ in _ROWS])
        + "".join(charts)
        + extra
        + f"<h2>Settings (identical faults and model policy for every arm)</h2><pre>{settings}</pre>"
        "</body></html>"
    )


def _policy_html(result: dict[str, Any]) -> str:
    """The summary table: per model policy and arm, over every scenario run."""
    rows = _SUMMARY
    head = "".join(f"<th>{html.escape(label.replace(chr(10), ' '))}</th>" for label, _, _ in rows)
    body = ""
    for name in result.get("model_policies_run", []):
        arms = result["model_policies"][name]
        for arm in ARMS:
            cells = [_cell(arms[arm], key, fmt) for _, key, fmt in rows]
            body += (
                f"<tr><td>{html.escape(name)}</td><td>{html.escape(_ARM_LABEL[arm])}</td>"
                + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                + "</tr>"
            )
    explained = [
        ("model policy", "the scripted model's behaviour (see below)"),
        ("agent", "; ".join(f"{_ARM_LABEL[arm]}: {_ARMS_EXPLAINED[arm]}" for arm in ARMS)),
        *((label.replace("\n", " "), _SUMMARY_EXPLAINED[key]) for label, key, _ in rows),
    ]
    return (
        f"<h2>Summary: every scenario run</h2><table><tr><th>model policy</th><th>agent</th>{head}</tr>{body}</table>"
        + _columns(explained)
        + f'<p class="cols">{html.escape(_POLICY_LEGEND)}</p>'
    )


def _pretty(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, sort_keys=True)
