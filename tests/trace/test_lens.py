"""The embedded trace: JSONL records, content-addressed prompts, redaction, failure isolation."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import loop_governor as lg
from loop_governor.trace import Lens, install, load_trace, rebuild_prompt, snapshot_path_for


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_each_distinct_message_is_stored_once_and_every_prompt_rebuilds(
    governor: lg.Governor, lens: Lens, trace_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    prompts = conversation(4)
    with governor.task("t1"):
        for prompt in prompts:
            emit_model_call(governor, prompt)
    assert lens.flush()

    distinct = {json.dumps(m, sort_keys=True) for p in prompts for m in p}
    stored = _lines(snapshot_path_for(trace_path))
    assert len(stored) == len(distinct) == len(prompts[-1])
    trace = load_trace(trace_path)
    assert [len(c["message_hashes"]) for c in trace.model_calls] == [len(p) for p in prompts]
    for call, prompt in zip(trace.model_calls, prompts, strict=True):
        assert rebuild_prompt(trace, call) == prompt
    assert [c["turn"] for c in trace.model_calls] == [1, 2, 3, 4]


def test_governed_calls_retries_and_task_bounds_are_recorded(
    governor: lg.Governor, lens: Lens, trace_path: Path
) -> None:
    flaky_failures = iter([TimeoutError("read timed out"), TimeoutError("read timed out")])

    def flaky(q: str) -> str:
        exc = next(flaky_failures, None)
        if exc is not None:
            raise exc
        return f"answer to {q}"

    with governor.task("t1"):
        assert governor.call("search_docs", flaky, "rotate") == "answer to rotate"
    lens.close()

    events = load_trace(trace_path).events
    kinds = [e["event"] for e in events]
    assert kinds[0] == "task_start" and kinds[-1] == "task_end"
    assert kinds.count("retry") == 2
    (tool_call,) = [e for e in events if e["event"] == "tool_call"]
    assert tool_call["tool"] == "search_docs"
    assert tool_call["status"] == "ok"
    assert tool_call["attempts"] == 3
    assert all(e["task_id"] == "t1" for e in events)
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)


def test_secrets_never_reach_the_trace_or_the_snapshot_store(
    governor: lg.Governor, lens: Lens, trace_path: Path, emit_model_call: Any, secret: str
) -> None:
    def leaky() -> str:
        raise PermissionError(f"401 Unauthorized: invalid api_key={secret}")

    with governor.task("t1"):
        emit_model_call(
            governor,
            [
                {"role": "system", "content": f"Use Authorization: Bearer {secret} for the docs API"},
                {"role": "user", "content": f"my password is https://admin:{secret}@db.example.com"},
            ],
        )
        with pytest.raises(lg.AgentToolError):
            governor.call("search_docs", leaky)
    lens.close()

    for path in (trace_path, snapshot_path_for(trace_path)):
        text = path.read_text(encoding="utf-8")
        assert secret not in text
    snapshot_text = snapshot_path_for(trace_path).read_text(encoding="utf-8")
    assert "[REDACTED]" in snapshot_text
    assert "db.example.com" in snapshot_text  # the rest of the message survives


def test_a_failing_file_sink_never_breaks_the_agent(
    governor: lg.Governor, tmp_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the trace directory should be")
    lens = install(governor, blocker / "trace.jsonl")
    with governor.task("t1"):
        assert governor.call("echo", lambda x: x, 7) == 7
        emit_model_call(governor, conversation(1)[0])
        assert governor.call("echo", lambda x: x, 8) == 8
    lens.close()
    assert lens.failures["jsonl"] >= 3
    assert "jsonl" in lens.last_errors
    assert governor.sink_failures == 0  # the Lens never raised into the governor


class _BrokenExporter(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        raise ConnectionError("collector unreachable")


class _RaisingProcessor(SimpleSpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("span processor bug")


def test_a_failing_span_pipeline_is_counted_and_the_file_trace_still_complete(
    governor: lg.Governor, trace_path: Path
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(_RaisingProcessor(_BrokenExporter()))
    lens = install(governor, trace_path, tracer_provider=provider)
    with governor.task("t1"):
        for i in range(3):
            assert governor.call("echo", lambda x: x, i) == i
    lens.close()
    assert lens.failures["otel"] >= 3
    assert [e["event"] for e in load_trace(trace_path).events].count("tool_call") == 3


def test_a_cut_short_last_line_is_skipped_not_fatal(
    governor: lg.Governor, lens: Lens, trace_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    with governor.task("t1"):
        emit_model_call(governor, conversation(1)[0])
    lens.close()
    with open(trace_path, "a", encoding="utf-8") as fh:
        fh.write('{"event":"tool_call","tool":"sea')  # a process killed mid-write
    trace = load_trace(trace_path)
    assert trace.skipped_lines == 1
    assert [e["event"] for e in trace.events] == ["task_start", "model_call", "task_end"]
    assert rebuild_prompt(trace, trace.model_calls[0]) == conversation(1)[0]


def test_reopening_a_trace_appends_and_keeps_the_store_deduplicated(
    new_governor: Any, trace_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    prompts = conversation(3)
    for task, prompt in (("first", prompts[1]), ("second", prompts[2])):
        gov = new_governor()
        with install(gov, trace_path):
            with gov.task(task):
                emit_model_call(gov, prompt)
    stored = _lines(snapshot_path_for(trace_path))
    assert len(stored) == len(prompts[2])
    trace = load_trace(trace_path)
    assert [c["task_id"] for c in trace.model_calls] == ["first", "second"]
    assert rebuild_prompt(trace, trace.model_calls[1]) == prompts[2]
    assert sum(1 for line in trace_path.read_text().splitlines() if "trace_header" in line) == 1


def test_messages_mutated_after_the_call_do_not_change_the_recorded_prompt(
    governor: lg.Governor, lens: Lens, trace_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    # CrewAI's before_llm_call hook edits the message list in place after the fact.
    prompt = conversation(2)[1]
    original = [dict(m) for m in prompt]
    with governor.task("t1"):
        emit_model_call(governor, prompt)
        prompt[1]["content"] = "rewritten later"
        del prompt[2:]
    lens.close()
    trace = load_trace(trace_path)
    assert rebuild_prompt(trace, trace.model_calls[0]) == original


def test_calls_from_many_threads_are_all_recorded_once(governor: lg.Governor, lens: Lens, trace_path: Path) -> None:
    def worker(n: int) -> None:
        with governor.task(f"t{n}"):
            for i in range(100):
                assert governor.call("echo", lambda x: x, i) == i

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lens.close()
    events = load_trace(trace_path).events
    calls = [e for e in events if e["event"] == "tool_call"]
    assert len(calls) == 400
    assert len({e["seq"] for e in events}) == len(events)
    assert {e["task_id"] for e in calls} == {"t0", "t1", "t2", "t3"}
    assert lens.failures == {}


def test_a_writer_that_falls_behind_drops_events_instead_of_blocking(governor: lg.Governor, trace_path: Path) -> None:
    # The writer is held back (long interval, no early wake-up) to play a stalled disk.
    lens = Lens(trace_path, emit=governor.emit, max_pending=10, flush_interval_s=3600, wake_batch=1 << 30)
    governor.subscribe(lens)
    with governor.task("t1"):
        for i in range(50):
            assert governor.call("echo", lambda x: x, i) == i
    lens.close()
    assert lens.failures["dropped"] == 42  # task_start + 9 calls fit in the 10 slots
    assert len(load_trace(trace_path).events) == 10


def test_values_under_secret_named_keys_never_reach_the_trace_snapshots_or_spans(trace_path: Path) -> None:
    # Regression: each string was redacted on its own, so {"password": "hunter2-correct"} in
    # custom event fields or dict tool-call arguments was written as is; and names such as
    # "status" or "kind" were trusted at any depth, not only as the governor's own fields.
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lens = Lens(trace_path, tracer_provider=provider)
    lens({"event": "task_start", "task_id": "t"})
    lens(
        {
            "event": "tool_start",
            "task_id": "t",
            "tool": "login",
            "args": {"password": "hunter2 correct", "api_key": "k9f8d7s6a5"},
        }
    )
    lens(
        {
            "event": "model_call",
            "task_id": "t",
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "login", "arguments": {"password": "pw-2"}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "status": "sk-proj-abcdefghijklmnop1234", "content": "ok"},
            ],
        }
    )
    lens({"event": "tool_call", "task_id": "t", "tool": "x", "status": "ok", "extra": {"kind": "Bearer abc123456789"}})
    lens({"event": "task_end", "task_id": "t", "status": "ok"})
    lens.close()
    provider.shutdown()

    text = trace_path.read_text(encoding="utf-8") + snapshot_path_for(trace_path).read_text(encoding="utf-8")
    spans = json.dumps([dict(s.attributes or {}) for s in exporter.get_finished_spans()], default=str)
    for secret in ("hunter2", "k9f8d7s6a5", "pw-2", "sk-proj-abcdefghijklmnop1234", "abc123456789"):
        assert secret not in text, secret
        assert secret not in spans, secret
    trace = load_trace(trace_path)
    (start,) = trace.of("tool_start")
    assert start["args"] == {"password": "[REDACTED]", "api_key": "[REDACTED]"}
    assert start["tool"] == "login"  # the governor's own top-level fields are kept as is
    rebuilt = rebuild_prompt(trace, trace.model_calls[0])
    assert rebuilt[0]["tool_calls"][0]["function"]["arguments"] == {"password": "[REDACTED]"}


@pytest.mark.parametrize("cut", ["trace", "snapshots", "both"])
def test_reopening_after_a_cut_short_line_loses_nothing_new(trace_path: Path, cut: str) -> None:
    # Regression: the next session appended straight after the partial last line, so its
    # first record was glued to it and lost; a glued snapshot's hash was still marked stored,
    # so the prompts using that message could never be rebuilt.
    first = Lens(trace_path, spans=False)
    first({"event": "model_call", "task_id": "t1", "messages": [{"role": "user", "content": "hello"}]})
    first.close()
    if cut in ("trace", "both"):
        with open(trace_path, "a", encoding="utf-8") as fh:
            fh.write('{"event":"tool_call","tool":"x"')
    if cut in ("snapshots", "both"):
        with open(snapshot_path_for(trace_path), "a", encoding="utf-8") as fh:
            fh.write('{"hash":"abc","mess')
    second_prompt = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "new msg"}]
    second = Lens(trace_path, spans=False)
    second({"event": "model_call", "task_id": "t2", "messages": second_prompt})
    second({"event": "tool_call", "task_id": "t2", "tool": "after", "status": "ok"})
    second.close()

    trace = load_trace(trace_path)
    assert trace.skipped_lines == (1 if cut in ("trace", "both") else 0)
    assert [(e["event"], e["task_id"]) for e in trace.events] == [
        ("model_call", "t1"),
        ("model_call", "t2"),
        ("tool_call", "t2"),
    ]
    assert rebuild_prompt(trace, trace.model_calls[1]) == second_prompt
    assert rebuild_prompt(trace, trace.model_calls[0]) == [{"role": "user", "content": "hello"}]
