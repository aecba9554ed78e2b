"""govern_tool on its own: same tool to crewAI, governed outcomes, fatal stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from crewai.hooks.dispatch import HookAborted
from crewai.tools import BaseTool, tool
from crewai.tools.tool_failure import ToolFailure
from crewai.utilities.agent_utils import convert_tools_to_openai_schema

import loop_governor as lg
from crewai_governor import (
    GovernedTool,
    GovernedToolError,
    GovernedToolFailure,
    govern_tool,
    govern_tools,
    stop_error,
)


@tool("word_count")
def word_count(text: str, limit: int = 100) -> int:
    """Count the words of a text, up to a limit."""
    return min(len(text.split()), limit)


def test_wrapped_tool_looks_identical_to_crewai(kit: Any, governor: lg.Governor) -> None:
    originals: list[BaseTool] = [kit.SearchTool(kit.Backend()), word_count]
    governed = govern_tools(originals, governor)
    for original, wrapped in zip(originals, governed, strict=True):
        assert isinstance(wrapped, GovernedTool) and wrapped.inner is original
        assert wrapped.name == original.name
        assert wrapped.description == original.description
        assert wrapped.args_schema is original.args_schema
        assert wrapped.result_schema is original.result_schema
        assert wrapped.formatted_description == original.formatted_description  # ReAct prompt
        assert wrapped.to_structured_tool().args == original.to_structured_tool().args
    # native function calling: byte-identical tool schemas
    assert convert_tools_to_openai_schema(governed)[0] == convert_tools_to_openai_schema(originals)[0]


def test_direct_run_returns_values_and_raises_structured_failures(kit: Any, governor: lg.Governor) -> None:
    assert govern_tool(word_count, governor).run(text="a b c") == 3

    failing = govern_tool(kit.SearchTool(kit.Backend(status=404, message="no such page")), governor)
    with pytest.raises(GovernedToolError) as raised:
        failing.run(query="x")
    assert str(raised.value) == raised.value.info.to_model_text()  # exactly the governor's JSON
    assert raised.value.info.error_type is lg.ErrorType.PERMANENT and raised.value.info.status == 404
    assert isinstance(raised.value.__cause__, kit.HTTPStatusError)  # the tool's own exception


def test_fatal_failure_is_carried_and_can_be_raised(kit: Any, governor: lg.Governor) -> None:
    failing = govern_tool(kit.SearchTool(kit.Backend(status=401, message="bad key")), governor)
    result = failing.run(query="x")
    assert isinstance(result, GovernedToolFailure)
    assert isinstance(result.fatal, lg.FatalError)
    with pytest.raises(lg.FatalError):
        result.raise_if_fatal()


def test_stop_error_is_both_the_fatal_class_and_a_crewai_stop() -> None:
    info = lg.GovernedError(error_type=lg.ErrorType.FATAL, tool="t", message="budget spent", code="max_steps")
    original = lg.BudgetExhaustedError(info, partial_results=["half"])
    stop = stop_error(original)
    assert isinstance(stop, lg.BudgetExhaustedError) and isinstance(stop, HookAborted)
    assert stop.info == info and stop.partial_results == ["half"]  # type: ignore[attr-defined]
    assert stop.__cause__ is original
    assert stop_error(stop) is stop


def test_default_governor_and_rewrapping(kit: Any, governor: lg.Governor, make_governor: Any) -> None:
    inner = kit.SearchTool(kit.Backend())
    wrapped = govern_tool(inner)
    assert wrapped.governor is lg.default_governor()
    assert govern_tool(wrapped) is wrapped
    other = make_governor()
    rewrapped = govern_tool(wrapped, other)
    assert rewrapped.governor is other and rewrapped.inner is inner
    with pytest.raises(TypeError):
        govern_tool(lambda: None, governor)  # type: ignore[arg-type]


def test_async_tool_is_governed_with_acall(governor: lg.Governor) -> None:
    attempts: list[str] = []

    @tool("async_fetch")
    async def async_fetch(url: str) -> str:
        """Fetch a URL."""
        attempts.append(url)
        if len(attempts) < 3:
            raise TimeoutError("read timed out")
        return "body"

    governed = govern_tool(async_fetch, governor)
    assert asyncio.run(governed.arun(url="https://example.invalid/x")) == "body"
    assert len(attempts) == 3


def test_sync_tool_through_arun(kit: Any, governor: lg.Governor) -> None:
    backend = kit.Backend(status=503)
    governed = govern_tool(kit.SearchTool(backend), governor)
    with pytest.raises(GovernedToolError) as raised:
        asyncio.run(governed.arun(query="x"))
    assert raised.value.info.error_type is lg.ErrorType.TRANSIENT
    assert backend.count == governor.config.retry_max_attempts


def test_failures_are_never_cached_by_crewai(kit: Any, governor: lg.Governor) -> None:
    wrapped = govern_tool(kit.SearchTool(kit.Backend()), governor)
    assert wrapped.cache_function({"query": "x"}, ToolFailure(message="boom")) is False
    # successes stay cacheable: crewAI caches only for a crew that opted in (cache=True)
    assert wrapped.cache_function({"query": "x"}, "fine") is True

    backend = kit.Backend(status=503, fail_first=governor.config.retry_max_attempts)
    same = kit.ToolStep("search_docs", {"query": "flaky"})
    llm = kit.ScriptedLLM(model="scripted", native=True, script=[same, same, kit.Final("done")])
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)], cache=True)
    assert crew.kickoff().raw == "done"
    # the second identical request reached the (recovered) service instead of a cached 503
    assert backend.count == governor.config.retry_max_attempts + 1
    tool_results = [m["content"] for m in llm.received[-1] if m.get("role") == "tool"]
    assert "Temporary failure" in tool_results[0] and tool_results[1].startswith("results for")


def test_inner_cache_function_still_applies(kit: Any, governor: lg.Governor) -> None:
    def only_short(_args: Any, result: Any) -> bool:
        return len(str(result)) < 5

    inner = kit.SearchTool(kit.Backend())
    inner.cache_function = only_short
    wrapped = govern_tool(inner, governor)
    assert wrapped.cache_function({}, "abc") is True
    assert wrapped.cache_function({}, "abcdefgh") is False
    assert wrapped.cache_function({}, ToolFailure(message="x")) is False
