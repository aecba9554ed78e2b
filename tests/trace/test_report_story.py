"""Issue 35: the report reads like the run.

Two real ``create_agent`` runs write one trace: the first (no thread id, so named by its
request) meets a 503 that is retried, a 404 the model repeats until the call is answered from
memory, the tool withdrawn and the run stopped; the second (a thread) searches once, then fails
on a quota error of its model. The page names each task, marks what was not a real call as such, quotes what
the model read instead of signatures, never shows a context health on a failed call, explains
every column of every table, and renders in Chromium with each of those marks visible.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from lg_browser import assert_columns_explained, screenshot
from lg_langchain import ScriptedChatModel
from lg_testing import HTTPError, VirtualClock

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.trace import load_trace, render_report

REQUEST = "Summarise the refund policy from the docs"


class QuotaError(Exception):
    status_code = 429
    code = "insufficient_quota"


def _usage(turn: int) -> dict[str, Any]:
    return {
        "input_tokens": 900 + 250 * turn,
        "output_tokens": 30,
        "total_tokens": 930 + 250 * turn,
        "input_token_details": {"cache_read": 600 if turn else 0},
    }


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("story") / "trace.jsonl"
    clock = VirtualClock(1_700_000_000.0)
    governor = lg.Governor(lg.GovernorConfig(trace_path=str(path)), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    outage = [HTTPError(503, "search backend unavailable")]

    @tool
    def search(query: str) -> str:
        """Search the docs."""
        clock.advance(0.4)
        if outage:
            raise outage.pop()
        return "refunds-2019.pdf, refunds-2024.pdf"

    @tool
    def fetch_page(url: str) -> str:
        """Fetch a page."""
        clock.advance(0.3)
        raise HTTPError(404, f"no document named {url}")

    def looping(messages: list[BaseMessage]) -> AIMessage:
        clock.advance(1.1)
        turn = sum(isinstance(m, AIMessage) for m in messages)
        name, args = ("search", {"query": "refunds"}) if turn == 0 else ("fetch_page", {"url": "refunds-2019.pdf"})
        call = {"name": name, "args": args, "id": f"call_{turn}", "type": "tool_call"}
        return AIMessage(content="", tool_calls=[call], usage_metadata=_usage(turn))  # type: ignore[arg-type]

    agent = create_agent(
        ScriptedChatModel(script=looping), tools=[search, fetch_page], middleware=[GovernorMiddleware(governor)]
    )
    with pytest.raises(lg.FatalError):
        agent.invoke({"messages": [("user", REQUEST)]})

    def out_of_quota(messages: list[BaseMessage]) -> AIMessage:
        clock.advance(0.5)
        if not any(isinstance(m, AIMessage) for m in messages):  # one search first: a healthy tool result
            call = {"name": "search", "args": {"query": "shipping"}, "id": "call_q0", "type": "tool_call"}
            return AIMessage(content="", tool_calls=[call], usage_metadata=_usage(0))  # type: ignore[arg-type]
        raise QuotaError("You exceeded your current quota, please check your plan and billing details.")

    broke = create_agent(
        ScriptedChatModel(script=out_of_quota), tools=[search], middleware=[GovernorMiddleware(governor)]
    )
    with pytest.raises(lg.FatalError):
        broke.invoke(
            {"messages": [("user", "And the shipping policy?")]}, {"configurable": {"thread_id": "quota-thread"}}
        )
    governor.lens.close()
    return path


def _section(page: str, title: str) -> str:
    return page.split(f"<h2>{title}</h2>")[1].split("</section>")[0]


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))


def test_tasks_are_named_by_their_request_or_thread_never_by_a_generated_id(story: Path) -> None:
    trace = load_trace(story)
    page = render_report(trace)
    generated = {e["task_id"] for e in trace.events if e.get("event") == "task_start"} - {"quota-thread"}
    assert len(generated) == 1 and re.fullmatch(r"[0-9a-f]{32}", next(iter(generated)))
    assert next(iter(generated)) not in page  # the hex id shows nowhere
    ended = _text(_section(page, "How each task ended"))
    assert f"{REQUEST} stopped NoProgressError [repeated_failure]" in ended
    assert "quota-thread stopped FatalError [insufficient_quota]" in ended


def test_calls_not_made_are_marked_and_never_drawn_as_calls(story: Path) -> None:
    trace = load_trace(story)
    page = render_report(trace)
    rows = [_text(r) for r in _section(page, "Tool calls").split("<tr>")[2:]]
    happened = [(r.split(" fetch_page ")[1] if " fetch_page " in r else r) for r in rows]
    assert sum("answered from memory, not called" in r for r in happened) == 2
    assert sum("refused, not called: the tool was withdrawn, so the run stopped" in r for r in happened) == 1
    assert sum("called: failed" in r for r in happened) == 1 and sum("called: ok" in r for r in happened) == 2
    timeline = _section(page, "Tool-call timeline")
    memory_marks = re.findall(r'<circle [^>]*stroke="#8e24aa"', timeline)
    stop_marks = re.findall(r'<polygon [^>]*fill="#b71c1c"', timeline)
    made_bars = re.findall(r'<rect [^>]*fill="#(?:43a047|e53935)"><title>[^<]*(?:search|fetch_page):', timeline)
    assert (len(memory_marks), len(stop_marks), len(made_bars)) == (2, 1, 3)  # 3 calls made, 3 not
    assert "fetch_page withdrawn from the model for the rest of the task" in timeline  # the band
    assert "stopped: repeated_failure" in timeline
    cards = _text(page.split('<div class="cards">')[1].split("</div></div><p")[0])
    for figure in ("3 tool calls made", "1 tool errors", "2 answered from memory", "1 refused", "1 withdrawals"):
        assert figure in cards, cards


def test_what_the_model_read_is_shown_not_the_signature(story: Path) -> None:
    page = render_report(load_trace(story))
    tools = _section(page, "Tool calls")
    assert "HTTPError: no document named refunds-2019.pdf — repeated unchanged" in _text(tools)
    visible = _text(re.sub(r'title="[^"]*"', "", tools))
    assert "<id>" not in visible and "&lt;id&gt;" not in visible  # the signature only on hover
    assert 'title="signature: fetch_page:HTTPError:no document named &lt;id&gt;.pdf"' in tools
    failed = _text(_section(page, "Failed model calls"))
    assert "You exceeded your current quota, please check your plan and billing details." in failed


def test_a_failed_model_call_shows_no_context_health(story: Path) -> None:
    page = render_report(load_trace(story))
    summaries = re.findall(r"<summary>(.*?)</summary>", _section(page, "Model calls and the prompt each one saw"))
    (failed,) = [s for s in summaries if "failed (" in s]
    assert "quota-thread" in failed and "failed (insufficient_quota)" in failed and "health" not in failed
    assert any("context health 100%" in s for s in summaries if s is not failed)  # the same prompt, answered


def test_every_column_of_every_table_is_explained_on_the_page(story: Path) -> None:
    assert_columns_explained(render_report(load_trace(story)), at_least=4)


@pytest.mark.chromium
def test_the_story_renders_in_headless_chromium(story: Path, tmp_path: Path) -> None:
    """The failing run with a retry, a memory answer, a withdrawal and a stop, as a browser draws it."""
    report = tmp_path / "report.html"
    report.write_text(render_report(load_trace(story)), encoding="utf-8")
    near = screenshot(report, tmp_path, (1200, 2200))  # down to the timeline and the tool-call table
    assert near("#fb8c00") > 20  # the retry
    assert near("#8e24aa") > 100  # two memory answers: hollow rings, and their rows' italics
    assert near("#b0bec5") > 1000  # the withdrawal band on fetch_page's row
    assert near("#b71c1c") > 300  # the stop: its line, its octagon and its label
    assert near("#e53935") > 50 and near("#43a047") > 50  # the calls made: one failed, one ok
