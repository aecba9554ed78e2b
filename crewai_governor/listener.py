"""Feed crewAI's event bus into the governor's events (and from there, Agent Lens).

crewAI reports usage raw, in the provider's own shape (``prompt_tokens`` /
``input_tokens`` / ``prompt_token_count``, cached tokens under three names); the listener
normalizes it with crewAI's own ``UsageMetrics.from_provider_dict`` so the figures agree
with crewAI's totals, cached prompt tokens included.

Handlers run on crewAI's thread pool, after the emitting code has moved on: call
[`GovernorEventListener.flush`][crewai_governor.listener.GovernorEventListener.flush] (``crewai_event_bus.flush``)
before reading results.

crewAI serializes an event's ``messages`` to a depth of five and writes anything deeper
as ``repr()``: a tool call's function name and arguments arrive as ``"'read_file'"`` and
``"'{\"path\": ...}'"``. The listener turns those back into the values crewAI sent, so
the trace shows the prompt as the model received it.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any

from crewai.events.base_event_listener import BaseEventListener
from crewai.events.event_bus import CrewAIEventsBus, crewai_event_bus
from crewai.events.types.llm_events import (
    LLMCallCompletedEvent,
    LLMCallFailedEvent,
    LLMCallStartedEvent,
)
from crewai.events.types.tool_usage_events import (
    ToolFailureDetectedEvent,
    ToolUsageErrorEvent,
    ToolUsageFinishedEvent,
)
from crewai.types.usage_metrics import UsageMetrics
from crewai.utilities.string_utils import sanitize_tool_name

import loop_governor as lg
from crewai_governor.llm import governor_of_llm
from crewai_governor.tools import GovernedStructuredTool, governor_of, is_governed_name
from loop_governor.adapter import resolve_governor

__all__ = ["GovernorEventListener"]

_MAX_STARTS = 10_000  # a started call whose completion never arrives must not leak forever


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


class GovernorEventListener(BaseEventListener):
    """Emits ``model_call``, ``tool_call`` and ``tool_failure`` events on a governor.

    * ``model_call`` -- per LLM call the governor does not run itself (a governed LLM's
      calls are reported by the governor, with attempts and classification): model,
      latency, input/output tokens, cache read and creation tokens, finish reason, the
      messages sent, crewAI's task id and agent role; failed calls carry ``error``, once
      per call (crewAI 1.15 emits two failure events for one failed call).
    * ``tool_call`` -- for calls this governor did not run itself: tools not wrapped by
      [`crewai_governor.govern_tool`][crewai_governor.tools.govern_tool] for it (the governor reports its governed calls
      itself, with attempts and classification). Decided per event, by the tool object
      the emitting executor holds, not by name: an unwrapped tool that shares a name with
      a wrapped one elsewhere is still reported.
    * ``tool_failure`` -- every failure crewAI records, governed or not, including its own
      (unknown tool, invalid input, repeated call, usage limit).

    Registering is global (crewAI has one bus); [`close`][crewai_governor.listener.GovernorEventListener.close]
    unregisters. Usable as a context manager: ``with GovernorEventListener(g) as lens: crew.kickoff()`` flushes
    and unregisters on exit.
    """

    def __init__(self, governor: lg.Governor | None = None) -> None:
        self.governor = resolve_governor(governor)
        self._lock = threading.Lock()
        self._starts: dict[str, datetime] = {}
        self._failed: dict[str, None] = {}  # call ids already reported as failed (insertion-ordered)
        self._handlers: list[tuple[type[Any], Callable[..., None]]] = [
            (LLMCallStartedEvent, self._on_llm_started),
            (LLMCallCompletedEvent, self._on_llm_completed),
            (LLMCallFailedEvent, self._on_llm_failed),
            (ToolUsageFinishedEvent, self._on_tool_finished),
            (ToolUsageErrorEvent, self._on_tool_error),
            (ToolFailureDetectedEvent, self._on_tool_failure),
        ]
        self._closed = False
        super().__init__()

    def setup_listeners(self, crewai_event_bus: CrewAIEventsBus) -> None:
        for event_type, handler in self._handlers:
            crewai_event_bus.register_handler(event_type, handler)

    # -- lifecycle --------------------------------------------------------------------
    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait for pending handlers; True when every one finished in time."""
        return crewai_event_bus.flush(timeout)

    def close(self) -> None:
        """Flush, then unregister every handler of this listener."""
        if self._closed:
            return
        self.flush()
        for event_type, handler in self._handlers:
            crewai_event_bus.off(event_type, handler)
        self._closed = True

    def __enter__(self) -> GovernorEventListener:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- LLM --------------------------------------------------------------------------
    def _on_llm_started(self, _source: Any, event: LLMCallStartedEvent) -> None:
        with self._lock:
            if len(self._starts) >= _MAX_STARTS:
                self._starts.clear()
            self._starts[event.call_id] = event.timestamp

    def _pop_start(self, call_id: str) -> datetime | None:
        with self._lock:
            return self._starts.pop(call_id, None)

    def _on_llm_completed(self, source: Any, event: LLMCallCompletedEvent) -> None:
        if governor_of_llm(source) is self.governor:
            self._pop_start(event.call_id)
            return  # the governed call reports itself
        usage = UsageMetrics.from_provider_dict(event.usage) or UsageMetrics()
        messages = event.messages
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        elif isinstance(messages, list):
            messages = _unrepr(messages)
        self.governor.emit(
            "model_call",
            model=event.model,
            latency_s=_seconds(self._pop_start(event.call_id), event.timestamp),
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cache_read_tokens=usage.cached_prompt_tokens,
            cache_creation_tokens=usage.cache_creation_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            finish_reason=event.finish_reason,
            messages=list(messages or []),
            call_id=event.call_id,
            crewai_task_id=event.task_id,
            agent_role=event.agent_role,
        )

    def _on_llm_failed(self, source: Any, event: LLMCallFailedEvent) -> None:
        start = self._pop_start(event.call_id)
        if governor_of_llm(source) is self.governor or not self._first_failure(event.call_id):
            return
        self.governor.emit(
            "model_call",
            model=event.model,
            status="error",
            latency_s=_seconds(start, event.timestamp),
            error=lg.redact(str(event.error)),
            call_id=event.call_id,
            crewai_task_id=event.task_id,
            agent_role=event.agent_role,
        )

    def _first_failure(self, call_id: str) -> bool:
        with self._lock:
            if call_id in self._failed:
                return False
            if len(self._failed) >= _MAX_STARTS:
                self._failed.pop(next(iter(self._failed)))
            self._failed[call_id] = None
            return True

    # -- tools ------------------------------------------------------------------------
    def _reported_by_governor(self, source: Any, event: Any) -> bool:
        """Whether this listener's governor ran (and so already reported) the call."""
        tool = _event_tool(source, event)
        if tool is not None:
            return governor_of(tool) is self.governor
        if event.tool_class is not None and event.tool_class != GovernedStructuredTool.__name__:
            return False  # ReAct events name the class of the structured tool that ran
        # Not traceable to a tool object (e.g. a direct LLM call's plain functions): the
        # names this governor wraps are the best evidence left.
        return is_governed_name(event.tool_name, self.governor)

    def _on_tool_finished(self, source: Any, event: ToolUsageFinishedEvent) -> None:
        if self._reported_by_governor(source, event):
            return
        failed = event.failure is not None
        self.governor.emit(
            "tool_call",
            tool=event.tool_name,
            status="error" if failed else "ok",
            error_type=None,
            signature=None,
            attempts=1,
            duration_s=_seconds(event.started_at, event.finished_at),
            call_key=lg.call_key(event.tool_name, (), _args_dict(event.tool_args)),
            from_cache=event.from_cache,
            source="crewai",
        )

    def _on_tool_error(self, source: Any, event: ToolUsageErrorEvent) -> None:
        if self._reported_by_governor(source, event):
            return
        error = event.error
        info = lg.classify(error, tool=event.tool_name) if isinstance(error, BaseException) else None
        self.governor.emit(
            "tool_call",
            tool=event.tool_name,
            status="error",
            error_type=None if info is None else str(info.error_type),
            signature=None if info is None else info.signature,
            attempts=max(1, event.run_attempts),
            duration_s=None,
            call_key=lg.call_key(event.tool_name, (), _args_dict(event.tool_args)),
            source="crewai",
        )

    def _on_tool_failure(self, source: Any, event: ToolFailureDetectedEvent) -> None:
        failure = event.failure
        tool = _event_tool(source, event)
        governed = is_governed_name(event.tool_name) if tool is None else governor_of(tool) is not None
        self.governor.emit(
            "tool_failure",
            tool=event.tool_name,
            reason=str(failure.reason.value),
            message=lg.redact(failure.message),
            code=failure.code,
            retryable=failure.retryable,
            policy=str(event.policy.value),
            governed=governed,
            crewai_task_id=event.task_id,
            agent_role=event.agent_role,
        )


