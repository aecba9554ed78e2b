"""Issue 16, end to end: a run ends even when the model ignores every word the governor says.

Scripted models that would go on for 200 rounds -- the same failing call, an A-B
ping-pong whose results never change, a critic whose verdict changes only its score --
through create_agent (GovernorMiddleware) and a real crew (install + governed tools):
each run ends within 8 model calls with a FatalError carrying the partial results.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from lg_crewai import CallableTool
from pydantic import BaseModel

import loop_governor as lg
from crewai_governor import govern_tools, install
from langchain_governor import GovernorMiddleware

ROUNDS = 200


class Services:
    """The tools' backends: a missing document, two lookups that never change, a critic
    whose score wanders; every successful call keeps a sub-result on the task."""

    def __init__(self, governor: lg.Governor) -> None:
        self.governor = governor
        self.calls: list[str] = []

    def _keep(self, what: str) -> None:
        self.calls.append(what)
        scope = self.governor.current_task()
        assert scope is not None, "the tool ran outside the governor task"
        scope.add_result(what)

    def fetch_doc(self, doc: str) -> str:
        self.calls.append(f"fetch {doc}")
        raise LookupError(f"document {doc} not found (404)")

    def search(self, query: str) -> str:
        self._keep(f"search {query}")
        return "3 results: the refund policy, the returns page, the FAQ"

    def open_page(self, url: str) -> str:
        self._keep(f"open {url}")
        return "Refunds are processed within 14 days of receiving the item."

    def review(self, draft: str) -> str:
        self._keep(f"review {len(self.calls)}")
        score = (6, 7, 6, 5, 7)[len(self.calls) % 5]
        return f"Score {score}/10 (reviewed 12:0{len(self.calls) % 10}): the conclusion is still unsupported."


# What each stubborn model asks for in round n (it never reads the governor's text).
def same_failing_call(n: int) -> tuple[str, dict[str, Any]]:
    return "fetch_doc", {"doc": "42"}


def ping_pong(n: int) -> tuple[str, dict[str, Any]]:
    return ("search", {"query": "refund policy"}) if n % 2 == 0 else ("open_page", {"url": "https://x/refunds"})


def critic_loop(n: int) -> tuple[str, dict[str, Any]]:
    # the same draft again (a new draft would be a new question: progress to the guards)
    return "review", {"draft": "draft 1: rewritten again"}


PATTERNS = {"same failing call": same_failing_call, "A-B ping-pong": ping_pong, "critic loop": critic_loop}
EXPECTED = {"same failing call": "repeated_failure", "A-B ping-pong": "cycle", "critic loop": "no_progress"}


# -- create_agent ---------------------------------------------------------------------------
def lc_tools(services: Services) -> list[Any]:
    @tool
    def fetch_doc(doc: str) -> str:
        """Fetch a document by id."""
        return services.fetch_doc(doc)

    @tool
    def search(query: str) -> str:
        """Search the help center."""
        return services.search(query)

    @tool
    def open_page(url: str) -> str:
        """Open a help-center page."""
        return services.open_page(url)

    @tool
    def review(draft: str) -> str:
        """Ask the critic to review a draft."""
        return services.review(draft)

    return [fetch_doc, search, open_page, review]


def lc_script(kit: Any, pattern: Callable[[int], tuple[str, dict[str, Any]]]) -> Callable[..., AIMessage]:
    def script(messages: list[BaseMessage]) -> AIMessage:
        n = len(kit.lc_results(messages))
        if n >= ROUNDS:
            return AIMessage(content="done")
        name, args = pattern(n)
        return kit.tool_call(name, args, f"call_{n}")

    return script


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("pattern", PATTERNS, ids=list(PATTERNS))
def test_create_agent_stubborn_loops_end_within_8_model_calls(
    kit: Any, make_governor: Callable[..., lg.Governor], pattern: str, mode: str
) -> None:
    governor = make_governor()
    services = Services(governor)
    model = kit.ScriptedChatModel(script=lc_script(kit, PATTERNS[pattern]))
    agent = create_agent(model, lc_tools(services), middleware=[GovernorMiddleware(governor)])
    payload = {"messages": [("user", "find the refund policy")]}

    with pytest.raises(lg.FatalError) as stopped:
        agent.invoke(payload) if mode == "sync" else asyncio.run(agent.ainvoke(payload))

    assert isinstance(stopped.value, lg.NoProgressError)
    assert stopped.value.info.code == EXPECTED[pattern]
    assert len(model.prompts) <= 8
    kept = [c for c in services.calls if not c.startswith("fetch")]
    # what the task finished comes with the stop (add_result's values, then the tool results)
    assert [r for r in stopped.value.partial_results if not (isinstance(r, dict) and "tool" in r)] == kept


# -- a real crew ----------------------------------------------------------------------------
class DocArgs(BaseModel):
    doc: str


class QueryArgs(BaseModel):
    query: str


class UrlArgs(BaseModel):
    url: str


class DraftArgs(BaseModel):
    draft: str


def crew_tools(services: Services) -> list[Any]:
    specs = [
        ("fetch_doc", "Fetch a document by id.", DocArgs, services.fetch_doc),
        ("search", "Search the help center.", QueryArgs, services.search),
        ("open_page", "Open a help-center page.", UrlArgs, services.open_page),
        ("review", "Ask the critic to review a draft.", DraftArgs, services.review),
    ]
    return [
        CallableTool(fn, name=name, description=description, args_schema=schema)
        for name, description, schema, fn in specs
    ]


@pytest.mark.parametrize("pattern", PATTERNS, ids=list(PATTERNS))
def test_crew_stubborn_loops_end_within_8_model_calls(
    kit: Any, make_governor: Callable[..., lg.Governor], pattern: str
) -> None:
    governor = make_governor()
    services = Services(governor)
    choose = PATTERNS[pattern]

    def script(messages: list[dict[str, Any]], turn: int) -> Any:
        if turn >= ROUNDS:
            return kit.Final("done")
        name, args = choose(turn)
        return kit.ToolStep(name, args)

    llm = kit.ScriptedLLM(model="scripted", script=script)
    crew = kit.make_crew(llm, govern_tools(crew_tools(services), governor), max_iter=ROUNDS + 5)

    with pytest.raises(lg.FatalError) as stopped, install(governor):
        crew.kickoff()

    assert isinstance(stopped.value, lg.NoProgressError)
    assert stopped.value.info.code == EXPECTED[pattern]
    assert len(llm.received) <= 8
    kept = [c for c in services.calls if not c.startswith("fetch")]
    assert [r for r in stopped.value.partial_results if not (isinstance(r, dict) and "tool" in r)] == kept
