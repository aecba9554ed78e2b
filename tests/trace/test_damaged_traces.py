"""Issue 17: a damaged or type-confused trace never crashes ``load_trace``, the report or an
appending writer; bad lines are skipped, counted, and the count shown."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from loop_governor.cli import app
from loop_governor.trace import Lens, load_trace, rebuild_prompt, render_report, snapshot_path_for

PROMPT = [{"role": "system", "content": "Antwort auf Deutsch: Grüße, café, 日本語"}, {"role": "user", "content": "hé"}]


def _good_trace(path: Path) -> None:
    lens = Lens(path, spans=False)
    lens({"event": "task_start", "task_id": "t1"})
    lens({"event": "model_call", "task_id": "t1", "input_tokens": 10, "messages": PROMPT})
    lens({"event": "tool_call", "task_id": "t1", "tool": "search", "status": "ok", "attempts": 1, "duration_s": 0.1})
    lens({"event": "task_end", "task_id": "t1"})
    lens.close()


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_a_writer_killed_mid_character_leaves_a_trace_that_loads_reports_and_continues(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    _good_trace(path)
    torn = '{"event":"tool_call","task_id":"t1","tool":"café'.encode()[:-1]  # half of "é"
    _append(path, torn)
    _append(snapshot_path_for(path), b'{"hash":"0123","message":{"content":"\xc3')

    trace = load_trace(path)
    assert (trace.skipped_lines, trace.skipped_snapshot_lines) == (1, 1)
    assert [e["event"] for e in trace.events] == ["task_start", "model_call", "tool_call", "task_end"]
    assert rebuild_prompt(trace, trace.model_calls[0]) == PROMPT
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 unreadable trace line(s) skipped" in result.output
    assert "1 unreadable trace line(s) skipped" in out.read_text(encoding="utf-8")

    # A restarted process appends: on a fresh line, nothing lost, nothing failing.
    second = Lens(path, spans=False)
    second({"event": "model_call", "task_id": "t2", "messages": [*PROMPT, {"role": "assistant", "content": "ö"}]})
    second({"event": "tool_call", "task_id": "t2", "tool": "after", "status": "ok"})
    second.close()
    assert second.failures == {}
    trace = load_trace(path)
    assert (trace.skipped_lines, trace.skipped_snapshot_lines) == (1, 1)
    assert [(e["event"], e.get("task_id")) for e in trace.events][-2:] == [("model_call", "t2"), ("tool_call", "t2")]
    assert rebuild_prompt(trace, trace.model_calls[-1])[-1] == {"role": "assistant", "content": "ö"}


TYPE_CONFUSED = [
    b'{"event":"model_call","task_id":["t1"],"turn":1}',
    b'{"event":"model_call","task_id":{"a":1},"input_tokens":5}',
    b'{"event":"anomaly","task_id":"t1","turn":[2],"kind":"x"}',
    b'{"event":"model_call","task_id":"t1","message_hashes":[[1]]}',
    b'{"event":"model_call","task_id":"t1","message_hashes":[null, 3]}',
    b'{"event":"model_call","task_id":"t1","message_hashes":"abc"}',
    b'{"event":"model_call","task_id":"t1","input_tokens":' + b"9" * 400 + b"}",
    b'{"event":"model_call","task_id":"t1","output_tokens":' + b"9" * 5000 + b"}",
    b'{"event":"tool_call","task_id":"t1","tool":"x","ts":' + b"9" * 320 + b"}",
    b'{"event":"tool_call","task_id":"t1","tool":"x","ts":Infinity,"duration_s":NaN}',
    b'{"event":"tool_call","task_id":"t1","tool":"x","attempts":"3"}',
    b'{"event":["model_call"]}',
    b'{"task_id":"t1","turn":1}',
    b"[1, 2, 3]",
    b'"a string"',
    b"\xff\xfe\x00\x9brandom\x00bytes",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"event":"x","deep":' + b"[" * 500 + b"]" * 500 + b"}",
    b'{"event":"model_call","seq":true}',
]


@pytest.mark.parametrize("line", TYPE_CONFUSED, ids=[f"case{i}" for i in range(len(TYPE_CONFUSED))])
def test_type_confused_lines_are_skipped_counted_and_reported(tmp_path: Path, line: bytes) -> None:
    path = tmp_path / "trace.jsonl"
    _good_trace(path)
    _append(path, line + b"\n")
    trace = load_trace(path)
    assert trace.skipped_lines == 1
    assert [e["event"] for e in trace.events] == ["task_start", "model_call", "tool_call", "task_end"]
    assert "1 unreadable trace line(s) skipped" in render_report(trace)


@pytest.mark.parametrize("name", ["snapdir", "..", ".", "", "x\x00y"])
def test_a_header_naming_a_directory_or_nonsense_falls_back_to_the_default_store(tmp_path: Path, name: str) -> None:
    path = tmp_path / "trace.jsonl"
    (tmp_path / "snapdir").mkdir()
    _good_trace(path)
    lines = path.read_bytes().splitlines()
    header = json.loads(lines[0])
    header["snapshots"] = name
    path.write_bytes(b"\n".join([json.dumps(header).encode(), *lines[1:]]) + b"\n")
    trace = load_trace(path)
    assert rebuild_prompt(trace, trace.model_calls[0]) == PROMPT
    render_report(trace)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "tool_calls": 5},
        {"role": "assistant", "tool_calls": [{"function": "str"}, 7, None]},
        {"role": ["x"], "content": {"a": [1]}, "name": {"n": 1}},
        "a bare string",
        None,
        [1, [2, [3]]],
    ],
)
def test_odd_snapshot_messages_render(tmp_path: Path, message: Any) -> None:
    path = tmp_path / "trace.jsonl"
    lens = Lens(path, spans=False)
    lens({"event": "model_call", "task_id": "t1", "messages": [message]})
    lens.close()
    trace = load_trace(path)
    assert rebuild_prompt(trace, trace.model_calls[0]) == [message]
    assert "<html" in render_report(trace)


# -- fuzzing ---------------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = [
    "event", "task_id", "turn", "seq", "ts", "tool", "status", "attempts", "duration_s", "latency_s", "model",
    "input_tokens", "cache_read_tokens", "output_tokens", "message_hashes", "prefix_kept", "context_health",
    "kind", "message", "to_state", "from_state", "finish_reason", "signature", "error_type",
]  # fmt: skip
_EVENTS = ["model_call", "tool_call", "retry", "breaker", "pruning", "anomaly", "task_start", "task_end", "summary"]


@st.composite
def _record(draw: st.DrawFn) -> bytes:
    record: dict[str, Any] = {"event": draw(st.sampled_from(_EVENTS)), "task_id": draw(st.sampled_from(["t1", "t2"]))}
    for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=6)):
        record[name] = draw(_json)
    return json.dumps(record).encode()


_line = st.one_of(
    _record(),
    st.binary(max_size=40),
    _json.map(lambda v: json.dumps(v).encode()),
    st.text(string.printable, max_size=40).map(str.encode),
)


def _is_header(line: bytes) -> bool:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("event") == "trace_header"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, max_size=12), snapshot_lines=st.lists(_line, max_size=4))
def test_fuzzed_traces_never_crash_the_loader_or_the_report(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], snapshot_lines: list[bytes]
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "trace.jsonl"
    _good_trace(path)
    before = len(load_trace(path).events)
    body = b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines)
    _append(path, body)
    _append(snapshot_path_for(path), b"".join(line.replace(b"\n", b" ") + b"\n" for line in snapshot_lines))
    trace = load_trace(path)
    nonblank = [line for line in body.split(b"\n") if line.strip()]
    assert len(trace.events) - before + trace.skipped_lines + sum(map(_is_header, nonblank)) == len(nonblank)
    assert "<html" in render_report(trace)
    for call in trace.model_calls:
        try:
            rebuild_prompt(trace, call)
        except (KeyError, ValueError):
            pass  # a fuzzed hash list names messages the store lacks: a clear, typed refusal
