"""Shared fixtures for the LangChain adapter tests: a scripted chat model, HTTP-like
errors, a scripted backend and a governor on virtual time (no real sleeping)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import lg_langchain
import pytest
from langchain_core.messages import BaseMessage, ToolMessage
from lg_langchain import call_tool_until, tool_messages
from lg_testing import HTTPError
from pydantic import Field

import loop_governor as lg


class Backend:
    """A remote service stand-in: fails with the scripted statuses, then answers.

    ``statuses`` are consumed one per call; ``None`` means success. ``forever`` repeats
    the last status once the script runs out.
    """

    def __init__(self, statuses: Sequence[int | None] = (), *, forever: bool = False) -> None:
        self.statuses = list(statuses)
        self.forever = forever
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        index = len(self.calls) - 1
        if index < len(self.statuses):
            status = self.statuses[index]
        else:
            status = self.statuses[-1] if (self.forever and self.statuses) else None
        if status is not None:
            raise HTTPError(status, f"backend answered {status}")
        return f"result for {json.dumps(kwargs, sort_keys=True)}"


class ScriptedChatModel(lg_langchain.ScriptedChatModel):
    """The shared scripted model, reporting usage with prompt-cache details by default."""

    usage: dict[str, Any] | None = Field(
        default_factory=lambda: {
            "input_tokens": 120,
            "output_tokens": 7,
            "total_tokens": 127,
            "input_token_details": {"cache_read": 96, "cache_creation": 0},
        }
    )


class Sleeps:
    """Virtual time: records requested delays instead of sleeping."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def events() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def governor(sleeps: Sleeps, events: list[dict[str, Any]]) -> lg.Governor:
    gov = lg.Governor(lg.GovernorConfig(), clock=sleeps.clock, sleep=sleeps.sleep, asleep=sleeps.asleep)
    gov.subscribe(events.append)
    return gov


class KeepLastToolResults:
    """Stand-in pruner: older tool results become a stub (copies; inputs untouched)."""

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep
        self.calls = 0

    def prune(self, messages: list[BaseMessage]) -> list[BaseMessage]:
        self.calls += 1
        tool_positions = [i for i, m in enumerate(messages) if isinstance(m, ToolMessage)]
        old = set(tool_positions[: max(0, len(tool_positions) - self.keep)])
        return [m.model_copy(update={"content": "[pruned]"}) if i in old else m for i, m in enumerate(messages)]


@pytest.fixture
def lc() -> SimpleNamespace:
    """The helpers above, for test modules (``--import-mode=importlib`` can't import conftest)."""
    return SimpleNamespace(
        Backend=Backend,
        HTTPError=HTTPError,
        ScriptedChatModel=ScriptedChatModel,
        KeepLastToolResults=KeepLastToolResults,
        call_tool_until=call_tool_until,
        tool_messages=tool_messages,
    )
