"""The error taxonomy: what a tool failure *means* for the loop around the model.

A plain exception string tells a model nothing about whether calling again can help,
so agents retry 404s forever and give up on a 503 that would pass in a second. Every
governed failure is therefore one of three kinds:

* transient -- the same call may succeed later (timeouts, 429, 5xx); the governor retries;
* permanent -- the same call will fail again (404, bad arguments); remember it, don't repeat;
* fatal -- the run cannot go on (401, exhausted billing); stop the run.

Each exception carries a [`GovernedError`][loop_governor.errors.GovernedError], the structured outcome the model reads.
"""

from __future__ import annotations

import json
import math
import re
from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from loop_governor.redaction import redact

MAX_MESSAGE_CHARS = 500

# How the model reads a governed failure (``GovernorConfig(error_format=...)``): plain text
# (the default) or the compact JSON object. Both are byte-stable for the same failure.
ErrorFormat = Literal["text", "json"]
ERROR_FORMATS: tuple[ErrorFormat, ...] = ("text", "json")


class ErrorType(str, Enum):
    """Classification of a failure. A ``str`` enum so it compares equal to its value."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    FATAL = "fatal"

    def __str__(self) -> str:
        return self.value


# the classification as the plain-text rendering names it
_KIND_WORDS = {
    ErrorType.TRANSIENT: "Temporary failure",
    ErrorType.PERMANENT: "Permanent failure",
    ErrorType.FATAL: "Fatal",
}

SEVERITY: dict[ErrorType, int] = {ErrorType.TRANSIENT: 0, ErrorType.PERMANENT: 1, ErrorType.FATAL: 2}


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut, so the model text stays small."""
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


