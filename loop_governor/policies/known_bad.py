"""Known-bad calls: a call that failed permanently is not made again -- while nothing changed.

The same tool with the same arguments will fail the same way (a 404, invalid
arguments), so the second time the model asks, the stored outcome comes back at once
and the backend is not hit. The memory lives in the store (shared by a fleet) and, with
checkpoints, survives a restart.

Until the world changes. A failure often names a precondition the agent can fix with
another tool: ``startEngine`` fails with "press the brake pedal", the agent calls
``pressBrakePedal``, then ``startEngine`` again -- and this time it must run. So a
success of any tool that may change state (any tool not declared
``ToolPolicy(read_only=True)``; the failed tool's own success with other arguments
included: a shell after an edit) retires every earlier failure of the task: asked
again, the call runs for real. A call repeated with nothing done in between is still
answered from memory. ``ToolPolicy(stateless=True)`` says a tool's failures depend on its
arguments alone: they stay known-bad for the whole task.

The lookup is on the path of every governed call of a task that had a permanent failure,
so [`BadCalls`][loop_governor.policies.known_bad.BadCalls] keeps a local index: when every known-bad call of the task
was recorded here, a call whose (normalized) arguments match none of them skips the store.
"""

from __future__ import annotations

from typing import Any

from loop_governor.call import TOOL, Call, Policy, Resumed, StopReason
from loop_governor.errors import AgentToolError, ErrorType, GovernedError, error_from_info
from loop_governor.policies.checkpointing import update_checkpoint
from loop_governor.runtime import Runtime


class BadCalls:
    """The known-bad calls this process recorded for one task, each with the task's world
    ([TaskScope.world][loop_governor.task.TaskScope.world]) at its failure."""

    __slots__ = ("local", "shapes")

    def __init__(self) -> None:
        self.local: dict[str, int] = {}  # call key -> the task's world at the failure
        self.shapes: set[tuple[str, int]] = set()  # (tool, normalized arguments) of those calls

    def add(self, call: Call, world: int) -> None:
        self.local[call.key] = world
        self.shapes.add((call.name, call.args_signature[0]))

    def cannot_match(self, call: Call, recorded: int) -> bool:
        """True when the task's known-bad calls were all recorded here (``recorded`` is the
        task's count) and none has this call's normalized arguments."""
        return recorded == len(self.local) and (call.name, call.args_signature[0]) not in self.shapes



def retired(memory: BadCalls | None, call: Call, world: int) -> bool:
    """Whether the call's failure describes an earlier world (something that may change
    state succeeded since): it runs again, unless the tool is stateless. A failure this
    process did not record (a checkpoint being resumed, another process of a fleet) is as
    of before this run, world 0: the first state-changing success here retires it."""
    if call.policy.stateless:
        return False
    recorded = memory.local.get(call.key, 0) if memory is not None else 0
    return world != recorded


class World(Policy):
    """Moves the task's world on after each success of a tool that may change state (the
    failures, warnings and verdicts recorded before describe the world as it was). Last in
    the chain but the run stop, so the guards of this very call still see the world it
    was made in."""

    kinds = frozenset({TOOL})
    __slots__ = ()

    def __init__(self, rt: Runtime | None = None) -> None:
        """Keeps nothing of the runtime: the world is the task's."""

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        if scope is not None and not call.policy.read_only:
            scope.world += 1
            scope.movers.append((scope.tool_calls, call))  # what may have fixed something (fixes.py)
        return result


class KnownBad(Policy):
    """Replays the stored outcome of a known-bad call; records new permanent failures."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        scope = call.scope
        assert scope is not None
        info: GovernedError | None = None
        cp, memory = scope.checkpoint, scope.bad_calls
        if cp is not None:
            info = cp.get_failure(call.key)
        elif not scope.known_bad or (memory is not None and memory.cannot_match(call, scope.known_bad)):
            return None  # the common case: nothing this call could be
        if info is None and scope.known_bad:
            stored = self.rt.store.known_bad_get(scope.task_id, call.key)
            if stored is not None:
                info = GovernedError.model_validate_json(stored)
        if info is None or retired(memory, call, scope.world):
            return None
        call.stop_reason = StopReason.KNOWN_BAD
        raise error_from_info(info)

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope = call.scope
        if scope is None or not call.attempt or error.info.error_type is not ErrorType.PERMANENT:
            return error  # a replay or a refusal is not a new failure
        key, governed = call.key, error.info
        self.rt.store.known_bad_put(scope.task_id, key, governed.model_dump_json())
        if scope.bad_calls is None:
            scope.bad_calls = BadCalls()
        if key not in scope.bad_calls.local:
            scope.known_bad += 1
        scope.bad_calls.add(call, scope.world)
        update_checkpoint(self.rt, scope, lambda cp: cp.record_failure(key, governed))
        return error
