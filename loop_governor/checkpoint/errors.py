"""Checkpoint failures, each its own type so callers can react to the one that happened.

A checkpoint that cannot be read must never be mistaken for "no checkpoint" (the task
would silently start over and repeat side effects), and a second writer must never
silently overwrite the first: both are explicit exceptions here.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base of every checkpoint failure."""


class CheckpointCorruptedError(CheckpointError):
    """Stored checkpoint data does not parse, fails its checksum or its schema.

    The original data is left where it was; ``quarantine`` names the copy written aside
    for inspection (a path, a table row or a Redis key), or ``None`` if even the copy
    could not be written.
    """

    def __init__(self, task_id: str, location: str, reason: str, quarantine: str | None) -> None:
        self.task_id = task_id
        self.location = location
        self.reason = reason
        self.quarantine = quarantine
        where = f"; copy quarantined at {quarantine}" if quarantine else "; quarantine copy failed"
        super().__init__(
            f"checkpoint for task {task_id!r} at {location} is corrupted: {reason}"
            f"{where}; the original was left untouched"
        )


class CheckpointConflictError(CheckpointError):
    """Another writer saved this task since this checkpoint was loaded (optimistic lock).

    Reload with ``store.load(task_id)``, re-apply the change, and save again; or pass
    ``force=True`` to ``save`` to overwrite deliberately.
    """

    def __init__(self, task_id: str, expected: int, found: int) -> None:
        self.task_id = task_id
        self.expected = expected
        self.found = found
        super().__init__(
            f"checkpoint for task {task_id!r} was written by another writer: "
            f"expected stored version {expected}, found {found}"
        )


class CheckpointSchemaError(CheckpointError):
    """The checkpoint was written with a newer schema than this version understands.

    Not corruption: a newer loop-governor wrote it. Nothing is quarantined.
    """


class CheckpointSerializationError(CheckpointError, TypeError):
    """A value is not JSON and no ``serializer`` was given to turn it into JSON.

    Checkpoints are JSON only (never pickle): a resumed task must get back exactly what
    was stored, and JSON is the one format that is safe to load from disk.
    """
