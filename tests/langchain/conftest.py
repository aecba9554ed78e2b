"""Shared fixtures for the LangChain adapter tests: a scripted chat model, HTTP-like
errors, a scripted backend and a governor on virtual time (no real sleeping)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

import loop_governor as lg


class HTTPError(Exception):
    """An error shaped like an SDK's HTTP error: the classifier reads ``status_code``."""

    def __init__(self, status_code: int, message: str = "") -> None:
        super().__init__(message or f"HTTP {status_code}")
        self.status_code = status_code


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


Script = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose reply is a function of the conversation it is shown.

    Choosing replies from the conversation (not from a call counter) keeps it correct
    across retries and resumes. ``prompts`` records every prompt exactly as received.
    ``bind_tools`` works (returns the model), unlike LangChain's built-in fakes.
    """

    script: Any
    prompts: list[list[BaseMessage]] = Field(default_factory=list)
    usage: dict[str, Any] = Field(
        default_factory=lambda: {
            "input_tokens": 120,
            "output_tokens": 7,
            "total_tokens": 127,
            "input_token_details": {"cache_read": 96, "cache_creation": 0},
        }
    )

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        self.prompts.append(list(messages))
        reply = self.script(list(messages))
        reply = reply.model_copy(
            update={"usage_metadata": self.usage, "response_metadata": {"finish_reason": "stop"}}
        )
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._reply(messages)


def tool_messages(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def call_tool_until(
    name: str, times: int, args: Callable[[int], dict[str, Any]], final: str = "done"
) -> Script:
    """Script: call ``name`` (one call per turn) until ``times`` results came back, then answer."""

    def script(messages: list[BaseMessage]) -> AIMessage:
        seen = len(tool_messages(messages))
        if seen >= times:
            return AIMessage(content=final)
        return AIMessage(
            content="",
            tool_calls=[{"name": name, "args": args(seen), "id": f"call_{seen}", "type": "tool_call"}],
        )

    return script


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
        return [
            m.model_copy(update={"content": "[pruned]"}) if i in old else m for i, m in enumerate(messages)
        ]


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
