"""Task checkpoints and resume: completed calls, known-bad calls, sub-task results.

>>> from loop_governor.checkpoint import TaskCheckpoint, FileCheckpointStore
>>> store = FileCheckpointStore(tmp_dir)                        # doctest: +SKIP
>>> cp = store.load("task-1") or TaskCheckpoint(task_id="task-1")  # doctest: +SKIP
>>> cp.record_success(call_key, result); store.save(cp)        # doctest: +SKIP

See [`loop_governor.checkpoint.base`][loop_governor.checkpoint.base] for the rules every store follows, and
[`loop_governor.checkpoint.journal`][loop_governor.checkpoint.journal] for how a save writes only what changed.
"""

from loop_governor.checkpoint.base import CheckpointStore
from loop_governor.checkpoint.errors import (
    CheckpointConflictError,
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointSchemaError,
    CheckpointSerializationError,
)
from loop_governor.checkpoint.file_store import FileCheckpointStore
from loop_governor.checkpoint.journal import Compaction
from loop_governor.checkpoint.memory_store import MemoryCheckpointStore
from loop_governor.checkpoint.model import SCHEMA_VERSION, Serializer, TaskCheckpoint, configure_key_memo, storage_key
from loop_governor.checkpoint.redis_store import RedisCheckpointStore
from loop_governor.checkpoint.sqlite_store import SQLiteCheckpointStore
from loop_governor.checkpoint.url import checkpoint_store_from_url

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointConflictError",
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointSchemaError",
    "CheckpointSerializationError",
    "CheckpointStore",
    "Compaction",
    "FileCheckpointStore",
    "MemoryCheckpointStore",
    "RedisCheckpointStore",
    "SQLiteCheckpointStore",
    "Serializer",
    "TaskCheckpoint",
    "checkpoint_store_from_url",
    "configure_key_memo",
    "storage_key",
]
