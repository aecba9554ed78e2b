"""A real crewAI Crew, a scripted model and failing backends: governed vs crewAI alone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from crewai.tools import tool
from crewai.tools.tool_failure import ToolFailureReason
from lg_testing import governed

import loop_governor as lg
from crewai_governor import govern_tool, govern_tools, install

ANSWER = "no docs today, answering from memory"


def _run(crew: Any, mode: str) -> Any:
    if mode == "kickoff":
        return crew.kickoff()
    if mode == "kickoff_async":
        return asyncio.run(crew.kickoff_async())
    return asyncio.run(crew.akickoff())


def test_crewai_alone_hammers_a_503_backend(kit: Any, native: bool) -> None:
    backend = kit.Backend(status=503, message="service unavailable")
    llm = kit.ScriptedLLM(model="scripted", native=native, script=kit.four_searches())

    out = kit.make_crew(llm, [kit.SearchTool(backend)]).kickoff()

    assert out.raw == ANSWER
    # native: one call per model request; ReAct: 3 attempts x 2 invokes per request
    assert backend.count == (4 if native else 24)


@pytest.mark.parametrize("mode", ["kickoff", "kickoff_async", "akickoff"])
def test_governed_503_reaches_backend_at_most_8_times(kit: Any, native: bool, mode: str, governor: lg.Governor) -> None:
    backend = kit.Backend(status=503, message="service unavailable")
    llm = kit.ScriptedLLM(model="scripted", native=native, script=kit.four_searches())
    crew = kit.make_crew(llm, govern_tools([kit.SearchTool(backend)], governor))

    with install(governor):
        out = _run(crew, mode)

    assert out.raw == ANSWER
    assert 1 <= backend.count <= 8
    assert len(llm.received) == 5  # four tool turns and the answer: no extra turns
    errors = kit.governed_errors(llm)
    assert len(errors) == 4
    assert {e["type"] for e in errors} == {"transient"}
    assert all("search_docs" in e["advice"] and "retryable" not in e for e in errors)
    # the first request was retried inside the governor; the model saw one outcome
    assert errors[0]["outcome"] == f"retries exhausted after {governor.config.retry_max_attempts} attempts"
    assert "service unavailable" in errors[0]["message"]
    # crewAI recorded the failures as the tool's own (raised), carrying the governor's JSON
    failures = out.tasks_output[0].tool_failures
    assert len(failures) == 4
    assert all(f.failure.reason is ToolFailureReason.EXCEPTION for f in failures)
    assert all(governed(f.failure.message)["advice"].startswith("search_docs ") for f in failures)


def test_governed_beats_crewai_alone_on_react(kit: Any, governor: lg.Governor) -> None:
    alone, governed = kit.Backend(status=503), kit.Backend(status=503)
    kit.make_crew(kit.ScriptedLLM(model="scripted", script=kit.four_searches()), [kit.SearchTool(alone)]).kickoff()
    llm = kit.ScriptedLLM(model="scripted", script=kit.four_searches())
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(governed), governor)])
    with install(governor):
        crew.kickoff()
    assert alone.count == 24
    assert governed.count <= 8
    assert governed.count * 3 <= alone.count


def test_404_reaches_backend_once(kit: Any, native: bool, governor: lg.Governor) -> None:
    backend = kit.Backend(status=404, message="no such page")
    same = kit.ToolStep("search_docs", {"query": "missing"})
    llm = kit.ScriptedLLM(model="scripted", native=native, script=[same, same, kit.Final("gave up on it")])
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with install(governor):
        out = crew.kickoff()

    assert out.raw == "gave up on it"
    assert backend.count == 1
    errors = kit.governed_errors(llm)
    assert errors and errors[0]["type"] == "permanent" and errors[0]["message"].endswith("no such page")


def test_404_without_install_in_explicit_task_scope(kit: Any, governor: lg.Governor) -> None:
    backend = kit.Backend(status=404)
    same = kit.ToolStep("search_docs", {"query": "missing"})
    llm = kit.ScriptedLLM(model="scripted", native=True, script=[same, same, kit.Final("done")])
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with governor.task("crew-run-1"):
        assert crew.kickoff().raw == "done"

    assert backend.count == 1
    assert [e["type"] for e in kit.governed_errors(llm)] == ["permanent"] * 2


@pytest.mark.parametrize("mode", ["kickoff", "kickoff_async", "akickoff"])
def test_fatal_error_stops_the_crew(kit: Any, native: bool, mode: str, governor: lg.Governor) -> None:
    backend = kit.Backend(status=401, message="invalid api key")
    llm = kit.ScriptedLLM(model="scripted", native=native, script=kit.four_searches())
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with pytest.raises(lg.FatalError) as caught, install(governor):
        _run(crew, mode)

    assert caught.value.info.error_type is lg.ErrorType.FATAL
    assert caught.value.info.status == 401
    assert backend.count == 1  # no crewAI retry, no agent-level task retry
    assert len(llm.received) == 1  # the model was not asked again


def test_fatal_error_stops_the_crew_without_hooks_installed(kit: Any, native: bool, governor: lg.Governor) -> None:
    backend = kit.Backend(status=401, message="invalid api key")
    llm = kit.ScriptedLLM(model="scripted", native=native, script=kit.four_searches())
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with pytest.raises(lg.FatalError):
        crew.kickoff()
    assert backend.count == 1


def test_success_passes_through_unchanged(kit: Any, native: bool, governor: lg.Governor) -> None:
    backend = kit.Backend()
    llm = kit.ScriptedLLM(
        model="scripted", native=native, script=[kit.ToolStep("search_docs", {"query": "ok"}), kit.Final("found it")]
    )
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with install(governor):
        out = crew.kickoff()

    assert out.raw == "found it"
    assert backend.hits == [{"query": "ok"}]
    assert "results for {'query': 'ok'}" in kit.all_text(llm)
    assert out.tasks_output[0].tool_failures == []


def test_decorated_tool_is_governed(kit: Any, native: bool, governor: lg.Governor) -> None:
    calls: list[str] = []

    @tool("lookup")
    def lookup(key: str) -> str:
        """Look a key up in the registry."""
        calls.append(key)
        raise ConnectionError("connection reset by peer")

    llm = kit.ScriptedLLM(
        model="scripted", native=native, script=[kit.ToolStep("lookup", {"key": "k"}), kit.Final("ok")]
    )
    crew = kit.make_crew(llm, [govern_tool(lookup, governor)])
    with install(governor):
        assert crew.kickoff().raw == "ok"

    assert len(calls) == governor.config.retry_max_attempts
    assert kit.governed_errors(llm)[0]["type"] == "transient"


def test_open_breaker_short_circuits_before_the_tool(
    kit: Any, native: bool, make_governor: Callable[..., lg.Governor]
) -> None:
    governor = make_governor(breaker_failure_threshold=1, retry_max_attempts=1)
    backend = kit.Backend(status=503)
    llm = kit.ScriptedLLM(model="scripted", native=native, script=kit.four_searches())
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with install(governor):
        out = crew.kickoff()

    assert out.raw == ANSWER
    assert backend.count == 1  # the breaker opened on the first failure
    shown = "\n".join(str(m.get("content")) for m in llm.received[-1])
    assert "Tool execution blocked by hook" not in shown
    errors = kit.governed_errors(llm)
    assert ["circuit breaker is open" in e["message"] for e in errors[1:]] == [True] * 3
    assert all(e["type"] == "transient" for e in errors)


def test_step_budget_stops_the_crew(kit: Any, make_governor: Callable[..., lg.Governor]) -> None:
    governor = make_governor(max_steps=3)
    backend = kit.Backend()
    llm = kit.ScriptedLLM(model="scripted", native=True, script=kit.four_searches())
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with pytest.raises(lg.BudgetExhaustedError), install(governor):
        crew.kickoff()
    # a step is an iteration: a model decision and its tool call. Three ran; the 4th model
    # call is refused and stops the run
    assert len(llm.received) == 3
    assert backend.count == 3
