"""The repeated-error guard: the same tool failing the same way about the same thing, N times in one task.

A model that reads "404 not found" or "payment amount does not add up" tends to try again:
the identical call after a varied ``think``, or the same booking with another amount. So
failures count for the whole task, whatever succeeds in between: a success elsewhere may
be the fix of a precondition, and then the retried call runs for real (known-bad memory
follows the world, [`loop_governor.policies.known_bad`][loop_governor.policies.known_bad]) -- but if it fails the same
way again, that failure counts. At ``repeated_error_threshold`` (default 3) the outcome becomes a
[`LoopDetectedError`][loop_governor.errors.LoopDetectedError] telling the model to stop, and the
ladder takes it from there ([`loop_governor.policies.escalation`][loop_governor.policies.escalation]: withdraw, then
stop).

"The same way about the same thing" is

* the same tool;
* the same *entity* ([Call.subject][loop_governor.call.Call.subject]): revised
  content -- another amount, a rewritten draft -- is the same question again, while
  another order id, date or file is another question: ten deleted orders are ten 404s,
  not one repeated ten times. An outage (a transient failure) is about the tool, whatever
  is asked;
* the same error ([ErrorInfo.identity][loop_governor.classify.ErrorInfo.identity]):
  numbers, ids and timestamps aside, names and quoted values kept -- a coding agent
  re-running a script after each ``pip install`` gets another missing module each time:
  the error changes, and it is iterating, not looping.

Two things are no repeat, measured on recorded runs: parallel calls of one model turn (one
decision, counted once), and a failure that comes back after something that may have fixed it
([`loop_governor.policies.fixes`][loop_governor.policies.fixes]): an edit, a toggle, a call that *did* something -- a
coding agent re-running its tests after each edit is iterating. A ``think``, a note or a new search in
between only said something: the failure counts. Such a failure is not counted, and the count
it would have added to stays where it was.
"""

from __future__ import annotations

from typing import Any

import xxhash

from loop_governor.call import Call, Policy
from loop_governor.errors import AgentToolError, ErrorType, LoopDetectedError
from loop_governor.policies.fixes import fixed_since
from loop_governor.runtime import Runtime


def failure_key(call: Call, error: AgentToolError) -> str:
    """What a failure of ``call`` is counted under: tool, entity and error (for an outage, the
    tool and the error alone), in the current *episode*: a success of the same question (for
    an outage, of the tool) ends it, and a later failure alike starts a new count."""
    info = call.info
    identity = info.identity if info is not None and info.identity else error.info.signature
    about = _about(call, error.info.error_type is ErrorType.TRANSIENT)
    scope = call.scope
    episode = 0
    if scope is not None:
        scope.failed_tools.add(call.name)
        episode = scope.episodes.setdefault(about, 0)
    digest = xxhash.xxh3_64_hexdigest(f"{about}\x00{episode}\x00{identity}".encode("utf-8", "surrogatepass"))
    return f"{call.name}:{digest}"


def _about(call: Call, outage: bool) -> str:
    return call.name if outage else f"{call.name}\x00{call.entity}"


def end_episodes(call: Call) -> None:
    """``call`` succeeded: the failures of its question, and an outage of its tool, are over."""
    scope = call.scope
    if scope is None or call.name not in scope.failed_tools:
        return
    episodes = scope.episodes
    for about in (call.name, _about(call, False)):
        if about in episodes:
            episodes[about] += 1


def counts_again(call: Call, key: str) -> bool:
    """Whether this failure of ``call`` (under ``key``) counts as a repeat: not a parallel
    call of the turn that already counted it, not a try after something that may have fixed
    it. Moves the key's last occurrence on."""
    scope = call.scope
    assert scope is not None
    step, decision = scope.tool_calls, scope.decision
    last = scope.error_turns.get(key)
    scope.error_turns[key] = (step, decision)
    if last is None:
        return True
    if decision is not None and last[1] == decision:
        return False  # parallel calls of one model turn are one decision: counted once
    return not fixed_since(call, last[0])


class RepeatedErrors(Policy):
    """Counts each failure per task (tool, entity, error) and escalates past the threshold."""

    __slots__ = ("rt", "threshold")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.threshold = rt.config.repeated_error_threshold

    def after_success(self, call: Call, result: Any) -> Any:
        end_episodes(call)
        return result

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        scope, info = call.scope, error.info
        if scope is None or info.error_type is ErrorType.FATAL or not call.attempt:
            return error  # a stop is already the strongest outcome; a replay or a refusal is no new failure
        key = failure_key(call, error)
        if not counts_again(call, key):
            return error
        count = self.rt.store.signature_hit(scope.task_id, key)
        if count < self.threshold:
            return error
        self.rt.events.emit("loop_detected", tool=info.tool, signature=info.signature, count=count)
        return LoopDetectedError(
            info.model_copy(
                update={
                    "error_type": ErrorType.PERMANENT,
                    "retryable": False,
                    "count": count,
                    "advice": f"{info.tool} failed the same way {count} times in this task; do not repeat it "
                    "unchanged or with small changes: fix the cause the message names, or continue without it",
                }
            )
        )
