"""Checkpoint glue of the governed call: resume finished calls, record new ones, save on a stop.

The checkpoint itself (model, stores, atomic writes) is [`loop_governor.checkpoint`][loop_governor.checkpoint];
this module is what a governed call does with it: a call the task already finished
returns its stored result without running; a success is recorded and saved; a run that
stops (fatal error, budget, no progress) saves what it did before the error leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy, Resumed
from loop_governor.errors import AgentToolError, FatalError
from loop_governor.redaction import redact

if TYPE_CHECKING:
    from loop_governor.checkpoint import TaskCheckpoint
    from loop_governor.runtime import Runtime
    from loop_governor.task import TaskScope

_SAVE_ATTEMPTS = 3


def update_checkpoint(rt: Runtime, scope: TaskScope, record: Callable[[TaskCheckpoint], object] | None = None) -> None:
    """Apply ``record`` to the task's checkpoint, then save it (no-op without one).

    Parallel tool calls of one task record into one checkpoint, so recording and
    saving run under the task's lock: no record lands in a checkpoint object that a
    concurrent save has just replaced by the merged one. The resulting event is
    emitted after the lock is released: a subscriber may wait on another thread (an
    event loop) that is itself about to record into this task.

    Errors raised by ``record`` propagate (nothing is saved). Saving never raises
    into the agent: the call it records already happened, and failing it because
    the checkpoint store is down (Redis gone, disk full) would lose the result too.
    Failures become ``checkpoint_failed`` events.
    """
    with scope.checkpoint_lock:
        cp = scope.checkpoint
        if cp is None:
            return
        if record is not None:
            record(cp)
        event = _save_locked(rt, scope, cp)
    if event is not None:
        rt.events.emit(event[0], **event[1])


def _save_locked(rt: Runtime, scope: TaskScope, cp: TaskCheckpoint) -> tuple[str, dict[str, Any]] | None:
    """The save of [`update_checkpoint`][loop_governor.policies.checkpointing.update_checkpoint] (lock held); returns
    the event to emit."""
    store = rt.checkpoints
    if store is None:
        return None
    from loop_governor.checkpoint import CheckpointConflictError

    cp.step = max(cp.step, scope.steps)
    try:
        for attempt in range(_SAVE_ATTEMPTS):
            try:
                version = store.save(cp)
                break
            except CheckpointConflictError:
                if attempt == _SAVE_ATTEMPTS - 1:
                    raise
                latest = store.load(scope.task_id)
                if latest is None:  # deleted meanwhile: ours is all there is
                    version = store.save(cp, force=True)
                    break
                # Another writer of the same task: keep both sides' work. Only what
                # the store holds counts as saved: if this save conflicts again, our
                # results are merged into the next copy too.
                stored_results = len(latest.results)
                latest.completed.update(cp.completed)
                latest.known_bad.update(cp.known_bad)
                latest.results.extend(cp.results[scope.results_saved :])  # ours since the last save
                latest.metadata.update(cp.metadata)
                latest.step = max(latest.step, cp.step)
                scope.checkpoint = cp = latest
                scope.results = latest.results
                scope.results_saved = stored_results
    except Exception as exc:
        rt.checkpoint_failures += 1
        return "checkpoint_failed", {"error": redact(f"{type(exc).__name__}: {exc}")[:500], "step": scope.steps}
    scope.results_saved = len(scope.results)
    return "checkpoint_saved", {"version": version, "step": scope.steps}


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


def stop_fields(error: BaseException) -> dict[str, Any]:
    """The fields that say why a run ended (``run_stopped``, ``task_end``), redacted."""
    if isinstance(error, FatalError):
        info = error.info
        return {
            "tool": info.tool,
            "error_class": type(error).__name__,
            "code": info.code,
            "status": info.status,
            "reason": error.reason,  # built from the redacted message
        }
    return {
        "error_class": type(error).__name__,
        "code": None,
        "reason": redact(f"{type(error).__name__}: {error}")[:500],
    }


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
