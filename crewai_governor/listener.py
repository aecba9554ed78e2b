"""Feed crewAI's event bus into the governor's events (and from there, Agent Lens).

crewAI reports usage raw, in the provider's own shape (``prompt_tokens`` /
``input_tokens`` / ``prompt_token_count``, cached tokens under three names); the listener
normalizes it with crewAI's own ``UsageMetrics.from_provider_dict`` so the figures agree
with crewAI's totals, cached prompt tokens included.

Handlers run on crewAI's thread pool, after the emitting code has moved on: call
:meth:`GovernorEventListener.flush` (``crewai_event_bus.flush``) before reading results.
"""

from __future__ import annotations

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

import loop_governor as lg
from crewai_governor._default import resolve_governor
from crewai_governor.tools import is_governed_name

__all__ = ["GovernorEventListener"]

_MAX_STARTS = 10_000  # a started call whose completion never arrives must not leak forever


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


class GovernorEventListener(BaseEventListener):
    """Emits ``model_call``, ``tool_call`` and ``tool_failure`` events on a governor.

    * ``model_call`` -- per LLM call: model, latency, input/output tokens, cache read and
      creation tokens, finish reason, the messages sent, crewAI's task id and agent role;
      failed calls carry ``error``.
    * ``tool_call`` -- for tools *not* wrapped by :func:`crewai_governor.govern_tool`
      (the governor reports governed calls itself, with attempts and classification).
    * ``tool_failure`` -- every failure crewAI records, governed or not, including its own
      (unknown tool, invalid input, repeated call, usage limit).

    Registering is global (crewAI has one bus); :meth:`close` unregisters. Usable as a
    context manager: ``with GovernorEventListener(g) as lens: crew.kickoff()`` flushes
    and unregisters on exit.
    """

    def __init__(self, governor: lg.Governor | None = None) -> None:
        self.governor = resolve_governor(governor)
        self._lock = threading.Lock()
        self._starts: dict[str, datetime] = {}
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

    def _on_llm_completed(self, _source: Any, event: LLMCallCompletedEvent) -> None:
        usage = UsageMetrics.from_provider_dict(event.usage) or UsageMetrics()
        messages = event.messages
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
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

    def _on_llm_failed(self, _source: Any, event: LLMCallFailedEvent) -> None:
        self.governor.emit(
            "model_call",
            model=event.model,
            latency_s=_seconds(self._pop_start(event.call_id), event.timestamp),
            error=lg.redact(str(event.error)),
            call_id=event.call_id,
            crewai_task_id=event.task_id,
            agent_role=event.agent_role,
        )

    # -- tools ------------------------------------------------------------------------
    def _on_tool_finished(self, _source: Any, event: ToolUsageFinishedEvent) -> None:
        if is_governed_name(event.tool_name):
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

    def _on_tool_error(self, _source: Any, event: ToolUsageErrorEvent) -> None:
        if is_governed_name(event.tool_name):
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

    def _on_tool_failure(self, _source: Any, event: ToolFailureDetectedEvent) -> None:
        failure = event.failure
        self.governor.emit(
            "tool_failure",
            tool=event.tool_name,
            reason=str(failure.reason.value),
            message=lg.redact(failure.message),
            code=failure.code,
            retryable=failure.retryable,
            policy=str(event.policy.value),
            governed=is_governed_name(event.tool_name),
            crewai_task_id=event.task_id,
            agent_role=event.agent_role,
        )


def _args_dict(args: Any) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    return {"input": args}
