"""The governed model call inside create_agent: only the model's own failures are governed,
and they leave the agent as the model's own exception class too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage
from lg_langchain import ScriptedChatModel
from lg_testing import no_asleep, no_sleep

import loop_governor as lg
from langchain_governor import GovernorMiddleware

MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def run(agent: Any, mode: str) -> Any:
    payload = {"messages": [("user", "hi")]}
    return agent.invoke(payload) if mode == "sync" else asyncio.run(agent.ainvoke(payload))


def governor() -> lg.Governor:
    return lg.Governor(sleep=no_sleep, asleep=no_asleep)


class Flaky:
    """A model script raising ``fault`` ``times`` times, then answering."""

    def __init__(self, fault: Exception, times: int) -> None:
        self.fault, self.times, self.calls = fault, times, 0

    def __call__(self, messages: list[BaseMessage]) -> AIMessage:
        self.calls += 1
        if self.calls <= self.times:
            raise self.fault
        return AIMessage(content="answer")


@MODES
def test_a_transient_model_failure_is_retried_by_the_governor(mode: str) -> None:
    script = Flaky(ConnectionError("connection reset by peer"), 2)
    agent = create_agent(ScriptedChatModel(script=script), [], middleware=[GovernorMiddleware(governor())])
    assert run(agent, mode)["messages"][-1].content == "answer"
    assert script.calls == 3


@MODES
def test_the_model_s_own_failure_leaves_as_its_own_class_and_the_governor_s(mode: str) -> None:
    script = Flaky(ConnectionError("connection reset by peer"), 99)
    agent = create_agent(ScriptedChatModel(script=script), [], middleware=[GovernorMiddleware(governor())])
    with pytest.raises(ConnectionError, match="connection reset by peer") as err:
        run(agent, mode)
    assert isinstance(err.value, lg.TransientError) and err.value.info.attempts == 3
    assert script.calls == 3


class Refuses(AgentMiddleware[Any, Any, Any]):
    """A middleware inside the governor that raises on its own (a guard, a misuse error)."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        raise RuntimeError("guard: this request is not allowed")

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        raise RuntimeError("guard: this request is not allowed")


@MODES
def test_another_middleware_s_error_passes_through_unclassified(mode: str) -> None:
    gov = governor()
    seen: list[dict[str, Any]] = []
    gov.subscribe(seen.append)
    script = Flaky(ConnectionError("never"), 0)
    agent = create_agent(ScriptedChatModel(script=script), [], middleware=[GovernorMiddleware(gov), Refuses()])
    with pytest.raises(RuntimeError) as err:
        run(agent, mode)
    assert type(err.value) is RuntimeError and not isinstance(err.value, lg.AgentToolError)
    assert script.calls == 0
    assert not [e for e in seen if e["event"] == "retry"]
    assert gov.store.breaker_get("model:scripted").failures == 0
