"""`loop-governor demo`: a scripted agent loop against fault-injecting tools, on virtual time.

It shows, step by step, what reaches the backend and what the model reads, for the
same scripted "model" with and without the governor. The model is a simulation, not a
real LLM: given a plain error string it calls again (as agents were observed to do);
given the governor's structured error it follows ``retryable`` and moves on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from loop_governor.config import GovernorConfig
from loop_governor.errors import AgentToolError, FatalError, read_model_text
from loop_governor.governor import Governor


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status_code = status


@dataclass
class _Tool:
    """A backend that fails by script: ``faults`` first, then ``forever`` (or success)."""

    name: str
    faults: list[_HTTPError | None] = field(default_factory=list)
    forever: _HTTPError | None = None
    calls: int = 0

    def __call__(self, arg: str) -> str:
        self.calls += 1
        if self.faults:
            fault = self.faults.pop(0)
            if fault is not None:
                raise fault
        elif self.forever is not None:
            raise self.forever
        return f"{self.name}({arg}) -> 200 OK"


def _tools() -> dict[str, _Tool]:
    return {
        "search": _Tool("search", faults=[_HTTPError(503, "upstream unavailable")] * 2),
        "fetch_doc": _Tool("fetch_doc", forever=_HTTPError(404, "document 'Q3-report' not found")),
        "pricing_api": _Tool("pricing_api", forever=_HTTPError(503, "service unavailable")),
        "crm": _Tool("crm", forever=_HTTPError(401, "token expired")),
    }


# The scripted task: (tool, argument, how many times the model insists on plain errors).
_PLAN: list[tuple[str, str, int]] = [
    ("search", "quarterly revenue", 6),
    ("fetch_doc", "Q3-report", 6),
    ("pricing_api", "sku-1", 10),
    ("crm", "account-7", 6),
]


def _run_plain(console: Console) -> tuple[int, list[list[str]]]:
    tools = _tools()
    rows: list[list[str]] = []
    for tool_name, arg, insist in _PLAN:
        tool = tools[tool_name]
        for attempt in range(1, insist + 1):
            try:
                out = tool(arg)
                rows.append([tool_name, str(attempt), out])
                break
            except Exception as exc:  # the model reads the string and calls again
                rows.append([tool_name, str(attempt), f"Error: {exc}"])
    return sum(t.calls for t in tools.values()), rows


def _run_governed(console: Console) -> tuple[int, list[list[str]], float]:
    tools = _tools()
    clock = _Clock()
    gov = Governor(GovernorConfig(), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    retries: list[str] = []
    gov.subscribe(
        lambda e: retries.append(f"{e['tool']} retry in {e['delay_s']:.1f}s") if e["event"] == "retry" else None
    )
    rows: list[list[str]] = []
    with gov.task("demo-task"):
        for tool_name, arg, insist in _PLAN:
            tool = tools[tool_name]
            for attempt in range(1, insist + 1):
                before = tool.calls
                try:
                    out = gov.call(tool_name, tool, arg)
                    rows.append([tool_name, str(attempt), str(tool.calls - before), out])
                    break
                except FatalError as exc:
                    rows.append([tool_name, str(attempt), str(tool.calls - before), "STOP " + exc.info.to_model_text()])
                    return sum(t.calls for t in tools.values()), rows, clock.now
                except AgentToolError as exc:
                    text = exc.info.to_model_text()
                    rows.append([tool_name, str(attempt), str(tool.calls - before), text])
                    if not (read_model_text(text) or {}).get("retryable", False):
                        break  # the model follows the structured advice and moves on
    return sum(t.calls for t in tools.values()), rows, clock.now


def run_demo(console: Console | None = None) -> dict[str, Any]:
    """Run both arms and print them; returns the backend call counts."""
    console = console or Console()
    console.rule("[bold]loop-governor demo[/bold] - a scripted agent loop (simulation, not a real model)")
    plain_calls, plain_rows = _run_plain(console)
    table = Table(title="Without the governor: the model reads error strings and calls again")
    for col in ("tool", "model call #", "what the model reads"):
        table.add_column(col, overflow="fold")
    for row in plain_rows:
        table.add_row(*row)
    console.print(table)

    gov_calls, gov_rows, elapsed = _run_governed(console)
    table = Table(title="With the governor: retries inside, one typed outcome per call")
    for col in ("tool", "model call #", "backend calls", "what the model reads"):
        table.add_column(col, overflow="fold")
    for row in gov_rows:
        table.add_row(*row)
    console.print(table)
    console.print(
        f"backend calls: [red]{plain_calls}[/red] without, [green]{gov_calls}[/green] with the governor; "
        f"the governed run stopped at the expired credential (fatal) after {elapsed:.1f}s of virtual backoff."
    )
    return {"plain_backend_calls": plain_calls, "governed_backend_calls": gov_calls}


def register(app: typer.Typer) -> None:
    @app.command()
    def demo() -> None:
        """A short scripted run of governed calls against fault-injecting tools."""
        run_demo()
