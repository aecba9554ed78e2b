"""GovernorMiddleware across runs and threads: task scopes end, pruners don't mix conversations."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from lg_langchain import tool_call

import loop_governor as lg
from langchain_governor import GovernorMiddleware, govern_tool


@tool
def fetch(url: str) -> str:
    """Fetch a page."""
    return "page " + url


def loop_or_greet(messages: list[BaseMessage]) -> AIMessage:
    last = [m for m in messages if isinstance(m, HumanMessage)][-1].content
    if last == "loop":
        return tool_call("fetch", {"url": f"u{len(messages)}"}, f"c{len(messages)}")
    return AIMessage(content="hello!")


def test_a_budget_stop_does_not_leave_the_thread_stuck(lc: Any) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_steps=4), sleep=lambda s: None)
    agent = create_agent(
        lc.ScriptedChatModel(script=loop_or_greet),
        [fetch],
        middleware=[GovernorMiddleware(gov)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "chat-1"}}
    with pytest.raises(lg.BudgetExhaustedError):
        agent.invoke({"messages": [("user", "loop")]}, config)
    # the next user turn on the same thread is a new run with a fresh budget
    assert agent.invoke({"messages": [("user", "just say hi")]}, config)["messages"][-1].content == "hello!"


def test_runs_without_a_thread_id_leave_no_task_state_behind(lc: Any) -> None:
    gov = lg.Governor(sleep=lambda s: None)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    crm = lc.Backend([401], forever=True)

    @tool
    def lookup(customer: str) -> str:
        """Look a customer up."""
        return crm(customer=customer)

    model = lc.ScriptedChatModel(script=lambda m: tool_call("lookup", {"customer": "acme"}, "c1"))
    agent = create_agent(model, [lookup], middleware=[GovernorMiddleware(gov)])
    for _ in range(5):
        with pytest.raises(lg.FatalError):
            agent.invoke({"messages": [("user", "go")]})
    kinds = [e["event"] for e in events]
    assert kinds.count("task_start") == kinds.count("task_end") == 5
    store = gov.store
    assert not store._budgets and not store._known_bad and not store._signatures  # type: ignore[attr-defined]


class _ExclusivePruner:
    """Fails loudly if two threads are inside prune() at once (a real pruner isn't thread-safe)."""

    def __init__(self) -> None:
        self.inside = 0
        self.overlaps = 0
        self.calls = 0

    def prune(self, messages: list[Any]) -> list[Any]:
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        time.sleep(0.002)  # widen the window a concurrent caller would hit
        self.calls += 1
        self.inside -= 1
        return list(messages)


def _batch(agent: Any, n: int) -> None:
    configs = [{"configurable": {"thread_id": f"user-{i}"}} for i in range(n)]
    agent.batch([{"messages": [("user", "loop")]} for _ in range(n)], configs, max_concurrency=n)


def _two_tool_calls_then_answer(messages: list[BaseMessage]) -> AIMessage:
    done = sum(1 for m in messages if m.type == "tool")
    return AIMessage(content="done") if done >= 2 else tool_call("fetch", {"url": f"u{done}"}, f"c{done}")


def test_a_shared_pruner_is_never_entered_by_two_conversations_at_once(lc: Any) -> None:
    pruner = _ExclusivePruner()
    gov = lg.Governor(sleep=lambda s: None)
    agent = create_agent(
        lc.ScriptedChatModel(script=_two_tool_calls_then_answer),
        [fetch],
        middleware=[GovernorMiddleware(gov, pruner=pruner)],
    )
    _batch(agent, 6)
    assert pruner.calls == 18 and pruner.overlaps == 0


def test_a_pruner_factory_gives_each_conversation_its_own_pruner(lc: Any) -> None:
    made: list[_ExclusivePruner] = []
    lock = threading.Lock()

    def factory() -> _ExclusivePruner:
        with lock:
            made.append(_ExclusivePruner())
            return made[-1]

    gov = lg.Governor(sleep=lambda s: None)
    agent = create_agent(
        lc.ScriptedChatModel(script=_two_tool_calls_then_answer),
        [fetch],
        middleware=[GovernorMiddleware(gov, pruner_factory=factory)],
    )
    _batch(agent, 4)
    assert len(made) == 4 and all(p.calls == 3 for p in made)


def test_wrapped_tools_report_the_tool_call_id_too(lc: Any) -> None:
    gov = lg.Governor(sleep=lambda s: None)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    model = lc.ScriptedChatModel(script=lc.call_tool_until("fetch", 2, lambda i: {"url": f"u{i}"}))
    agent = create_agent(model, [govern_tool(fetch, gov)], middleware=[GovernorMiddleware(gov)])
    agent.invoke({"messages": [("user", "go")]})
    ids = [e.get("tool_call_id") for e in events if e["event"] == "tool_call"]
    assert ids == ["call_0", "call_1"]


def test_an_interrupt_inside_a_tool_pauses_the_run_and_resumes(lc: Any) -> None:
    from langgraph.types import Command, interrupt

    approvals: list[Any] = []

    @tool
    def send(amount: int) -> str:
        """Send money after a human approves."""
        approvals.append(interrupt(f"approve {amount}?"))
        return f"sent {amount}"

    gov = lg.Governor(sleep=lambda s: None)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    for wrap in (False, True):
        approvals.clear()
        model = lc.ScriptedChatModel(script=lc.call_tool_until("send", 1, lambda i: {"amount": 5}))
        tools = [govern_tool(send, gov)] if wrap else [send]
        agent = create_agent(model, tools, middleware=[GovernorMiddleware(gov)], checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": f"pay-{wrap}"}}
        paused = agent.invoke({"messages": [("user", "pay")]}, config)
        assert paused["__interrupt__"][0].value == "approve 5?"  # not classified as a tool failure
        done = agent.invoke(Command(resume="yes"), config)
        assert approvals == ["yes"] and done["messages"][-1].content == "done"
    assert not [e for e in events if e["event"] == "tool_call" and e["status"] == "error"]


class _ApproveModelCalls(AgentMiddleware):  # type: ignore[type-arg]
    """A model-call middleware inside the governor's that asks a human first."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[Any] = []

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        from langgraph.types import interrupt

        self.answers.append(interrupt("approve this model call?"))
        return handler(request)

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        from langgraph.types import interrupt

        self.answers.append(interrupt("approve this model call?"))
        return await handler(request)


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
def test_an_interrupt_inside_the_model_call_pauses_the_run_and_resumes(lc: Any, use_async: bool) -> None:
    from langgraph.types import Command

    gov = lg.Governor(sleep=lambda s: None)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    approve = _ApproveModelCalls()
    model = lc.ScriptedChatModel(script=lambda _messages: AIMessage("done"))
    agent = create_agent(model, [], middleware=[GovernorMiddleware(gov), approve], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"approve-{use_async}"}}

    def run(payload: Any) -> Any:
        return asyncio.run(agent.ainvoke(payload, config)) if use_async else agent.invoke(payload, config)

    paused = run({"messages": [("user", "hi")]})
    assert paused["__interrupt__"][0].value == "approve this model call?"  # not a failed model call
    done = run(Command(resume="yes"))
    assert approve.answers == ["yes"] and done["messages"][-1].content == "done"
    assert not [e for e in events if e["event"] == "model_call" and e["status"] == "error"]


def test_governed_model_copies_go_with_their_models(lc: Any) -> None:
    """A model made per request (dynamic model selection, an agent built per request) must
    not live on in the middleware's cache of governed copies, nor keep its copy alive."""
    import gc
    import weakref

    from langchain_openai import ChatOpenAI

    from langchain_governor.models import ModelCopies

    copies = ModelCopies("off")
    alive: list[weakref.ref[Any]] = []
    for _ in range(3):
        retrying = ChatOpenAI(model="gpt-4o-mini", api_key="sk-test", base_url="http://127.0.0.1:9/v1")
        plain = lc.ScriptedChatModel(script=lambda _m: AIMessage("done"))  # nothing to copy
        governed, _ = copies(retrying)
        assert governed is not retrying and governed.max_retries == 0
        assert copies(governed)[0] is governed and copies(plain)[0] is plain
        alive += [weakref.ref(retrying), weakref.ref(governed), weakref.ref(plain)]
    del retrying, plain, governed
    gc.collect()
    assert [r for r in alive if r() is not None] == []
    assert copies._copies == {}
