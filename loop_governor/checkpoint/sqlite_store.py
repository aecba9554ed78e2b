"""Checkpoints in one SQLite database (WAL): the embedded default that survives restarts.

Every save is one ``BEGIN IMMEDIATE`` transaction: read the stored version, compare,
write. ``BEGIN IMMEDIATE`` takes SQLite's write lock up front, so two processes cannot
both pass the version check. ``synchronous=FULL`` fsyncs the WAL on each commit, the
same durability the file store gets from its fsyncs.
"""

from __future__ import annotations

import builtins
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, decode, encode
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lg_checkpoints (
    task_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    checksum TEXT NOT NULL,
    body BLOB NOT NULL,
    updated_at REAL
);
CREATE TABLE IF NOT EXISTS lg_checkpoint_quarantine (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    version INTEGER,
    checksum TEXT,
    body BLOB,
    reason TEXT NOT NULL,
    quarantined_at REAL NOT NULL
);
"""


class SQLiteCheckpointStore:
    """Checkpoints as rows of ``lg_checkpoints`` in a WAL-mode SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.serializer = serializer
        self._clock = clock
        self._lock = threading.Lock()  # one connection, shared by the store's threads
        if self.path.parent != Path():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so the
            # transaction boundaries are exactly the ones documented above.
            self._db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise self._corrupt_file(str(exc)) from None

    def __repr__(self) -> str:
        return f"SQLiteCheckpointStore({str(self.path)!r})"

    # -- public API ------------------------------------------------------------------------

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        now = self._clock()
        new = cp.version + 1
        serializer = cp.serializer or self.serializer
        if not force:
            body, digest = encode(cp, new, now, serializer)
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT version, checksum, body FROM lg_checkpoints WHERE task_id = ?", (cp.task_id,)
                ).fetchone()
                stored = 0 if row is None else row[0]
                if not isinstance(stored, int):
                    if not force:
                        db.execute("ROLLBACK")
                        raise self._corrupted_row(cp.task_id, row, "version column is not an integer")
                    stored = 0
                if force:
                    new = max(stored, cp.version) + 1
                    body, digest = encode(cp, new, now, serializer)
                elif stored != cp.version:
                    raise CheckpointConflictError(cp.task_id, cp.version, stored)
                db.execute(
                    "INSERT INTO lg_checkpoints (task_id, version, checksum, body, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
                    "version = excluded.version, checksum = excluded.checksum, body = excluded.body, "
                    "updated_at = excluded.updated_at",
                    (cp.task_id, new, digest, body, now),
                )
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        cp.version = new
        cp.updated_at = now
        return new

    def load(self, task_id: str) -> TaskCheckpoint | None:
        check_task_id(task_id)
        with self._lock:
            try:
                row = self._db.execute(
                    "SELECT version, checksum, body FROM lg_checkpoints WHERE task_id = ?", (task_id,)
                ).fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._corrupt_file(str(exc), task_id) from None
            if row is None:
                return None
            version, digest, body = row
            try:
                if not isinstance(version, int) or not isinstance(digest, str):
                    raise CorruptData("version or checksum column has the wrong type")
                if isinstance(body, str):
                    body = body.encode("utf-8")
                if not isinstance(body, bytes):
                    raise CorruptData("body column is not a blob")
                return decode(task_id, version, digest, body)
            except CorruptData as exc:
                raise self._corrupted_row(task_id, row, str(exc)) from None

    def delete(self, task_id: str) -> bool:
        check_task_id(task_id)
        with self._lock:
            cur = self._db.execute("DELETE FROM lg_checkpoints WHERE task_id = ?", (task_id,))
            return cur.rowcount > 0

    def list(self) -> builtins.list[str]:
        with self._lock:
            rows = self._db.execute("SELECT task_id FROM lg_checkpoints ORDER BY task_id").fetchall()
        return sorted(str(r[0]) for r in rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- corruption ------------------------------------------------------------------------

    def _corrupted_row(self, task_id: str, row: tuple[object, object, object], reason: str) -> CheckpointCorruptedError:
        """Copy the bad row into ``lg_checkpoint_quarantine`` (once per distinct content).

        Called with ``self._lock`` held and no transaction open (autocommit), so the
        copy is committed before the error is raised.
        """
        version, digest, body = row
        location = f"{self.path}::lg_checkpoints[{task_id!r}]"
        try:
            exists = self._db.execute(
                "SELECT id FROM lg_checkpoint_quarantine WHERE task_id = ? AND checksum IS ? AND body IS ?",
                (task_id, digest, body),
            ).fetchone()
            if exists is None:
                cur = self._db.execute(
                    "INSERT INTO lg_checkpoint_quarantine "
                    "(task_id, version, checksum, body, reason, quarantined_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (task_id, version, digest, body, reason, self._clock()),
                )
                qid = cur.lastrowid
            else:
                qid = exists[0]
            quarantine: str | None = f"{self.path}::lg_checkpoint_quarantine[id={qid}]"
        except sqlite3.Error:
            quarantine = None
        return CheckpointCorruptedError(task_id, location, reason, quarantine)

    def _corrupt_file(self, reason: str, task_id: str | None = None) -> CheckpointCorruptedError:
        """The database file itself is unreadable: copy it aside, leave it in place."""
        target = self.path.with_name(f"{self.path.name}.corrupt-{int(self._clock())}")
        try:
            if not target.exists():
                shutil.copy2(self.path, target)
            quarantine: str | None = str(target)
        except OSError:
            quarantine = None
        return CheckpointCorruptedError(task_id or "*", str(self.path), f"database unreadable: {reason}", quarantine)
