"""Child process for the README logging snippet test: one failing run, logs on stderr.

Usage: ``python logging_child.py SNIPPET_FILE {crew,agent} {plain,root} WORKDIR``. Runs the
README's logging snippet exactly as written, then (``root``) configures the root logger the
way an application or a framework does, then runs one crew or one ``create_agent`` agent
whose search fails once with a 503 (retried) and whose page tool answers 404 to a model
that repeats the call whatever it reads, until the governor stops the run. Only the
logging output is of interest: the process prints nothing else to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the lg_* helpers

SNIPPET, FRAMEWORK, ROOT, WORKDIR = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])

from lg_crewai_env import offline_crewai  # noqa: E402

offline_crewai(WORKDIR / "home")

exec(compile(SNIPPET.read_text(encoding="utf-8"), "README.md logging snippet", "exec"))

import logging  # noqa: E402

if ROOT == "root":
    # what an application (or a framework) does at start: a handler on the root logger
    logging.basicConfig(level=logging.INFO, format="ROOT %(levelname)s %(name)s: %(message)s")

from lg_testing import HTTPError  # noqa: E402

import loop_governor as lg  # noqa: E402

governor = lg.Governor(lg.GovernorConfig(retry_base_delay=0.01))
search_failures = [HTTPError(503, "search backend unavailable")]


def search(query: str) -> str:
    if search_failures:
        raise search_failures.pop()
    return f"results for {query}"


def fetch_page(url: str) -> str:
    raise HTTPError(404, f"no document at {url}")


def tools(decorate: Any) -> list[Any]:
    """search and fetch_page as the framework's tools (``decorate``: its ``tool`` decorator)."""

    @decorate("search")
    def search_tool(query: str) -> str:
        """Search the docs."""
        return search(query)

    @decorate("fetch_page")
    def fetch_tool(url: str) -> str:
        """Fetch a page."""
        return fetch_page(url)

    return [search_tool, fetch_tool]


def run_crew() -> None:
    from crewai.tools import tool
    from lg_crewai import Final, ScriptedLLM, ToolStep, make_crew

    from crewai_governor import govern_tools, install

    steps = [ToolStep("search", {"query": "refunds"})] + [ToolStep("fetch_page", {"url": "refunds-2019.pdf"})] * 8
    llm = ScriptedLLM(model="scripted", native=True, script=[*steps, Final("done")])
    crew = make_crew(
        llm,
        govern_tools(tools(tool), governor),
        role="researcher",
        goal="answer from the docs",
        tasks=[("What is our refund policy?", "one paragraph")],
        max_iter=12,
    )
    with install(governor):
        crew.kickoff()


def run_agent() -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from lg_langchain import ScriptedChatModel

    from langchain_governor import GovernorMiddleware

    def script(messages: list) -> AIMessage:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        name, args = ("search", {"query": "refunds"}) if turn == 0 else ("fetch_page", {"url": "refunds-2019.pdf"})
        return AIMessage(
            content="", tool_calls=[{"name": name, "args": args, "id": f"call_{turn}", "type": "tool_call"}]
        )

    agent = create_agent(
        ScriptedChatModel(script=script), tools=tools(tool), middleware=[GovernorMiddleware(governor)]
    )
    agent.invoke({"messages": [("user", "Summarise the docs")]})


try:
    run_crew() if FRAMEWORK == "crew" else run_agent()
except lg.FatalError as stop:
    print(f"stopped: {stop.info.code}")  # stdout: the test checks the run really ended with the stop
