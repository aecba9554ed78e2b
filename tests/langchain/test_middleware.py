"""create_agent + GovernorMiddleware, end to end with a scripted model (invoke and ainvoke)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from lg_testing import governed

import loop_governor as lg
from langchain_governor import GovernorMiddleware, govern_tool


def run_agent(agent: Any, mode: str, text: str = "go", config: dict[str, Any] | None = None) -> dict[str, Any]:
    payload = {"messages": [("user", text)]}
    if mode == "sync":
        return agent.invoke(payload, config)  # type: ignore[no-any-return]
    return asyncio.run(agent.ainvoke(payload, config))  # type: ignore[no-any-return]


MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def fetch_tool(backend: Callable[..., str]) -> BaseTool:
    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return backend(url=url)

    return fetch_page


def errors_in(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    return [governed(m.content) for m in messages if isinstance(m, ToolMessage) and m.status == "error"]


def test_without_middleware_a_failing_tool_aborts_the_run(lc: Any) -> None:
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/404"}))
    agent = create_agent(model, [fetch_tool(lc.Backend([404]))])
    with pytest.raises(lc.HTTPError):
        agent.invoke({"messages": [("user", "go")]})


@MODES
def test_permanent_error_reaches_the_model_and_the_run_completes(mode: str, lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([404])
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/404"}))
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor)])
    result = run_agent(agent, mode)

    assert result["messages"][-1].content == "done"
    next_prompt = model.prompts[1]
    tool_message = next_prompt[-1]
    assert isinstance(tool_message, ToolMessage)
    assert tool_message.status == "error"
    error = governed(tool_message.content)
    assert error["type"] == "permanent"
    assert "404" in error["message"]
    assert "fetch_page" in error["advice"]
    assert len(backend.calls) == 1


@MODES
def test_transient_errors_are_retried_and_the_model_sees_only_success(
    mode: str, lc: Any, governor: lg.Governor
) -> None:
    backend = lc.Backend([503, 503, None])
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/busy"}))
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor)])
    result = run_agent(agent, mode)

    assert len(backend.calls) == 3
    assert result["messages"][-1].content == "done"
    seen = model.prompts[1]
    assert [m.status for m in seen if isinstance(m, ToolMessage)] == ["success"]
    assert seen[-1].content.startswith("result for")
    assert all(not errors_in(prompt) for prompt in model.prompts)


@MODES
def test_a_tool_down_for_good_is_cut_off_by_budget_and_breaker(mode: str, lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503], forever=True)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 10, lambda i: {"url": f"https://x/page/{i}"}))
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor)])
    result = run_agent(agent, mode)

    # a service that is down is not hammered, and its outage never ends the run: the model
    # is told it is unavailable, then it is withdrawn until it may be back
    assert result["messages"][-1].content == "done"
    assert len(backend.calls) <= 8
    errors = errors_in(model.prompts[-1])
    refused = [e for e in errors if "circuit breaker is open" in e["message"]]
    assert refused
    assert refused[0]["outcome"] == "not attempted" and "retryable" not in refused[0]  # no request made
    assert "withdraw fetch_page from your tools" in refused[0]["advice"]  # the ladder's next step
    assert any("fetch_page is now withdrawn" in e["advice"] for e in errors)
    assert "offered again in about" in errors[-1]["advice"]  # called anyway: refused, not a stop


@MODES
def test_fatal_error_stops_the_run(mode: str, lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([401])
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/me"}))
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor)])
    with pytest.raises(lg.FatalError) as caught:
        run_agent(agent, mode)
    assert caught.value.info.status == 401
    assert len(backend.calls) == 1
    assert len(model.prompts) == 1  # the model was never asked again


@MODES
def test_known_bad_call_is_answered_without_calling_again(mode: str, lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([404, None])
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 2, lambda i: {"url": "https://x/gone"}))
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor)])
    result = run_agent(agent, mode)

    assert len(backend.calls) == 1  # the run is one task: the identical call is known-bad
    first, second = errors_in(result["messages"])
    assert first["type"] == second["type"] == "permanent"


@MODES
def test_wrapped_tools_are_not_governed_twice(mode: str, lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503, 503, None])
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/busy"}))
    wrapped = govern_tool(fetch_tool(backend), governor)
    agent = create_agent(model, [wrapped], middleware=[GovernorMiddleware(governor)])
    run_agent(agent, mode)
    assert len(backend.calls) == 3
    governed = [e for e in governor_events(governor, agent, mode, lc) if e["event"] == "tool_call"]
    assert len(governed) == 1


def governor_events(governor: lg.Governor, agent: Any, mode: str, lc: Any) -> list[dict[str, Any]]:
    """Run ``agent`` once more (backend healthy) and return the events it produced."""
    seen: list[dict[str, Any]] = []
    unsubscribe = governor.subscribe(seen.append)
    try:
        run_agent(agent, mode, "again")
    finally:
        unsubscribe()
    return seen


@MODES
def test_model_calls_are_steps_of_one_task_with_usage_events(
    mode: str, lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 2, lambda i: {"url": f"https://x/{i}"}))
    agent = create_agent(
        model, [fetch_tool(lc.Backend())], system_prompt="be brief", middleware=[GovernorMiddleware(governor)]
    )
    run_agent(agent, mode)

    model_calls = [e for e in events if e["event"] == "model_call"]
    assert len(model_calls) == 3
    first = model_calls[0]
    assert first["input_tokens"] == 120 and first["output_tokens"] == 7
    assert first["cache_read_tokens"] == 96 and first["cache_creation_tokens"] == 0
    assert first["finish_reason"] == "stop"
    assert first["model"] == "scripted"
    assert first["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    assert model_calls[-1]["messages"][-1]["role"] == "tool"

    task_ids = {e["task_id"] for e in events}
    assert len(task_ids) == 1 and None not in task_ids  # model and tool nodes share one task
    ends = [e for e in events if e["event"] == "task_end"]
    assert len(ends) == 1
    # a step is an iteration: one model decision and the tool calls it asked for
    assert ends[0]["model_calls"] == 3 and ends[0]["tool_calls"] == 2 and ends[0]["steps"] == 3


def test_thread_id_names_the_task(lc: Any, governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x"}))
    agent = create_agent(
        model,
        [fetch_tool(lc.Backend())],
        middleware=[GovernorMiddleware(governor)],
        checkpointer=InMemorySaver(),
    )
    agent.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "thread-42"}})
    assert {e["task_id"] for e in events} == {"thread-42"}


def test_max_steps_stops_a_runaway_agent(lc: Any, sleeps: Any) -> None:
    governor = lg.Governor(lg.GovernorConfig(max_steps=4), clock=sleeps.clock, sleep=sleeps.sleep)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 100, lambda i: {"url": f"https://x/{i}"}))
    agent = create_agent(model, [fetch_tool(lc.Backend())], middleware=[GovernorMiddleware(governor)])
    with pytest.raises(lg.BudgetExhaustedError) as spent:
        agent.invoke({"messages": [("user", "go")]})
    # four iterations (a model decision and its tool call) ran; the fifth model call is refused
    assert len(model.prompts) == 4
    assert spent.value.info.code == "max_steps"


def test_a_scope_opened_by_the_caller_is_used(lc: Any, governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x"}))
    agent = create_agent(model, [fetch_tool(lc.Backend())], middleware=[GovernorMiddleware(governor)])
    with governor.task("nightly-report") as scope:
        agent.invoke({"messages": [("user", "go")]})
        assert scope.model_calls == 2
    assert {e["task_id"] for e in events} == {"nightly-report"}


@MODES
def test_pruner_shapes_only_what_the_model_sees(
    mode: str, lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    pruner = lc.KeepLastToolResults(keep=1)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 3, lambda i: {"url": f"https://x/{i}"}))
    agent = create_agent(model, [fetch_tool(lc.Backend())], middleware=[GovernorMiddleware(governor, pruner=pruner)])
    result = run_agent(agent, mode)

    last_prompt = model.prompts[-1]
    assert [m.content for m in last_prompt if isinstance(m, ToolMessage)][:2] == ["[pruned]", "[pruned]"]
    stored = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert all(c.startswith("result for") for c in stored)  # graph state keeps the full history
    pruning = [e for e in events if e["event"] == "pruning"]
    assert len(pruning) == 4
    assert pruning[-1]["tokens_after"] < pruning[-1]["tokens_before"]
    assert pruning[-1]["messages_after"] == pruning[-1]["messages_before"]


def test_tool_errors_leave_unknown_tools_to_the_tool_node(lc: Any, governor: lg.Governor) -> None:
    def script(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return AIMessage(content="done")
        return AIMessage(content="", tool_calls=[{"name": "no_such_tool", "args": {}, "id": "c1", "type": "tool_call"}])

    model = lc.ScriptedChatModel(script=script)
    agent = create_agent(model, [fetch_tool(lc.Backend())], middleware=[GovernorMiddleware(governor)])
    result = agent.invoke({"messages": [("user", "go")]})
    reply = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert reply.status == "error"
    assert "no_such_tool" in reply.content


@MODES
def test_a_fatal_stop_from_inside_a_tool_is_recorded_as_fatal(
    mode: str, lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    # A tool that runs a governed tool of its own (an agent as a tool, say): the inner
    # fatal stop is a LangGraph bubble-up, but for the middleware it is the call's failure.
    inner = govern_tool(fetch_tool(lc.Backend([401])), lg.Governor(sleep=lambda s: None))

    @tool
    async def research(topic: str) -> str:
        """Research a topic."""
        return str(await inner.ainvoke({"url": f"https://x/{topic}"}))

    @tool
    def research_sync(topic: str) -> str:
        """Research a topic."""
        return str(inner.invoke({"url": f"https://x/{topic}"}))

    name = "research" if mode == "async" else "research_sync"
    model = lc.ScriptedChatModel(script=lc.call_tool_until(name, 1, lambda i: {"topic": "t"}))
    agent = create_agent(model, [research, research_sync], middleware=[GovernorMiddleware(governor)])
    with pytest.raises(lg.FatalError) as caught:
        run_agent(agent, mode)
    assert caught.value.info.status == 401
    calls = [e for e in events if e["event"] == "tool_call" and e["tool"] == name]
    assert [(e["status"], e["error_type"]) for e in calls] == [("error", "fatal")]
    kinds = [e["event"] for e in events]
    assert kinds.count("task_start") == kinds.count("task_end") == 1


@MODES
def test_a_governed_tools_fatal_stop_ends_the_middlewares_task(
    mode: str, lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": "https://x/me"}))
    fetch = govern_tool(fetch_tool(lc.Backend([401], forever=True)), governor)
    agent = create_agent(model, [fetch], middleware=[GovernorMiddleware(governor)])
    for _ in range(2):
        with pytest.raises(lg.FatalError):
            run_agent(agent, mode)
    kinds = [e["event"] for e in events]
    assert kinds.count("task_start") == kinds.count("task_end") == 2
