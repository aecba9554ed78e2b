"""The repeated-error guard: same name, same error signature, N times in one task.

A model that reads "404 not found" tends to ask again with a trivially different
argument; the signature (tool + exception type + normalized message) is the same every
time. After ``repeated_error_threshold`` such failures the outcome becomes a
:class:`~loop_governor.errors.LoopDetectedError` telling the model to stop.
"""

from __future__ import annotations

from loop_governor.call import Call, Policy
from loop_governor.errors import AgentToolError, ErrorType, LoopDetectedError
from loop_governor.runtime import Runtime


class RepeatedErrors(Policy):
    """Counts each failure's signature per task and escalates past the threshold."""

    __slots__ = ("rt", "threshold")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.threshold = rt.config.repeated_error_threshold

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope, info = call.scope, error.info
        if scope is None or info.error_type is ErrorType.FATAL or not call.attempt:
            return error  # a stop is already the strongest outcome; a replay or a refusal is no new failure
        decision = scope.decision
        if decision is not None:
            # parallel calls of one model turn are one decision: counted once
            if scope.error_turns.get(info.signature) == decision:
                return error
            scope.error_turns[info.signature] = decision
        # counted in this world: after a success that may have changed state (an edit, a
        # login) a failure alike is the next try, not the same mistake again
        count = self.rt.store.signature_hit(scope.task_id, f"{info.signature}@{scope.world}")
        if count < self.threshold:
            return error
        self.rt.events.emit("loop_detected", tool=info.tool, signature=info.signature, count=count)
        return LoopDetectedError(
            info.model_copy(
                update={
                    "error_type": ErrorType.PERMANENT,
                    "retryable": False,
                    "count": count,
                    "advice": f"{info.tool} failed the same way {count} times with nothing fixed in between; "
                    "do not repeat it unchanged: fix the cause, change the arguments, or continue without it",
                }
            )
        )
