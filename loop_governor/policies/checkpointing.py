"""Checkpoint glue of the governed call: resume finished calls, record new ones, save on a stop.

The checkpoint itself (model, stores, atomic writes) is [`loop_governor.checkpoint`][loop_governor.checkpoint];
this module is what a governed call does with it: a call the task already finished
returns its stored result without running; a success is recorded and saved; a run that
stops (fatal error, budget, no progress) saves what it did before the error leaves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy, Resumed
from loop_governor.errors import AgentToolError, FatalError
from loop_governor.redaction import redact
from loop_governor.task import stop_fields, update_checkpoint

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime
    from loop_governor.task import TaskScope

def record_success(rt: Runtime, scope: TaskScope, key: str, result: Any) -> None:
    from loop_governor.checkpoint import CheckpointSerializationError

    try:
        update_checkpoint(rt, scope, lambda cp: cp.record_success(key, result))
    except CheckpointSerializationError as exc:
        # The call succeeded; failing the agent because its result isn't JSON would
        # be worse than not skipping it on resume. Say so in the trace instead.
        rt.events.emit("checkpoint_skipped", call_key=key, reason=redact(f"{type(exc).__name__}: {exc}")[:500])


def stop_run(rt: Runtime, scope: TaskScope | None, error: AgentToolError) -> AgentToolError:
    """A fatal outcome stops the run: save what it did, hand back its partial results,
    remember the stop on the scope (its ``task_end`` says how the task ended) and report
    it once (a ``run_stopped`` event: a WARNING of the ``loop_governor`` logger)."""
    if not isinstance(error, FatalError) or getattr(error, "_lg_stop_reported", False):
        return error
    error._lg_stop_reported = True  # type: ignore[attr-defined]  # once, whichever guard stops first
    if scope is not None:
        update_checkpoint(rt, scope)
        error.partial_results = scope.partial_results()
        if scope.stop is None:
            scope.stop = error
    rt.events.emit("run_stopped", **stop_fields(error))
    return error


class RunStop(Policy):
    """A fatal outcome ends the run: its checkpoint is saved, its partial results attached.

    Also keeps the task's latest successful tool results (references only, bounded: they
    are redacted and cut when a stop hands them back as ``partial_results``)."""

    in_task_only = False  # a stop outside a task is still reported
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        if scope is not None and call.kind == TOOL:
            scope.tool_results.append((call.name, result))
        return result

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        return stop_run(self.rt, call.scope, error)


class Checkpointing(Policy):
    """Resume finished tool calls; record successes (in the chain only with a checkpoint store)."""

    kinds = frozenset({TOOL})

    __slots__ = ("rt",)

    @classmethod
    def applies(cls, rt: Runtime) -> bool:
        return rt.checkpoints is not None

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before(self, call: Call) -> Resumed | None:
        scope = call.scope
        if scope is None or scope.checkpoint is None or not scope.resumable or call.policy.poll:
            return None
        key = call.key
        if key not in scope.resumable or scope.world:
            # made in this run, or asked again after something changed state since the
            # resume: the call runs for real (a poll always does)
            return None
        found, value = scope.checkpoint.get_result(key)
        if not found:
            return None
        scope.resumable.discard(key)  # answered once: asked again, it runs
        rt = self.rt
        if rt.events.emitting:
            rt.events.emit(
                "tool_call", tool=call.name, status="ok", attempts=0, duration_s=0.0, call_key=call.key, resumed=True
            )
        return Resumed(value)

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        if scope is not None and scope.checkpoint is not None:
            record_success(self.rt, scope, call.key, result)
        return result
