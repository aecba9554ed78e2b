"""The interface every checkpoint store implements, and the rules they all follow.

Rules (tested for every store):

* ``save(cp)`` is atomic: a reader sees the old checkpoint or the new one, never a mix,
  even if the writer is killed mid-save.
* ``save(cp)`` writes what changed since ``cp`` was last loaded or saved (one journal
  record, see [`loop_governor.checkpoint.journal`][loop_governor.checkpoint.journal]), so its cost does not grow with
  the task; now and then it writes a full snapshot instead (compaction, first save,
  ``force``, or a checkpoint the store did not produce). A failed save leaves the
  changes in ``cp`` for the next one.
* ``save(cp)`` is conditional: it succeeds only if the stored version is still
  ``cp.version`` (0 = "nothing stored yet"), then stores ``cp.version + 1`` and updates
  ``cp.version`` and ``cp.updated_at`` in place. Otherwise ``CheckpointConflictError``.
  ``force=True`` overwrites whatever is stored.
* ``load`` returns ``None`` only when nothing is stored. Data that does not verify raises
  ``CheckpointCorruptedError`` after writing a quarantine copy; the original stays put,
  and ``save`` refuses to overwrite it unless ``force=True``. (A save appends without
  re-reading the whole journal: damage inside it is reported by the next ``load``.)
"""

from __future__ import annotations

import builtins
from typing import Protocol, runtime_checkable

from loop_governor.checkpoint.model import TaskCheckpoint


@runtime_checkable
class CheckpointStore(Protocol):
    """Where task checkpoints live (file, SQLite, Redis, memory)."""

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        """Store ``cp`` atomically if nobody else wrote it since; returns the new version."""
        ...

    def load(self, task_id: str) -> TaskCheckpoint | None:
        """The stored checkpoint, or ``None`` if there is none."""
        ...

    def delete(self, task_id: str) -> bool:
        """Remove the checkpoint; ``True`` if there was one."""
        ...

    def list(self) -> builtins.list[str]:
        """Task ids with a stored checkpoint, sorted."""
        ...

    def close(self) -> None:
        """Release connections and handles."""
        ...


def check_task_id(task_id: str) -> str:
    """Reject ids no store can key on (empty, not encodable); returns the id."""
    if not isinstance(task_id, str) or not task_id:
        raise ValueError("task_id must be a non-empty string")
    try:
        task_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("task_id must be valid Unicode (no lone surrogates)") from None
    return task_id
