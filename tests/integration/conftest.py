"""End-to-end fixtures: real LangChain / LangGraph / crewAI runs driven by scripted models.

These tests prove the issues' "must show" items through the adapters, so the models are
the only fakes: a LangChain chat model and a crewAI ``BaseLLM`` whose replies are a
function of the conversation they are shown (which survives pruning, retries and
resumes), and which record every prompt exactly as received.

crewAI must be configured offline before anything imports it: importing crewai writes
under ``~/.local/share/crewai`` and starts telemetry otherwise, hence the environment set
at module top. pytest runs with ``--import-mode=importlib``, so test modules get these
helpers through fixtures, not imports.
"""

from __future__ import annotations

import os
import tempfile

os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_DISABLE_TRACKING"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["HOME"] = tempfile.mkdtemp(prefix="lg-integration-home-")

import copy
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from crewai import Agent, Crew, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import BaseLLM, llm_call_context
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_openai_messages
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel, Field, PrivateAttr

import loop_governor as lg

# BaseLLM.get_input_tokens_count warns on every call of a model without a native counter.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)

NOTE_MARK = "[loop-governor]"
"""How the governor's no-progress note starts (loop_governor.progress.NOTE)."""


# -- LangChain ----------------------------------------------------------------------------
LcScript = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose reply is a function of the prompt; records every prompt.

    ``bind_tools`` works (LangChain's own fakes raise there). ``usage`` is attached to
    every reply as ``usage_metadata``, the way provider integrations report it.
    """

    script: Any
    prompts: list[list[BaseMessage]] = Field(default_factory=list)
    usage: dict[str, Any] = Field(
        default_factory=lambda: {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
    )

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        self.prompts.append(list(messages))
        reply = self.script(list(messages)).model_copy(
            update={"usage_metadata": dict(self.usage), "response_metadata": {"finish_reason": "stop"}}
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


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def lc_results(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


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
@dataclass(frozen=True)
class ToolStep:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Final:
    text: str


CrewScript = Callable[[list[dict[str, Any]], int], "ToolStep | Final"]


def native_turn(messages: list[dict[str, Any]]) -> int:
    """Tool exchanges done so far, from the newest ``call_N`` result still in the prompt
    (so the count survives a pruner that stubs or drops old results)."""
    done = -1
    for m in messages:
        tcid = str(m.get("tool_call_id") or "")
        if m.get("role") == "tool" and tcid.startswith("call_"):
            done = max(done, int(tcid.removeprefix("call_")))
    return done + 1


class ScriptedLLM(BaseLLM):
    """A crewAI LLM with native (OpenAI-style) tool calls, replying by a script.

    ``script(messages, turn)`` returns a :class:`ToolStep` or :class:`Final`. Every call
    records a deep copy of what it received and emits crewAI's LLM events with provider
    usage, as a real provider client does.
    """

    script: Any
    usage: dict[str, Any] = Field(default_factory=lambda: {"prompt_tokens": 100, "completion_tokens": 10})
    # crewAI assumes 4096 tokens for an unknown model, then defers big tool results to
    # files and summarizes the conversation itself; a current model's window avoids that.
    context_window: int = 200_000
    _received: list[list[dict[str, Any]]] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def received(self) -> list[list[dict[str, Any]]]:
        return self._received

    def supports_function_calling(self) -> bool:
        return True

    def get_context_window_size(self) -> int:
        return self.context_window

    def supports_stop_words(self) -> bool:
        return False

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any | None = None,
        from_agent: Any | None = None,
        response_model: type[BaseModel] | None = None,
    ) -> Any:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        with self._lock:
            self._received.append(copy.deepcopy(list(messages)))
        turn = native_turn(messages)
        step = self.script(messages, turn)
        reply: Any
        if isinstance(step, Final):
            reply = step.text
        else:
            reply = [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {"name": step.name, "arguments": json.dumps(step.args)},
                }
            ]
        with llm_call_context():
            self._emit_call_started_event(messages=messages, tools=tools, from_task=from_task, from_agent=from_agent)
            self._emit_call_completed_event(
                response=reply,
                call_type=LLMCallType.TOOL_CALL if isinstance(reply, list) else LLMCallType.LLM_CALL,
                from_task=from_task,
                from_agent=from_agent,
                messages=messages,
                usage=dict(self.usage),
                finish_reason="tool_calls" if isinstance(reply, list) else "stop",
            )
        return reply

    async def acall(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any | None = None,
        from_agent: Any | None = None,
        response_model: type[BaseModel] | None = None,
    ) -> Any:
        return self.call(messages, tools, callbacks, available_functions, from_task, from_agent, response_model)


def make_crew(llm: ScriptedLLM, tools: list[Any], *, max_iter: int = 25) -> Crew:
    agent = Agent(
        role="writer",
        goal="deliver the requested text",
        backstory="careful",
        llm=llm,
        tools=tools,
        max_iter=max_iter,
        verbose=False,
    )
    task = Task(description="Write the text and get it reviewed.", expected_output="the text", agent=agent)
    return Crew(agents=[agent], tasks=[task], verbose=False)


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
def _no_sleep(_seconds: float) -> None:
    return None


async def _no_asleep(_seconds: float) -> None:
    return None


@pytest.fixture
def make_governor() -> Callable[..., lg.Governor]:
    """A governor whose retries back off on virtual time (no real sleeping)."""

    def build(**config: Any) -> lg.Governor:
        return lg.Governor(lg.GovernorConfig(**config), sleep=_no_sleep, asleep=_no_asleep, random=lambda: 0.5)

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
        lc_results=lc_results,
        lc_bytes=lc_bytes,
        assert_lc_pairs_intact=assert_lc_pairs_intact,
        ScriptedLLM=ScriptedLLM,
        ToolStep=ToolStep,
        Final=Final,
        make_crew=make_crew,
        assert_dict_pairs_intact=assert_dict_pairs_intact,
    )
