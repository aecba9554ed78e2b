"""Issue 10, end to end: a never-satisfied critic and a step budget, through create_agent
(GovernorMiddleware) and through a real crew (install + governed tools).

The scripted models would go on for 100 rounds; the governor must end the loop because
the critic's verdict stopped changing (or the step budget ran out), keeping what was done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from lg_crewai import CallableTool
from pydantic import BaseModel, Field

import loop_governor as lg
from crewai_governor import govern_tool, install
from langchain_governor import GovernorMiddleware

ROUNDS = 100
VERDICT = "REJECTED: the argument in section 2 is still not rigorous enough; tighten it."
ANSWER = "Final text: draft as it stands, with the critic's last remarks noted."
MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def run(agent: Any, mode: str) -> dict[str, Any]:
    payload = {"messages": [("user", "Write the essay and get it past the critic.")]}
    if mode == "sync":
        return agent.invoke(payload)  # type: ignore[no-any-return]
    return asyncio.run(agent.ainvoke(payload))  # type: ignore[no-any-return]


class Critic:
    """A critic that is never satisfied: whatever the draft, the same verdict."""

    def __init__(self) -> None:
        self.drafts: list[str] = []

    def __call__(self, draft: str) -> str:
        self.drafts.append(draft)
        return VERDICT


def lc_critic(critic: Critic) -> Any:
    @tool
    def review_draft(draft: str) -> str:
        """Ask the critic to review a draft."""
        return critic(draft)

    return review_draft


def reviser(kit: Any, *, obeys_note: bool) -> Callable[[list[BaseMessage]], AIMessage]:
    """A stuck model that sends the same draft to the critic every round, for up to 100
    rounds; with ``obeys_note`` it answers once the governor's note shows up in a tool
    result. (A model sending a *new* draft each round asks a new question each time: that
    is progress to the loop guards, and the step budget bounds it.)"""

    def script(messages: list[BaseMessage]) -> AIMessage:
        results = kit.lc_results(messages)
        if obeys_note and results and kit.NOTE_MARK in str(results[-1].content):
            return AIMessage(content=ANSWER)
        if len(results) >= ROUNDS:
            return AIMessage(content=ANSWER)
        n = len(results)
        return kit.tool_call("review_draft", {"draft": "draft 1: revised per remark 1"}, f"call_{n}")

    return script


# -- never-satisfied critic, create_agent ----------------------------------------------------
@MODES
def test_create_agent_critic_loop_ends_with_no_progress_error(
    mode: str, kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    critic = Critic()
    model = kit.ScriptedChatModel(script=reviser(kit, obeys_note=False))
    agent = create_agent(model, [lc_critic(critic)], middleware=[GovernorMiddleware(governor)])

    with pytest.raises(lg.NoProgressError) as stopped:
        run(agent, mode)

    # the typed error the issue asks for: a loop detection that stops the run
    assert isinstance(stopped.value, lg.FatalError) and not isinstance(stopped.value, lg.PermanentError)
    assert stopped.value.code == "no_progress"
    assert stopped.value.info.code == "no_progress" and stopped.value.info.tool == "review_draft"
    assert len(critic.drafts) == 4
    assert len(model.prompts) <= 8
    # the model was told, in the critic's results, before the run was stopped: a warning
    # that the next identical verdict withdraws the critic, then the withdrawal
    noted = [m for m in model.prompts[-1] if isinstance(m, ToolMessage) and kit.NOTE_MARK in str(m.content)]
    assert len(noted) == 2 and "the next identical verdict withdraws review_draft" in str(noted[0].content)
    assert "review_draft is now withdrawn" in str(noted[1].content)
    assert [e["tool"] for e in events if e["event"] == "tool_withdrawn"] == ["review_draft"]
    assert [e["action"] for e in events if e["event"] == "no_progress"] == ["warn", "withdraw"]
    # its only tool withdrawn, the model called it anyway: the stop
    assert len(model.prompts) == 5 and "after it was withdrawn" in stopped.value.info.message
    # the 5th request kept the tool's definition: the conversation holds tool history, which
    # Anthropic and Bedrock refuse without tools (issue 33); an OpenAI model is told
    # tool_choice="none" instead (tests/integration/test_issue33_conversation.py)
    assert model.tool_names[-1] == ["review_draft"]


@MODES
def test_create_agent_critic_loop_ends_with_the_answer_when_the_model_obeys(
    mode: str, kit: Any, governor: lg.Governor
) -> None:
    critic = Critic()
    model = kit.ScriptedChatModel(script=reviser(kit, obeys_note=True))
    agent = create_agent(model, [lc_critic(critic)], middleware=[GovernorMiddleware(governor)])

    result = run(agent, mode)

    assert result["messages"][-1].content == ANSWER
    assert len(critic.drafts) == 3
    assert len(model.prompts) == 4
    note = kit.lc_results(result["messages"])[-1]
    assert note.content.startswith(VERDICT) and kit.NOTE_MARK in note.content
    assert note.status == "success"  # a verdict with advice, not a tool failure


def test_changing_verdicts_are_progress_and_run_to_the_end(kit: Any, governor: lg.Governor) -> None:
    """The guard must not cut a loop that is converging: every verdict says something new."""
    remarks = "citations tone structure length examples sources figures spelling grammar intro outro title"
    verdicts = iter(f"REJECTED: the {word} of section 2 needs work." for word in remarks.split())

    @tool
    def review_draft(draft: str) -> str:
        """Ask the critic to review a draft."""
        return next(verdicts, "APPROVED: ship it.")

    def script(messages: list[BaseMessage]) -> AIMessage:
        results = kit.lc_results(messages)
        if results and "APPROVED" in str(results[-1].content):
            return AIMessage(content=ANSWER)
        return kit.tool_call("review_draft", {"draft": f"d{len(results)}"}, f"call_{len(results)}")

    model = kit.ScriptedChatModel(script=script)
    agent = create_agent(model, [review_draft], middleware=[GovernorMiddleware(governor)])
    result = agent.invoke({"messages": [("user", "go")]})
    assert result["messages"][-1].content == ANSWER
    assert len(kit.lc_results(result["messages"])) == 13


# -- never-satisfied critic, crew ------------------------------------------------------------
class DraftArgs(BaseModel):
    draft: str = Field(description="the draft to review")


class CrewCritic(CallableTool):
    """``CrewCritic(critic)``: the critic as a crewAI ``BaseTool`` subclass."""

    name: str = "review_draft"
    description: str = "Ask the critic to review a draft."
    args_schema: type[BaseModel] = DraftArgs


def crew_reviser(kit: Any, *, obeys_note: bool) -> Callable[[list[dict[str, Any]], int], Any]:
    def script(messages: list[dict[str, Any]], turn: int) -> Any:
        results = [m for m in messages if m.get("role") == "tool"]
        if obeys_note and results and kit.NOTE_MARK in str(results[-1].get("content")):
            return kit.Final(ANSWER)
        if turn >= ROUNDS:
            return kit.Final(ANSWER)
        return kit.ToolStep("review_draft", {"draft": "draft 1: revised per remark 1"})

    return script


@pytest.mark.parametrize("mode", ["kickoff", "akickoff"])
def test_crew_critic_loop_ends_with_no_progress_error(
    mode: str, kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    critic = Critic()
    llm = kit.ScriptedLLM(model="scripted", script=crew_reviser(kit, obeys_note=False))
    crew = kit.make_crew(llm, [govern_tool(CrewCritic(critic), governor)], max_iter=ROUNDS + 5)

    with pytest.raises(lg.NoProgressError) as stopped, install(governor):
        crew.kickoff() if mode == "kickoff" else asyncio.run(crew.akickoff())

    assert isinstance(stopped.value, lg.FatalError) and not isinstance(stopped.value, lg.PermanentError)
    assert stopped.value.code == "no_progress"
    assert stopped.value.info.code == "no_progress"
    assert len(critic.drafts) == 4
    assert len(llm.received) <= 8
    assert [e["action"] for e in events if e["event"] == "no_progress"] == ["warn", "withdraw"]
    assert [e["tool"] for e in events if e["event"] == "tool_withdrawn"] == ["review_draft"]


def test_crew_critic_loop_ends_with_the_answer_when_the_model_obeys(kit: Any, governor: lg.Governor) -> None:
    critic = Critic()
    llm = kit.ScriptedLLM(model="scripted", script=crew_reviser(kit, obeys_note=True))
    crew = kit.make_crew(llm, [govern_tool(CrewCritic(critic), governor)], max_iter=ROUNDS + 5)

    with install(governor):
        out = crew.kickoff()

    assert out.raw == ANSWER
    assert len(critic.drafts) == 3
    assert len(llm.received) == 4
    last_result = [m for m in llm.received[-1] if m.get("role") == "tool"][-1]
    assert str(last_result["content"]).startswith(VERDICT) and kit.NOTE_MARK in str(last_result["content"])


# -- max_steps=4 caps a tool loop, partial results kept -------------------------------------
def counting_tool(governor: lg.Governor, calls: list[int]) -> Callable[[int], str]:
    """A tool that keeps each sub-result on the governor task (what a user's tool does
    to have partial results delivered when the task is cut short)."""

    def fetch(page: int) -> str:
        calls.append(page)
        text = f"page {page}: {page * 7} new rows"
        scope = governor.current_task()
        assert scope is not None, "the tool ran outside the governor task"
        scope.add_result({"page": page, "rows": page * 7})
        return text

    return fetch


def lc_pager(kit: Any) -> Callable[[list[BaseMessage]], AIMessage]:
    def script(messages: list[BaseMessage]) -> AIMessage:
        n = len(kit.lc_results(messages))
        if n >= ROUNDS:
            return AIMessage(content=ANSWER)
        return kit.tool_call("fetch_page", {"page": n}, f"call_{n}")

    return script


def lc_fetch_tool(fn: Callable[[int], str]) -> Any:
    @tool
    def fetch_page(page: int) -> str:
        """Fetch one page of rows."""
        return fn(page)

    return fetch_page


def test_create_agent_max_steps_caps_the_tool_loop_and_keeps_partial_results(
    kit: Any, make_governor: Callable[..., lg.Governor]
) -> None:
    governor = make_governor(max_steps=4)
    calls: list[int] = []
    model = kit.ScriptedChatModel(script=lc_pager(kit))
    middleware = GovernorMiddleware(governor)
    agent = create_agent(model, [lc_fetch_tool(counting_tool(governor, calls))], middleware=[middleware])

    with pytest.raises(lg.BudgetExhaustedError) as spent:
        agent.invoke({"messages": [("user", "collect every page")]})

    assert spent.value.info.code == "max_steps"
    # a step is an iteration (a model decision and its tool call): 4 tool calls, no more
    assert calls == list(range(4))
    assert len(model.prompts) == 4
    assert [r for r in spent.value.partial_results if "tool" not in r] == [{"page": p, "rows": p * 7} for p in range(4)]


def test_crew_max_steps_caps_the_tool_loop_and_keeps_partial_results(
    kit: Any, make_governor: Callable[..., lg.Governor]
) -> None:
    governor = make_governor(max_steps=4)
    calls: list[int] = []
    fetch = counting_tool(governor, calls)

    class PageArgs(BaseModel):
        page: int

    class FetchPage(CallableTool):
        name: str = "fetch_page"
        description: str = "Fetch one page of rows."
        args_schema: type[BaseModel] = PageArgs

    def script(messages: list[dict[str, Any]], turn: int) -> Any:
        return kit.Final(ANSWER) if turn >= ROUNDS else kit.ToolStep("fetch_page", {"page": turn})

    llm = kit.ScriptedLLM(model="scripted", script=script)
    crew = kit.make_crew(llm, [govern_tool(FetchPage(fetch), governor)], max_iter=ROUNDS + 5)

    with pytest.raises(lg.BudgetExhaustedError) as spent, install(governor):
        crew.kickoff()

    assert spent.value.info.code == "max_steps"
    assert calls == list(range(4))
    assert len(llm.received) == 4
    assert [r for r in spent.value.partial_results if "tool" not in r] == [{"page": p, "rows": p * 7} for p in range(4)]
