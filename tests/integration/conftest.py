"""End-to-end fixtures: real LangChain / LangGraph / crewAI runs driven by scripted models.

These tests prove the issues' "must show" items through the adapters, so the models are
the only fakes: a LangChain chat model and a crewAI ``BaseLLM`` whose replies are a
function of the conversation they are shown (which survives pruning, retries and
resumes), and which record every prompt exactly as received.

crewAI must be configured offline before anything imports it: importing crewai writes
under ``~/.local/share/crewai`` and starts telemetry otherwise, hence the call at module
top. pytest runs with ``--import-mode=importlib``, so test modules get these helpers
through fixtures, not imports.
"""

from __future__ import annotations

from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-integration-home-")

import functools  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import lg_crewai  # noqa: E402
import lg_langchain  # noqa: E402
import pytest  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_openai_messages  # noqa: E402
from lg_crewai import Final, ToolStep  # noqa: E402
from lg_langchain import tool_call, tool_messages  # noqa: E402
from lg_testing import no_asleep, no_sleep  # noqa: E402
from pydantic import Field  # noqa: E402

import loop_governor as lg  # noqa: E402

NOTE_MARK = "[loop-governor]"
"""How the governor's no-progress note starts (loop_governor.policies.progress.NOTE)."""


# -- LangChain ----------------------------------------------------------------------------
class ScriptedChatModel(lg_langchain.ScriptedChatModel):
    """The shared scripted model; ``usage`` goes on every reply as ``usage_metadata``."""

    usage: dict[str, Any] | None = Field(
        default_factory=lambda: {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
    )


def lc_bytes(message: BaseMessage) -> str:
    """The message as a provider receives it (OpenAI wire format), serialized: equal
    strings mean a byte-identical prompt prefix, i.e. a prompt-cache hit."""
    return json.dumps(convert_to_openai_messages(message), sort_keys=True, default=str)


def assert_lc_pairs_intact(messages: Sequence[BaseMessage]) -> None:
    """No tool result without its call before it, no tool call left unanswered."""
    issued: set[str] = set()
    answered: set[str] = set()
    for m in messages:
        if isinstance(m, AIMessage):
            issued |= {str(c["id"]) for c in m.tool_calls}
        elif isinstance(m, ToolMessage):
            assert m.tool_call_id in issued, f"orphaned tool result {m.tool_call_id}"
            answered.add(m.tool_call_id)
    assert issued <= answered, f"tool calls without results: {issued - answered}"


# -- crewAI -------------------------------------------------------------------------------
class ScriptedLLM(lg_crewai.ScriptedLLM):
    """The shared scripted LLM with native (OpenAI-style) tool calls; ``script(messages,
    turn)`` returns a :class:`ToolStep` or :class:`Final`."""

    native: bool = True
    usage: dict[str, Any] = Field(default_factory=lambda: {"prompt_tokens": 100, "completion_tokens": 10})
    # crewAI assumes 4096 tokens for an unknown model, then defers big tool results to
    # files and summarizes the conversation itself; a current model's window avoids that.
    context_window: int | None = 200_000


make_crew = functools.partial(
    lg_crewai.make_crew,
    role="writer",
    goal="deliver the requested text",
    tasks=[("Write the text and get it reviewed.", "the text")],
    max_iter=25,
)


def assert_dict_pairs_intact(messages: Sequence[dict[str, Any]]) -> None:
    issued: set[str] = set()
    answered: set[str] = set()
    for m in messages:
        if m.get("role") == "assistant":
            issued |= {str(c["id"]) for c in m.get("tool_calls") or []}
        elif m.get("role") == "tool":
            assert m.get("tool_call_id") in issued, f"orphaned tool result {m.get('tool_call_id')}"
            answered.add(str(m["tool_call_id"]))
    assert issued <= answered, f"tool calls without results: {issued - answered}"


# -- governors on virtual time -------------------------------------------------------------
@pytest.fixture
def make_governor() -> Callable[..., lg.Governor]:
    """A governor whose retries back off on virtual time (no real sleeping)."""

    def build(**config: Any) -> lg.Governor:
        return lg.Governor(lg.GovernorConfig(**config), sleep=no_sleep, asleep=no_asleep, random=lambda: 0.5)

    return build


@pytest.fixture
def events() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def governor(make_governor: Callable[..., lg.Governor], events: list[dict[str, Any]]) -> lg.Governor:
    gov = make_governor()
    lock = threading.Lock()

    def sink(record: dict[str, Any]) -> None:
        with lock:
            events.append(record)

    gov.subscribe(sink)
    return gov


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above for test modules (``--import-mode=importlib`` can't import conftest)."""
    return SimpleNamespace(
        NOTE_MARK=NOTE_MARK,
        ScriptedChatModel=ScriptedChatModel,
        tool_call=tool_call,
        lc_results=tool_messages,
        lc_bytes=lc_bytes,
        assert_lc_pairs_intact=assert_lc_pairs_intact,
        ScriptedLLM=ScriptedLLM,
        ToolStep=ToolStep,
        Final=Final,
        make_crew=make_crew,
        assert_dict_pairs_intact=assert_dict_pairs_intact,
    )
