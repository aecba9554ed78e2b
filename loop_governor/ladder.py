"""The last steps of the escalation ladder: withdraw the tool, then end the run.

A stop ends someone's work, so the governor climbs a ladder before it takes one: it
tells the model (a structured error or a note: "do not repeat this unchanged"), then
answers from memory without calling the tool, then *withdraws* the tool from the model
for the rest of the task, and only then ends the run -- when the model persists (it calls
the withdrawn tool anyway).

Withdrawal is a task fact the adapters act on where the framework allows it: LangChain's
``GovernorMiddleware`` drops the tool from the model request's tool list, crewAI's
governed LLM from the tool schemas it sends. Where nothing can hide the tool (a plain
``g.call``), the model reads that the tool is withdrawn and that calling it again ends the
task. Every withdrawal is a ``tool_withdrawn`` event (and so a span and a log line).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from loop_governor.call import TOOL, Call, Policy, Resumed
from loop_governor.errors import (
    AgentToolError,
    ErrorType,
    GovernedError,
    NoProgressError,
    PermanentError,
    TransientError,
)

_T = TypeVar("_T")

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime
    from loop_governor.scope import TaskScope


def withdraw_at(repeats: int) -> int:
    """After a warning, the repeat that withdraws the tool, for ``escalation_repeats``: the
    one before the last, so the stop (the next call of the withdrawn tool) comes where a
    stop always came -- ``escalation_repeats`` repeats after the warning (at least one
    repeat withdraws, at least one more ends the run)."""
    return max(1, repeats - 1)


# stops for identical calls with identical answers: what a poll does by design
_IDENTICAL = frozenset({"no_progress", "cycle"})


def withdraw(
    rt: Runtime,
    call: Call,
    code: str,
    why: str,
    tools: Iterable[str] = (),
    for_s: float | None = None,
    message: str | None = None,
) -> str:
    """Withdraw ``call``'s tool (and ``tools``: every tool of a cycle) for the rest of its
    task -- or, for a tool that is unavailable (``for_s``), until it may be back; returns
    what the model reads."""
    scope = call.scope
    assert scope is not None
    names = [call.name, *sorted(set(tools) - {call.name})]
    until = None if for_s is None else rt.clock() + max(1.0, for_s)
    for name in names:
        scope.withdrawn[name] = (code, scope.decision, until)
        rt.events.emit("tool_withdrawn", tool=name, code=code, reason=why, for_s=for_s, message=message)
    listed = " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + f" and {names[-1]}"
    verb, them = ("is", "it") if len(names) == 1 else ("are", "them")
    if for_s is None:
        return (
            f"{listed} {verb} now withdrawn from your tools for the rest of this task ({why}); use another "
            f"tool or give your final answer. Calling {them} again ends the task."
        )
    return (
        f"{listed} {verb} now withdrawn from your tools for the next {max(1, round(for_s))}s ({why}); use "
        f"another tool meanwhile: {them} will be offered again once {verb} may be back."
    )


def _lapsed(rt: Runtime, scope: TaskScope, name: str) -> bool:
    """Whether ``name``'s withdrawal for an outage is over (then it is taken back)."""
    entry = scope.withdrawn.get(name)
    if entry is None or entry[2] is None or rt.clock() < entry[2]:
        return False
    scope.withdrawn.pop(name, None)
    rt.events.emit("tool_restored", tool=name, code=entry[0])
    return True


def withdrawn_error(
    rt: Runtime, call: Call, error: AgentToolError, code: str, why: str, for_s: float | None = None
) -> AgentToolError:
    """``error`` as the model reads it once the tool is withdrawn (same type and message)."""
    note = withdraw(rt, call, code, why, for_s=for_s, message=error.info.message)
    info = error.info
    return type(error)(info.model_copy(update={"advice": note, "retryable": False}))


def _stop(scope: TaskScope, tool: str, code: str, message: str) -> NoProgressError:
    info = GovernedError(
        error_type=ErrorType.FATAL,
        tool=tool,
        code=code,
        message=message,
        signature=f"{tool}:NoProgressError:{code}",
        advice="the loop ignored the governor's advice: stop and report what was done",
    )
    return NoProgressError(info)


def offered(scope: TaskScope, names: Sequence[str]) -> list[bool]:
    """For adapters, before a model request: which of the request's tools (by name) the
    model is still offered (a tool withdrawn for an outage comes back when it may be up).
    With every tool withdrawn the request goes out with none, so the model gives its final
    answer; a tool call it makes anyway ends the run."""
    rt, withdrawn = scope.governor.rt, scope.withdrawn
    return [name not in withdrawn or _lapsed(rt, scope, name) for name in names]


def tool_name(tool: Any) -> str:
    """A model request's tool's name, duck-typed (the core imports no framework): a tool
    object's ``name``, or a provider tool dict, flat or OpenAI's ``{"type": "function",
    "function": {...}}``."""
    if isinstance(tool, dict):
        inner = tool.get("function")
        return str((inner if isinstance(inner, dict) else tool).get("name", ""))
    return str(getattr(tool, "name", ""))


def offered_tools(scope: TaskScope, tools: Sequence[_T]) -> list[_T] | None:
    """For adapters: a model request's ``tools`` less the withdrawn ones, or None when
    none of them is withdrawn (the request goes out as it is)."""
    keep = offered(scope, [tool_name(t) for t in tools])
    return None if all(keep) else [t for t, kept in zip(tools, keep, strict=True) if kept]


class Withdrawn(Policy):
    """Ends the run when the model calls a tool it was told is withdrawn."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        scope = call.scope
        if scope is None or not scope.withdrawn:
            return None
        entry = scope.withdrawn.get(call.name)
        if entry is None or _lapsed(self.rt, scope, call.name):
            return None
        code, decision, until = entry
        call.stop_reason = "withdrawn"
        if until is not None:
            # withdrawn while the tool is unavailable (an outage, an open breaker, a rate
            # limit): a call before it may be back is refused, never a stop -- the service
            # recovers on its own, and then the tool is offered again
            wait = max(1, round(until - self.rt.clock()))
            raise TransientError(
                GovernedError(
                    error_type=ErrorType.TRANSIENT,
                    tool=call.name,
                    code="withdrawn",
                    message=f"{call.name} is withdrawn from your tools while it is unavailable",
                    signature=f"{call.name}:Withdrawn:unavailable",
                    attempts=0,
                    retry_after=float(wait),
                    advice=f"{call.name} will be offered again in about {wait}s; use another tool meanwhile",
                )
            )
        if decision is not None and decision == scope.decision:
            # a parallel call of the turn that got the tool withdrawn: the model has not
            # been told yet, so this is no persisting -- refused, not a stop
            raise PermanentError(
                GovernedError(
                    error_type=ErrorType.PERMANENT,
                    tool=call.name,
                    code="withdrawn",
                    message=f"{call.name} was withdrawn from your tools for the rest of this task",
                    signature=f"{call.name}:Withdrawn",
                    attempts=0,
                    advice=f"use another tool or give your final answer; calling {call.name} again ends the task",
                )
            )
        self.rt.events.emit("escalation", tool=call.name, subject="withdrawn", action="stop", count=1)
        if code.startswith("poll_"):
            message = f"the model polled {call.name} again after the poll reached its bound and was withdrawn ({code})"
        else:
            message = (
                f"the model called {call.name} after it was withdrawn for repeating calls that did not help ({code})"
            )
        if code in _IDENTICAL:
            message += f"; if {call.name} is a status poll, declare it with ToolPolicy(poll=True)"
        raise _stop(scope, call.name, code, message)
