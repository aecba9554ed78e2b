"""crewAI's own contracts for a failing or limited tool hold for a governed tool too.

crewAI reports a tool that raises with a ``ToolUsageErrorEvent`` (not its success event),
counts it in ``task.tools_errors`` and records the failure with reason ``exception``;
usage limits are counted on the tool object the user made. Dashboards and guards built
on those keep working when the tools are governed -- while crewAI's ReAct loop still never
re-runs a failing call the governor already retried, and the model reads the governor's
JSON alone.
"""

from __future__ import annotations

import threading
from typing import Any

from crewai.events.event_bus import crewai_event_bus
from crewai.events.types.tool_usage_events import ToolUsageErrorEvent, ToolUsageFinishedEvent
from crewai.tools.tool_failure import ToolFailureReason
from lg_testing import governed

import loop_governor as lg
from crewai_governor import govern_tool


class _ToolEvents:
    """crewAI's tool events for one tool name (handlers run on crewAI's thread pool)."""

    def __init__(self, tool_name: str) -> None:
        self.errors: list[Any] = []
        self.finished: list[Any] = []
        self._lock = threading.Lock()
        self._name = tool_name

        def on_error(_source: Any, event: ToolUsageErrorEvent) -> None:
            if event.tool_name == self._name:
                with self._lock:
                    self.errors.append(event)

        def on_finished(_source: Any, event: ToolUsageFinishedEvent) -> None:
            if event.tool_name == self._name:
                with self._lock:
                    self.finished.append(event)

        self._handlers = [(ToolUsageErrorEvent, on_error), (ToolUsageFinishedEvent, on_finished)]
        for event_type, handler in self._handlers:
            crewai_event_bus.register_handler(event_type, handler)

    def close(self) -> None:
        crewai_event_bus.flush()
        for event_type, handler in self._handlers:
            crewai_event_bus.off(event_type, handler)


def _run_failing_search(kit: Any, governor: lg.Governor, native: bool, status: int) -> tuple[Any, Any, Any, Any]:
    backend = kit.Backend(status=status, message="backend says no")
    llm = kit.ScriptedLLM(
        model="scripted", native=native, script=[kit.ToolStep("search_docs", {"query": "q"}), kit.Final("done")]
    )
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])
    events = _ToolEvents("search_docs")
    try:
        out = crew.kickoff()
    finally:
        events.close()
    return out, crew, backend, (events, llm)


def test_a_failing_governed_tool_is_a_failed_tool_call_to_crewai(kit: Any, governor: lg.Governor, native: bool) -> None:
    out, crew, backend, (events, llm) = _run_failing_search(kit, governor, native, status=503)

    assert out.raw == "done"
    # crewAI's error event, never its success event, for the failed call
    assert events.errors and not events.finished
    assert all(governed(e.error)["type"] == "transient" for e in events.errors)
    # counted as tool errors, recorded as a raised failure
    assert crew.tasks[0].tools_errors >= 1
    failures = out.tasks_output[0].tool_failures
    assert [f.failure.reason for f in failures] == [ToolFailureReason.EXCEPTION]
    attempts = governor.config.retry_max_attempts
    assert f"retries exhausted after {attempts} attempts" in failures[0].failure.message
    # the governor retried; crewAI's ReAct loop (3 attempts x 2 invocations) did not add any
    assert backend.count == governor.config.retry_max_attempts
    # what the model read after the call: the governor's JSON, without crewAI's wording
    answer_prompt = llm.received[-1]
    seen = [m for m in answer_prompt if m.get("role") == "tool"] if native else answer_prompt[-2:-1]
    text = str(seen[-1]["content"])
    body = text.split("Observation: ", 1)[-1]
    assert governed(body)["message"] == "HTTPStatusError: HTTP 503: backend says no" and body.startswith("Error: HTTP")
    assert "Error executing tool" not in text and "I encountered an error" not in text


def test_a_permanent_failure_is_counted_once_per_crewai_attempt(kit: Any, governor: lg.Governor) -> None:
    out, crew, backend, (events, _llm) = _run_failing_search(kit, governor, native=True, status=404)
    assert backend.count == 1
    assert crew.tasks[0].tools_errors == 1 and len(events.errors) == 1
    assert out.tasks_output[0].tool_failures[0].failure.reason is ToolFailureReason.EXCEPTION


def test_usage_limits_count_on_the_users_own_tool(kit: Any, governor: lg.Governor, native: bool) -> None:
    def run(wrap: bool) -> tuple[Any, Any, Any]:
        backend = kit.Backend()
        mine = kit.SearchTool(backend, max_usage_count=2)
        tool = govern_tool(mine, governor) if wrap else mine
        steps = [kit.ToolStep("search_docs", {"query": f"q{i}"}) for i in range(3)] + [kit.Final("done")]
        llm = kit.ScriptedLLM(model="scripted", native=native, script=steps)
        assert kit.make_crew(llm, [tool]).kickoff().raw == "done"
        assert "usage limit" in kit.all_text(llm)
        return backend, mine, tool

    plain_backend, plain_tool, _ = run(wrap=False)
    backend, mine, governed = run(wrap=True)

    # the limit stops the same calls as without the governor (crewAI's ReAct path counts
    # a call twice), and it is counted on the user's own tool, the wrapper agreeing
    assert backend.count == plain_backend.count >= 1
    assert mine.current_usage_count == plain_tool.current_usage_count == 2
    assert governed.current_usage_count == mine.current_usage_count
    governed.reset_usage_count()
    assert mine.current_usage_count == 0
