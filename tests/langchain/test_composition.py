"""The governor composes with LangChain's and LangGraph's own machinery.

Human approval (interrupts, HumanInTheLoopMiddleware), ToolErrorMiddleware,
ToolRetryMiddleware, a user's own tool wrapper and ContextEditingMiddleware keep doing
what they do without the governor; the governor only handles the tool's own failures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    HumanInTheLoopMiddleware,
    ToolErrorMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from lg_testing import governed
from pydantic import BaseModel, ValidationError

import loop_governor as lg
from langchain_governor import GovernedToolError, GovernorMiddleware, govern_tool, govern_tools
from loop_governor.state.breaker import BreakerState

MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def invoke(agent: Any, mode: str, payload: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    if mode == "sync":
        return agent.invoke(payload, config)  # type: ignore[no-any-return]
    return asyncio.run(agent.ainvoke(payload, config))  # type: ignore[no-any-return]


def fetch_tool(backend: Callable[..., str]) -> BaseTool:
    @tool
    def fetch_page(url: str) -> str:
        """Fetch a web page."""
        return backend(url=url)

    return fetch_page


def one_fetch(lc: Any, url: str = "https://x/a") -> Any:
    return lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 1, lambda i: {"url": url}))


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def approval_agent(lc: Any, governor: lg.Governor, backend: Any) -> Any:
    """The governor first, a human approving each fetch (per-call interrupts) inside it."""
    return create_agent(
        one_fetch(lc),
        [fetch_tool(backend)],
        middleware=[
            GovernorMiddleware(governor),
            HumanInTheLoopMiddleware({"fetch_page": True}, interrupt_mode="per_call"),
        ],
        checkpointer=InMemorySaver(),
    )


class Approval(BaseModel):
    approved: bool


# -- 1. an interrupt answered with an invalid value stays open ---------------------------------


@MODES
def test_an_invalid_resume_value_leaves_a_governed_tools_interrupt_open(mode: str, governor: lg.Governor) -> None:
    @tool
    def ask_human() -> str:
        """Ask a human for approval."""
        return f"approved={interrupt('Approve?', response_schema=Approval).approved}"

    graph = (
        StateGraph(MessagesState)
        .add_node("tools", ToolNode([govern_tool(ask_human, governor)]))
        .add_edge(START, "tools")
        .compile(checkpointer=InMemorySaver())
    )
    call = AIMessage(content="", tool_calls=[{"name": "ask_human", "args": {}, "id": "c1", "type": "tool_call"}])
    config = thread("approval")
    [pending] = invoke(graph, mode, {"messages": [call]}, config)["__interrupt__"]

    with pytest.raises(ValidationError):
        invoke(graph, mode, Command(resume={pending.id: {"approved": "maybe"}}), config)
    assert [i.id for i in graph.get_state(config).interrupts] == [pending.id]  # still open

    done = invoke(graph, mode, Command(resume={pending.id: {"approved": True}}), config)
    assert done["messages"][-1].content == "approved=True"


def test_an_interrupt_during_a_half_open_probe_does_not_close_the_breaker(governor: lg.Governor) -> None:
    @tool
    def ask_human() -> str:
        """Ask a human for approval, then call a service."""
        return f"approved={interrupt('Approve?')}"

    policy = governor.rt.policy("tool", "ask_human").breaker
    for _ in range(policy.failure_threshold):
        governor.store.breaker_record("ask_human", False, False, governor.rt.clock(), policy)
    governor.rt.sleep(policy.cooldown_s + 1)  # the cooldown is over: the next call is the probe
    graph = (
        StateGraph(MessagesState)
        .add_node("tools", ToolNode([govern_tool(ask_human, governor)]))
        .add_edge(START, "tools")
        .compile(checkpointer=InMemorySaver())
    )
    call = AIMessage(content="", tool_calls=[{"name": "ask_human", "args": {}, "id": "c1", "type": "tool_call"}])
    assert invoke(graph, "sync", {"messages": [call]}, thread("probe"))["__interrupt__"]
    assert governor.store.breaker_get("ask_human").state is not BreakerState.CLOSED


def test_hitl_inside_the_governor_rejects_a_bad_answer_without_using_up_the_interrupt(
    lc: Any, governor: lg.Governor
) -> None:
    backend = lc.Backend()
    agent = approval_agent(lc, governor, backend)
    config = thread("hitl")
    [pending] = agent.invoke({"messages": [("user", "go")]}, config)["__interrupt__"]

    with pytest.raises(ValidationError):
        agent.invoke(Command(resume={pending.id: {"type": "not-a-decision"}}), config)
    assert backend.calls == []

    done = agent.invoke(Command(resume={pending.id: {"type": "approve"}}), config)
    assert done["messages"][-1].content == "done" and len(backend.calls) == 1


# -- 2. other middlewares' errors are theirs ---------------------------------------------------


class Guard(AgentMiddleware):
    """A guard that aborts the run before the tool runs."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        raise PermissionError("guard: fetch_page is not allowed here")

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        raise PermissionError("guard: fetch_page is not allowed here")


