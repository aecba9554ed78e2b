"""Issue 25 in LangChain: misuse fails at construction, programming errors propagate as
without the governor, a finished thread's checkpoint does not answer a new run, a stop
ends the task with its outcome, and ToolRetryMiddleware around the governor does not
make the model read attempts that were never made."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.tools import StructuredTool, tool
from lg_testing import governed

import loop_governor as lg
from langchain_governor import GovernorMiddleware, govern_tools
from loop_governor.context import ContextPruner


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def fetch_tool(backend: Any) -> Any:
    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return backend(url=url)

    return fetch_page


# -- misuse at construction ------------------------------------------------------------------


def test_misuse_fails_at_construction_naming_the_parameter(governor: lg.Governor, lc: Any) -> None:
    with pytest.raises(TypeError, match=r"governor must be a loop_governor\.Governor .*lg\.Governor\(config\)"):
        GovernorMiddleware(lg.GovernorConfig())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pruner must be an object with a prune"):
        GovernorMiddleware(governor, pruner=ContextPruner)  # type: ignore[arg-type]  # the class, not one
    with pytest.raises(TypeError, match="pruner_factory must be a function returning a new pruner"):
        GovernorMiddleware(governor, pruner_factory=ContextPruner())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pass pruner or pruner_factory, not both"):
        GovernorMiddleware(governor, pruner=ContextPruner(), pruner_factory=ContextPruner)
    GovernorMiddleware(governor, pruner_factory=ContextPruner)  # a class is a factory
    single = fetch_tool(lc.Backend())
    with pytest.raises(TypeError, match=r"govern_tools: tools must be a list of tools.*pass \[tool\]"):
        govern_tools(single, governor)  # type: ignore[arg-type]
    assert len(govern_tools([single], governor)) == 1


def test_a_tool_that_is_no_tool_fails_at_construction_naming_the_parameter(governor: lg.Governor) -> None:
    """Issue 35: ``govern_tools(["search"])`` used to fail with "'function' object has no
    attribute 'name'" (LangChain's ``tool("search")`` is a decorator)."""
    from langchain_governor import govern_tool

    def search(query: str) -> str:
        """Search the docs."""
        return query

    def undocumented(query: str) -> str:
        return query

    with pytest.raises(
        TypeError, match=r"^tools\[0\] must be a LangChain BaseTool .*the string 'search' .*not its name"
    ):
        govern_tools(["search"], governor)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^tool must be a LangChain BaseTool .*the string 'search'"):
        govern_tool("search", governor)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^tools\[1\] must be a LangChain BaseTool .*got NoneType"):
        govern_tools([search, None], governor)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^govern_tools: tools must be a list of tools, got the function search"):
        govern_tools(search, governor)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^govern_tools: tools must be a list of tools, got NoneType"):
        govern_tools(None, governor)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^tool: undocumented cannot become a LangChain tool: .*docstring"):
        govern_tool(undocumented, governor)
    with pytest.raises(TypeError, match=r"^tool must be .* not the class"):
        govern_tool(StructuredTool, governor)  # type: ignore[arg-type]
    assert [t.name for t in govern_tools([search], governor)] == ["search"]  # a documented function is a tool


# -- programming errors ------------------------------------------------------------------------


def test_an_async_only_tool_invoked_synchronously_raises_as_without_the_governor(
    governor: lg.Governor, lc: Any, events: list[dict[str, Any]]
) -> None:
    async def lookup(city: str) -> str:
        return city

    only_async = StructuredTool.from_function(coroutine=lookup, name="lookup", description="Look a city up.")

    def agent(middleware: list[Any]) -> Any:
        model = lc.ScriptedChatModel(script=lc.call_tool_until("lookup", 1, lambda i: {"city": "Paris"}))
        return create_agent(model, [only_async], middleware=middleware)

    with pytest.raises(NotImplementedError) as bare:
        agent([]).invoke({"messages": [("user", "go")]})
    with pytest.raises(NotImplementedError) as governed:
        agent([GovernorMiddleware(governor)]).invoke({"messages": [("user", "go")]})
    assert str(governed.value) == str(bare.value)
    assert not isinstance(governed.value, lg.AgentToolError)
    assert not [e for e in events if e["event"] == "tool_call"]  # not a tool failure


# -- no stale resume -----------------------------------------------------------------------------


def test_a_finished_thread_does_not_answer_a_new_run_from_its_checkpoint(lc: Any, tmp_path: Path) -> None:
    backend = lc.Backend()

    def run(**middleware: Any) -> list[Any]:
        gov = lg.Governor(lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}"), sleep=lambda s: None)
        model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/w"}))
        agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(gov, **middleware)])
        return lc.tool_messages(agent.invoke({"messages": [("user", "weather")]}, thread("t1"))["messages"])

    run()
    run()  # the quickstart run again, same thread_id: the tool is called again
    assert len(backend.calls) == 2
    run(resume=True)  # asked for: the finished thread's result comes back
    assert len(backend.calls) == 2


# -- a stop ends the task with its outcome ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stop_ends_the_task_with_its_outcome(
    governor: lg.Governor, lc: Any, events: list[dict[str, Any]], mode: str
) -> None:
    backend = lc.Backend([401], forever=True)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/a"}))
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor)])
    payload = {"messages": [("user", "go")]}
    with pytest.raises(lg.FatalError) as stop:
        if mode == "sync":
            agent.invoke(payload, thread("stop-1"))
        else:
            asyncio.run(agent.ainvoke(payload, thread("stop-1")))
    assert str(stop.value).startswith("loop-governor stopped the run: fetch_page (unauthorized, 401): ")
    assert stop.value.info.code == "unauthorized"  # every stop has a code to branch on
    (end,) = [e for e in events if e["event"] == "task_end"]
    assert end["task_id"] == "stop-1" and end["outcome"] == "stopped" and end["error_class"] == "FatalError"


# -- what the model reads --------------------------------------------------------------------------


def test_tool_retry_middleware_around_the_governor_reads_the_real_attempts(governor: lg.Governor, lc: Any) -> None:
    backend = lc.Backend([404], forever=True)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/gone"}))
    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor), retry])
    (message,) = lc.tool_messages(agent.invoke({"messages": [("user", "go")]})["messages"])
    assert len(backend.calls) == 1  # the retries were answered from the known outcome
    body = governed(message.content)
    assert body["type"] == "permanent" and "retries exhausted" not in message.content  # real requests only
