"""In-process state: the default. Fast enough that the success path costs a dict lookup."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence

from loop_governor.breaker import (
    ADMIT,
    ADMIT_DIRTY,
    Admission,
    BreakerPolicy,
    BreakerRecord,
    BreakerState,
    Transition,
    admit,
    force,
    record,
)
from loop_governor.ratelimit import Bucket, take_all
from loop_governor.stores.base import BreakerStatus, Clock

_CLOSED = BreakerState.CLOSED


class MemoryStore:
    """Thread-safe in-memory store. One lock guards every transition (they are tiny)."""

    name = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._breakers: dict[str, BreakerRecord] = {}
        self._budgets: dict[str, int] = defaultdict(int)
        self._known_bad: dict[str, dict[str, str]] = {}
        self._signatures: dict[str, dict[str, int]] = {}
        self._buckets: dict[str, tuple[float, float]] = {}

    def breaker_admit(self, tool: str, clock: Clock, policy: BreakerPolicy) -> tuple[Admission, Transition | None]:
        rec = self._breakers.get(tool)
        # Lock-free fast path: a closed breaker admits everything (no clock read).
        if rec is None or rec.state is _CLOSED:
            return (ADMIT_DIRTY if rec is not None and rec.failures else ADMIT), None
        with self._lock:
            rec = self._breakers.get(tool, BreakerRecord())
            adm, new, transition = admit(rec, clock(), policy)
            if new is not rec:
                self._breakers[tool] = new
            return adm, transition

    def breaker_record(self, tool: str, ok: bool, probe: bool, now: float, policy: BreakerPolicy) -> Transition | None:
        with self._lock:
            rec = self._breakers.get(tool, BreakerRecord())
            new, transition = record(rec, ok, probe, now, policy)
            if new is not rec:
                self._breakers[tool] = new
            return transition

    def breaker_get(self, tool: str) -> BreakerRecord:
        return self._breakers.get(tool, BreakerRecord())

    def breaker_list(self) -> list[BreakerStatus]:
        with self._lock:
            return [
                BreakerStatus(tool, rec.state, rec.failures, rec.opened_at)
                for tool, rec in sorted(self._breakers.items())
            ]

    def breaker_force(self, tool: str, state: BreakerState | str, now: float) -> None:
        with self._lock:
            self._breakers[tool] = force(state, now)

    def rate_acquire(self, tool: str, rate_per_s: float, burst: float, now: float) -> float:
        return self.rate_acquire_all([(tool, rate_per_s, burst, 1.0)], now)

    def rate_acquire_all(self, buckets: Sequence[Bucket], now: float) -> float:
        with self._lock:
            states, wait = take_all([self._buckets.get(b[0]) for b in buckets], buckets, now)
            for bucket, state in zip(buckets, states, strict=True):
                self._buckets[bucket[0]] = state
            return wait

    def budget_take(self, task_id: str, limit: int) -> bool:
        with self._lock:
            if self._budgets[task_id] >= limit:
                return False
            self._budgets[task_id] += 1
            return True

    def budget_used(self, task_id: str) -> int:
        return self._budgets.get(task_id, 0)

    def known_bad_get(self, task_id: str, key: str) -> str | None:
        calls = self._known_bad.get(task_id)
        return None if calls is None else calls.get(key)

    def known_bad_put(self, task_id: str, key: str, info_json: str) -> None:
        with self._lock:
            self._known_bad.setdefault(task_id, {})[key] = info_json

    def known_bad_count(self, task_id: str) -> int:
        return len(self._known_bad.get(task_id, ()))

    def signature_hit(self, task_id: str, signature: str) -> int:
        with self._lock:
            counts = self._signatures.setdefault(task_id, {})
            counts[signature] = counts.get(signature, 0) + 1
            return counts[signature]

    def end_task(self, task_id: str) -> None:
        with self._lock:
            self._budgets.pop(task_id, None)
            self._known_bad.pop(task_id, None)
            self._signatures.pop(task_id, None)

    def close(self) -> None:
        return None
