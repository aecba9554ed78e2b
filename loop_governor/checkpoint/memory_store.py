"""Checkpoints in process memory: the default when no store URL is configured.

It keeps the *encoded* bytes (a snapshot plus journal records, like the durable stores),
not the objects, so it behaves exactly like them (JSON round trip, redaction, checksums,
two-writer rule, incremental saves): code tested against it meets no surprise when
switched to a file, SQLite or Redis.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable

from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, checksum
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.journal import PendingSave, compaction, replay
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint

Record = tuple[int, str, bytes]  # version, checksum, bytes


class _Stored:
    """One task: its snapshot and the journal records since."""

    __slots__ = ("journal_bytes", "records", "snapshot")

    def __init__(self, snapshot: Record) -> None:
        self.snapshot = snapshot
        self.records: list[Record] = []
        self.journal_bytes = 0

    @property
    def version(self) -> int:
        return self.records[-1][0] if self.records else self.snapshot[0]

    @property
    def tail(self) -> str:
        return self.records[-1][1] if self.records else self.snapshot[1]


class MemoryCheckpointStore:
    """A dict of encoded checkpoints, guarded by a lock; gone when the process exits."""

    def __init__(
        self,
        *,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
        compact_min_bytes: int | None = None,
        compact_ratio: float | None = None,
    ) -> None:
        self.serializer = serializer
        self._clock = clock
        self._compaction = compaction(compact_min_bytes, compact_ratio)
        self._lock = threading.Lock()
        self._data: dict[str, _Stored] = {}

    def __repr__(self) -> str:
        return "MemoryCheckpointStore()"

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        with PendingSave(cp, self.serializer, self._clock()) as pending, self._lock:
            stored = self._data.get(cp.task_id)
            version = 0 if stored is None else stored.version
            if not force and version != cp.version:
                raise CheckpointConflictError(cp.task_id, cp.version, version)
            if (
                not force
                and stored is not None
                and pending.appendable(version, stored.tail)
                and not pending.compaction_due(self._compaction, stored.journal_bytes, len(stored.snapshot[2]))
            ):
                record = pending.record
                assert record is not None
                new = version + 1
                digest = checksum(new, record)
                stored.records.append((new, digest, record))
                stored.journal_bytes += len(record)
                pending.appended(new, digest, stored.journal_bytes)
                return new
            new = max(version, cp.version) + 1
            body = b"".join(pending.snapshot_parts())
            digest = checksum(new, body)
            self._data[cp.task_id] = _Stored((new, digest, body))
            pending.snapshotted(new, digest, len(body))
            return new

    def load(self, task_id: str) -> TaskCheckpoint | None:
        with self._lock:
            stored = self._data.get(check_task_id(task_id))
            if stored is None:
                return None
            snapshot, records = stored.snapshot, list(stored.records)
        try:
            return replay(task_id, snapshot, records)
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
