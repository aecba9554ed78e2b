"""Issue 7 must-show, end to end: a create_agent run with GovernorMiddleware whose model
reports cache_read 0 on every turn, traced by Agent Lens.

* the JSONL trace from ``GovernorConfig(trace_path=...)`` rebuilds the last prompt,
  including the last tool result's text (redacted), and flags the cache anomaly;
* the spans (through the user's TracerProvider) carry the GenAI semantic-convention
  attribute names, taken from opentelemetry-semantic-conventions as the Lens does;
* ``loop-governor report`` turns that trace into an HTML page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from typer.testing import CliRunner

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.cli import app
from loop_governor.trace import install, load_trace, rebuild_prompt

SECRET = "sk-proj-abcdefghijklmnopqrstuvwx1234"
LAST_RESULT = "Rotate the key under Settings > API keys, then restart the workers"
INPUT_TOKENS = 1800  # above the ~1024-token minimum providers cache from
USAGE = {
    "input_tokens": INPUT_TOKENS,
    "output_tokens": 25,
    "total_tokens": INPUT_TOKENS + 25,
    "input_token_details": {"cache_read": 0, "cache_creation": 0},
}


class PageMissing(Exception):
    status_code = 404


@tool
def open_page(url: str) -> str:
    """Open a documentation page."""
    raise PageMissing(f"no page at {url}")


@tool
def search_docs(query: str) -> str:
    """Search the documentation."""
    if query == "rotate key":
        return f"{LAST_RESULT} (old key was {SECRET})"
    return f"{query}: " + "background on API keys. " * 40


def docs_script(kit: Any) -> Any:
    """Open a missing page, search twice, answer: four model calls, three tool calls."""
    steps = [
        ("open_page", {"url": "https://docs.example/keys"}),
        ("search_docs", {"query": "api keys"}),
        ("search_docs", {"query": "rotate key"}),
    ]

    def script(messages: list[BaseMessage]) -> AIMessage:
        n = len(kit.lc_results(messages))
        if n >= len(steps):
            return AIMessage(content="Rotate it in Settings > API keys and restart the workers.")
        name, args = steps[n]
        return kit.tool_call(name, args, f"call_{n}")

    return script


def run_docs_agent(kit: Any, governor: lg.Governor) -> Any:
    model = kit.ScriptedChatModel(script=docs_script(kit), usage=USAGE)
    agent = create_agent(
        model,
        [open_page, search_docs],
        system_prompt="You answer questions about the docs.",
        middleware=[GovernorMiddleware(governor)],
    )
    result = agent.invoke({"messages": [("user", "How do I rotate the API key?")]})
    assert result["messages"][-1].content.startswith("Rotate it in Settings")
    return model


def test_trace_rebuilds_the_last_prompt_and_flags_the_cache_miss(kit: Any, tmp_path: Path, make_governor: Any) -> None:
    path = tmp_path / "run" / "trace.jsonl"
    governor = make_governor(trace_path=str(path))
    model = run_docs_agent(kit, governor)
    governor.lens.close()

    trace = load_trace(path)
    calls = trace.model_calls
    assert len(calls) == len(model.prompts) == 4
    assert all(c["input_tokens"] == INPUT_TOKENS and c["cache_read_tokens"] == 0 for c in calls)

    # the exact prompt of the last decision comes back from the content-addressed store
    last_prompt = rebuild_prompt(trace, calls[-1])
    assert len(last_prompt) == len(model.prompts[-1])
    last_tool = [m for m in last_prompt if m.get("role") == "tool"][-1]
    assert LAST_RESULT in last_tool["content"]
    # ... redacted before it was written
    assert SECRET not in path.read_text() and SECRET not in json.dumps(trace.snapshots)
    assert "[REDACTED]" in last_tool["content"]
    # each distinct message is stored once, though four prompts repeat the first ones
    hashes = [h for c in calls for h in c["message_hashes"]]
    assert len(trace.snapshots) == len(set(hashes)) < len(hashes)

    cache = [a for a in trace.anomalies if a.get("kind") == "cache_read_zero"]
    assert len(cache) == 1
    assert cache[0]["turn"] == 2  # flagged at the first turn that should have hit the cache

    tools = trace.tool_calls
    assert [t["tool"] for t in tools] == ["open_page", "search_docs", "search_docs"]
    assert tools[0]["status"] == "error" and tools[0]["error_type"] == "permanent"


def test_loop_governor_report_writes_html_for_the_run(kit: Any, tmp_path: Path, make_governor: Any) -> None:
    path = tmp_path / "trace.jsonl"
    governor = make_governor(trace_path=str(path))
    run_docs_agent(kit, governor)
    governor.lens.close()

    out = tmp_path / "report" / "run.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])

    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "cache_read_zero" in page
    assert "open_page" in page and "search_docs" in page
    assert "Rotate the key under Settings &gt; API keys" in page  # the prompt, escaped
    assert SECRET not in page


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> tuple[TracerProvider, InMemorySpanExporter]:
    # This folder's conftest sets OTEL_SDK_DISABLED=true for crewAI; an SDK provider built
    # under it makes no spans at all.
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _named(spans: tuple[ReadableSpan, ...], operation: str) -> list[ReadableSpan]:
    return [s for s in spans if (s.attributes or {}).get(GEN_AI_OPERATION_NAME) == operation]


def test_spans_carry_genai_semconv_names(
    kit: Any, make_governor: Any, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    governor = make_governor()
    lens = install(governor, tracer_provider=provider)
    run_docs_agent(kit, governor)
    lens.close()

    finished = exporter.get_finished_spans()
    (agent,) = _named(finished, "invoke_agent")
    chats = _named(finished, "chat")
    tools = _named(finished, "execute_tool")
    assert len(chats) == 4 and len(tools) == 3
    for chat in chats:
        attrs = chat.attributes or {}
        assert attrs[GEN_AI_REQUEST_MODEL] == "scripted"
        assert attrs[GEN_AI_USAGE_INPUT_TOKENS] == INPUT_TOKENS
        assert attrs[GEN_AI_USAGE_OUTPUT_TOKENS] == 25
        assert attrs[GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 0
    assert [(s.attributes or {})[GEN_AI_TOOL_NAME] for s in tools] == ["open_page", "search_docs", "search_docs"]
    assert (tools[0].attributes or {})[ERROR_TYPE] == "permanent"
    assert ERROR_TYPE not in (tools[1].attributes or {})
    # one agent run: every model and tool span is a child of the run's span
    assert agent.context is not None
    assert all(s.parent is not None and s.parent.span_id == agent.context.span_id for s in chats + tools)
    assert "loop_governor.anomaly" in [e.name for e in agent.events]


def test_tool_spans_carry_the_tool_call_id(
    kit: Any, make_governor: Any, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    governor = make_governor()
    lens = install(governor, tracer_provider=provider)
    run_docs_agent(kit, governor)
    lens.close()
    tools = _named(exporter.get_finished_spans(), "execute_tool")
    assert [(s.attributes or {}).get(GEN_AI_TOOL_CALL_ID) for s in tools] == ["call_0", "call_1", "call_2"]
