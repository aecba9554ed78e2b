"""The state-store protocol: everything the governor shares beyond one call.

Breaker state is per tool and shared across tasks (and, with Redis, across processes);
budgets, known-bad calls and repeated-error counts are per task. Every method is one
atomic operation, so the governor never needs a lock of its own around store state and
any backend that honours this protocol behaves the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from loop_governor.state.breaker import Admission, BreakerPolicy, BreakerRecord, BreakerState, Transition
from loop_governor.state.bucket import Bucket, State

Clock = Callable[[], float]


class StoreConfigError(ValueError):
    """``store_url`` (or ``client=``) names a server the store cannot share state through:
    a Redis Cluster node given as a plain ``redis://`` URL (``MOVED``), a read-only
    replica (``READONLY``), a Sentinel port, a server refusing the credentials, or a
    ``client=`` that does not decode responses. Raised at construction instead of running
    every process on its own local state unnoticed."""


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    """One tool's breaker, as listed by ``loop-governor breakers``."""

    tool: str
    state: BreakerState
    failures: int
    opened_at: float


def rebase(state: State | None, now: float) -> State | None:
    """A bucket stamped in the future (the clock stepped back) restarts its refill at
    ``now``, keeping its tokens: elapsed time is never negative, and the bucket is not
    frozen until the clock catches up with the old stamp."""
    if state is None or state[1] <= now:
        return state
    return state[0], now


@runtime_checkable
class Store(Protocol):
    """Atomic state operations. ``now`` comes from the governor's (injectable) clock."""

    name: str

    # -- breakers (per tool) --
    def breaker_admit(self, tool: str, clock: Clock, policy: BreakerPolicy) -> tuple[Admission, Transition | None]:
        """May a call to ``tool`` go ahead? Reads ``clock`` only when the breaker is not closed
        (the success path of a healthy tool costs no clock read and, on Redis, one round trip)."""
        ...

    def breaker_record(
        self, tool: str, ok: bool, probe: bool, now: float, policy: BreakerPolicy, *, backdate_s: float = 0.0
    ) -> Transition | None:
        """Record one attempt's outcome as of ``now - backdate_s``; returns the state change
        it caused, if any. A success is recorded whenever it completes (it resets failures
        that completed while it ran); a store skips the write when there is nothing to reset.
        ``backdate_s`` dates a handed-back probe one cooldown ago (stores on a server clock
        apply it to the server's time)."""
        ...

    def breaker_get(self, tool: str) -> BreakerRecord: ...

    def breaker_list(self) -> list[BreakerStatus]: ...

    def breaker_force(self, tool: str, state: BreakerState | str, now: float) -> None: ...

    def rate_acquire(self, tool: str, rate_per_s: float, burst: float, now: float) -> float:
        """Take one token from the tool's bucket: 0.0 if admitted, else seconds to wait
        (nothing taken). See [`loop_governor.state.bucket.take_token`][loop_governor.state.bucket.take_token]."""
        ...

    def rate_acquire_all(self, buckets: Sequence[Bucket], now: float) -> float:
        """Take each ``(key, rate_per_s, burst, cost)`` bucket's cost, all or nothing, in
        one atomic step: 0.0 if admitted, else seconds to wait (nothing taken). See
        [`loop_governor.state.bucket.take_all`][loop_governor.state.bucket.take_all]."""
        ...

    # -- per-task state --
    def budget_take(self, task_id: str, limit: int) -> bool:
        """Take one retry from the task's budget; False (and nothing taken) when spent."""
        ...

    def budget_used(self, task_id: str) -> int: ...

    def known_bad_get(self, task_id: str, key: str) -> str | None:
        """The stored model-facing error JSON for a known-bad call, or None."""
        ...

    def known_bad_put(self, task_id: str, key: str, info_json: str) -> None: ...

    def known_bad_count(self, task_id: str) -> int: ...

    def signature_hit(self, task_id: str, signature: str) -> int:
        """Count one more failure with this signature in the task; returns the new count."""
        ...

    def end_task(self, task_id: str) -> None:
        """Forget the task's state (its scope closed)."""
        ...

    def close(self) -> None: ...
