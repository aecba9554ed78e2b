"""The events of a governed call: one ``tool_call`` or ``model_call`` per call.

The trace (Agent Lens, OpenTelemetry) reads these; the model never sees intermediate
retries, and neither does the trace as separate calls: each governed call is one event
with its status, error type, attempts and the time it waited (backoff, rate limits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import MODEL, Call, Policy, Resumed
from loop_governor.errors import AgentToolError

if TYPE_CHECKING:
    from loop_governor.classify import ErrorInfo
    from loop_governor.errors import GovernedError
    from loop_governor.events import Events
    from loop_governor.runtime import Runtime


def tool_error(
    events: Events,
    tool: str,
    info: GovernedError | ErrorInfo,
    *,
    attempts: int = 0,
    duration_s: float = 0.0,
    **fields: Any,
) -> None:
    """The ``tool_call`` event of a call that ended in ``info``: one shape for every way a
    call can fail (failed, replayed known-bad, refused by an open breaker or a rate limit)."""
    events.emit(
        "tool_call",
        tool=tool,
        status="error",
        error_type=info.error_type.value,
        signature=info.signature,
        attempts=attempts,
        duration_s=duration_s,
        **fields,
    )


_REFUSAL_FLAGS = {"known_bad": "known_bad", "breaker": "circuit_open", "rate_limited": "rate_limited"}


class Refusals(Policy):
    """A call refused without being made (open breaker, rate limit, a known-bad call
    replayed) is a ``call_refused`` event, listened to or not: the ``loop_governor``
    logger warns about it (:mod:`loop_governor.logs`). Runs on failures only."""

    in_task_only = False
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        if call.attempt or call.stop_reason not in _REFUSAL_FLAGS:
            return error
        info = error.info
        self.rt.events.emit(
            "call_refused",
            tool=call.name,
            kind=call.kind,
            reason=_REFUSAL_FLAGS[call.stop_reason],
            code=info.code,
            message=info.message,
            retry_after=info.retry_after,
        )
        return error


class Report(Policy):
    """Emits the call's event once it has an outcome (only while someone listens)."""

    in_task_only = False
    listeners_only = True
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        call.started = self.rt.clock()  # for the event's duration / latency
        return None

    def after_success(self, call: Call, result: Any) -> Any:
        events = self.rt.events
        if not events.emitting:
            return result
        if call.kind == MODEL:
            self._model_call(call, result, None)
        else:
            events.emit(
                "tool_call",
                tool=call.name,
                status="ok",
                error_type=None,
                signature=None,
                attempts=call.attempt,
                duration_s=self._duration(call),
                call_key=call.key_if_known,
            )
        return result

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        events = self.rt.events
        if not events.emitting or call.stop_reason == "task_budget":
            return error  # a spent task budget is its own event (budget_exhausted)
        if call.kind == MODEL:
            self._model_call(call, None, error)
            return error
        fields: dict[str, Any] = {"call_key": call.key_if_known}
        flag = _REFUSAL_FLAGS.get(call.stop_reason or "") if not call.attempt else None
        if flag is not None:
            fields[flag] = True
        else:
            fields["stop_reason"] = call.stop_reason
        tool_error(events, call.name, error.info, attempts=call.attempt, duration_s=self._duration(call), **fields)
        return error

    def _duration(self, call: Call) -> float:
        return (self.rt.clock() - call.started) if call.started else 0.0

    def _model_call(self, call: Call, result: Any, error: AgentToolError | None) -> None:
        fields: dict[str, Any] = {
            "model": call.name,
            "endpoint": call.name,
            "status": "ok" if error is None else "error",
            "attempts": call.attempt,
            "waited_s": call.waited_s,
            "latency_s": self._duration(call),
        }
        if call.fallback_from is not None:
            fields["fallback_from"] = call.fallback_from
        if error is not None:
            info = error.info
            fields.update(error_type=info.error_type.value, signature=info.signature, stop_reason=call.stop_reason)
            if info.status is not None:
                fields["http_status"] = info.status
            if info.code is not None:
                fields["error_code"] = info.code
        if call.usage is not None:
            fields.update(call.usage.fields())
        options = call.model
        if options is not None and options.describe is not None:
            try:
                described = options.describe(result)
            except Exception as exc:  # a broken describer must not lose the event
                described = {"describe_failed": f"{type(exc).__name__}"}
            fields.update(described)  # the adapter knows the model's own name best
        self.rt.events.emit("model_call", **fields)
