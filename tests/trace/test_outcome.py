"""Issue 25 in the trace: the report says how each task ended and keeps runs appended to
one trace apart; the OTel run span carries the outcome; the CLI report is the same page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lg_testing import Backend, HTTPError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from typer.testing import CliRunner

import loop_governor as lg
from loop_governor.cli import app
from loop_governor.trace import install, load_trace
from loop_governor.trace.report import render_report, runs_apart


def _model_call(gov: lg.Governor, turn_text: str) -> None:
    gov.emit("model_call", model="m", status="ok", input_tokens=10, output_tokens=1, messages=[turn_text])


def _one_run(path: Path, *, stop: bool) -> None:
    """One process's run of task "t1": two model calls, a tool call, maybe a stop."""
    gov = lg.Governor(lg.GovernorConfig(trace_path=str(path)), sleep=lambda s: None)
    try:
        with gov.task("t1"):
            _model_call(gov, "hello")
            gov.call("search", Backend(), "q")
            _model_call(gov, "hello again")
            if stop:
                with pytest.raises(lg.FatalError):
                    gov.call("crm", Backend(forever=HTTPError(401, "token expired")))
    finally:
        gov.lens.close()


def test_runs_appended_to_one_trace_stay_apart_with_their_outcomes(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    _one_run(path, stop=False)
    _one_run(path, stop=True)  # the same script run again, same trace path, same task id
    trace = load_trace(path)
    assert len({e.get("run_id") for e in trace.events}) == 2
    apart = runs_apart(trace)
    turns: dict[Any, list[Any]] = {}
    for call in apart.model_calls:
        turns.setdefault(call["task_id"], []).append(call["turn"])
    assert turns == {"t1 · run 1": [1, 2], "t1 · run 2": [1, 2]}  # not 1,2,1,2 in one task
    page = render_report(trace)
    ended = page.split("How each task ended")[1].split("</section>")[0]
    assert "t1 · run 1</td><td>completed" in ended
    assert "t1 · run 2</td><td>stopped" in ended and "crm (unauthorized, 401): HTTPError: token expired" in ended
    # the CLI writes the same page
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "t1 · run 2</td><td>stopped" in out.read_text(encoding="utf-8")
    assert "task t1 · run 2 stopped: FatalError crm (unauthorized, 401): HTTPError: token expired" in " ".join(
        result.output.split()
    )


def test_a_trace_with_one_run_keeps_its_task_ids(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    _one_run(path, stop=False)
    trace = load_trace(path)
    assert runs_apart(trace) is trace


def test_the_otel_run_span_carries_the_outcome() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gov = lg.Governor(sleep=lambda s: None)
    lens = install(gov, tracer_provider=provider)
    with gov.task("fine"):
        gov.call("search", Backend(), "q")
    with gov.task("stopped"), pytest.raises(lg.FatalError):
        gov.call("billing", Backend(forever=HTTPError(402, "payment required")))
    lens.close()
    runs = {
        s.attributes["loop_governor.task.id"]: s
        for s in exporter.get_finished_spans()
        if s.name.startswith("invoke_agent")
    }
    fine, stopped = runs["fine"], runs["stopped"]
    assert fine.attributes["loop_governor.task.outcome"] == "completed"
    assert fine.status.status_code is not StatusCode.ERROR
    assert stopped.attributes["loop_governor.task.outcome"] == "stopped"
    assert stopped.attributes["error.type"] == "FatalError"
    assert "billing (payment_required, 402)" in str(stopped.attributes["loop_governor.stop.reason"])
    assert stopped.status.status_code is StatusCode.ERROR
