"""Escalation: every soft signal the model gets has a hard follow-up.

The governor tells the model things in text -- "do not repeat this call unchanged",
"this tool keeps failing the same way", "this tool is unavailable", "this tool is rate
limited" -- and a model may ignore text: trackers of other frameworks have reports of
models repeating a refused call hundreds of times. So each of those signals is
remembered per task with what it was about, and after the model has been told,
``escalation_repeats`` more attempts at the same thing (default 2, per tool
``ToolPolicy(escalation_repeats=)``) climb the ladder (:mod:`loop_governor.ladder`): the
tool is withdrawn, and calling it anyway ends the run. The text says so from the first
time ("2 more identical calls withdraw search_docs").

What "the same thing" is, per signal:

* a permanent failure (then its known-bad replays): the identical call;
* the repeated-error guard's ``LoopDetectedError``: the same error for the same call but
  for its numbers (the next flight number, another line range); for a transient signature
  (the service keeps failing), the tool, while it does;
* an open breaker's or a shared rate limit's refusal: the same call but for its numbers,
  while the tool is refused.

The first two hold only while the world stands still: after a success of a tool that
may change state (the fix of a precondition) the retried call runs for real
(:mod:`loop_governor.known_bad`) and the count starts over. Counting a fix that did not
fix it would stop coding agents that re-run the same failing script after each edit
(measured on recorded runs); cycles still catch a fix-and-retry pair that repeats with
the same results.
The last two are about the tool's availability, not about what the model asked: any
success of the tool ends them (a later outage is a new one the model is told about).
Parallel calls of one model turn are one decision: they never count as repeats of each
other, nor of a warning given in that same turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy
from loop_governor.errors import AgentToolError, CircuitOpenError, ErrorType, FatalError, LoopDetectedError
from loop_governor.ladder import withdrawn_error
from loop_governor.progress import withdraws_text

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

# what the model was told about -> (a repeat, repeats, the stop's code)
_SUBJECTS = {
    "call": (
        "identical call with nothing fixed in between",
        "identical calls with nothing fixed in between",
        "repeated_failure",
    ),
    "signature": (
        "call failing the same way with nothing fixed in between",
        "calls failing the same way with nothing fixed in between",
        "repeated_failure",
    ),
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
        kind, about = subject[0]
        # in this world: after a success that may have changed it (a fix), the retried call
        # runs for real and its count starts over -- a coding agent re-running the same
        # failing script after each edit is iterating, not looping (its step budget bounds it)
        # (a stateless tool's failure depends on its arguments alone: no fix resets it)
        if kind in ("call", "signature"):  # (an outage's subjects are about the tool, not the call)
            identical = call.key if call.policy.stateless else f"{call.key}@{scope.world}"
            if kind == "call" or ("call", identical) in scope.told:
                kind, about = "call", identical  # the identical call again: its own count goes on
            else:
                about = f"{about}@{scope.world}"
        key, repeat = (kind, about), subject[1]
        # the ladder: told, answered from memory (or refused) ``escalation_repeats`` more
        # times, then withdrawn; the next call of it ends the run
        told, limit = scope.told, call.policy.escalation_repeats
        invocation, decision = call.invocation, scope.decision
        seen = told.get(key)
        if seen is None and not repeat:
            told[key] = (0, invocation, decision)  # told now: the text says what a repeat will do
            if kind in _AVAILABILITY:
                scope.unavailable.setdefault(call.name, set()).add(key)
            elif kind == "call":
                scope.told_calls.setdefault(call.name, {})[call.key] = key
            return self._warn(call, error, key, limit)
        count, last, last_decision = seen or (0, None, None)
        if (invocation is not None and invocation == last) or (decision is not None and decision == last_decision):
            # the same tool call again (a retrying middleware around the governor), or a
            # parallel call of the same model turn: the model did not ask again after
            # being told, nothing to count
            return self._warn(call, error, key, limit - count)
        count += 1
        told[key] = (count, invocation, decision)
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
