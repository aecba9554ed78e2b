"""`loop-governor report`: one self-contained HTML page, checked as text and in real Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lg_browser import screenshot
from typer.testing import CliRunner

import loop_governor as lg
from loop_governor.cli import app
from loop_governor.trace import DetectorConfig, install, load_trace, render_report

LAST_RESULT = "Rotate keys under Settings > API <keys> & restart"


@pytest.fixture
def scripted_trace(
    governor: lg.Governor, clock: Any, trace_path: Path, conversation: Any, emit_model_call: Any
) -> Iterator[Path]:
    """A two-task run: cache misses, a flaky tool with retries, a breaker trip, a pruning."""
    lens = install(governor, trace_path, detectors=DetectorConfig(cache_min_input_tokens=0))
    prompts = conversation(6)
    prompts[-1][-1] = {**prompts[-1][-1], "content": LAST_RESULT}
    timeouts = iter([True, False, True, True, True, True, True, True, True, True])

    def search(q: str) -> str:
        clock.now += 0.3
        if next(timeouts, True):
            raise TimeoutError("upstream timed out")
        return f"page for {q}"

    with governor.task("docs-question"):
        for turn, prompt in enumerate(prompts):
            clock.now += 1.2
            emit_model_call(governor, prompt, input_tokens=1800 + 900 * turn, cache_read=0)
            try:
                governor.call("search_docs", search, f"q{turn}")
            except lg.AgentToolError:
                pass
            if turn == 3:
                governor.emit("pruning", tokens_before=5400, tokens_after=2600, messages_before=9, messages_after=6)
    with governor.task("follow-up"):
        for turn, prompt in enumerate(prompts[:3]):
            clock.now += 0.8
            emit_model_call(governor, prompt, input_tokens=1500 + 700 * turn, cache_read=1200 * turn)
            governor.call("calculator", lambda: 42)
    lens.close()
    yield trace_path


def test_report_holds_charts_anomalies_and_every_prompt(scripted_trace: Path) -> None:
    trace = load_trace(scripted_trace)
    page = render_report(trace)

    assert page.count('<details class="call"') == len(trace.model_calls) == 9
    for call in trace.model_calls:
        assert f'id="call-{call["seq"]}"' in page
        assert f'href="#call-{call["seq"]}"' in page  # each bar opens its prompt
    assert "Tokens per turn" in page and "Tool-call timeline" in page
    assert "cache_read_zero" in page and "repeated_error" in page
    assert "search_docs" in page and "calculator" in page
    assert "breaker search_docs: closed → open" in page  # the trip on the timeline
    assert "pruning: 5400 → 2600 tokens" in page
    assert re.search(r"retry search_docs attempt \d", page)
    # the model's view is there verbatim, and escaped
    assert "Rotate keys under Settings &gt; API &lt;keys&gt; &amp; restart" in page
    assert "<keys>" not in page


def test_report_is_self_contained(scripted_trace: Path) -> None:
    page = render_report(load_trace(scripted_trace))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert not re.search(r"@import|url\(|<link\b|<script[^>]+src", page, re.I)
    assert "https://" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_report_command_writes_the_page(scripted_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    result = CliRunner().invoke(app, ["report", str(scripted_trace), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8") == render_report(load_trace(scripted_trace))
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code != 0
    assert not (tmp_path / "report.html").exists()


@pytest.mark.chromium
def test_report_renders_in_headless_chromium(scripted_trace: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text(render_report(load_trace(scripted_trace)), encoding="utf-8")
    near = screenshot(report, tmp_path, (1200, 1500))  # the outcome tables come first, the charts below them
    # the token chart's cached (green) and uncached (orange) bars and the error bars drew
    assert near("#2e7d32") > 200
    assert near("#ef6c00") > 200
    assert near("#e53935") > 50
