"""``govern_tool``: same tool to LangChain, governed failures as structured results."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, tool
from lg_testing import governed
from pydantic import BaseModel

import loop_governor as lg
from langchain_governor import GovernedTool, govern_tool, govern_tools


def _tool_call(name: str, args: dict[str, Any], call_id: str = "call_1") -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def make_fetch(backend: Any) -> BaseTool:
    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return backend(url=url)

    return fetch_page


def make_afetch(backend: Any) -> BaseTool:
    @tool
    async def fetch_page(url: str) -> str:
        """Fetch a web page (async)."""
        return backend(url=url)

    return fetch_page


class RowsInput(BaseModel):
    query: str


def test_wrapper_keeps_everything_langchain_and_models_see(governor: lg.Governor) -> None:
    inner = StructuredTool.from_function(
        func=lambda query: (query, [query]),
        name="rows",
        description="Search rows.",
        args_schema=RowsInput,
        response_format="content_and_artifact",
        return_direct=True,
        tags=["db"],
        metadata={"owner": "data"},
    )
    wrapped = govern_tool(inner, governor)
    assert isinstance(wrapped, GovernedTool)
    assert wrapped.name == "rows"
    assert wrapped.description == "Search rows."
    assert wrapped.args_schema is RowsInput
    assert wrapped.response_format == "content_and_artifact"
    assert wrapped.return_direct is True
    assert wrapped.tags == ["db"]
    assert wrapped.metadata == {"owner": "data"}
    assert wrapped.tool_call_schema.model_json_schema() == inner.tool_call_schema.model_json_schema()


def test_success_matches_the_plain_tool_including_artifact(governor: lg.Governor) -> None:
    @tool(response_format="content_and_artifact")
    def rows(query: str) -> tuple[str, list[int]]:
        """Search rows."""
        return f"2 rows for {query}", [1, 2]

    wrapped = govern_tool(rows, governor)
    plain_msg = rows.invoke(_tool_call("rows", {"query": "x"}))
    governed_msg = wrapped.invoke(_tool_call("rows", {"query": "x"}))
    assert isinstance(governed_msg, ToolMessage)
    assert governed_msg.content == plain_msg.content == "2 rows for x"
    assert governed_msg.artifact == [1, 2]
    assert governed_msg.status == "success"
    assert wrapped.invoke({"query": "x"}) == rows.invoke({"query": "x"}) == "2 rows for x"


def test_permanent_failure_becomes_error_tool_message(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([404])
    fetch = govern_tool(make_fetch(backend), governor)
    message = fetch.invoke(_tool_call("fetch_page", {"url": "https://x/missing"}))
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert message.tool_call_id == "call_1"
    error = governed(message.content)
    assert error["type"] == "permanent"
    assert "404" in error["message"]
    assert "fetch_page" in error["advice"]
    assert len(backend.calls) == 1


def test_without_a_tool_call_the_error_is_the_plain_model_text(lc: Any, governor: lg.Governor) -> None:
    fetch = govern_tool(make_fetch(lc.Backend([404])), governor)
    result = fetch.invoke({"url": "https://x/missing"})
    assert isinstance(result, str)
    assert governed(result)["type"] == "permanent" and result.startswith("Error: ")


def test_transient_failures_are_retried_inside_one_invoke(lc: Any, governor: lg.Governor, sleeps: Any) -> None:
    backend = lc.Backend([503, 503, None])
    fetch = govern_tool(make_fetch(backend), governor)
    message = fetch.invoke(_tool_call("fetch_page", {"url": "https://x/busy"}))
    assert message.status == "success"
    assert message.content.startswith("result for")
    assert len(backend.calls) == 3
    assert len(sleeps.delays) == 2  # backoff ran on virtual time


def test_fatal_failure_propagates(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([401])
    fetch = govern_tool(make_fetch(backend), governor)
    with pytest.raises(lg.FatalError) as caught:
        fetch.invoke(_tool_call("fetch_page", {"url": "https://x/private"}))
    assert caught.value.info.status == 401
    assert len(backend.calls) == 1


@pytest.mark.asyncio
async def test_async_paths_govern_the_same_way(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503, 503, None])
    fetch = govern_tool(make_afetch(backend), governor)
    ok = await fetch.ainvoke(_tool_call("fetch_page", {"url": "https://x/a"}))
    assert ok.status == "success" and len(backend.calls) == 3

    missing = govern_tool(make_afetch(lc.Backend([404])), governor)
    message = await missing.ainvoke(_tool_call("fetch_page", {"url": "https://x/b"}, "call_2"))
    assert message.status == "error"
    assert governed(message.content)["type"] == "permanent"

    with pytest.raises(lg.FatalError):
        await govern_tool(make_afetch(lc.Backend([401])), governor).ainvoke(
            _tool_call("fetch_page", {"url": "https://x/c"}, "call_3")
        )


@pytest.mark.asyncio
async def test_sync_tool_under_ainvoke_is_governed(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503, None])
    fetch = govern_tool(make_fetch(backend), governor)
    message = await fetch.ainvoke(_tool_call("fetch_page", {"url": "https://x/d"}))
    assert message.status == "success"
    assert len(backend.calls) == 2


def test_known_bad_call_is_not_repeated_within_a_task(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([404, None])
    fetch = govern_tool(make_fetch(backend), governor)
    with governor.task("t-known-bad"):
        first = fetch.invoke(_tool_call("fetch_page", {"url": "https://x/gone"}, "a"))
        second = fetch.invoke(_tool_call("fetch_page", {"url": "https://x/gone"}, "b"))
    assert first.status == second.status == "error"
    assert second.tool_call_id == "b"
    assert len(backend.calls) == 1  # the identical call was answered from memory


def test_governing_twice_never_double_wraps(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503, 503, None])
    once = govern_tool(make_fetch(backend), governor)
    assert govern_tool(once, governor) is once
    other = lg.Governor(lg.GovernorConfig(), sleep=lambda _: None)
    rewrapped = govern_tool(once, other)
    assert rewrapped.inner is once.inner and rewrapped.governor is other
    rewrapped.invoke({"url": "https://x/e"})
    assert len(backend.calls) == 3  # one governor's retries, not 3 x 3


def test_govern_tools_accepts_plain_functions(governor: lg.Governor) -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    (wrapped,) = govern_tools([add], governor)
    assert wrapped.name == "add"
    assert wrapped.invoke({"a": 2, "b": 3}) == 5


def test_governor_none_uses_one_process_wide_default(lc: Any) -> None:
    first = govern_tool(make_fetch(lc.Backend()))
    second = govern_tool(make_fetch(lc.Backend()))
    assert isinstance(first.governor, lg.Governor)
    assert first.governor is second.governor


def _react_agent(lc: Any, tools: list[BaseTool], name: str, model: Any = None) -> Any:
    import warnings

    from langgraph.prebuilt import ToolNode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in LangGraph 1.x
        from langgraph.prebuilt import create_react_agent

        if model is None:
            model = lc.ScriptedChatModel(script=lc.call_tool_until(name, 1, lambda n: {"url": f"https://x/{n}"}))
        return create_react_agent(model, ToolNode(tools, handle_tool_errors=True))


@pytest.mark.parametrize("how", ["invoke", "stream", "ainvoke", "astream"])
@pytest.mark.parametrize("make", [make_fetch, make_afetch], ids=["sync", "async"])
@pytest.mark.asyncio
async def test_fatal_failure_stops_a_toolnode_that_handles_tool_errors(
    lc: Any, governor: lg.Governor, how: str, make: Any
) -> None:
    # ToolNode(handle_tool_errors=True) turns every exception into a ToolMessage;
    # a governed fatal stop must get through it and end the run.
    if make is make_afetch and how in ("invoke", "stream"):
        pytest.skip("an async-only tool has no sync path")
    backend = lc.Backend([401], forever=True)
    agent = _react_agent(lc, [govern_tool(make(backend), governor)], "fetch_page")
    state = {"messages": [("user", "go")]}
    with pytest.raises(lg.FatalError) as caught:
        if how == "invoke":
            agent.invoke(state)
        elif how == "stream":
            list(agent.stream(state))
        elif how == "ainvoke":
            await agent.ainvoke(state)
        else:
            [chunk async for chunk in agent.astream(state)]
    assert caught.value.info.status == 401
    assert len(backend.calls) == 1


def test_fatal_stop_keeps_its_class_and_state(lc: Any, governor: lg.Governor) -> None:
    from langgraph.errors import GraphBubbleUp

    from langchain_governor.errors import GovernedFatalError, fatal_stop

    budget = lg.BudgetExhaustedError("steps spent", tool="fetch_page", partial_results=["r1"])
    stop = fatal_stop(budget)
    assert isinstance(stop, lg.BudgetExhaustedError) and isinstance(stop, GovernedFatalError)
    assert isinstance(stop, GraphBubbleUp)
    assert stop.info is budget.info and stop.partial_results == ["r1"] and str(stop) == str(budget)
    assert fatal_stop(stop) is stop
    again = pickle.loads(pickle.dumps(stop))
    assert type(again) is type(stop) and again.info == budget.info and again.partial_results == ["r1"]


def test_a_budget_stop_keeps_its_class_through_a_toolnode_that_handles_tool_errors(lc: Any, sleeps: Any) -> None:
    governor = lg.Governor(lg.GovernorConfig(max_steps=2), clock=sleeps.clock, sleep=sleeps.sleep)
    backend = lc.Backend()
    fetch = govern_tool(make_fetch(backend), governor)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 5, lambda n: {"url": f"https://x/{n}"}))
    agent = _react_agent(lc, [fetch], "fetch_page", model=model)
    with governor.task("budgeted"), pytest.raises(lg.BudgetExhaustedError) as caught:
        agent.invoke({"messages": [("user", "go")]})
    assert len(backend.calls) == 2
    assert caught.value.info.code == "max_steps"
