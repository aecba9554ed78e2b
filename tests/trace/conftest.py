"""Shared fixtures for the Agent Lens tests: a governor on virtual time and a scripted run.

pytest runs with --import-mode=importlib, so helpers are handed out as fixtures rather
than imported from this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import loop_governor as lg
from loop_governor.trace import DetectorConfig, Lens, install

SECRET = "sk-proj-abcdefghijklmnopqrstuvwx1234"


class VirtualClock:
    """Time that only moves when the governor sleeps or a test advances it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def governor(clock: VirtualClock) -> lg.Governor:
    return lg.Governor(lg.GovernorConfig(), clock=clock, sleep=clock.sleep, random=lambda: 0.5)


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "trace.jsonl"


@pytest.fixture
def lens(governor: lg.Governor, trace_path: Path) -> Iterator[Lens]:
    # Small thresholds so short scripted conversations exercise the detectors.
    lens = install(governor, trace_path, detectors=DetectorConfig(cache_min_input_tokens=0))
    yield lens
    lens.close()


def conversation(turns: int) -> list[list[dict[str, Any]]]:
    """The prompts of a ``turns``-turn tool-using conversation, each extending the last."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You answer questions about the docs."},
        {"role": "user", "content": "How do I rotate the API key?"},
    ]
    prompts = [list(messages)]
    for i in range(1, turns):
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "search_docs", "arguments": f'{{"q": "rotate key {i}"}}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"result page {i}: use the console"})
        prompts.append(list(messages))
    return prompts


def emit_model_call(
    governor: lg.Governor,
    messages: list[dict[str, Any]],
    *,
    cache_read: int = 0,
    input_tokens: int = 2000,
    model: str = "scripted-model",
    **extra: Any,
) -> None:
    governor.emit(
        "model_call",
        model=model,
        latency_s=0.25,
        input_tokens=input_tokens,
        output_tokens=40,
        cache_read_tokens=cache_read,
        cache_creation_tokens=0,
        finish_reason="tool_calls",
        messages=messages,
        **extra,
    )


@pytest.fixture(name="conversation")
def conversation_fixture() -> Any:
    return conversation


@pytest.fixture(name="emit_model_call")
def emit_model_call_fixture() -> Any:
    return emit_model_call


@pytest.fixture(name="secret")
def secret_fixture() -> str:
    return SECRET


@pytest.fixture
def new_governor(clock: VirtualClock) -> Any:
    """A factory for further governors sharing the test's virtual clock."""
    return lambda: lg.Governor(lg.GovernorConfig(), clock=clock, sleep=clock.sleep, random=lambda: 0.5)


@pytest.fixture(autouse=True)
def _otel_sdk_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CrewAI tests' conftest sets OTEL_SDK_DISABLED=true for the whole session (crewAI
    must not phone home); a TracerProvider built under it makes no spans at all."""
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
