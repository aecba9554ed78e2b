"""Checkpoints in process memory: the default when no store URL is configured.

It keeps the *encoded* bytes, not the objects, so it behaves exactly like the durable
stores (JSON round trip, redaction, checksums, two-writer rule): code tested against it
meets no surprise when switched to a file, SQLite or Redis.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable

from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, decode, encode
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint


class MemoryCheckpointStore:
    """A dict of encoded checkpoints, guarded by a lock; gone when the process exits."""

    def __init__(self, *, serializer: Serializer | None = None, clock: Callable[[], float] = time.time) -> None:
        self.serializer = serializer
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, tuple[int, str, bytes]] = {}

    def __repr__(self) -> str:
        return "MemoryCheckpointStore()"

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        now = self._clock()
        with self._lock:
            stored = self._data.get(cp.task_id, (0, "", b""))[0]
            if not force and stored != cp.version:
                raise CheckpointConflictError(cp.task_id, cp.version, stored)
            new = max(stored, cp.version) + 1
            body, digest = encode(cp, new, now, cp.serializer or self.serializer)
            self._data[cp.task_id] = (new, digest, body)
        cp.version = new
        cp.updated_at = now
        return new

    def load(self, task_id: str) -> TaskCheckpoint | None:
        with self._lock:
            record = self._data.get(check_task_id(task_id))
        if record is None:
            return None
        try:
            return decode(task_id, *record)
        except CorruptData as exc:  # only if someone tampered with _data
            raise CheckpointCorruptedError(task_id, "memory", str(exc), None) from None

    def delete(self, task_id: str) -> bool:
        with self._lock:
            return self._data.pop(check_task_id(task_id), None) is not None

    def list(self) -> builtins.list[str]:
        with self._lock:
            return sorted(self._data)

    def close(self) -> None:
        """Nothing to release."""
