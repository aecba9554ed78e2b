"""Declared polls: bounded per job, with a warning before the bound and a withdrawal at it.

A status poll (``ToolPolicy(poll=True)``) repeats by design: identical calls with identical
answers until the job is done, so the loop guards leave it alone. It is bounded instead, per
polled *job* -- the poll's arguments named like ids (``job_id``); an attempt counter or a
timestamp beside them is the same job polled again -- by ``max_calls`` (default 60) and
``max_wall_s`` (default 3600 s from the job's first poll): a job of up to an hour, polled
once a minute. Near a bound (80 %) the model reads a warning in the poll's result; at the
bound the poll is refused and the tool withdrawn ([`loop_governor.policies.ladder`][loop_governor.policies.ladder]);
only a poll of it after that ends the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy, Resumed, StopReason
from loop_governor.errors import ErrorType, GovernedError, PermanentError
from loop_governor.fingerprint import args_job
from loop_governor.policies.ladder import annotate, withdraw

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

NEAR = 0.8  # the share of a bound at which the model is warned


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f}s"


class Polls(Policy):
    """Counts a declared poll's calls and time per job; warns, then withdraws at the bound."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    @classmethod
    def applies(cls, rt: Runtime) -> bool:
        return any(t.poll for t in rt.config.tools.values())

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def _job(self, call: Call) -> list[Any]:
        scope = call.scope
        assert scope is not None
        key = f"{call.name}\x00{args_job(call.args, call.kwargs)}"
        entry = scope.polls.get(key)
        if entry is None:
            entry = scope.polls[key] = [0, self.rt.clock(), False]  # calls, first poll, warned
        return entry

    def before(self, call: Call) -> Resumed | None:
        policy = call.policy
        if not policy.poll:
            return None
        entry = self._job(call)
        calls, first = entry[0], entry[1]
        elapsed = self.rt.clock() - first
        # the poll at the bound itself still runs (a job of exactly an hour is seen done)
        over = "max_calls" if calls >= policy.poll_calls else "max_wall_s" if elapsed > policy.poll_wall else None
        if over is None:
            entry[0] = calls + 1
            return None
        call.stop_reason = StopReason.POLL_BOUND
        bound = f"{policy.poll_calls} polls" if over == "max_calls" else f"{_minutes(policy.poll_wall)} of polling"
        why = f"this job reached its bound of {bound}"
        self.rt.events.emit("poll_bound", tool=call.name, bound=over, calls=calls, elapsed_s=round(elapsed, 3))
        note = withdraw(self.rt, call, f"poll_{over}", why)
        raise PermanentError(
            GovernedError(
                error_type=ErrorType.PERMANENT,
                tool=call.name,
                code=f"poll_{over}",
                message=f"the poll of {call.name} reached its bound ({calls} polls in {_minutes(elapsed)}; "
                f"max_calls={policy.poll_calls}, max_wall_s={policy.poll_wall:g})",
                signature=f"{call.name}:PollBound:{over}",
                attempts=0,
                advice=f"report the job's last status; {note}",
            )
        )

    def after_success(self, call: Call, result: Any) -> Any:
        policy = call.policy
        if not policy.poll:
            return result
        entry = self._job(call)
        calls, elapsed = entry[0], self.rt.clock() - entry[1]
        # the next poll at the cadence seen so far: a poll every 20 minutes is warned at 40
        cadence = elapsed / (calls - 1) if calls > 1 else 0.0
        if entry[2] or (calls + 1 < NEAR * policy.poll_calls + 1 and elapsed + cadence < NEAR * policy.poll_wall):
            return result
        entry[2] = True
        self.rt.events.emit("poll_near_bound", tool=call.name, calls=calls, elapsed_s=round(elapsed, 3))
        left_calls, left_s = max(0, policy.poll_calls - calls), max(0.0, policy.poll_wall - elapsed)
        return annotate(
            result,
            f"[loop-governor] this job has been polled {calls} times over {_minutes(elapsed)}; at most "
            f"{left_calls} more polls or {_minutes(left_s)} remain before {call.name} is withdrawn for it. "
            "If it is still not done, report its status instead of polling on.",
        )
