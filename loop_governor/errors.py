"""The error taxonomy: what a tool failure *means* for the loop around the model.

A plain exception string tells a model nothing about whether calling again can help,
so agents retry 404s forever and give up on a 503 that would pass in a second. Every
governed failure is therefore one of three kinds:

* transient -- the same call may succeed later (timeouts, 429, 5xx); the governor retries;
* permanent -- the same call will fail again (404, bad arguments); remember it, don't repeat;
* fatal -- the run cannot go on (401, exhausted billing); stop the run.

Each exception carries a :class:`GovernedError`, the structured outcome the model reads.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loop_governor.redaction import redact

MAX_MESSAGE_CHARS = 500


class ErrorType(str, Enum):
    """Classification of a failure. A ``str`` enum so it compares equal to its value."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    FATAL = "fatal"

    def __str__(self) -> str:
        return self.value


SEVERITY: dict[ErrorType, int] = {ErrorType.TRANSIENT: 0, ErrorType.PERMANENT: 1, ErrorType.FATAL: 2}


def truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut, so the model text stays small."""
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


class GovernedError(BaseModel):
    """The structured, model-facing outcome of a failed governed call.

    ``to_model_text`` is what the model reads: compact JSON with a fixed key order, so
    the same failure yields byte-identical text (and the provider's prompt cache holds).
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

    @field_validator("message")
    @classmethod
    def _clean_message(cls, value: str) -> str:
        return truncate(redact(value))

    @field_validator("advice")
    @classmethod
    def _clean_advice(cls, value: str | None) -> str | None:
        return None if value is None else truncate(redact(value))

    def to_model_text(self) -> str:
        """Compact, stable JSON ``{"error": {...}}``; ``None`` fields are left out."""
        body: dict[str, Any] = {"type": self.error_type.value, "retryable": self.retryable}
        if self.tool is not None:
            body["tool"] = self.tool
        if self.status is not None:
            body["status"] = self.status
        if self.code is not None:
            body["code"] = self.code
        body["message"] = self.message
        body["attempts"] = self.attempts
        if self.retry_after is not None:
            # whole seconds: a Retry-After date recomputed a moment later gives the same bytes
            body["retry_after"] = math.ceil(self.retry_after)
        if self.count is not None:
            body["count"] = self.count
        if self.advice is not None:
            body["advice"] = self.advice
        return json.dumps({"error": body}, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


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


class FatalError(AgentToolError):
    """The run cannot continue (credentials, billing, a spent budget, a loop that ignored
    every warning); adapters let it stop the run. ``partial_results`` holds what the
    task finished before it stopped (its sub-results, also in the checkpoint)."""

    default_type = ErrorType.FATAL

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


class NoProgressError(LoopDetectedError, FatalError):
    """The loop kept going after being told its tool's verdict no longer changes: end the run.

    Both a :class:`LoopDetectedError` (what happened) and a :class:`FatalError` (what
    adapters do with it: stop the run), with the partial results of the task.
    """

    default_type = ErrorType.FATAL


ERROR_CLASS: dict[ErrorType, type[AgentToolError]] = {
    ErrorType.TRANSIENT: TransientError,
    ErrorType.PERMANENT: PermanentError,
    ErrorType.FATAL: FatalError,
}


def error_from_info(info: GovernedError) -> AgentToolError:
    """The exception class matching a stored :class:`GovernedError` (e.g. a known-bad replay)."""
    return ERROR_CLASS[info.error_type](info)
