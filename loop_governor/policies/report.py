"""The events of a governed call: one ``tool_call`` or ``model_call`` per call.

The trace (Agent Lens, OpenTelemetry) reads these; the model never sees intermediate
retries, and neither does the trace as separate calls: each governed call is one event
with its status, error type, attempts and the time it waited (backoff, rate limits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import MODEL, Call, Policy, Resumed, StopReason
from loop_governor.errors import AgentToolError
from loop_governor.logs import level_of

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
    call can fail (failed, replayed known-bad, refused by an open breaker or a rate limit).

    It carries what the model read: the tool's own (redacted) ``message`` and the
    governor's ``advice``, beside the ``signature`` that groups failures alike."""
    extra: dict[str, Any] = {"message": info.message}
    advice = getattr(info, "advice", None)  # an ErrorInfo (a hook's refusal) has none
    if advice:
        extra["advice"] = advice
    if info.status is not None:
        extra["http_status"] = info.status
    if info.code is not None:
        extra["error_code"] = info.code
    events.emit(
        "tool_call",
        tool=tool,
        status="error",
        error_type=info.error_type.value,
        signature=info.signature,
        attempts=attempts,
        duration_s=duration_s,
        **extra,
        **fields,
    )


_REFUSAL_FLAGS: dict[str, str] = {
    StopReason.KNOWN_BAD: "known_bad",
    StopReason.BREAKER: "circuit_open",
    StopReason.RATE_LIMITED: "rate_limited",
}


class Failures(Policy):
    """How each failed call ended, as the model reads it: the ``tool_call`` event of a
    failed tool call, and a ``call_refused`` event for a call refused without being made
    (open breaker, rate limit, a known-bad call answered from memory).

    Last in the chain but the stop ([`RunStop`][loop_governor.policies.checkpointing.RunStop]), so
    the events carry the final text -- the loop guards' warnings and withdrawals
    included -- and come after the decisions that shaped it. In the chain whether or not
    anyone listens: the ``loop_governor`` logger writes these lines
    ([`loop_governor.logs`][loop_governor.logs]); a failure path, so nothing is spent on a success."""

    in_task_only = False
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        events = self.rt.events
        if call.stop_reason is StopReason.TASK_BUDGET:
            return error  # a spent task budget is its own event (budget_exhausted)
        if call.kind == MODEL:
            if not events.emitting and level_of("model_call") is not None:
                # nobody listens, so Report made no model_call event: one for the logger
                self._model_failure(call, error)
            return error
        if not events.emitting and level_of("tool_call") is None:
            return error
        info = error.info
        fields: dict[str, Any] = {"call_key": call.key_if_known}
        flag = _REFUSAL_FLAGS.get(call.stop_reason or "") if not call.attempt else None
        if flag is not None:
            fields[flag] = True
        else:
            fields["stop_reason"] = call.stop_reason
        duration = (self.rt.clock() - call.started) if call.started else 0.0
        tool_error(events, call.name, info, attempts=call.attempt, duration_s=duration, **fields)
        if flag is not None:
            events.emit(
                "call_refused",
                tool=call.name,
                kind=call.kind,
                reason=flag,
                code=info.code,
                message=info.message,
                advice=info.advice,
                retry_after=info.retry_after,
            )
        return error

    def _model_failure(self, call: Call, error: AgentToolError) -> None:
        info = error.info
        self.rt.events.emit(
            "model_call",
            model=call.name,
            endpoint=call.name,
            status="error",
            attempts=call.attempt,
            error_type=info.error_type.value,
            signature=info.signature,
            message=info.message,
            stop_reason=call.stop_reason,
            http_status=info.status,
            error_code=info.code,
        )


class Report(Policy):
    """Emits a successful call's event, and a failed model call's (only while someone
    listens); a failed tool call's is [`Failures`][loop_governor.policies.report.Failures]'."""

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
        # a failed tool call's event comes from Failures, once the text the model reads is final
        if call.kind == MODEL and self.rt.events.emitting and call.stop_reason is not StopReason.TASK_BUDGET:
            self._model_call(call, None, error)
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
            fields.update(
                error_type=info.error_type.value,
                signature=info.signature,
                message=info.message,
                stop_reason=call.stop_reason,
            )
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
