"""Memory budgets for the trace: caches bounded by the bytes they hold, not their entries.

An entry count bounds nothing when entries vary from 50 bytes to 100 KB: 8192 memoized
prompt messages of 100 KB each are 800 MB. Every cache the Lens keeps for the life of the
process is therefore a [`BoundedMemo`][loop_governor.trace.budget.BoundedMemo] with a byte budget, and per-task state is
dropped at ``task_end``.

Hand-written rather than ``cachetools.LRUCache(getsizeof=...)``: that would be a new core
dependency, and its pure-Python ``__getitem__`` chain costs a few microseconds a lookup on
the writer's per-record path; an ``OrderedDict`` with a running byte total is ~20 lines.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

MiB = 1 << 20


@dataclass(frozen=True)
class TraceBudget:
    """Byte budgets of the Lens's long-lived caches (defaults: ~14 MB in all).

    * ``snapshot_memo``: prompt messages already redacted and hashed (a conversation
      re-sends its prefix every turn; a hit skips redaction);
    * ``stored_hashes``: hashes of messages the snapshot store holds (the store's dedup);
      once evicted, a message that comes back is written again: readers keep one copy;
    * ``record_memo``: redacted short strings of event records (tool names, task ids);
    * ``anomalies``: the most recent anomaly events kept for
      [`Lens.anomalies`][loop_governor.trace.lens.Lens.anomalies].
    """

    snapshot_memo: int = 8 * MiB
    stored_hashes: int = 4 * MiB
    record_memo: int = 1 * MiB
    anomalies: int = 1 * MiB

    def __post_init__(self) -> None:
        for name in ("snapshot_memo", "stored_hashes", "record_memo", "anomalies"):
            if getattr(self, name) < 0:
                raise ValueError(f"TraceBudget.{name} must be >= 0 bytes")


class BoundedMemo(Generic[K, V]):
    """A least-recently-used map whose entries' sizes (as the caller estimates them) stay
    within ``budget`` bytes. An entry larger than the whole budget is not kept."""

    __slots__ = ("_budget", "_bytes", "_data")

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._bytes = 0
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()

    @property
    def bytes(self) -> int:
        """The estimated bytes held now (always <= the budget)."""
        return self._bytes

    @property
    def budget(self) -> int:
        return self._budget

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K) -> V | None:
        hit = self._data.get(key)
        if hit is None:
            return None
        self._data.move_to_end(key)
        return hit[0]

    def touch(self, key: K) -> bool:
        """Whether ``key`` is held (marking it recently used)."""
        if key in self._data:
            self._data.move_to_end(key)
            return True
        return False

    def put(self, key: K, value: V, nbytes: int) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if nbytes > self._budget:
            return
        self._data[key] = (value, nbytes)
        self._bytes += nbytes
        while self._bytes > self._budget:
            _, (_, size) = self._data.popitem(last=False)
            self._bytes -= size

    def clear(self) -> None:
        self._data.clear()
        self._bytes = 0