class GovernedError(BaseModel):
    """The structured, model-facing outcome of a failed governed call.

    ``to_model_text`` is what the model reads: plain text by default, leading with the
    tool's own message, or compact JSON with a fixed key order
    (``GovernorConfig(error_format="json")``). Either way the same failure yields
    byte-identical text, so the provider's prompt cache holds.
    """

    model_config = ConfigDict(frozen=True, use_enum_values=False)

    error_type: ErrorType
    retryable: bool = False
    tool: str | None = None
    status: int | None = None
    code: str | None = None
    message: str = ""
    signature: str = ""
    attempts: int = 1
    retry_after: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    advice: str | None = None
    count: int | None = None
    # the format the governor that made this outcome renders it in (see ``rendered``)
    _format: ErrorFormat = PrivateAttr(default="text")

    @field_validator("message")
    @classmethod
    def _clean_message(cls, value: str) -> str:
        return truncate(redact(value))

    @field_validator("advice")
    @classmethod
    def _clean_advice(cls, value: str | None) -> str | None:
        return None if value is None else truncate(redact(value))

    def outcome_text(self) -> str:
        """What the outcome means for the caller, in plain words: the model reads this
        instead of a bare ``"retryable": false`` beside ``"transient"`` (which reads as a
        contradiction when the retries are what is spent). Counts real attempts only."""
        if self.error_type is ErrorType.FATAL:
            return "run stopped"
        if self.retryable:
            return "may be retried"
        if self.error_type is ErrorType.PERMANENT:
            return "will fail again if repeated"
        if self.attempts <= 0:
            return "not attempted"
        return f"retries exhausted: {self.attempts} attempt{'s' if self.attempts != 1 else ''}"

    def to_model_text(self, format: ErrorFormat | None = None) -> str:
        """What the model reads, in ``format`` (default: the format of the governor that
        made this outcome, ``GovernorConfig.error_format``, else plain text).

        Plain text leads with ``Error: <the tool's own message>``, then one sentence: the
        classification and what to do. Measured with a 1.5B model on 127.0.0.1 (start the
        engine, which fails until the brake is pressed; 10 seeds each): the bare agent's
        "Error: ..." string solved it 5 times, the governor's JSON 0 times, the same
        governor rendering plain text 3 times. The JSON form (``{"error": {...}}``, the
        tool's message first too) suits agents and tools that parse the outcome."""
        if (format or self._format) == "json":
            return self.to_json_text()
        return self.to_plain_text()

    def to_plain_text(self) -> str:
        """``Error: <message>`` and, on the next line, one sentence: the classification and
        what to do (``Permanent failure: ...``): the tool's own words first, then what the
        governor made of them."""
        message = self.message or (f"{self.tool} failed" if self.tool else "the call failed")
        note = _KIND_WORDS[self.error_type]
        if self.error_type is ErrorType.TRANSIENT:
            note += ", " + self.outcome_text().replace("retries exhausted: ", "retries exhausted after ")
        advice = (self.advice or "").strip()
        if advice:
            note = f"{note}: {advice}"
        if not note.endswith((".", "!", "?")):
            note += "."
        return f"Error: {message}\n{note}"

    def rendered(self, format: ErrorFormat) -> GovernedError:
        """This outcome, to be read in ``format`` (a copy, unless it already is)."""
        if self._format == format:
            return self
        copy = self.model_copy()
        copy._format = format
        return copy

    def to_json_text(self) -> str:
        """Compact, stable JSON ``{"error": {...}}``; ``None`` fields are left out.

        The tool's own message comes first: a model reading "Brake pedal must be pressed"
        before anything else fixes the cause (measured with a small local model: after the
        classification first, it never pressed the brake)."""
        body: dict[str, Any] = {
            "message": self.message,
            "type": self.error_type.value,
            "outcome": self.outcome_text(),
        }
        if self.retryable:
            body["retryable"] = True  # a client's own retry may help (kept for readers keyed on it)
        if self.tool is not None:
            body["tool"] = self.tool
        if self.status is not None:
            body["status"] = self.status
        if self.code is not None:
            body["code"] = self.code
        body["attempts"] = self.attempts
        if self.retry_after is not None:
            # whole seconds: a Retry-After date recomputed a moment later gives the same bytes
            body["retry_after"] = math.ceil(self.retry_after)
        if self.count is not None:
            body["count"] = self.count
        if self.advice is not None:
            body["advice"] = self.advice
        return json.dumps({"error": body}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


# The plain-text rendering (``to_plain_text``): the message (which may span lines), then the
# classification line.
_PLAIN = re.compile(
    r"Error: (?P<message>.*?)\n(?P<kind>Temporary failure|Permanent failure|Fatal)"
    r"(?:, (?P<outcome>[^:\n]*))?(?:: (?P<advice>[^\n]*?))?\.?(?:\n|\Z)",
    re.S,
)
# ... for one failure: its classification line is the last one (the tool's own message may hold a
# line that reads like one)
_PLAIN_LAST = re.compile(_PLAIN.pattern.replace("(?P<message>.*?)", "(?P<message>.*)"), re.S)
_KIND_TYPES = {"Temporary failure": "transient", "Permanent failure": "permanent", "Fatal": "fatal"}


def read_model_text(text: object) -> dict[str, Any] | None:
    """The fields of the governed failure a text carries, in either format (``type``,
    ``message``, ``advice``; the JSON form has every field it rendered), or None when it
    carries none. The failure may sit inside a longer text (a framework's "Error executing
    tool: ..." prose). For readers of tool results: the bench's scripted models, memory
    filters, tests."""
    if not isinstance(text, str) or ("Error" not in text and '"error"' not in text):
        return None
    start = text.find('{"error":')
    if start >= 0:
        try:
            parsed, _ = json.JSONDecoder().raw_decode(text, start)
        except ValueError:
            parsed = None
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and error.get("type") in _KIND_TYPES.values():
            return error
    match = _PLAIN_LAST.search(text, text.find("Error: ") if "Error: " in text else 0)
    if match is None:
        return None
    fields: dict[str, Any] = {"message": match["message"], "type": _KIND_TYPES[match["kind"]]}
    if match["outcome"]:
        fields["outcome"] = match["outcome"]
        if match["outcome"] == "may be retried":
            fields["retryable"] = True
    if match["advice"]:
        fields["advice"] = match["advice"]
    return fields


class AgentToolError(Exception):
    """Base of every governed failure; ``.info`` is what the model should see."""

    default_type: ClassVar[ErrorType] = ErrorType.PERMANENT

    def __init__(self, info: GovernedError | str, *, tool: str | None = None) -> None:
        if isinstance(info, str):
            info = GovernedError(
                error_type=self.default_type,
                retryable=False,
                tool=tool,
                message=info,
                signature=f"{tool}:{type(self).__name__}" if tool else type(self).__name__,
            )
        self.info: GovernedError = info
        super().__init__(info.message)

    @property
    def retryable(self) -> bool:
        return self.info.retryable

    @property
    def error_type(self) -> ErrorType:
        return self.info.error_type

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.info,))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.info.to_model_text()})"


