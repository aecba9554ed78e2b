"""In-process state: the default. Fast enough that the success path costs a dict lookup.

Bounded: per-tool / per-endpoint state (breakers, rate buckets) and per-task state each
keep at most ``max_entries`` keys, least recently written evicted first, so a process
that sees an open-ended stream of endpoints or tasks (a base URL per tenant, tasks that
never end) does not grow without bound. Evicting a key forgets a closed breaker's
failure count, a bucket (it comes back full) or an abandoned task's budget: the same as
a key that expired in Redis.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TypeVar

from loop_governor.state.breaker import (
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
from loop_governor.state.bucket import Bucket, State, take_all
from loop_governor.stores.base import BreakerStatus, Clock, rebase

_CLOSED = BreakerState.CLOSED
_K = TypeVar("_K")
_V = TypeVar("_V")

#: Default bound on the keys of each kind a MemoryStore keeps (about 0.6 KB each).
MAX_ENTRIES = 10_000


class _Lru(OrderedDict[_K, _V]):
    """An OrderedDict that drops its least recently written keys beyond ``limit``
    (callers hold the store's lock; reads stay plain, lock-free dict lookups)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: _K, value: _V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)

    def touch(self, key: _K) -> None:
        if key in self:
            self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


class MemoryStore:
    """Thread-safe in-memory store. One lock guards every transition (they are tiny).

    ``max_entries`` bounds each kind of state (breakers, rate buckets, tasks) as an LRU:
    see the module docstring.
    """

    name = "memory"

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._breakers: _Lru[str, BreakerRecord] = _Lru(max_entries)
        self._budgets: _Lru[str, int] = _Lru(max_entries)
        self._known_bad: _Lru[str, dict[str, str]] = _Lru(max_entries)
        self._signatures: _Lru[str, dict[str, int]] = _Lru(max_entries)
        self._buckets: _Lru[str, State] = _Lru(max_entries)

    def breaker_admit(self, tool: str, clock: Clock, policy: BreakerPolicy) -> tuple[Admission, Transition | None]:
        rec = self._breakers.get(tool)
        # Lock-free fast path: a closed breaker admits everything (no clock read).
        if rec is None or rec.state is _CLOSED:
            return (ADMIT_DIRTY if rec is not None and rec.failures else ADMIT), None
        with self._lock:
            rec = self._breakers.get(tool, BreakerRecord())
            adm, new, transition = admit(rec, clock(), policy)
            if new is not rec:
                self._breakers.put(tool, new)
            return adm, transition

    def breaker_record(
        self, tool: str, ok: bool, probe: bool, now: float, policy: BreakerPolicy, *, backdate_s: float = 0.0
    ) -> Transition | None:
        if ok and not probe:
            rec = self._breakers.get(tool)
            if rec is None or (rec.state is _CLOSED and not rec.failures):
                return None  # nothing to reset: a success on a healthy tool writes nothing
        with self._lock:
            rec = self._breakers.get(tool, BreakerRecord())
            new, transition = record(rec, ok, probe, now - backdate_s, policy)
            if new is not rec:
                self._breakers.put(tool, new)
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
            self._breakers.put(tool, force(state, now))

    def rate_acquire(self, tool: str, rate_per_s: float, burst: float, now: float) -> float:
        return self.rate_acquire_all([(tool, rate_per_s, burst, 1.0)], now)

    def rate_acquire_all(self, buckets: Sequence[Bucket], now: float) -> float:
        with self._lock:
            states, wait = take_all([rebase(self._buckets.get(b[0]), now) for b in buckets], buckets, now)
            for bucket, state in zip(buckets, states, strict=True):
                self._buckets.put(bucket[0], state)
            return wait

    def budget_take(self, task_id: str, limit: int) -> bool:
        with self._lock:
            used = self._budgets.get(task_id, 0)
            if used >= limit:
                return False
            self._budgets.put(task_id, used + 1)
            return True

    def budget_used(self, task_id: str) -> int:
        return self._budgets.get(task_id, 0)

    def known_bad_get(self, task_id: str, key: str) -> str | None:
        calls = self._known_bad.get(task_id)
        return None if calls is None else calls.get(key)

    def known_bad_put(self, task_id: str, key: str, info_json: str) -> None:
        with self._lock:
            calls = self._known_bad.get(task_id)
            if calls is None:
                calls = {}
                self._known_bad.put(task_id, calls)
            else:
                self._known_bad.touch(task_id)
            calls[key] = info_json

    def known_bad_count(self, task_id: str) -> int:
        return len(self._known_bad.get(task_id, ()))

    def signature_hit(self, task_id: str, signature: str) -> int:
        with self._lock:
            counts = self._signatures.get(task_id)
            if counts is None:
                counts = {}
                self._signatures.put(task_id, counts)
            else:
                self._signatures.touch(task_id)
            counts[signature] = counts.get(signature, 0) + 1
            return counts[signature]

    def end_task(self, task_id: str) -> None:
        with self._lock:
            self._budgets.pop(task_id, None)
            self._known_bad.pop(task_id, None)
            self._signatures.pop(task_id, None)

    def close(self) -> None:
        return None
