"""Known-bad calls: a call that failed permanently is not made again in the same task.

The same tool with the same arguments will fail the same way (a 404, invalid
arguments), so the second time the model asks, the stored outcome comes back at once
and the backend is not hit. The memory lives in the store (shared by a fleet) and, with
checkpoints, survives a restart.

Until the tool does something else: a tool with state (a shell, a database, a file
system) may well succeed with the same arguments after another call to it changed that
state -- a coding agent re-runs ``python reproduce.py`` after editing the file it runs.
So a success of the same tool with other arguments retires its earlier failures in this
task (they run again if asked); a tool without state loses nothing but one repeat call,
and ``ToolPolicy(stateless=True)`` keeps its failures known-bad for the whole task.

The lookup is on the path of every governed call of a task that had a permanent failure,
so :class:`BadCalls` keeps a local index: when every known-bad call of the task was
recorded here, a call whose (normalized) arguments match none of them skips the store.
"""

from __future__ import annotations

from typing import Any

from loop_governor.call import TOOL, Call, Policy, Resumed
from loop_governor.checkpointing import update_checkpoint
from loop_governor.errors import AgentToolError, ErrorType, GovernedError, error_from_info
from loop_governor.runtime import Runtime


class BadCalls:
    """The known-bad calls this process recorded for one task, and each tool's
    generation (how many other calls of it succeeded since)."""

    __slots__ = ("generations", "local", "shapes")

    def __init__(self) -> None:
        self.local: dict[str, tuple[str, int]] = {}  # call key -> (tool, generation at the failure)
        self.shapes: set[tuple[str, int]] = set()  # (tool, normalized arguments) of those calls
        self.generations: dict[str, int] = {}  # tools with local entries -> generation

    def add(self, call: Call) -> None:
        tool = call.name
        generation = self.generations.setdefault(tool, 0)
        self.local[call.key] = (tool, generation)
        self.shapes.add((tool, call.args_signature[0]))

    def cannot_match(self, call: Call, recorded: int) -> bool:
        """True when the task's known-bad calls were all recorded here (``recorded`` is the
        task's count) and none has this call's normalized arguments."""
        return recorded == len(self.local) and (call.name, call.args_signature[0]) not in self.shapes

    def retired(self, call: Call) -> bool:
        entry = self.local.get(call.key)
        return entry is not None and entry[1] != self.generations.get(entry[0], 0)

    def generation(self, tool: str) -> int:
        return self.generations.get(tool, 0)


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
        if info is None or (memory is not None and memory.retired(call)):
            return None
        call.stop_reason = "known_bad"
        raise error_from_info(info)

    def after_success(self, call: Call, result: Any) -> Any:
        memory = call.scope.bad_calls if call.scope is not None else None
        if memory is not None and call.name in memory.generations and not call.policy.stateless:
            memory.generations[call.name] += 1  # the tool did something else: its failures retire
        return result

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
        scope.bad_calls.add(call)
        update_checkpoint(self.rt, scope, lambda cp: cp.record_failure(key, governed))
        return error
