"""GovernorCallbackHandler on chains and the legacy AgentExecutor; pruned views for
LangGraph pre_model_hook and chat-message history."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool

import loop_governor as lg
from langchain_governor import (
    GovernedChatMessageHistory,
    GovernorCallbackHandler,
    govern_tool,
    make_pre_model_hook,
)


def test_callback_records_the_prompt_and_usage_of_any_chain(
    lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    model = lc.ScriptedChatModel(script=lambda messages: AIMessage(content="hello"))
    chain = ChatPromptTemplate.from_messages([("system", "be brief"), ("user", "{q}")]) | model
    handler = GovernorCallbackHandler(governor)
    chain.invoke({"q": "hi"}, {"callbacks": [handler]})

    (event,) = [e for e in events if e["event"] == "model_call"]
    assert event["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert event["input_tokens"] == 120 and event["output_tokens"] == 7
    assert event["cache_read_tokens"] == 96
    assert event["status"] == "ok"
    assert event["latency_s"] >= 0


def test_callback_records_tool_runs_and_classified_errors(
    lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    backend = lc.Backend([404])

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return backend(key=key)

    handler = GovernorCallbackHandler(governor)
    call = {"name": "lookup", "args": {"key": "k"}, "id": "call_9", "type": "tool_call"}
    try:
        lookup.invoke(call, {"callbacks": [handler]})
    except lc.HTTPError:
        pass
    start, end = [e for e in events if e["event"] in ("tool_start", "tool_end")]
    assert start["tool"] == "lookup" and start["tool_call_id"] == "call_9"
    assert end["status"] == "error"
    assert end["error_type"] == "permanent"
    assert end["tool_call_id"] == "call_9"


def test_callback_on_the_legacy_agent_executor(lc: Any, governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langchain_classic.agents import AgentExecutor, create_tool_calling_agent

    backend = lc.Backend([503, None])

    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return backend(url=url)

    def script(messages: list[Any]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return AIMessage(content="done")
        return AIMessage(content="", tool_calls=[{"name": "fetch_page", "args": {"url": "u"}, "id": "c1"}])

    model = lc.ScriptedChatModel(script=script)
    prompt = ChatPromptTemplate.from_messages([("user", "{input}"), MessagesPlaceholder("agent_scratchpad")])
    tools = [govern_tool(fetch_page, governor)]
    executor = AgentExecutor(agent=create_tool_calling_agent(model, tools, prompt), tools=tools)
    out = executor.invoke({"input": "go"}, {"callbacks": [GovernorCallbackHandler(governor)]})

    assert out["output"] == "done"
    assert len(backend.calls) == 2  # retried inside the governed tool
    names = [e["event"] for e in events]
    assert names.count("model_call") == 2
    assert names.count("tool_start") == names.count("tool_end") == 1
    assert "retry" in names
    second_prompt = [e for e in events if e["event"] == "model_call"][1]["messages"]
    assert second_prompt[-1]["role"] == "tool" and second_prompt[-1]["content"].startswith("result for")


def test_pre_model_hook_prunes_the_model_input_only(
    lc: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return f"page {url} " * 20

    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 3, lambda i: {"url": f"u{i}"}))
    hook = make_pre_model_hook(lc.KeepLastToolResults(keep=1), governor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent = create_react_agent(model, [fetch_page], pre_model_hook=hook)
    result = agent.invoke({"messages": [("user", "go")]})

    seen = [m.content for m in model.prompts[-1] if isinstance(m, ToolMessage)]
    assert seen[:2] == ["[pruned]", "[pruned]"] and seen[2].startswith("page u2")
    kept = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert all(c.startswith("page") for c in kept)
    assert [e for e in events if e["event"] == "pruning"][-1]["tokens_after"] < [
        e for e in events if e["event"] == "pruning"
    ][-1]["tokens_before"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_governed_chat_history_serves_the_pruned_view(lc: Any) -> None:
    store = InMemoryChatMessageHistory()
    store.add_messages(
        [
            HumanMessage("q1"),
            AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "a"}]),
            ToolMessage("big result one", tool_call_id="a"),
            AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "b"}]),
            ToolMessage("big result two", tool_call_id="b"),
            AIMessage("answer"),
        ]
    )
    history = GovernedChatMessageHistory(store, lc.KeepLastToolResults(keep=1))
    assert [m.content for m in history.messages if isinstance(m, ToolMessage)] == [
        "[pruned]",
        "big result two",
    ]
    assert [m.content for m in history.full_messages if isinstance(m, ToolMessage)] == [
        "big result one",
        "big result two",
    ]

    model = lc.ScriptedChatModel(script=lambda messages: AIMessage(content=json.dumps(len(messages))))
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("user", "{q}")])
    chain = RunnableWithMessageHistory(
        prompt | model, lambda session_id: history, input_messages_key="q", history_messages_key="history"
    )
    chain.invoke({"q": "next"}, {"configurable": {"session_id": "s"}})
    assert "[pruned]" in [m.content for m in model.prompts[-1]]
    assert len(store.messages) == 8  # the new turn was written to the real history, in full
    assert "big result one" in [m.content for m in store.messages]
