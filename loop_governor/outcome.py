"""The one outcome a failed governed call hands back: a typed error carrying what to read.

The model reads a tool's outcome (``GovernedError.to_model_text()``); a model call's
outcome is read by the operator (it stops the run or reaches the caller), so its advice
speaks about the endpoint, not about other tools.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loop_governor.call import MODEL, StopReason
from loop_governor.errors import (
    AgentToolError,
    CircuitOpenError,
    ErrorType,
    FatalError,
    GovernedError,
    PermanentError,
    TransientError,
)

if TYPE_CHECKING:
    from loop_governor.call import Call
    from loop_governor.classify import ErrorInfo
    from loop_governor.state.breaker import Admission

_FATAL_ADVICE = "the run cannot continue: credentials, billing or quota must be fixed by an operator"


def _elsewhere(kind: str, name: str) -> str:
    if kind == MODEL:
        return "configure a fallback model or retry the task later"
    return "use another tool or continue without it"


# A failure that names something to do first: the agent can fix the cause with another
# tool (press the brake, log in, create the record), and then the same call is right.
_PRECONDITION = re.compile(
    r"\bmust\b|\bneeds? to\b|\bhas to be\b|\bfirst\b|\brequire[sd]?\b|\bbefore\b|\bplease\b|\bnot (?:yet )?"
    r"(?:authenticated|logged in|signed in|started|running|ready|connected|enabled|activated|initiali[sz]ed|"
    r"set up|configured|open|selected|verified|confirmed)\b|\blog ?in\b|\bsign ?in\b|\bsession\b|\bcreate it\b",
    re.I,
)


def names_precondition(message: str) -> bool:
    """Whether a failure's message names something to do first ("must be pressed", "not
    authenticated", "not found: create it first")."""
    return _PRECONDITION.search(message) is not None


def advice(kind: str, name: str, info: ErrorInfo, reason: str | None, attempts: int) -> str:
    """What to do next, in one sentence the model (or operator) can act on."""
    if info.error_type is ErrorType.FATAL:
        return _FATAL_ADVICE
    if info.error_type is ErrorType.PERMANENT:
        if kind == MODEL:
            return f"{name} rejected the request; change the request or the model"
        if names_precondition(info.message):
            return (
                f"fix what the message asks for first (for example with another tool) or change the arguments, "
                f"then calling {name} again is the right move; repeated unchanged with nothing fixed, it fails "
                "the same way"
            )
        return f"repeated unchanged, this call to {name} fails the same way; change the arguments or use another tool"
    rest = _elsewhere(kind, name)
    if reason is StopReason.BUDGET:
        return f"the retry budget of this task is spent; do not call {name} again now; " + (
            "retry the task later" if kind == MODEL else "continue without it or report"
        )
    if reason is StopReason.RETRY_AFTER and info.retry_after is not None:
        return f"{name} asked for a pause of {info.retry_after:.0f}s; {rest}"
    if reason is StopReason.BREAKER:
        return f"{name} is unavailable (circuit open); {rest}"
    if reason is StopReason.WAIT:
        return f"{name} kept throttling the request for longer than the call may wait; {rest}"
    return f"{name} failed {attempts} times in a row; {rest}"


def failure(call: Call) -> AgentToolError:
    """The outcome of a call whose attempts all failed (``call.info`` is the last one)."""
    info = call.info
    assert info is not None  # set by the retry predicate for every failed attempt
    attempts = max(call.attempt, 1)
    governed = GovernedError(
        error_type=info.error_type,
        retryable=False,
        tool=call.name,
        status=info.status,
        code=info.code,
        message=info.message,
        signature=info.signature,
        attempts=attempts,
        retry_after=info.retry_after if info.error_type is ErrorType.TRANSIENT else None,
        advice=advice(call.kind, call.name, info, call.stop_reason, attempts),
    )
    if info.error_type is ErrorType.FATAL:
        return FatalError(governed)
    if info.error_type is ErrorType.PERMANENT:
        return PermanentError(governed)
    return TransientError(governed)


def circuit_open(kind: str, name: str, admission: Admission) -> CircuitOpenError:
    """The refusal of a call whose breaker is open: the call was not made."""
    wait = max(1, round(admission.retry_in))
    info = GovernedError(
        error_type=ErrorType.TRANSIENT,
        retryable=False,
        tool=name,
        code="circuit_open",
        message=f"{name} failed repeatedly; its circuit breaker is {admission.state.value}",
        signature=f"{name}:CircuitOpenError:circuit open",
        attempts=0,
        retry_after=float(wait),
        advice=f"{name} is unavailable for ~{wait}s; {_elsewhere(kind, name)}",
    )
    return CircuitOpenError(info)


def rate_limited(kind: str, name: str, wait: float, limit: str) -> TransientError:
    """The refusal of a call whose shared rate limit would make it wait past the cap."""
    seconds = max(1, round(wait))
    info = GovernedError(
        error_type=ErrorType.TRANSIENT,
        tool=name,
        code="rate_limited",
        message=f"{name} is over its shared rate limit of {limit}",
        signature=f"{name}:RateLimited:rate limit",
        attempts=0,
        retry_after=float(seconds),
        advice=f"{name} is rate limited for ~{seconds}s; {_elsewhere(kind, name)}",
    )
    return TransientError(info)
