"""The last steps of the escalation ladder: withdraw the tool, then end the run.

A stop ends someone's work, so the governor climbs a ladder before it takes one: it
tells the model (a structured error or a note: "do not repeat this unchanged"), then
answers from memory without calling the tool, then *withdraws* the tool from the model
for the rest of the task, and only then ends the run -- when the model persists (it calls
the withdrawn tool anyway).

A withdrawal is a task fact, with a lifecycle:

* it starts with a ``tool_withdrawn`` event (a span and a log line) and a note in the
  result the model reads;
* it ends when the cause may be gone: a withdrawal while the tool is unavailable (an
  outage, an open breaker, a rate limit) when that time is up; a withdrawal for
  repeating when *another* tool that may change state succeeds (the agent pressed the
  brake, logged in, edited the file: the withdrawn call may work now). Either way a
  ``tool_restored`` event, and after a state change the result of the tool that made it
  tells the model the tool is back;
* what the model is offered meanwhile is the adapters' to apply, through
  `tool_offer`: the tools that are not withdrawn; but never a request with tool
  history and no tools (Anthropic and Bedrock refuse it): with every tool withdrawn the
  tools array stays as it is -- the first block of every provider's prompt cache -- and
  the adapter forbids tool calls the provider's own way (``tool_choice="none"``) where
  it has one. crewAI's text (ReAct) prompts lose the tool's description where the
  adapter can edit them; where it cannot it says so (`keep_listed`) and a call of
  the tool is refused, never a stop -- the model was following its prompt.

The guards that climb the ladder (repeats, escalation, no progress, cycles, polls) share
its vocabulary, kept here: a guard's [`Verdict`][loop_governor.policies.ladder.Verdict] on one step,
[`annotate`][loop_governor.policies.ladder.annotate] for the note the model reads, and
[`withdraws_text`][loop_governor.policies.ladder.withdraws_text], the sentence every warning carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from loop_governor.call import TOOL, Call, Policy, Resumed, StopReason
from loop_governor.conversation import uses_tools
from loop_governor.errors import (
    AgentToolError,
    ErrorType,
    FatalError,
    GovernedError,
    NoProgressError,
    PermanentError,
    TransientError,
)
from loop_governor.policies.fixes import did_something

_T = TypeVar("_T")

# A task's withdrawn tool: (the stop's code, the model decision it was withdrawn in, the
# clock time an availability withdrawal ends or None, whether a state change lifts it).
Withdrawal = tuple[str, int | None, float | None, bool]

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime
    from loop_governor.task import TaskScope


def withdraws_text(remaining: int, tool: str, what: str = "repeat", whats: str | None = None) -> str:
    """The plain sentence every warning carries: how many more repeats withdraw the tool
    (the ladder's next step, [`loop_governor.policies.ladder`][loop_governor.policies.ladder])."""
    if remaining <= 1:
        return f"the next {what} withdraws {tool} from your tools"
    return f"{remaining} more {whats or what + 's'} withdraw {tool} from your tools"


def annotate(result: Any, note: str) -> Any:
    """Append ``note`` to what the model will read; unchanged if that can't be done safely."""
    if isinstance(result, str):
        return f"{result}\n\n{note}"
    content = getattr(result, "content", None)
    copier = getattr(result, "model_copy", None)
    if isinstance(content, str) and callable(copier):
        return copier(update={"content": f"{content}\n\n{note}"})  # pydantic models (ToolMessage)
    if isinstance(result, dict) and isinstance(result.get("content"), str):
        return {**result, "content": f"{result['content']}\n\n{note}"}
    return result


@dataclass(slots=True)
class Verdict:
    """What a guard concluded about one step: nothing, warn the model, or stop.

    ``remaining``: how many more repeats the model has before the stop (for the warning).
    """

    action: str  # "ok" | "warn" | "stop"
    reason: str = ""
    count: int = 0
    remaining: int = 0


OK = Verdict("ok")


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
    # A withdrawal for repeating lifts when another tool changes state -- unless the
    # repeats already came after such changes: the fixes were tried, and did not help.
    liftable = {n: for_s is None and scope.streaks.get(n, scope.world) == scope.world for n in names}
    for name in names:
        scope.withdrawn[name] = (code, scope.decision, until, liftable[name])
        rt.events.emit("tool_withdrawn", tool=name, code=code, reason=why, for_s=for_s, message=message)
    listed = " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + f" and {names[-1]}"
    verb, them = ("is", "it") if len(names) == 1 else ("are", "them")
    if for_s is None:
        unless = ""
        if all(liftable.values()):
            unless = f", unless another tool changes something {them} depend{'s' if len(names) == 1 else ''} on"
        return (
            f"{listed} {verb} now withdrawn for the rest of this task ({why}){unless}; use another tool or give "
            f"your final answer. Calling {them} again ends the task."
        )
    return (
        f"{listed} {verb} now withdrawn from your tools for the next {max(1, round(for_s))}s ({why}); use "
        f"another tool meanwhile: {them} will be offered again once {verb} may be back."
    )


def _restore(rt: Runtime, scope: TaskScope, name: str, **why: Any) -> Withdrawal | None:
    """Take ``name``'s withdrawal back (a ``tool_restored`` event); its entry, if it had one."""
    entry = scope.withdrawn.pop(name, None)
    scope.listed.discard(name)
    if entry is not None:
        rt.events.emit("tool_restored", tool=name, code=entry[0], **why)
    return entry


def _lapsed(rt: Runtime, scope: TaskScope, name: str) -> bool:
    """Whether ``name``'s withdrawal for an outage is over (then it is taken back)."""
    entry = scope.withdrawn.get(name)
    if entry is None or entry[2] is None or rt.clock() < entry[2]:
        return False
    _restore(rt, scope, name, reason="time")
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
    """Which of a model request's tools (by name) the model may still call (a tool
    withdrawn for an outage comes back when it may be up)."""
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


@dataclass(frozen=True, slots=True)
class Offer(Generic[_T]):
    """What a model request offers once some of its tools are withdrawn.

    ``tools``: the tools array to send: without the withdrawn tools (possibly empty, in a
    conversation without tool history: then send none), or, when every tool is withdrawn
    and the conversation holds tool history, unchanged (Anthropic and Bedrock refuse tool
    history without tools). ``forbid``: that last case -- the adapter forbids tool calls
    where the provider lets it (``tool_choice="none"``); a call the model makes anyway
    ends the run."""

    tools: list[_T]
    forbid: bool


def tool_offer(scope: TaskScope, tools: Sequence[_T], messages: Sequence[Any]) -> Offer[_T] | None:
    """For adapters, before a model request: what to offer (see `Offer`), or None
    when none of the request's tools is withdrawn (the request goes out as it is).

    A withdrawn tool is left out while others remain: the model cannot call what it is
    not offered, the ladder's strongest step short of a stop (``loop-governor bench
    --runs 1``, the stubborn model policy: 4 of 38 tasks failed with the tool left out, 11
    of 38 with it kept and its calls ending the run), at the price of one prompt-cache
    miss per withdrawal. Providers that check tool history want tools *defined*, any of them
    (Bedrock accepts a placeholder; see tests/lg_openai_server.py): never none, so when
    every tool of a request with tool history is withdrawn the array stays as it is and
    the adapter forbids tool calls where the provider can."""
    keep = offered(scope, [tool_name(t) for t in tools])
    if all(keep):
        return None
    if not any(keep) and uses_tools(messages):
        return Offer(list(tools), forbid=True)
    return Offer([t for t, kept in zip(tools, keep, strict=True) if kept], forbid=False)


def keep_listed(scope: TaskScope, names: Iterable[str]) -> None:
    """For adapters that cannot take withdrawn tools out of what the model reads (a text
    prompt they could not edit): those tools stay listed, so calling one is refused --
    told plainly -- and never ends the run."""
    scope.listed.update(names)


def _stopped_again(stop: FatalError) -> FatalError:
    """The stop that already ended the task, as the outcome of a call made after it (a
    parallel call of the same turn): a copy, reported once already."""
    again = type(stop)(stop.info, partial_results=stop.partial_results)
    again._lg_stop_reported = True  # type: ignore[attr-defined]
    return again


class Withdrawn(Policy):
    """Ends the run when the model calls a tool it was told is withdrawn; takes a
    withdrawal for repeating back when another tool may have changed the world. A task
    that was stopped runs no further tool call."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        scope = call.scope
        if scope is None:
            return None
        if scope.stop is not None:
            call.stop_reason = StopReason.STOPPED
            raise _stopped_again(scope.stop)
        if not scope.withdrawn:
            return None
        entry = scope.withdrawn.get(call.name)
        if entry is None or _lapsed(self.rt, scope, call.name):
            return None
        code, decision, until, _ = entry
        call.stop_reason = StopReason.WITHDRAWN
        if call.name in scope.listed:
            # the adapter could not take the tool out of the model's prompt: the model is
            # following its instructions, so the call is refused and the run goes on
            raise PermanentError(
                GovernedError(
                    error_type=ErrorType.PERMANENT,
                    tool=call.name,
                    code="withdrawn",
                    message=f"{call.name} is withdrawn for this task; it is still listed in your instructions "
                    "only because they could not be changed",
                    signature=f"{call.name}:Withdrawn:listed",
                    attempts=0,
                    advice=f"do not call {call.name}: it will not run; use another tool or give your final answer",
                )
            )
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

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope = call.scope
        if scope is not None and call.name not in scope.streaks:
            scope.streaks[call.name] = scope.world  # the world its failures began in
        return error

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        if scope is None:
            return result
        if scope.streaks:
            scope.streaks.pop(call.name, None)
        if not scope.withdrawn or call.policy.read_only or not did_something(call):
            return result
        # Another tool that may change state succeeded: what a tool withdrawn for
        # repeating kept getting may be different now (the precondition it named was
        # fixed), so it is offered again -- from a later model decision than its
        # withdrawal (a parallel call of that same turn is no fix the model chose).
        # A ``think``, a note or a search only said something (fixes.did_something).
        decision = scope.decision
        back = [
            name
            for name, (_, when, _until, liftable) in list(scope.withdrawn.items())
            if name != call.name and liftable and (decision is None or when != decision)
        ]
        for name in back:
            _restore(self.rt, scope, name, reason="world_changed", by=call.name)
        if not back:
            return result

        listed = " and ".join(back) if len(back) < 3 else ", ".join(back[:-1]) + f" and {back[-1]}"
        verb = "is" if len(back) == 1 else "are"
        return annotate(
            result,
            f"[loop-governor] {listed} {verb} offered again: {call.name} may have changed what "
            f"{'it depends' if len(back) == 1 else 'they depend'} on.",
        )
