"""OpenTelemetry spans with GenAI semantic-convention names, through the user's provider."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import loop_governor as lg
from loop_governor.trace import install


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _run(governor: lg.Governor, conversation: Any, emit_model_call: Any, secret: str) -> None:
    failures = iter([TimeoutError("read timed out")])

    def search(q: str) -> str:
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return "found"

    def broken(q: str) -> str:
        raise LookupError(f"no such page (token={secret})")

    prompts = conversation(2)
    with governor.task("t1"):
        emit_model_call(governor, prompts[0], cache_read=0, input_tokens=1500)
        assert governor.call("search_docs", search, "rotate") == "found"
        with pytest.raises(lg.PermanentError):
            governor.call("open_page", broken, "x")
        emit_model_call(governor, prompts[1], cache_read=0, input_tokens=1600)
        governor.emit("response", content=f"Done. Your new key is {secret}")


def test_task_model_and_tool_spans_carry_genai_semconv_names(
    governor: lg.Governor,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    conversation: Any,
    emit_model_call: Any,
    secret: str,
) -> None:
    lens = install(governor, None, tracer_provider=provider)
    _run(governor, conversation, emit_model_call, secret)
    lens.close()
    spans = exporter.get_finished_spans()

    (task,) = _by_name(spans, "invoke_agent t1")
    assert task.attributes is not None
    assert task.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert task.attributes["loop_governor.task.steps"] == 2

    chats = _by_name(spans, "chat scripted-model")
    assert len(chats) == 2
    first = chats[0].attributes
    assert first is not None
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "scripted-model"
    assert first["gen_ai.usage.input_tokens"] == 1500
    assert first["gen_ai.usage.output_tokens"] == 40
    assert first["gen_ai.usage.cache_read.input_tokens"] == 0
    assert first["gen_ai.usage.cache_creation.input_tokens"] == 0
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    # the model span lasts as long as the reported latency
    assert chats[0].end_time - chats[0].start_time == 250_000_000  # type: ignore[operator]

    (ok,) = _by_name(spans, "execute_tool search_docs")
    assert ok.attributes is not None
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["gen_ai.tool.name"] == "search_docs"
    assert ok.attributes["loop_governor.tool.attempts"] == 2
    assert "error.type" not in ok.attributes
    assert [e.name for e in ok.events] == ["loop_governor.retry"]  # the retry sits on its tool span

    (bad,) = _by_name(spans, "execute_tool open_page")
    assert bad.attributes is not None
    assert bad.attributes["error.type"] == "permanent"
    assert bad.status.status_code is StatusCode.ERROR

    for child in [*chats, ok, bad]:
        assert child.parent is not None and child.parent.span_id == task.context.span_id
        assert child.context.trace_id == task.context.trace_id
    # the cache anomaly of turn 2 is an event on the task span
    (response,) = [e for e in task.events if e.name == "loop_governor.response"]
    assert response.attributes is not None
    assert response.attributes["loop_governor.content"] == "Done. Your new key is [REDACTED]"
    anomalies = [e for e in task.events if e.name == "loop_governor.anomaly"]
    assert [e.attributes["loop_governor.kind"] for e in anomalies] == ["cache_read_zero"]  # type: ignore[index]
    # nothing secret leaves through span attributes, events or status text
    dump = repr([(s.attributes, [e.attributes for e in s.events], s.status.description) for s in spans])
    assert secret not in dump


def test_tool_call_id_from_an_adapter_becomes_gen_ai_tool_call_id(
    governor: lg.Governor, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    lens = install(governor, None, tracer_provider=provider)
    with governor.task("t1"):
        governor.emit(
            "tool_call",
            tool="calc",
            status="ok",
            error_type=None,
            signature=None,
            attempts=1,
            duration_s=0.01,
            call_key="calc:ab",
            tool_call_id="call_42",
        )
    lens.close()
    (span,) = _by_name(exporter.get_finished_spans(), "execute_tool calc")
    assert span.attributes is not None and span.attributes["gen_ai.tool.call.id"] == "call_42"


def test_spans_nest_under_the_callers_active_span(
    governor: lg.Governor, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    lens = install(governor, None, tracer_provider=provider)
    with provider.get_tracer("app").start_as_current_span("http request") as outer:
        with governor.task("t1"):
            governor.call("echo", lambda: 1)
    lens.close()
    (task,) = _by_name(exporter.get_finished_spans(), "invoke_agent t1")
    assert task.parent is not None and task.parent.span_id == outer.get_span_context().span_id


def test_unfinished_tasks_are_ended_on_close(
    governor: lg.Governor, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    lens = install(governor, None, tracer_provider=provider)
    governor.emit("task_start", task_id="crashed")
    governor.emit("breaker", task_id="crashed", tool="search", from_state="closed", to_state="open")
    assert exporter.get_finished_spans() == ()
    lens.close()
    (task,) = exporter.get_finished_spans()
    assert task.name == "invoke_agent crashed"
    assert [e.name for e in task.events] == ["loop_governor.breaker"]


def test_the_global_tracer_provider_is_used_by_default(tmp_path: Path) -> None:
    # A fresh interpreter: the global provider can be set only once per process, and a
    # governor is often built before the application configures OpenTelemetry.
    script = textwrap.dedent(
        """
        import loop_governor as lg
        from loop_governor.trace import install
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        g = lg.Governor(lg.GovernorConfig())
        lens = install(g)                      # before any provider exists
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)    # configured afterwards
        with g.task("late"):
            g.call("echo", lambda: 1)
        lens.close()
        print(sorted(s.name for s in exporter.get_finished_spans()))
        """
    )
    env = {**os.environ, "OTEL_SDK_DISABLED": "false"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == "['execute_tool echo', 'invoke_agent late']"


def test_a_failed_model_call_is_one_chat_span_with_error_type(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    class QuotaError(Exception):
        status_code = 429
        code = "insufficient_quota"

    def model(prompt: str) -> str:
        raise QuotaError("You exceeded your current quota")

    governor = lg.Governor(sleep=lambda s: None)
    lens = install(governor, tracer_provider=provider)
    with governor.task("t1"), pytest.raises(lg.FatalError):
        governor.call_model("openai:gpt-4o", model, "hi")
    lens.close()
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert chat.name == "chat openai:gpt-4o"
    assert chat.attributes["error.type"] == "fatal"
    assert chat.attributes["loop_governor.model.attempts"] == 1
    assert chat.status.status_code is StatusCode.ERROR


def test_a_model_calls_retries_sit_on_its_chat_span(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """A retried model call's retries belong to its chat span; outside a task they were
    held for a tool span that never comes, one more for every retry the process made."""

    class Overloaded(Exception):
        status_code = 503

    attempts = iter([Overloaded("overloaded"), None])

    def model(prompt: str) -> dict[str, Any]:
        exc = next(attempts)
        if exc is not None:
            raise exc
        return {"usage": {"prompt_tokens": 5, "completion_tokens": 1}}

    governor = lg.Governor(sleep=lambda s: None)
    lens = install(governor, tracer_provider=provider)
    governor.call_model("openai:gpt-4o", model, "hi")  # outside a task
    lens.flush()
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert [e.name for e in chat.events] == ["loop_governor.retry"]
    assert lens._bridge is not None and not lens._bridge._retries  # nothing held back
    lens.close()
