"""Known-bad calls: a call that failed permanently is not made again in the same task.

The same tool with the same arguments will fail the same way (a 404, invalid
arguments), so the second time the model asks, the stored outcome comes back at once --
byte-identical, so the provider's prompt cache holds -- and the backend is not hit. The
memory lives in the store (shared by a fleet) and, with checkpoints, survives a restart.
"""

from __future__ import annotations

from loop_governor.call import TOOL, Call, Policy, Resumed
from loop_governor.checkpointing import update_checkpoint
from loop_governor.errors import AgentToolError, ErrorType, GovernedError, error_from_info
from loop_governor.runtime import Runtime


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
        cp = scope.checkpoint
        if cp is not None:
            info = cp.get_failure(call.key)
        if info is None and scope.known_bad:
            stored = self.rt.store.known_bad_get(scope.task_id, call.key)
            if stored is not None:
                info = GovernedError.model_validate_json(stored)
        if info is None:
            return None
        call.stop_reason = "known_bad"
        raise error_from_info(info)

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope = call.scope
        if scope is None or not call.attempt or error.info.error_type is not ErrorType.PERMANENT:
            return error  # a replay or a refusal is not a new failure
        key, governed = call.key, error.info
        self.rt.store.known_bad_put(scope.task_id, key, governed.model_dump_json())
        scope.known_bad += 1
        update_checkpoint(self.rt, scope, lambda cp: cp.record_failure(key, governed))
        return error