class AsyncOnly(AgentMiddleware):
    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(request)


@MODES
def test_an_inner_middlewares_abort_is_not_a_tool_failure(mode: str, lc: Any, governor: lg.Governor) -> None:
    events: list[dict[str, Any]] = []
    governor.subscribe(events.append)
    backend = lc.Backend()
    agent = create_agent(one_fetch(lc), [fetch_tool(backend)], middleware=[GovernorMiddleware(governor), Guard()])

    with pytest.raises(PermissionError, match="guard"):
        invoke(agent, mode, {"messages": [("user", "go")]})
    assert backend.calls == []
    assert not [e for e in events if e["event"] == "tool_call"]  # nothing classified or retried


def test_sync_async_misuse_of_an_inner_middleware_surfaces(lc: Any, governor: lg.Governor) -> None:
    agent = create_agent(
        one_fetch(lc), [fetch_tool(lc.Backend())], middleware=[GovernorMiddleware(governor), AsyncOnly()]
    )
    with pytest.raises(NotImplementedError):
        agent.invoke({"messages": [("user", "go")]})


# -- 3. a recorded ToolMessage comes back whole ------------------------------------------------


def test_a_checkpointed_tool_message_is_restored_with_every_field(lc: Any, tmp_path: Any) -> None:
    runs: list[str] = []

    @tool
    def lookup(customer: str) -> ToolMessage:
        """Look a customer up (returns a message of its own)."""
        runs.append(customer)
        return ToolMessage(
            content=f"{customer}: premium",
            tool_call_id="ignored",
            id="msg-7",
            additional_kwargs={"source": "crm"},
            response_metadata={"decision": "approved"},
            artifact={"rows": 1},
        )

    def run() -> list[ToolMessage]:
        gov = lg.Governor(lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}"), sleep=lambda s: None)
        model = lc.ScriptedChatModel(
            script=lc.call_tool_until("lookup", 1, lambda i: {"customer": "acme"}, call_id=lambda n: f"call_{n}")
        )
        agent = create_agent(model, [lookup], middleware=[GovernorMiddleware(gov, resume=True)])
        out = agent.invoke({"messages": [("user", "who")]}, thread("crm-1"))
        return lc.tool_messages(out["messages"])

    first = run()
    again = run()  # same task id, resume=True: the result comes from the checkpoint
    assert runs == ["acme"]
    for message in (first[0], again[0]):
        assert message.id == "msg-7" and message.tool_call_id == "call_0"
        assert message.additional_kwargs == {"source": "crm"}
        assert message.response_metadata == {"decision": "approved"}
        assert message.artifact == {"rows": 1}


# -- 4. governor first: the human and an inner retrier run once per call -----------------------


def test_a_transient_failure_after_approval_does_not_ask_the_human_again(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503])
    agent = approval_agent(lc, governor, backend)
    config = thread("approve-once")
    [pending] = agent.invoke({"messages": [("user", "go")]}, config)["__interrupt__"]

    done = agent.invoke(Command(resume={pending.id: {"type": "approve"}}), config)
    assert "__interrupt__" not in done  # the retry did not ask again
    assert len(backend.calls) == 2 and done["messages"][-1].content == "done"


@MODES
def test_retries_do_not_multiply_with_an_inner_tool_retry(mode: str, lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503], forever=True)
    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False, on_failure="error")
    agent = create_agent(one_fetch(lc), [fetch_tool(backend)], middleware=[GovernorMiddleware(governor), retry])

    out = invoke(agent, mode, {"messages": [("user", "go")]})
    assert len(backend.calls) == governor.config.retry_max_attempts  # 3, not 3 x 3
    assert lc.tool_messages(out["messages"])[0].status == "error"


# -- 5. governor last or governed tools: what is outside still sees the failure ----------------


