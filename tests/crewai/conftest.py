"""Shared fixtures for the crewAI adapter tests: offline crewAI, a scripted LLM, backends.

The environment is set at module top, before anything imports crewai: importing crewai
writes under ~/.local/share/crewai and would start telemetry otherwise.
"""

from __future__ import annotations

import os
import tempfile

os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_DISABLE_TRACKING"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["HOME"] = tempfile.mkdtemp(prefix="lg-crewai-home-")

import copy
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from crewai import Agent, Crew, Task
from crewai.events.types.llm_events import LLMCallType
from crewai.llms.base_llm import BaseLLM, llm_call_context
from crewai.tools import BaseTool
from pydantic import BaseModel, Field, PrivateAttr

import loop_governor as lg

# BaseLLM.get_input_tokens_count logs a warning on every call for a model without a
# native counter; it says nothing about the adapter.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)


# -- actions the scripted model takes, one per turn --------------------------------------
@dataclass(frozen=True)
class ToolStep:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Final:
    text: str


Step = ToolStep | Final

_TURN_MARK = re.compile(r"\[turn (\d+)\]")


def _assistant_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content") or "") for m in messages if m.get("role") == "assistant"]


class ScriptedLLM(BaseLLM):
    """A crewAI LLM that plays a fixed script, native tool calls or ReAct text.

    The turn is derived from the conversation (tool results seen so far), not from a
    counter, so the script holds whatever crewAI re-sends. Every call records a deep copy
    of the messages it received and emits crewAI's LLM events with provider usage, as a
    real provider client does.
    """

    native: bool = False
    script: list[Any] = Field(default_factory=list)
    usage: dict[str, Any] = Field(
        default_factory=lambda: {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    )
    _received: list[list[dict[str, Any]]] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def received(self) -> list[list[dict[str, Any]]]:
        return self._received

    def supports_function_calling(self) -> bool:
        return self.native

    def supports_stop_words(self) -> bool:
        return not self.native

    def _turn(self, messages: list[dict[str, Any]]) -> int:
        # Derived from the newest tool exchange still in the conversation (call ids
        # "call_N" natively, "[turn N]" markers in ReAct text), so it survives pruning.
        done = -1
        if self.native:
            for m in messages:
                tcid = str(m.get("tool_call_id") or "")
                if m.get("role") == "tool" and tcid.startswith("call_"):
                    done = max(done, int(tcid.removeprefix("call_")))
        else:
            for text in _assistant_texts(messages):
                for match in _TURN_MARK.finditer(text):
                    if "Observation:" in text[match.end() :]:
                        done = max(done, int(match.group(1)))
        return done + 1

    def _reply(self, step: Step, turn: int) -> Any:
        if isinstance(step, Final):
            return step.text if self.native else f"Thought: I can answer now.\nFinal Answer: {step.text}"
        if self.native:
            return [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {"name": step.name, "arguments": json.dumps(step.args)},
                }
            ]
        return (
            f"Thought: [turn {turn}] I should use a tool.\nAction: {step.name}\nAction Input: {json.dumps(step.args)}"
        )

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
        turn = self._turn(messages)
        step = self.script[min(turn, len(self.script) - 1)]
        reply = self._reply(step, turn)
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


def all_text(llm: ScriptedLLM) -> str:
    """Every message content the model was shown, across all its calls."""
    return "\n".join(str(m.get("content") or "") for msgs in llm.received for m in msgs)


def governed_errors(llm: ScriptedLLM) -> list[dict[str, Any]]:
    """The governor's JSON error bodies found in what the model was shown (last call)."""
    found: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for m in llm.received[-1]:
        text = str(m.get("content") or "")
        start = text.find('{"error":')
        while start != -1:
            body, end = decoder.raw_decode(text, start)
            found.append(body["error"])
            start = text.find('{"error":', end)
    return found


# -- backends that fail like HTTP services ------------------------------------------------
class HTTPStatusError(Exception):
    """Raised by the fake backends; the classifier reads ``status_code``."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass
class Backend:
    """Counts every request that reaches the service; fails with ``status`` when set."""

    status: int | None = None
    message: str = "backend error"
    fail_first: int | None = None  # fail only the first N requests (None: every one)
    hits: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, **kwargs: Any) -> str:
        with self.lock:
            self.hits.append(kwargs)
            n = len(self.hits)
        failing = self.fail_first is None or n <= self.fail_first
        if self.status is not None and failing:
            raise HTTPStatusError(self.status, f"HTTP {self.status}: {self.message}")
        return f"results for {kwargs}"

    @property
    def count(self) -> int:
        return len(self.hits)


class SearchArgs(BaseModel):
    query: str = Field(description="what to look for")


class SearchTool(BaseTool):
    """A BaseTool subclass backed by a :class:`Backend`."""

    name: str = "search_docs"
    description: str = "Search the documentation for a query."
    args_schema: type[BaseModel] = SearchArgs
    _backend: Backend = PrivateAttr()

    def __init__(self, backend: Backend, **data: Any) -> None:
        super().__init__(**data)
        self._backend = backend

    def _run(self, query: str) -> str:
        return self._backend(query=query)


def make_crew(llm: ScriptedLLM, tools: list[Any], *, max_iter: int = 12, **crew_kwargs: Any) -> Crew:
    agent = Agent(
        role="researcher",
        goal="answer the question",
        backstory="careful",
        llm=llm,
        tools=tools,
        max_iter=max_iter,
        verbose=False,
    )
    task = Task(description="Find the answer.", expected_output="the answer", agent=agent)
    return Crew(agents=[agent], tasks=[task], verbose=False, **crew_kwargs)


def _no_sleep(_seconds: float) -> None:
    return None


async def _no_asleep(_seconds: float) -> None:
    return None


@pytest.fixture
def make_governor() -> Callable[..., lg.Governor]:
    """A governor on virtual time: retries back off without sleeping."""

    def build(**config: Any) -> lg.Governor:
        return lg.Governor(lg.GovernorConfig(**config), sleep=_no_sleep, asleep=_no_asleep)

    return build


@pytest.fixture
def governor(make_governor: Callable[..., lg.Governor]) -> lg.Governor:
    return make_governor()


@pytest.fixture
def events(governor: lg.Governor) -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(record: dict[str, Any]) -> None:
        with lock:
            seen.append(record)

    unsubscribe = governor.subscribe(sink)
    yield seen
    unsubscribe()


@pytest.fixture(params=[True, False], ids=["native", "react"])
def native(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


class CrewKit:
    """The helpers above, handed to tests as a fixture (``--import-mode=importlib`` means
    a test module cannot ``import conftest``)."""

    ScriptedLLM = ScriptedLLM
    ToolStep = ToolStep
    Final = Final
    Backend = Backend
    SearchTool = SearchTool
    HTTPStatusError = HTTPStatusError
    make_crew = staticmethod(make_crew)
    all_text = staticmethod(all_text)
    governed_errors = staticmethod(governed_errors)

    @staticmethod
    def four_searches(answer: str = "no docs today, answering from memory") -> list[Step]:
        """The model searches four times with different queries, then answers."""
        return [ToolStep("search_docs", {"query": f"q{i}"}) for i in range(4)] + [Final(answer)]


@pytest.fixture
def kit() -> type[CrewKit]:
    return CrewKit
