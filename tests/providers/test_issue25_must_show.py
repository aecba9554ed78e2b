"""Issue 25, must show: a run stopped on an exhausted quota after a successful tool call
says so everywhere -- the log, ``task_end``, the HTML report, ``str(exc)`` -- and hands
back what it did (``partial_results``). Real ChatOpenAI in ``create_agent`` and a real
crewAI crew, against the local OpenAI-compatible server (429 ``insufficient_quota``)."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import openai
import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from lg_openai_server import OpenAIServer, insufficient_quota, tool_reply
from lg_testing import VirtualClock

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.trace import load_trace
from loop_governor.trace.report import render_report

KEY = "sk-test-governed-0000abcd"
MODEL = "gpt-4o-mini"
STOP = "loop-governor stopped the run: "


@pytest.fixture
def governed(tmp_path: Path) -> Any:
    clock = VirtualClock()
    made: list[lg.Governor] = []

    def make() -> tuple[lg.Governor, list[dict[str, Any]]]:
        gov = lg.Governor(
            lg.GovernorConfig(trace_path=str(tmp_path / "trace.jsonl")),
            clock=clock,
            sleep=clock.sleep,
            asleep=clock.asleep,
        )
        events: list[dict[str, Any]] = []
        gov.subscribe(events.append)
        made.append(gov)
        return gov, events

    yield make
    for gov in made:
        gov.lens.close()


def _pages_then_quota(server: OpenAIServer) -> None:
    server.set_script([tool_reply("fetch_page", {"page": 0}), tool_reply("fetch_page", {"page": 1}), "done"])
    server.add_rule(lambda r: insufficient_quota() if r.number >= 2 else None)  # after one tool call


def _assert_the_stop_is_visible(
    gov: lg.Governor,
    events: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
    stop: lg.FatalError,
) -> None:
    # str(exc): the governor's sentence, the provider's code in the reason
    text = str(stop)
    assert text.startswith(STOP) and "insufficient_quota" in text and "429" in text
    assert stop.code == "insufficient_quota"
    assert text == STOP + stop.reason  # .reason: the same words, without the prefix
    # partial results: the successful tool call, without any add_result
    assert stop.partial_results, "partial_results is empty after a successful tool call"
    first = stop.partial_results[0]
    assert first["tool"] == "fetch_page" and first["result"].startswith("page 0: ")
    # the log: one WARNING for the stop, naming the endpoint and the reason
    warnings = [r.getMessage() for r in caplog.records if r.name == "loop_governor" and r.levelno == logging.WARNING]
    assert any(STOP in m and "insufficient_quota" in m for m in warnings), warnings
    # task_end says how the task ended and why
    (end,) = [e for e in events if e["event"] == "task_end"]
    assert end["outcome"] == "stopped" and end["code"] == "insufficient_quota"
    assert "insufficient_quota" in end["reason"] and KEY not in end["reason"]
    # the report's first screen: how the task ended, and the failed model call
    gov.lens.flush()
    page = render_report(load_trace(gov.config.trace_path))
    first_screen = page.split("Tokens per turn")[0]
    assert "How each task ended" in first_screen and ">stopped<" in first_screen
    assert "insufficient_quota" in first_screen
    failed = first_screen.split("Failed model calls")[1]
    assert "429" in failed and "insufficient_quota" in failed and "fatal" in failed
    assert KEY not in page


def test_langchain_run_stopped_on_an_exhausted_quota_says_so_everywhere(
    openai_server: OpenAIServer, governed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loop_governor")
    gov, events = governed()
    _pages_then_quota(openai_server)

    @tool
    def fetch_page(page: int) -> str:
        """Fetch one page of rows."""
        return f"page {page}: " + "row " * 50

    model = ChatOpenAI(model=MODEL, base_url=openai_server.url, api_key=KEY)
    agent = create_agent(model, [fetch_page], middleware=[GovernorMiddleware(gov)])
    with pytest.raises(lg.FatalError) as caught:
        agent.invoke({"messages": [("user", "collect")]}, {"configurable": {"thread_id": "quota-1"}})
    stop = caught.value
    assert openai_server.count() == 2
    # the governor's stop is what propagates; the provider's error is its cause
    assert isinstance(stop.__cause__, openai.RateLimitError)
    # never the provider's retryable class: an application's `except RateLimitError: retry`
    # must not retry a run stopped on an exhausted quota (issue 33)
    assert not isinstance(stop, openai.RateLimitError)
    assert type(stop).__qualname__ == "GovernedFatalError"
    last_line = traceback.format_exception(stop)[-1]
    assert STOP in last_line
    _assert_the_stop_is_visible(gov, events, caplog, stop)


def test_crewai_run_stopped_on_an_exhausted_quota_says_so_everywhere(
    openai_server: OpenAIServer, governed: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import crewai
    from crewai.tools import BaseTool
    from lg_crewai import make_crew
    from pydantic import BaseModel

    from crewai_governor import govern_tools, install

    caplog.set_level(logging.INFO, logger="loop_governor")
    gov, events = governed()
    _pages_then_quota(openai_server)

    class PageArgs(BaseModel):
        page: int

    class FetchPage(BaseTool):
        name: str = "fetch_page"
        description: str = "Fetch one page of rows."
        args_schema: type[BaseModel] = PageArgs

        def _run(self, page: int) -> str:
            return f"page {page}: " + "row " * 50

    llm = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)
    tools = govern_tools([FetchPage()], gov)
    crew = make_crew(
        llm, tools, role="collector", goal="collect pages", tasks=[("Collect the pages.", "done")], max_iter=30
    )
    with pytest.raises(lg.FatalError) as caught, install(gov):
        crew.kickoff()
    assert openai_server.count() == 2
    _assert_the_stop_is_visible(gov, events, caplog, caught.value)