def on_error_naming_the_error(seen: list[Exception]) -> Callable[[Exception, Any], str | None]:
    def on_error(exc: Exception, request: Any) -> str | None:
        seen.append(exc)
        if isinstance(exc, GovernedToolError):
            return f"fetch failed ({exc.info.error_type}); try something else"
        return None

    return on_error


@MODES
@pytest.mark.parametrize("setup", ["governor-last", "governed-tools"])
def test_an_outer_tool_error_middleware_still_formats_the_failure(
    mode: str, setup: str, lc: Any, governor: lg.Governor
) -> None:
    seen: list[Exception] = []
    backend = lc.Backend([404])
    outer = ToolErrorMiddleware(on_error_naming_the_error(seen))
    if setup == "governor-last":
        tools, middleware = [fetch_tool(backend)], [outer, GovernorMiddleware(governor)]
    else:
        tools, middleware = govern_tools([fetch_tool(backend)], governor, raise_errors=True), [outer]
    agent = create_agent(one_fetch(lc), tools, middleware=middleware)

    out = invoke(agent, mode, {"messages": [("user", "go")]})
    [message] = lc.tool_messages(out["messages"])
    assert message.content == "fetch failed (permanent); try something else"
    assert message.status == "error"
    [error] = seen
    assert isinstance(error, lc.HTTPError) and error.status_code == 404  # the tool's own class
    assert error.info.tool == "fetch_page"


class CountingRetry(AgentMiddleware):
    """A user's retry wrapper: calls the handler again while it raises."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[Exception] = []

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        for _ in range(3):
            try:
                return handler(request)
            except Exception as exc:
                self.failures.append(exc)
        raise self.failures[-1]


def test_an_outer_retry_wrapper_sees_the_exception_and_retries_do_not_multiply(lc: Any, governor: lg.Governor) -> None:
    backend = lc.Backend([503], forever=True)
    wrapper = CountingRetry()
    agent = create_agent(one_fetch(lc), [fetch_tool(backend)], middleware=[wrapper, GovernorMiddleware(governor)])

    out = agent.invoke({"messages": [("user", "go")]})
    assert len(wrapper.failures) == 3  # it saw the failure each time ...
    assert len(backend.calls) == governor.config.retry_max_attempts  # ... replayed, not re-run
    [message] = lc.tool_messages(out["messages"])
    assert message.status == "error" and governed(message.content)["type"] == "transient"


# -- 6. a chat-only agent keeps its graph ------------------------------------------------------


def test_a_chat_only_governor_adds_no_tools_node(lc: Any, governor: lg.Governor) -> None:
    def model() -> Any:
        return lc.ScriptedChatModel(script=lambda messages: AIMessage(content="hi"))

    plain = create_agent(model())
    chat_only = create_agent(model(), middleware=[GovernorMiddleware(governor, govern_tool_calls=False)])
    assert "tools" not in chat_only.get_graph().nodes
    assert set(chat_only.get_graph().nodes) - {n for n in chat_only.get_graph().nodes if "Governor" in n} == set(
        plain.get_graph().nodes
    )
    assert chat_only.invoke({"messages": [("user", "hello")]})["messages"][-1].content == "hi"
    # the default governs tool calls (and says so to create_agent by its tool hooks)
    assert "tools" in create_agent(model(), middleware=[GovernorMiddleware(governor)]).get_graph().nodes
    assert isinstance(GovernorMiddleware(governor, govern_tool_calls=False), GovernorMiddleware)


# -- trace: the prompt the chat model received -------------------------------------------------


def test_the_trace_records_the_prompt_after_inner_context_editing(lc: Any, governor: lg.Governor) -> None:
    events: list[dict[str, Any]] = []
    governor.subscribe(events.append)
    backend = lc.Backend()
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch_page", 4, lambda i: {"url": f"https://x/{i}"}))
    editing = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=10, keep=1, placeholder="[cleared]")])
    agent = create_agent(model, [fetch_tool(backend)], middleware=[GovernorMiddleware(governor), editing])
    agent.invoke({"messages": [("user", "go")]})

    calls = [e for e in events if e["event"] == "model_call"]
    assert len(calls) == len(model.prompts) == 5
    cleared = 0
    for event, prompt in zip(calls, model.prompts, strict=True):
        sent = [str(m.content) for m in prompt]
        assert [str(m["content"]) for m in event["messages"]] == sent
        cleared += sent.count("[cleared]")
    assert cleared > 0  # the editing happened, and the trace shows it
