"""Detectors: the anomalies a user relies on the trace to flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import loop_governor as lg
from loop_governor.trace import DetectorConfig, Lens, context_health, install, load_trace


def _kinds(lens: Lens) -> list[str]:
    return [a["kind"] for a in lens.anomalies]


def test_cache_reads_stuck_at_zero_with_an_unchanged_prefix_are_flagged_once(
    governor: lg.Governor, lens: Lens, trace_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    seen: list[dict[str, Any]] = []
    governor.subscribe(lambda e: seen.append(dict(e)) if e["event"] == "anomaly" else None)
    with governor.task("t1"):
        for prompt in conversation(4):
            emit_model_call(governor, prompt, cache_read=0)
    lens.close()

    assert _kinds(lens) == ["cache_read_zero"]
    (anomaly,) = seen  # published on the governor's bus, so every subscriber sees it
    assert anomaly["task_id"] == "t1"
    assert anomaly["turn"] == 2
    assert anomaly["prefix_messages"] == 2
    in_file = load_trace(trace_path).anomalies
    assert [(a["kind"], a["task_id"], a["turn"]) for a in in_file] == [("cache_read_zero", "t1", 2)]


def test_cache_hits_or_a_changed_prefix_are_not_flagged(
    governor: lg.Governor, lens: Lens, conversation: Any, emit_model_call: Any
) -> None:
    prompts = conversation(3)
    with governor.task("hits"):
        emit_model_call(governor, prompts[0], cache_read=0)
        emit_model_call(governor, prompts[1], cache_read=1800)
    with governor.task("rewritten"):
        emit_model_call(governor, prompts[1], cache_read=0)
        changed = [dict(m) for m in prompts[2]]
        changed[3] = {**changed[3], "content": "[pruned]"}  # a pruner rewrote an old message
        emit_model_call(governor, changed, cache_read=0)
    assert _kinds(lens) == []


def test_prompts_below_the_provider_cache_minimum_are_not_flagged(
    governor: lg.Governor, trace_path: Path, conversation: Any, emit_model_call: Any
) -> None:
    lens = install(governor, None)  # defaults: providers cache only prompts >= 1024 tokens
    with governor.task("t1"):
        for prompt in conversation(3):
            emit_model_call(governor, prompt, cache_read=0, input_tokens=300)
    with governor.task("t2"):
        for prompt in conversation(3):
            emit_model_call(governor, prompt, cache_read=0, input_tokens=3000)
    lens.close()
    assert [(a["kind"], a["task_id"]) for a in lens.anomalies] == [("cache_read_zero", "t2")]


def test_repeated_error_signatures_are_flagged_at_the_threshold(governor: lg.Governor, lens: Lens) -> None:
    def failing(page: int) -> str:
        raise LookupError("page not found")  # unknown error -> permanent: no retries, no breaker

    with governor.task("t1"):
        for page in range(2):
            with pytest.raises(lg.AgentToolError):
                governor.call("fetch_page", failing, page)
        assert _kinds(lens) == []
        with pytest.raises(lg.AgentToolError):
            governor.call("fetch_page", failing, 2)
    (anomaly,) = lens.anomalies
    assert anomaly["kind"] == "repeated_error"
    assert anomaly["tool"] == "fetch_page"
    assert anomaly["count"] == 3


def test_context_growth_per_turn_is_flagged(governor: lg.Governor, conversation: Any, emit_model_call: Any) -> None:
    lens = install(governor, None, detectors=DetectorConfig(growth_tokens_per_turn=5000, cache_min_input_tokens=0))
    prompts = conversation(3)
    with governor.task("t1"):
        emit_model_call(governor, prompts[0], input_tokens=2000, cache_read=1)
        emit_model_call(governor, prompts[1], input_tokens=6000, cache_read=1)  # +4000: fine
        emit_model_call(governor, prompts[2], input_tokens=31000, cache_read=1)  # a tool dumped a file
    lens.close()
    (anomaly,) = lens.anomalies
    assert (anomaly["kind"], anomaly["turn"], anomaly["growth_tokens"]) == ("context_growth", 3, 25000)


def test_low_context_health_is_flagged_when_errors_and_repeats_dominate(
    governor: lg.Governor, lens: Lens, emit_model_call: Any
) -> None:
    error = '{"error":{"type":"transient","retryable":false,"tool":"search"}}'
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find it"}]
    for content in ["page 1", error, error, "page 1", error]:
        messages.append({"role": "tool", "tool_call_id": "x", "content": content})
    health, results = context_health(messages)
    assert (round(health, 2), results) == (0.2, 5)  # 1 useful result of 5
    with governor.task("t1"):
        emit_model_call(governor, messages, cache_read=5)
    assert _kinds(lens) == ["low_context_health"]
    assert lens.anomalies[0]["health"] == 0.2


def test_health_counts_framework_error_texts_and_ignores_non_tool_messages() -> None:
    messages = [
        {"role": "assistant", "content": "Error: I am just talking"},
        {"role": "tool", "content": "Error executing tool: boom"},  # CrewAI
        {"role": "tool", "content": "fine", "status": "error"},  # LangChain ToolMessage status
        {"role": "tool", "content": "ok"},
        {"role": "tool", "content": "other"},
    ]
    assert context_health(messages) == (0.5, 4)
    assert context_health([{"role": "user", "content": "hi"}]) == (1.0, 0)


def test_a_long_prompt_with_a_short_shared_prefix_is_not_flagged(
    governor: lg.Governor, conversation: Any, emit_model_call: Any
) -> None:
    # Turn 2 sends 3000 tokens, but all it shares with turn 1 is a short system prompt
    # and question: below the provider's 1024-token minimum, nothing could be cached.
    lens = install(governor, None)
    first = conversation(1)[0]
    second = [*first, {"role": "user", "content": "Here is the whole manual: " + "rotate keys often. " * 600}]
    with governor.task("t1"):
        emit_model_call(governor, first, cache_read=0, input_tokens=40)
        emit_model_call(governor, second, cache_read=0, input_tokens=3000)
        emit_model_call(governor, [*second, {"role": "user", "content": "and?"}], cache_read=0, input_tokens=3010)
    lens.close()
    # turn 3 shares the 3000-token turn 2 prompt: that one should have been cached
    assert [(a["kind"], a["turn"]) for a in lens.anomalies] == [("cache_read_zero", 3)]
    assert lens.anomalies[0]["prefix_tokens"] >= 2900
