"""LangChain's ``test_jump_to_is_ephemeral`` with the governor in (issue 27, item 10).

``make compat`` runs LangChain's own test with GovernorMiddleware first and last (tool
hooks off on a tool-less agent, as the injection sets them) and it passes in every mode.
With the tool hooks on (the default), the agent gets a tools node, and LangChain's
model->tools edge honours a ``jump_to`` that the hook never declared in ``can_jump_to``
(langchain/agents/factory.py, the model_to_tools edge): any middleware with a
``wrap_tool_call`` does the same, so this is LangChain's edge, marked strict below.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.errors import GraphRecursionError

import loop_governor as lg
from langchain_governor import GovernorMiddleware


class Jumps(AgentMiddleware):  # type: ignore[type-arg]
    """LangChain's test middleware: asserts jump_to is gone, then sets it (undeclared)."""

    def before_model(self, state: Any, runtime: Any) -> dict[str, Any]:
        assert "jump_to" not in state
        return {"jump_to": "model"}

    def after_model(self, state: Any, runtime: Any) -> dict[str, Any]:
        assert "jump_to" not in state
        return {"jump_to": "model"}


def _run(governor_first: bool, **options: Any) -> dict[str, Any]:
    governor = GovernorMiddleware(lg.Governor(), **options)
    middleware = [governor, Jumps()] if governor_first else [Jumps(), governor]
    model = GenericFakeChatModel(messages=itertools.repeat(AIMessage("hi")))
    agent = create_agent(model=model, middleware=middleware)
    return agent.invoke({"messages": [HumanMessage("Hello")]}, {"recursion_limit": 25})  # type: ignore[no-any-return]


@pytest.mark.parametrize("governor_first", [True, False], ids=["first", "last"])
def test_jump_to_is_ephemeral_with_the_governor_in(governor_first: bool) -> None:
    assert "jump_to" not in _run(governor_first, govern_tool_calls=False)


@pytest.mark.xfail(
    strict=True,
    raises=(GraphRecursionError, AssertionError),
    reason="LangChain's model->tools edge honours an undeclared jump_to once any middleware has a tool hook",
)
@pytest.mark.parametrize("governor_first", [True, False], ids=["first", "last"])
def test_jump_to_is_ephemeral_with_the_governors_tool_hooks_on(governor_first: bool) -> None:
    assert "jump_to" not in _run(governor_first)
