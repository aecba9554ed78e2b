"""GovernorMiddleware with each of LangChain's own middleware, in both orders (issue 33, Build 6).

Every combination must *work*: an exhausted quota costs one request and raises
``lg.FatalError``; a model that repeats the same call with the same answer is stopped by
the governor's ladder; and the thread stays usable -- its next user message is answered --
against a local server that enforces the providers' history rules (unanswered tool calls,
and tool history without tools, are a 400). A real ``ChatOpenAI`` makes every request.

The docs (docs/langchain.md, "Middleware order") show the orders tested here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    HumanInTheLoopMiddleware,
    ModelCallLimitMiddleware,
    ModelFallbackMiddleware,
    ModelRetryMiddleware,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from lg_openai_server import OpenAIServer, RecordedRequest, Reply, ToolCall, insufficient_quota
from lg_testing import no_sleep

import loop_governor as lg
from langchain_governor import GovernorMiddleware

KEY = "sk-test-matrix-0000"


def chat(server: OpenAIServer, model: str = "gpt-4o-mini") -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=server.url, api_key=KEY)


# LangChain's middleware, configured so that the governor's stops are what a run meets:
# no waits, limits above what a loop takes to be stopped, the human asked about a tool
# the model never calls, summaries and edits that do fire on these short runs.
THEIRS: dict[str, Callable[[OpenAIServer], Any]] = {
    "ModelRetry": lambda server: ModelRetryMiddleware(initial_delay=0, jitter=False),
    "ToolRetry": lambda server: ToolRetryMiddleware(initial_delay=0, jitter=False),
    "ModelFallback": lambda server: ModelFallbackMiddleware(chat(server, "gpt-4o")),
    "ToolCallLimit": lambda server: ToolCallLimitMiddleware(run_limit=50),
    "ModelCallLimit": lambda server: ModelCallLimitMiddleware(run_limit=50),
    "Summarization": lambda server: SummarizationMiddleware(
        model=chat(server), trigger=("messages", 6), keep=("messages", 3)
    ),
    "HumanInTheLoop": lambda server: HumanInTheLoopMiddleware({"send_email": True}),
    "ContextEditing": lambda server: ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=50, keep=1)]),
}
ORDERS = ("governor-first", "governor-last")


@tool
def job_status(job_id: str) -> str:
    """The status of a build job."""
    return f'{{"job_id": "{job_id}", "state": "running"}}'


@tool
def send_email(to: str) -> str:
    """Send an e-mail."""
    return "sent"


def looping_model(request: RecordedRequest) -> Reply | str:
    """Asks for the same status every turn; answers a summary request (no tools) and a
    user's thanks with text. Call ids are unique per request (a summary may drop turns)."""
    last = request.messages[-1]
    if not request.tools:
        return "Summary: the job was polled; it is still running."
    if last.get("role") == "user" and "thanks" in str(last.get("content")):
        return "You are welcome."
    return Reply(tool_calls=(ToolCall("job_status", {"job_id": "J-1"}, id=f"call_r{request.number}"),))


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(looping_model, history_rules="anthropic") as started:
        yield started


def agent_for(server: OpenAIServer, theirs: str, order: str, gov: lg.Governor) -> Any:
    other, governor = THEIRS[theirs](server), GovernorMiddleware(gov)
    middleware = [governor, other] if order == "governor-first" else [other, governor]
    return create_agent(chat(server), [job_status, send_email], middleware=middleware, checkpointer=InMemorySaver())


COMBINATIONS = [pytest.param(theirs, order, id=f"{theirs}-{order}") for theirs in THEIRS for order in ORDERS]


@pytest.mark.parametrize(("theirs", "order"), COMBINATIONS)
def test_an_exhausted_quota_costs_one_request_and_stops_the_run(server: OpenAIServer, theirs: str, order: str) -> None:
    server.fail_forever(insufficient_quota())
    agent = agent_for(server, theirs, order, lg.Governor(sleep=no_sleep))
    with pytest.raises(lg.FatalError) as stop:
        agent.invoke({"messages": [("user", "is the build done?")]}, {"configurable": {"thread_id": "q"}})
    assert stop.value.info.code == "insufficient_quota"
    assert server.count() == 1


@pytest.mark.parametrize(("theirs", "order"), COMBINATIONS)
def test_a_loop_is_stopped_and_the_thread_stays_usable(server: OpenAIServer, theirs: str, order: str) -> None:
    agent = agent_for(server, theirs, order, lg.Governor(sleep=no_sleep))
    config = {"configurable": {"thread_id": "loop"}}
    with pytest.raises(lg.FatalError) as stop:
        agent.invoke({"messages": [("user", "is the build done?")]}, config)
    assert stop.value.info.code in ("no_progress", "cycle")
    assert server.count() <= 8  # stopped on the ladder, not by a limit
    # every tool call of the thread is answered, the stop's with the reason
    messages = agent.get_state(config).values["messages"]
    asked = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    assert asked <= answered
    # the next user message starts a new task and is answered (the server enforces the rules)
    reply = agent.invoke({"messages": [("user", "thanks")]}, config)
    assert reply["messages"][-1].content == "You are welcome."
    assert not [r for r in server.completions if r.status == 400]