# crewAI's to_serializable(messages) depth: values this deep are written as repr()
_REPR_DEPTH = 5


def _unrepr(value: Any, depth: int = 0) -> Any:
    """``value`` with the repr() strings crewAI wrote at its depth limit read back
    (``ast.literal_eval``: literals only; anything else stays the string it was)."""
    if depth >= _REPR_DEPTH:
        if isinstance(value, str):
            try:
                return ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return value
        return value
    if isinstance(value, dict):
        return {k: _unrepr(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_unrepr(v, depth + 1) for v in value]
    return value


_TOOL_LISTS = ("original_tools", "tools")


def _event_tool(source: Any, event: Any) -> Any:
    """The tool object behind a crewAI tool event, or None when it cannot be found.

    crewAI 1.15's tool events carry the tool's name (and, on the ReAct path, its class
    name) but not the tool: it is looked up by name among the tools of whatever emitted
    the event -- an agent executor (``original_tools``), a ``ToolUsage`` (``tools``, the
    structured forms) or an agent (``tools``) -- then of that emitter's agent.
    """
    name = sanitize_tool_name(event.tool_name)
    holders = (source, getattr(source, "agent", None), getattr(event, "agent", None))
    for holder in holders:
        if holder is None:
            continue
        for attr in _TOOL_LISTS:
            tools = getattr(holder, attr, None)
            if not isinstance(tools, list | tuple):
                continue
            for tool in list(tools):
                tool_name = getattr(tool, "name", None)
                if isinstance(tool_name, str) and sanitize_tool_name(tool_name) == name:
                    return tool
    return None


def _args_dict(args: Any) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    return {"input": args}
