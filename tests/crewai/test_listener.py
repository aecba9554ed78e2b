"""GovernorEventListener: crewAI's event bus -> governor events, usage normalized."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lg_testing import governed

import loop_governor as lg
from crewai_governor import GovernorEventListener, govern_tool, install

OPENAI_USAGE = {"prompt_tokens": 120, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 64}}
# Anthropic's raw shape: input_tokens excludes the cache counters, which come separately
ANTHROPIC_USAGE = {
    "input_tokens": 20,
    "output_tokens": 5,
    "cache_read_input_tokens": 100,
    "cache_creation_input_tokens": 10,
}


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (OPENAI_USAGE, {"input_tokens": 120, "output_tokens": 30, "cache_read_tokens": 64, "cache_creation_tokens": 0}),
        (
            ANTHROPIC_USAGE,
            {"input_tokens": 130, "output_tokens": 5, "cache_read_tokens": 100, "cache_creation_tokens": 10},
        ),
    ],
    ids=["openai", "anthropic"],
)
def test_model_calls_carry_normalized_usage(
    kit: Any,
    governor: lg.Governor,
    events: list[dict[str, Any]],
    usage: dict[str, Any],
    expected: dict[str, int],
) -> None:
    llm = kit.ScriptedLLM(
        model="scripted-model",
        native=True,
        usage=usage,
        script=[kit.ToolStep("search_docs", {"query": "x"}), kit.Final("done")],
    )
    with GovernorEventListener(governor) as lens:
        kit.make_crew(llm, [kit.SearchTool(kit.Backend())]).kickoff()
        lens.flush()

    calls = [e for e in events if e["event"] == "model_call"]
    assert len(calls) == len(llm.received) == 2
    for event, received in zip(calls, llm.received, strict=True):
        assert {k: event[k] for k in expected} == expected
        assert event["model"] == "scripted-model"
        assert event["latency_s"] is not None and event["latency_s"] >= 0
        assert event["agent_role"] == "researcher"
        assert event["crewai_task_id"]
        assert [m["role"] for m in event["messages"]] == [m["role"] for m in received]
    assert [e["finish_reason"] for e in calls] == ["tool_calls", "stop"]


def test_governed_failures_reach_the_governor_once(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    backend = kit.Backend(status=404)
    llm = kit.ScriptedLLM(
        model="scripted", native=True, script=[kit.ToolStep("search_docs", {"query": "gone"}), kit.Final("done")]
    )
    with GovernorEventListener(governor) as lens, install(governor):
        kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)]).kickoff()
        lens.flush()

    tool_calls = [e for e in events if e["event"] == "tool_call"]
    # the governor reported the call; the listener did not add crewAI's copy of it
    assert len(tool_calls) == 1 and tool_calls[0]["error_type"] == "permanent"
    failures = [e for e in events if e["event"] == "tool_failure"]
    assert len(failures) == 1
    assert failures[0]["governed"] is True and failures[0]["reason"] == "exception"
    assert governed(failures[0]["message"])["type"] == "permanent"


def test_ungoverned_tools_are_reported_from_crewai_events(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    from crewai.tools import tool

    @tool("flaky_lookup")
    def flaky_lookup(key: str) -> str:
        """Look a key up."""
        raise kit.HTTPStatusError(503, "HTTP 503: upstream unavailable")

    @tool("calculator")
    def calculator(expression: str) -> str:
        """Evaluate an expression."""
        return "4"

    llm = kit.ScriptedLLM(
        model="scripted",
        native=True,
        script=[
            kit.ToolStep("flaky_lookup", {"key": "a"}),
            kit.ToolStep("calculator", {"expression": "2+2"}),
            kit.Final("done"),
        ],
    )
    with GovernorEventListener(governor) as lens:
        kit.make_crew(llm, [flaky_lookup, calculator]).kickoff()
        lens.flush()

    by_tool = {e["tool"]: e for e in events if e["event"] == "tool_call"}
    assert by_tool["flaky_lookup"]["status"] == "error"
    assert by_tool["flaky_lookup"]["error_type"] == "transient"
    assert by_tool["flaky_lookup"]["source"] == "crewai"
    assert by_tool["calculator"]["status"] == "ok"
    assert by_tool["calculator"]["call_key"] == lg.call_key("calculator", (), {"expression": "2+2"})
    failures = [e for e in events if e["event"] == "tool_failure"]
    assert [(f["tool"], f["reason"], f["governed"]) for f in failures] == [("flaky_lookup", "exception", False)]


def test_close_unregisters_the_listener(kit: Any, governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    lens = GovernorEventListener(governor)
    lens.close()
    llm = kit.ScriptedLLM(model="scripted", native=True, script=[kit.Final("done")])
    kit.make_crew(llm, []).kickoff()
    lens.flush()
    assert [e for e in events if e["event"] == "model_call"] == []


def test_an_ungoverned_tool_sharing_a_governed_tools_name_is_reported(
    kit: Any, governor: lg.Governor, make_governor: Any, events: list[dict[str, Any]], native: bool
) -> None:
    # some other crew or module governs a tool named search_docs ...
    govern_tool(kit.SearchTool(kit.Backend()), make_governor())
    # ... this crew's search_docs is not governed: crewAI's events are all there is
    llm = kit.ScriptedLLM(
        model="scripted", native=native, script=[kit.ToolStep("search_docs", {"query": "a"}), kit.Final("done")]
    )
    with GovernorEventListener(governor) as lens:
        kit.make_crew(llm, [kit.SearchTool(kit.Backend())]).kickoff()
        lens.flush()

    tool_calls = [e for e in events if e["event"] == "tool_call"]
    assert [(e["tool"], e["status"], e["source"]) for e in tool_calls] == [("search_docs", "ok", "crewai")]


def test_calls_of_this_governors_tools_are_not_reported_twice(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]], native: bool
) -> None:
    backend = kit.Backend()
    llm = kit.ScriptedLLM(
        model="scripted", native=native, script=[kit.ToolStep("search_docs", {"query": "a"}), kit.Final("done")]
    )
    with GovernorEventListener(governor) as lens, install(governor):
        kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)]).kickoff()
        lens.flush()

    tool_calls = [e for e in events if e["event"] == "tool_call"]
    assert backend.count == 1
    assert len(tool_calls) == 1 and "source" not in tool_calls[0]


def test_traced_prompts_carry_tool_calls_as_the_model_received_them(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    llm = kit.ScriptedLLM(
        model="scripted", native=True, script=[kit.ToolStep("search_docs", {"query": "it's"}), kit.Final("done")]
    )
    with GovernorEventListener(governor) as lens:
        kit.make_crew(llm, [govern_tool(kit.SearchTool(kit.Backend()), governor)]).kickoff()
        lens.flush()

    second = [e for e in events if e["event"] == "model_call"][1]
    traced = [m["tool_calls"] for m in second["messages"] if m.get("tool_calls")]
    sent = [m["tool_calls"] for m in llm.received[1] if m.get("tool_calls")]
    assert traced == sent  # crewAI's event has them as "'search_docs'" and "'{...}'"
    assert traced[0][0]["function"]["name"] == "search_docs"
    assert json.loads(traced[0][0]["function"]["arguments"]) == {"query": "it's"}
