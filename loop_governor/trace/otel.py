"""Trace records -> OpenTelemetry spans with GenAI semantic-convention attribute names.

One span per task (``invoke_agent``), per model call (``chat``) and per tool call
(``execute_tool``); every other event (retry, breaker, pruning, anomaly, response, ...)
becomes a span event on the tool span it belongs to (retries) or on the task span.
Model and tool spans are created when their event arrives, i.e. after the call finished,
so their start time is set back by the reported latency/duration.

Attribute names come from opentelemetry-semantic-conventions so a semconv rename is a
dependency bump, not a hunt for string literals. Names the conventions do not define live
under ``loop_governor.*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.semconv._incubating.attributes.gen_ai_attributes import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_NAME,
    GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GenAiOperationNameValues,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from loop_governor.trace.records import attribute_value

# No semconv constants exist (0.66b2) for these governor notions, hence our own namespace.
ATTR_TASK_ID = "loop_governor.task.id"
ATTR_STEPS = "loop_governor.task.steps"
ATTR_TURN = "loop_governor.turn"
ATTR_MESSAGE_COUNT = "loop_governor.prompt.message_count"
ATTR_PREFIX_KEPT = "loop_governor.prompt.prefix_kept"
ATTR_CONTEXT_HEALTH = "loop_governor.context.health"
ATTR_TOOL_STATUS = "loop_governor.tool.status"
ATTR_ATTEMPTS = "loop_governor.tool.attempts"
ATTR_SIGNATURE = "loop_governor.error.signature"
ATTR_CALL_KEY = "loop_governor.tool.call_key"
ATTR_MODEL_ATTEMPTS = "loop_governor.model.attempts"
ATTR_MODEL_WAITED = "loop_governor.model.waited_s"
ATTR_MODEL_ENDPOINT = "loop_governor.model.endpoint"
ATTR_USAGE_ESTIMATED = "loop_governor.usage.estimated"
ATTR_OUTCOME = "loop_governor.task.outcome"  # completed / stopped / failed
ATTR_STOP_CODE = "loop_governor.stop.code"
ATTR_STOP_REASON = "loop_governor.stop.reason"

_INVOKE_AGENT = GenAiOperationNameValues.INVOKE_AGENT.value
_CHAT = GenAiOperationNameValues.CHAT.value
_EXECUTE_TOOL = GenAiOperationNameValues.EXECUTE_TOOL.value

# Fields every record has, not worth repeating as span-event attributes.
_ENVELOPE = frozenset({"event", "ts", "seq", "task_id", "run_id"})


def _ns(seconds: Any) -> int:
    return int(seconds * 1e9) if isinstance(seconds, (int, float)) and seconds > 0 else 0


# Span attribute <- record field, copied when the record has the field.
_CHAT_FIELDS = (
    (GEN_AI_REQUEST_MODEL, "model"),
    (GEN_AI_USAGE_INPUT_TOKENS, "input_tokens"),
    (GEN_AI_USAGE_OUTPUT_TOKENS, "output_tokens"),
    (GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "cache_read_tokens"),
    (GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, "cache_creation_tokens"),
    (ATTR_TURN, "turn"),
    (ATTR_PREFIX_KEPT, "prefix_kept"),
    (ATTR_CONTEXT_HEALTH, "context_health"),
    (ATTR_MODEL_ENDPOINT, "endpoint"),
    (ATTR_MODEL_ATTEMPTS, "attempts"),
    (ATTR_MODEL_WAITED, "waited_s"),
    (ATTR_USAGE_ESTIMATED, "usage_estimated"),
    (ATTR_SIGNATURE, "signature"),
)
_TOOL_FIELDS = (
    (GEN_AI_TOOL_CALL_ID, "tool_call_id"),
    (ATTR_TOOL_STATUS, "status"),
    (ATTR_ATTEMPTS, "attempts"),
    (ATTR_SIGNATURE, "signature"),
    (ATTR_CALL_KEY, "call_key"),
)


def _copy_fields(record: Mapping[str, Any], fields: tuple[tuple[str, str], ...], attrs: dict[str, Any]) -> None:
    for name, field in fields:
        value = record.get(field)
        if value is not None:
            attrs[name] = attribute_value(value)


def _attrs(record: Mapping[str, Any], skip: frozenset[str] = _ENVELOPE) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in skip:
            continue
        v = attribute_value(value)
        if v is not None:
            out[f"loop_governor.{key}"] = v
    return out


class SpanBridge:
    """Keeps open task spans and turns records into spans. Called from one thread only."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        # The global provider is looked up now but is a proxy until the user installs one,
        # so a governor built before OpenTelemetry is configured still exports later.
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer("loop_governor.trace")
        # Open task spans per task id, with the context that parents their children
        # (built once per task rather than once per child span).
        self._tasks: dict[Any, list[tuple[Span, Context]]] = {}
        self._retries: dict[tuple[Any, Any], list[tuple[dict[str, Any], int]]] = {}

    def _task_span(self, task_id: Any) -> Span | None:
        stack = self._tasks.get(task_id)
        return stack[-1][0] if stack else None

    def _parent(self, task_id: Any, ambient: Context | None) -> Context | None:
        stack = self._tasks.get(task_id)
        return stack[-1][1] if stack else ambient

    def handle(self, record: Mapping[str, Any], now_ns: int, ambient: Context | None) -> None:
        kind = record.get("event")
        task_id = record.get("task_id")
        if kind == "task_start":
            span = self._tracer.start_span(
                f"{_INVOKE_AGENT} {task_id}",
                context=ambient,
                kind=SpanKind.INTERNAL,
                attributes={GEN_AI_OPERATION_NAME: _INVOKE_AGENT, ATTR_TASK_ID: str(task_id)},
                start_time=now_ns,
            )
            self._tasks.setdefault(task_id, []).append((span, trace.set_span_in_context(span)))
        elif kind == "task_end":
            self._end_task(record, now_ns)
        elif kind == "model_call":
            self._model_call(record, now_ns, ambient)
        elif kind == "tool_call":
            self._tool_call(record, now_ns, ambient)
        elif kind == "retry":
            # Retries happen inside the governed call, before its tool_call (or model_call)
            # record arrives: hold them and attach them to that span. A model call's
            # retries name its endpoint in "tool" (the model_call record's "endpoint").
            key = (task_id, record.get("tool"))
            self._retries.setdefault(key, []).append((_attrs(record), now_ns))
        else:
            self._event(str(kind), record, now_ns, ambient)

    def _end_task(self, record: Mapping[str, Any], now_ns: int) -> None:
        task_id = record.get("task_id")
        stack = self._tasks.get(task_id)
        if not stack:
            return
        span, _ = stack.pop()
        if not stack:
            del self._tasks[task_id]
        for key in [k for k in self._retries if k[0] == task_id]:
            for attrs, ts in self._retries.pop(key):
                span.add_event("loop_governor.retry", attrs, timestamp=ts)
        steps = record.get("steps")
        if isinstance(steps, int):
            span.set_attribute(ATTR_STEPS, steps)
        outcome = record.get("outcome")
        if isinstance(outcome, str):
            span.set_attribute(ATTR_OUTCOME, outcome)
            if outcome != "completed":
                # the run span says how it ended: error.type is the stop's class
                span.set_attribute(ERROR_TYPE, str(record.get("error_class") or outcome))
                if record.get("code") is not None:
                    span.set_attribute(ATTR_STOP_CODE, str(record.get("code")))
                reason = str(record.get("reason") or "")
                if reason:
                    span.set_attribute(ATTR_STOP_REASON, reason)
                span.set_status(Status(StatusCode.ERROR, f"{outcome}: {reason}"[:500]))
        span.end(end_time=now_ns)

    def _model_call(self, record: Mapping[str, Any], now_ns: int, ambient: Context | None) -> None:
        model = record.get("model")
        attrs: dict[str, Any] = {GEN_AI_OPERATION_NAME: _CHAT}
        _copy_fields(record, _CHAT_FIELDS, attrs)
        reason = record.get("finish_reason")
        if reason:
            attrs[GEN_AI_RESPONSE_FINISH_REASONS] = [str(reason)]
        hashes = record.get("message_hashes")
        if isinstance(hashes, list):
            attrs[ATTR_MESSAGE_COUNT] = len(hashes)
        failed = record.get("status") == "error" or "error" in record
        if failed:
            attrs[ERROR_TYPE] = str(record.get("error_type") or "error")
        span = self._tracer.start_span(
            f"{_CHAT} {model}" if model else _CHAT,
            context=self._parent(record.get("task_id"), ambient),
            kind=SpanKind.CLIENT,
            attributes=attrs,
            start_time=now_ns - _ns(record.get("latency_s")),
        )
        if failed:
            span.set_status(Status(StatusCode.ERROR, str(record.get("signature") or record.get("error") or "")))
        for retry_attrs, ts in self._retries.pop((record.get("task_id"), record.get("endpoint")), ()):
            span.add_event("loop_governor.retry", retry_attrs, timestamp=ts)
        span.end(end_time=now_ns)

    def _tool_call(self, record: Mapping[str, Any], now_ns: int, ambient: Context | None) -> None:
        tool = record.get("tool")
        task_id = record.get("task_id")
        # Operation and tool name at start (samplers may look at them); the rest only if
        # the span records: with no SDK installed this is the common, free case.
        span = self._tracer.start_span(
            f"{_EXECUTE_TOOL} {tool}",
            context=self._parent(task_id, ambient),
            kind=SpanKind.INTERNAL,
            attributes={GEN_AI_OPERATION_NAME: _EXECUTE_TOOL, GEN_AI_TOOL_NAME: str(tool)},
            start_time=now_ns - _ns(record.get("duration_s")),
        )
        retries = self._retries.pop((task_id, tool), ())
        if span.is_recording():
            attrs: dict[str, Any] = {}
            _copy_fields(record, _TOOL_FIELDS, attrs)
            if record.get("status") == "error":
                attrs[ERROR_TYPE] = str(record.get("error_type") or "error")
                span.set_status(Status(StatusCode.ERROR, str(record.get("signature") or "")))
            span.set_attributes(attrs)
            for retry_attrs, ts in retries:
                span.add_event("loop_governor.retry", retry_attrs, timestamp=ts)
        span.end(end_time=now_ns)

    def _event(self, kind: str, record: Mapping[str, Any], now_ns: int, ambient: Context | None) -> None:
        name = f"loop_governor.{kind}"
        span = self._task_span(record.get("task_id"))
        if span is not None:
            span.add_event(name, _attrs(record), timestamp=now_ns)
            return
        # No open task span (a breaker trip outside any task, say): a zero-length span
        # keeps the event visible in the backend instead of dropping it.
        lone = self._tracer.start_span(name, context=ambient, attributes=_attrs(record), start_time=now_ns)
        lone.end(end_time=now_ns)

    def close(self, now_ns: int) -> None:
        """End task spans left open (a run that crashed before task_end)."""
        for task_id in list(self._tasks):
            while self._tasks.get(task_id):
                self._end_task({"event": "task_end", "task_id": task_id}, now_ns)
