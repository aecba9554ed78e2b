"""Escalation: every soft signal the model gets has a hard follow-up.

The governor tells the model things in text -- "do not repeat this call", "this tool
keeps failing the same way", "this tool is unavailable", "this tool is rate limited" --
and a model may ignore text: trackers of other frameworks have reports of models
repeating a refused call hundreds of times. So each of those signals is remembered per
task with what it was about, and after the model has been told, ``escalation_repeats``
more attempts at the same thing (default 2, per tool ``ToolPolicy(escalation_repeats=)``)
end the run with :class:`~loop_governor.errors.NoProgressError` (a ``FatalError``: the
checkpoint is saved, the partial results come with it). The text says so plainly from
the first time ("2 more identical calls end the task").

What "the same thing" is, per signal -- until the tool succeeds with other arguments: a
tool with state (a shell after an edit) may well behave differently now, so the count
starts over:

* a permanent failure (then its known-bad replays): the identical call;
* the repeated-error guard's ``LoopDetectedError``: the same error for the same call but
  for its numbers (the next flight number, another line range); for a transient signature
  (the service keeps failing), the tool, while it does;
* an open breaker's or a shared rate limit's refusal: the same call but for its numbers,
  while the tool is refused.

The last two are about the tool's availability, not about what the model asked: any
success of the tool ends them (a later outage is a new one the model is told about).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy
from loop_governor.errors import (
    AgentToolError,
    CircuitOpenError,
    ErrorType,
    FatalError,
    GovernedError,
    LoopDetectedError,
    NoProgressError,
)
from loop_governor.known_bad import BadCalls
from loop_governor.progress import ends_text

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

# what the model was told about -> (a repeat, repeats, the stop's code)
_SUBJECTS = {
    "call": ("identical call", "identical calls", "repeated_failure"),
    "signature": ("call failing the same way", "calls failing the same way", "repeated_failure"),
    "outage": ("call while it keeps failing", "calls while it keeps failing", "repeated_failure"),
    "breaker": ("call while it is unavailable", "calls while it is unavailable", "repeated_refusal"),
    "rate": ("call while it is rate limited", "calls while it is rate limited", "repeated_refusal"),
}


# subjects about the tool's availability: any success of the tool ends them
_AVAILABILITY = frozenset({"outage", "breaker", "rate"})


def _subject(call: Call, error: AgentToolError) -> tuple[tuple[str, str], bool] | None:
    """What this outcome is about, and whether it repeats something the model was told
    (True) or tells it for the first time (False); None when it is no soft signal."""
    reason = call.stop_reason
    if not call.attempt:  # refused before the call ran
        if reason == "known_bad":
            return ("call", call.key), True
        if reason == "breaker" or isinstance(error, CircuitOpenError):
            return ("breaker", f"{call.name}:{call.args_shape}"), False
        if reason == "rate_limited":
            return ("rate", f"{call.name}:{call.args_shape}"), False
        return None
    if isinstance(error, LoopDetectedError):
        if call.info is not None and call.info.error_type is ErrorType.TRANSIENT:
            return ("outage", call.name), False  # the service keeps failing, whatever is asked
        # the same error for the same call but for a number (the next flight), not any call
        # of the tool that fails alike: a shell's commands share "Traceback ..." signatures
        return ("signature", f"{error.info.signature}:{call.args_shape}"), False
    if error.info.error_type is ErrorType.PERMANENT:
        return ("call", call.key), False
    return None


class Escalation(Policy):
    """Counts what the model was told not to repeat, and stops the run past the limit."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        if scope is not None and scope.unavailable:
            # the tool answered: its outage (failures, breaker, rate limit) is over
            for key in scope.unavailable.pop(call.name, ()):
                scope.told.pop(key, None)
        return result

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope = call.scope
        if scope is None or isinstance(error, FatalError):
            return error
        subject = _subject(call, error)
        if subject is None:
            return error
        kind, about = subject[0]
        # in the tool's current generation: a success of the tool with other arguments
        # since the warning means the world moved on (a shell after an edit), start over
        memory = scope.bad_calls
        if memory is None:
            memory = scope.bad_calls = BadCalls()
        memory.generations.setdefault(call.name, 0)
        key, repeat = (kind, f"{about}@{memory.generation(call.name)}"), subject[1]
        told, limit = scope.told, call.policy.escalation_repeats
        invocation = call.invocation
        seen = told.get(key)
        if seen is None and not repeat:
            told[key] = (0, invocation)  # told now: the text says what a repeat will do
            if kind in _AVAILABILITY:
                scope.unavailable.setdefault(call.name, set()).add(key)
            return self._warn(call, error, key, limit)
        count, last = seen or (0, None)
        if invocation is not None and invocation == last:
            # the same tool call again (a retrying middleware around the governor), not
            # the model asking again: nothing to count
            return self._warn(call, error, key, limit - count)
        count += 1
        told[key] = (count, invocation)
        if count >= limit:
            return self._stop(call, error, key, count)
        return self._warn(call, error, key, limit - count)

    def _warn(self, call: Call, error: AgentToolError, key: tuple[str, str], remaining: int) -> AgentToolError:
        what, whats, _ = _SUBJECTS[key[0]]
        self.rt.events.emit("escalation", tool=call.name, subject=key[0], action="warn", remaining=remaining)
        call.warned = True
        info = error.info
        advice = f"{info.advice or ''}; {ends_text(remaining, what, whats)}".lstrip("; ")
        return type(error)(info.model_copy(update={"advice": advice}))

    def _stop(self, call: Call, error: AgentToolError, key: tuple[str, str], count: int) -> AgentToolError:
        _, whats, code = _SUBJECTS[key[0]]
        self.rt.events.emit("escalation", tool=call.name, subject=key[0], action="stop", count=count)
        info = GovernedError(
            error_type=ErrorType.FATAL,
            tool=call.name,
            code=code,
            message=f"the model made {count} more {whats} to {call.name} after being told not to "
            f"({error.info.message})",
            signature=f"{call.name}:NoProgressError:{code}",
            advice="the loop ignored the governor's advice: stop and report what was done",
            count=count,
        )
        return NoProgressError(info)