class TransientError(AgentToolError):
    """The call may succeed later; the governor already retried what the budget allowed."""

    default_type = ErrorType.TRANSIENT


class PermanentError(AgentToolError):
    """The same call will fail again; the governor remembers it as known-bad for the task."""

    default_type = ErrorType.PERMANENT


STOP_PREFIX = "loop-governor stopped the run: "


def stop_reason(info: GovernedError) -> str:
    """Why a run stopped, in one redacted line: ``<tool> (<code>, <status>): <message>``."""
    parts = [info.tool] if info.tool else []
    detail = ", ".join(str(x) for x in (info.code, info.status) if x is not None)
    if detail:
        parts.append(f"({detail})")
    head = " ".join(parts)
    return f"{head}: {info.message}" if head and info.message else head or info.message


class FatalError(AgentToolError):
    """The run cannot continue (credentials, billing, a spent budget, a loop that ignored
    every warning); adapters let it stop the run. Every error that ends a run is one,
    and none is a [`PermanentError`][loop_governor.errors.PermanentError] (``except PermanentError`` written first must
    not swallow a stop).

    ``str(exc)`` reads ``"loop-governor stopped the run: <reason>"``; ``.reason`` is that
    reason (redacted) and ``.code`` the stop's code (``insufficient_quota``,
    ``max_steps``, ``no_progress``, ``cycle``...).

    ``partial_results`` holds what the task got done before it stopped: first what
    ``scope.add_result()`` recorded (also in the checkpoint), then the task's latest
    successful tool results as ``{"tool": name, "result": text}`` -- at most
    ``PARTIAL_RESULTS_MAX`` of them (the latest), each redacted and cut to
    ``PARTIAL_RESULT_CHARS`` characters. Empty outside a task."""

    default_type = ErrorType.FATAL

    def __str__(self) -> str:
        return STOP_PREFIX + stop_reason(self.info)

    # Settable: framework classes mixed in (crewAI's HookAborted, a provider's error)
    # keep attributes of these names; the governor's own value is the default.
    @property
    def code(self) -> str | None:
        """The stop's code (the provider's error code, the budget, ``no_progress``...)."""
        return self.__dict__.get("_lg_code", self.info.code)

    @code.setter
    def code(self, value: str | None) -> None:
        self.__dict__["_lg_code"] = value

    @property
    def reason(self) -> str:
        """Why the run stopped, in one redacted line: what failed, its code, its message."""
        return self.__dict__.get("_lg_reason") or stop_reason(self.info)

    @reason.setter
    def reason(self, value: str) -> None:
        self.__dict__["_lg_reason"] = value

    def __init__(
        self,
        info: GovernedError | str,
        *,
        tool: str | None = None,
        partial_results: list[Any] | None = None,
    ) -> None:
        super().__init__(info, tool=tool)
        self.partial_results: list[Any] = list(partial_results or [])


class CircuitOpenError(TransientError):
    """The tool's breaker is open: the call was not made."""


class LoopDetectedError(PermanentError):
    """The same tool failed the same way repeatedly in this task: stop repeating it."""


class BudgetExhaustedError(FatalError):
    """A task budget (steps, tokens, cost, time) ran out; carries the partial results."""


class NoProgressError(FatalError):
    """The loop kept going after being told its tool's verdict no longer changes (the same
    result, a cycle, a warning ignored): end the run, with the partial results of the task.

    A [`FatalError`][loop_governor.errors.FatalError] only: not a
    [`LoopDetectedError`][loop_governor.errors.LoopDetectedError] (a ``PermanentError``, which the model reads and the
    run survives) since 0.x -- ``.code`` says which guard stopped it (``no_progress``, ``cycle``, ``escalation``...).
    """


ERROR_CLASS: dict[ErrorType, type[AgentToolError]] = {
    ErrorType.TRANSIENT: TransientError,
    ErrorType.PERMANENT: PermanentError,
    ErrorType.FATAL: FatalError,
}


def error_from_info(info: GovernedError) -> AgentToolError:
    """The exception class matching a stored [`GovernedError`][loop_governor.errors.GovernedError] (e.g. a known-bad
    replay)."""
    return ERROR_CLASS[info.error_type](info)
