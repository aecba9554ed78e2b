"""The three-state circuit breaker, as pure transition functions.

The state lives in a store (memory, SQLite, Redis); the rules live here, once, so every
backend makes the same decisions: the memory store applies them under a lock, SQLite in
an immediate transaction, Redis in a Lua script that mirrors them.

closed --(threshold consecutive failures, in completion order)--> open --(cooldown elapsed, first caller)-->
half_open (exactly one probe in flight) --success--> closed / --failure--> open.
A probe that never reports back (its process died) expires after one cooldown, so a
breaker can't stay half-open forever.

"Consecutive" is counted in the order calls *complete*: every success resets the count,
whenever it was admitted (a call admitted while the count was zero that succeeds after
another call's failure resets it too), so overlapping calls count as they would one after
another. A clock that steps back (a wall clock, or a Redis failover to a host whose clock
lags) never freezes a breaker: a timestamp found in the future is moved to ``now``, so
the breaker waits at most one cooldown from the step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_threshold: int = 5
    cooldown_s: float = 60.0


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """Persistent breaker state for one tool."""

    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: float = 0.0
    probe_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether a call may go ahead. ``dirty`` means a success must reset a failure count."""

    allowed: bool
    probe: bool = False
    dirty: bool = False
    state: BreakerState = BreakerState.CLOSED
    retry_in: float = 0.0
    failures: int = 0


ADMIT = Admission(True)
ADMIT_DIRTY = Admission(True, dirty=True)

Transition = tuple[BreakerState, BreakerState]


def admit(rec: BreakerRecord, now: float, policy: BreakerPolicy) -> tuple[Admission, BreakerRecord, Transition | None]:
    """Decide admission; returns the admission, the new record and any state change."""
    if rec.state is BreakerState.CLOSED:
        return (ADMIT_DIRTY if rec.failures else ADMIT), rec, None
    if rec.state is BreakerState.OPEN and now < rec.opened_at:
        rec = replace(rec, opened_at=now)  # the clock stepped back: elapsed time is never negative
    elif rec.state is BreakerState.HALF_OPEN and now < rec.probe_at:
        rec = replace(rec, probe_at=now)
    if rec.state is BreakerState.OPEN:
        ready_at = rec.opened_at + policy.cooldown_s
        if now >= ready_at:
            new = replace(rec, state=BreakerState.HALF_OPEN, probe_at=now)
            return (
                Admission(True, probe=True, dirty=True, state=BreakerState.HALF_OPEN),
                new,
                (
                    BreakerState.OPEN,
                    BreakerState.HALF_OPEN,
                ),
            )
        return Admission(False, state=rec.state, retry_in=ready_at - now, failures=rec.failures), rec, None
    # half-open: one probe is in flight; a stale probe (its caller vanished) is replaced.
    stale_at = rec.probe_at + policy.cooldown_s
    if now >= stale_at:
        new = replace(rec, probe_at=now)
        return Admission(True, probe=True, dirty=True, state=BreakerState.HALF_OPEN), new, None
    return Admission(False, state=rec.state, retry_in=stale_at - now, failures=rec.failures), rec, None


def record(
    rec: BreakerRecord, ok: bool, probe: bool, now: float, policy: BreakerPolicy
) -> tuple[BreakerRecord, Transition | None]:
    """Apply one call outcome (``ok`` = the service answered) to the record."""
    if ok:
        if rec.state is BreakerState.CLOSED:
            return (BreakerRecord() if rec.failures else rec), None
        if rec.state is BreakerState.HALF_OPEN and probe:
            return BreakerRecord(), (BreakerState.HALF_OPEN, BreakerState.CLOSED)
        # A late success from before the breaker opened proves little: leave it open.
        return rec, None
    failures = rec.failures + 1
    if rec.state is BreakerState.HALF_OPEN:
        if probe:
            return BreakerRecord(BreakerState.OPEN, failures, now, 0.0), (BreakerState.HALF_OPEN, BreakerState.OPEN)
        return replace(rec, failures=failures), None
    if rec.state is BreakerState.OPEN:
        return replace(rec, failures=failures), None
    if failures >= policy.failure_threshold:
        return BreakerRecord(BreakerState.OPEN, failures, now, 0.0), (BreakerState.CLOSED, BreakerState.OPEN)
    return replace(rec, failures=failures), None


def force(state: BreakerState | str, now: float) -> BreakerRecord:
    """The record an operator sets by hand (``loop-governor breakers open|close``)."""
    state = BreakerState(state)
    if state is BreakerState.CLOSED:
        return BreakerRecord()
    if state is BreakerState.OPEN:
        return BreakerRecord(BreakerState.OPEN, 0, now, 0.0)
    return BreakerRecord(BreakerState.HALF_OPEN, 0, now, 0.0)
