"""Escalation: every soft signal the model gets has a hard follow-up.

The governor tells the model things in text -- "do not repeat this call unchanged",
"this tool keeps failing the same way", "this tool is unavailable", "this tool is rate
limited" -- and a model may ignore text: trackers of other frameworks have reports of
models repeating a refused call hundreds of times. So each of those signals is
remembered per task with what it was about, and after the model has been told,
``escalation_repeats`` more attempts at the same thing (default 2, per tool
``ToolPolicy(escalation_repeats=)``) climb the ladder
([`loop_governor.policies.ladder`][loop_governor.policies.ladder]): the tool is withdrawn, and calling it anyway ends
the run. The text says so from the first time ("2 more identical calls withdraw search_docs").

What "the same thing" is, per signal:

* a permanent failure (then its known-bad replays): the identical call failing the same
  way -- also after a success elsewhere: the call then runs for real (the success may have
  been the fix), but failing the same way again it is the same thing again;
* the repeated-error guard's ``LoopDetectedError``: the same tool failing the same way about
  the same entity ([`loop_governor.policies.repeats`][loop_governor.policies.repeats]); for a transient failure (the
  service keeps failing), the tool, while it does;
* an open breaker's or a shared rate limit's refusal: the same call but for its numbers,
  while the tool is refused.

A failure that comes back after something that may have fixed it (an edit, a toggle:
[`loop_governor.policies.fixes`][loop_governor.policies.fixes]) is iterating, not counted; a failure with another error
is news, told afresh. The last two signals are about the
tool's availability, not about what the model asked: any success of the tool ends them,
and their withdrawal lasts only until the tool may be back.
Parallel calls of one model turn are one decision: they never count as repeats of each
other, nor of a warning given in that same turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy, StopReason
from loop_governor.errors import AgentToolError, CircuitOpenError, ErrorType, FatalError, LoopDetectedError
from loop_governor.policies.fixes import fixed_since
from loop_governor.policies.ladder import withdrawn_error, withdraws_text
from loop_governor.policies.repeats import failure_key

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

# what the model was told about -> (a repeat, repeats, the stop's code)
_SUBJECTS = {
    "call": ("identical call failing the same way", "identical calls failing the same way", "repeated_failure"),
    "signature": ("call failing the same way", "calls failing the same way", "repeated_failure"),
    "outage": ("call while it keeps failing", "calls while it keeps failing", "repeated_failure"),
    "breaker": ("call while it is unavailable", "calls while it is unavailable", "repeated_refusal"),
    "rate": ("call while it is rate limited", "calls while it is rate limited", "repeated_refusal"),
}


# subjects about the tool's availability: any success of the tool ends them
_AVAILABILITY = frozenset({"outage", "breaker", "rate"})


def _subject(call: Call, error: AgentToolError) -> tuple[tuple[str, str], bool] | None:
    """What this outcome is about, and whether it repeats something the model was told
    (True) or is a failure of its own (False); None when it is no soft signal."""
    reason = call.stop_reason
    if not call.attempt:  # refused before the call ran
        if reason is StopReason.KNOWN_BAD:
            return ("call", call.key), True
        if reason is StopReason.BREAKER or isinstance(error, CircuitOpenError):
            return ("breaker", f"{call.name}:{call.args_shape}"), False
        if reason is StopReason.RATE_LIMITED:
            return ("rate", f"{call.name}:{call.args_shape}"), False
        return None
    if isinstance(error, LoopDetectedError):
        if call.info is not None and call.info.error_type is ErrorType.TRANSIENT:
            return ("outage", call.name), False  # the service keeps failing, whatever is asked
        if ("call", call.key) in call.scope.told:  # type: ignore[union-attr]  # (in a task: checked by the caller)
            return ("call", call.key), False  # the identical call again: its own count goes on
        return ("signature", failure_key(call, error)), False
    if error.info.error_type is ErrorType.PERMANENT:
        return ("call", call.key), False
    return None


def _identity(call: Call, error: AgentToolError) -> str:
    """The failure's own error (``ErrorInfo.identity``), or its signature for a replay."""
    info = call.info
    return info.identity if info is not None and info.identity else error.info.signature


