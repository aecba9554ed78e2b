"""crewAI test helpers shared by the test folders and the crash-test child processes.

Scripted ``BaseLLM`` models (tool calls by script, or one answer per task), a ``BaseTool``
around a plain callable, and a one-agent crew builder. No pytest here: ``crew_child.py``
imports this module too. The process must have called ``lg_crewai_env.offline_crewai()``
before importing it (checked below, before crewai loads).
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lg_crewai_env

lg_crewai_env.require_offline_crewai()

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.events.types.llm_events import LLMCallType  # noqa: E402
from crewai.llms.base_llm import BaseLLM, llm_call_context  # noqa: E402
from crewai.tools import BaseTool  # noqa: E402
from pydantic import BaseModel, Field, PrivateAttr  # noqa: E402

# BaseLLM.get_input_tokens_count logs a warning on every call for a model without a
# native counter; it says nothing about the code under test.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)


# -- actions a scripted model takes, one per turn --------------------------------------------
@dataclass(frozen=True)
class ToolStep:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Final:
    text: str


Step = ToolStep | Final
CrewScript = Callable[[list[dict[str, Any]], int], Step]

_TURN_MARK = re.compile(r"\[turn (\d+)\]")


def native_turn(messages: list[dict[str, Any]]) -> int:
    """Tool exchanges done so far, from the newest ``call_N`` result still in the prompt
    (so the count survives a pruner that stubs or drops old results)."""
    done = -1
    for m in messages:
        tcid = str(m.get("tool_call_id") or "")
        if m.get("role") == "tool" and tcid.startswith("call_"):
            done = max(done, int(tcid.removeprefix("call_")))
    return done + 1


def react_turn(messages: list[dict[str, Any]]) -> int:
    """Tool exchanges done so far, from the newest ``[turn N]`` marker in an assistant text
    that an observation followed."""
    done = -1
    for m in messages:
        if m.get("role") != "assistant":
            continue
        text = str(m.get("content") or "")
        for match in _TURN_MARK.finditer(text):
            if "Observation:" in text[match.end() :]:
                done = max(done, int(match.group(1)))
    return done + 1


class ScriptedLLM(BaseLLM):
    """A crewAI LLM that plays a script, with native tool calls or ReAct text.

    ``script`` is a list of steps (one per turn, the last one repeating) or a function
    ``script(messages, turn)`` returning a :class:`ToolStep` or :class:`Final`. The turn is
    derived from the conversation (tool results seen so far), not from a counter, so the
    script holds whatever crewAI re-sends. Every call records a deep copy of the messages
    it received and emits crewAI's LLM events with provider ``usage``, as a real provider
    client does. ``context_window`` replaces crewAI's default window when set.
    """

    native: bool = False
    script: Any = Field(default_factory=list)
    usage: dict[str, Any] = Field(
        default_factory=lambda: {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 64},
        }
    )
    context_window: int | None = None
    _received: list[list[dict[str, Any]]] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def received(self) -> list[list[dict[str, Any]]]:
        return self._received

    def supports_function_calling(self) -> bool:
        return self.native

    def supports_stop_words(self) -> bool:
        return not self.native

    def get_context_window_size(self) -> int:
        return self.context_window if self.context_window is not None else super().get_context_window_size()

    def _step(self, messages: list[dict[str, Any]], turn: int) -> Step:
        if callable(self.script):
            return self.script(messages, turn)  # type: ignore[no-any-return]
        return self.script[min(turn, len(self.script) - 1)]  # type: ignore[no-any-return]

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
        turn = native_turn(messages) if self.native else react_turn(messages)
        reply = self._reply(self._step(messages, turn), turn)
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

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


# -- one answer per task (the crew resume tests) ----------------------------------------------
_TASK = re.compile(r"TASK-(\d)")


class TaskAnswerLLM(BaseLLM):
    """A crewAI LLM answering each task at once (a ReAct final answer).

    The answer names the task (its ``TASK-N`` marker in the prompt's newest "Current
    Task:" part) and which earlier outputs (``OUTPUT-N``) the prompt carried as context, so
    tests can see what ran and what it saw. Subclasses see every call in :meth:`on_task`.
    """

    def supports_function_calling(self) -> bool:
        return False

    def on_task(self, task: str) -> None:
        """Called with ``"task-N"`` (``"task-?"`` without a marker) before answering."""

    def call(
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str:
        text = messages if isinstance(messages, str) else "\n".join(str(m.get("content") or "") for m in messages)
        task = _TASK.search(text.rsplit("Current Task:", 1)[-1])
        number = task.group(1) if task else "?"
        self.on_task(f"task-{number}")
        seen = sorted(set(re.findall(r"OUTPUT-(\d)", text)))
        return f"Thought: done.\nFinal Answer: OUTPUT-{number} (context saw {','.join(seen) or 'nothing'})"


# -- tools and crews ----------------------------------------------------------------------------
class CallableTool(BaseTool):
    """A ``BaseTool`` subclass whose runs call a plain function with the tool's arguments.

    Subclasses set ``name``, ``description`` and ``args_schema``; the function is private,
    so the tool's public fields are only what crewAI renders.
    """

    _fn: Callable[..., str] = PrivateAttr()

    def __init__(self, fn: Callable[..., str], **data: Any) -> None:
        super().__init__(**data)
        self._fn = fn

    def _run(self, **kwargs: Any) -> str:
        return self._fn(**kwargs)


def make_crew(
    llm: BaseLLM,
    tools: Sequence[Any] = (),
    *,
    role: str,
    goal: str,
    tasks: Sequence[tuple[str, str]],
    max_iter: int,
    task_kwargs: dict[str, Any] | None = None,
    **crew_kwargs: Any,
) -> Crew:
    """One agent (``llm``, ``tools``) running ``tasks``, (description, expected output) pairs."""
    agent = Agent(
        role=role,
        goal=goal,
        backstory="careful",
        llm=llm,
        tools=list(tools),
        max_iter=max_iter,
        verbose=False,
    )
    crew_tasks = [
        Task(description=description, expected_output=expected, agent=agent, **(task_kwargs or {}))
        for description, expected in tasks
    ]
    return Crew(agents=[agent], tasks=crew_tasks, verbose=False, **crew_kwargs)