class Escalation(Policy):
    """Counts what the model was told not to repeat, and withdraws the tool past the limit."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        if scope is None:
            return result
        if scope.unavailable:
            # the tool answered: its outage (failures, breaker, rate limit) is over
            for key in tuple(scope.unavailable.pop(call.name, ())):  # (a parallel call may still add)
                scope.told.pop(key, None)
        calls = scope.told_calls.get(call.name) if scope.told_calls else None
        if calls:
            # the very call works now (its cause was fixed): a later failure is news
            told = calls.pop(call.key, None)
            if told is not None:
                scope.told.pop(told, None)
        return result

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope = call.scope
        if scope is None or isinstance(error, FatalError):
            return error
        subject = _subject(call, error)
        if subject is None:
            return error
        key, repeat = subject
        kind = key[0]
        # the ladder: told, answered from memory (or run again after a fix and failing the
        # same way) ``escalation_repeats`` more times, then withdrawn; the next call ends the run
        told, limit = scope.told, call.policy.escalation_repeats
        invocation, decision, step = call.invocation, scope.decision, scope.tool_calls
        seen = told.get(key)
        identity = _identity(call, error) if kind == "call" and not repeat else None
        if seen is not None and identity is not None and seen[3] is not None and identity != seen[3]:
            seen = None  # the identical call failing another way: news, told afresh
        if seen is None and not repeat:
            told[key] = (0, invocation, decision, identity, step)  # told now: the text says what a repeat does
            if kind in _AVAILABILITY:
                scope.unavailable.setdefault(call.name, set()).add(key)
            elif kind == "call":
                scope.told_calls.setdefault(call.name, {})[call.key] = key
            return self._warn(call, error, key, limit)
        count, last, last_decision, known, last_step = seen or (0, None, None, identity, step)
        if (invocation is not None and invocation == last) or (decision is not None and decision == last_decision):
            # the same tool call again (a retrying middleware around the governor), or a
            # parallel call of the same model turn: the model did not ask again after
            # being told, nothing to count
            return self._warn(call, error, key, limit - count)
        if not repeat and kind == "call" and fixed_since(call, last_step):
            # run again after something that may have fixed it (an edit) and failing the same
            # way: iterating, not a repeat
            told[key] = (count, invocation, decision, known, step)
            return self._warn(call, error, key, limit - count)
        count += 1
        told[key] = (count, invocation, decision, known, step)
        if count >= limit:
            return self._withdraw(call, error, key, count)
        return self._warn(call, error, key, limit - count)

    def _warn(self, call: Call, error: AgentToolError, key: tuple[str, str], remaining: int) -> AgentToolError:
        what, whats, _ = _SUBJECTS[key[0]]
        self.rt.events.emit("escalation", tool=call.name, subject=key[0], action="warn", remaining=remaining)
        call.warned = True
        info = error.info
        advice = f"{info.advice or ''}; {withdraws_text(remaining, call.name, what, whats)}".lstrip("; ")
        return type(error)(info.model_copy(update={"advice": advice}))

    def _withdraw(self, call: Call, error: AgentToolError, key: tuple[str, str], count: int) -> AgentToolError:
        _, whats, code = _SUBJECTS[key[0]]
        self.rt.events.emit("escalation", tool=call.name, subject=key[0], action="withdraw", count=count)
        call.warned = True
        why = f"{count} more {whats} after being told"
        # unavailable (an outage, an open breaker, a rate limit): withdrawn until it may be back
        for_s = (error.info.retry_after or call.policy.breaker.cooldown_s) if key[0] in _AVAILABILITY else None
        return withdrawn_error(self.rt, call, error, code, why, for_s)
