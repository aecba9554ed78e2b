"""Checkpoints in one SQLite database (WAL): the embedded default that survives restarts.

Per task, a snapshot row in ``lg_checkpoints`` (the whole checkpoint, as before) and one
row per save since in ``lg_checkpoint_journal`` (that save's changes, see
[`loop_governor.checkpoint.journal`][loop_governor.checkpoint.journal]): a save inserts one small row, so it costs the
same at call 5000 as at call 5. Once the journal outgrows the snapshot, a save rewrites
the snapshot row and deletes the journal rows in the same transaction.

Every save is one ``BEGIN IMMEDIATE`` transaction: read the stored version, compare,
write. ``BEGIN IMMEDIATE`` takes SQLite's write lock up front, so two processes cannot
both pass the version check. ``synchronous=FULL`` fsyncs the WAL on each commit, the
same durability the file store gets from its fsyncs. Databases from earlier releases
(snapshot rows only) load as they are; the journal table is added on open.
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
from loop_governor.checkpoint.codec import CorruptData, checksum
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.journal import PendingSave, compaction, replay
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lg_checkpoints (
    task_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    checksum TEXT NOT NULL,
    body BLOB NOT NULL,
    updated_at REAL
);
CREATE TABLE IF NOT EXISTS lg_checkpoint_journal (
    task_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    checksum TEXT NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (task_id, version)
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

Row = tuple[object, object, object]  # version, checksum, body as stored


class SQLiteCheckpointStore:
    """Checkpoints as a snapshot row plus journal rows in a WAL-mode SQLite file."""

    def __init__(
        self,
        path: str | Path,
        *,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 30.0,
        compact_min_bytes: int | None = None,
        compact_ratio: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.serializer = serializer
        self.compaction = compaction(compact_min_bytes, compact_ratio)
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
        task_id = cp.task_id
        with PendingSave(cp, self.serializer, self._clock()) as pending, self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                # length(body), not body: SQLite reads a blob's size without its pages,
                # so the check costs the same however large the snapshot is.
                snapshot = db.execute(
                    "SELECT version, checksum, length(body) FROM lg_checkpoints WHERE task_id = ?", (task_id,)
                ).fetchone()
                last = db.execute(
                    "SELECT version, checksum FROM lg_checkpoint_journal WHERE task_id = ? "
                    "ORDER BY version DESC LIMIT 1",
                    (task_id,),
                ).fetchone()
                stored, tail = 0, None
                if snapshot is not None:
                    if isinstance(snapshot[0], int) and isinstance(snapshot[1], str):
                        stored, tail = snapshot[0], snapshot[1]
                    elif not force:
                        db.execute("ROLLBACK")
                        raise self._corrupted_row(
                            task_id, self._snapshot_row(task_id), "version column is not an integer"
                        )
                if last is not None and isinstance(last[0], int) and last[0] > stored and isinstance(last[1], str):
                    stored, tail = last[0], last[1]
                if not force and stored != cp.version:
                    raise CheckpointConflictError(task_id, cp.version, stored)
                if (
                    not force
                    and snapshot is not None
                    and pending.appendable(stored, tail)
                    and not pending.compaction_due(
                        self.compaction, cp.sync_state().journal_bytes, int(snapshot[2] or 0)
                    )
                ):
                    record = pending.record
                    assert record is not None
                    new = stored + 1
                    digest = checksum(new, record)
                    db.execute(
                        "INSERT INTO lg_checkpoint_journal (task_id, version, checksum, body) VALUES (?, ?, ?, ?)",
                        (task_id, new, digest, record),
                    )
                    db.execute("COMMIT")
                    pending.appended(new, digest)
                    return new
                new = max(stored, cp.version) + 1
                body = b"".join(pending.snapshot_parts())
                digest = checksum(new, body)
                db.execute(
                    "INSERT INTO lg_checkpoints (task_id, version, checksum, body, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(task_id) DO UPDATE SET "
                    "version = excluded.version, checksum = excluded.checksum, body = excluded.body, "
                    "updated_at = excluded.updated_at",
                    (task_id, new, digest, body, pending.now),
                )
                db.execute("DELETE FROM lg_checkpoint_journal WHERE task_id = ?", (task_id,))
                db.execute("COMMIT")
                pending.snapshotted(new, digest, len(body))
                return new
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def load(self, task_id: str) -> TaskCheckpoint | None:
        check_task_id(task_id)
        with self._lock:
            try:
                row = self._snapshot_row(task_id)
                if row is None:
                    return None
                journal = self._db.execute(
                    "SELECT version, checksum, body FROM lg_checkpoint_journal WHERE task_id = ? AND version > ? "
                    "ORDER BY version",
                    (task_id, row[0] if isinstance(row[0], int) else 0),
                ).fetchall()
            except sqlite3.DatabaseError as exc:
                raise self._corrupt_file(str(exc), task_id) from None
            try:
                snapshot = _typed(row, "snapshot")
                records = [_typed(r, "journal", i) for i, r in enumerate(journal)]
                return replay(task_id, snapshot, records)
            except CorruptData as exc:
                if exc.part == "journal" and journal:
                    bad = journal[exc.index if exc.index is not None else -1]
                    raise self._corrupted_row(task_id, bad, str(exc), journal=True) from None
                raise self._corrupted_row(task_id, row, str(exc)) from None

    def delete(self, task_id: str) -> bool:
        check_task_id(task_id)
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM lg_checkpoint_journal WHERE task_id = ?", (task_id,))
                cur = db.execute("DELETE FROM lg_checkpoints WHERE task_id = ?", (task_id,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return cur.rowcount > 0

    def list(self) -> builtins.list[str]:
        with self._lock:
            rows = self._db.execute("SELECT task_id FROM lg_checkpoints ORDER BY task_id").fetchall()
        return sorted(str(r[0]) for r in rows)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- corruption ------------------------------------------------------------------------

    def _snapshot_row(self, task_id: str) -> Row | None:
        row: Row | None = self._db.execute(
            "SELECT version, checksum, body FROM lg_checkpoints WHERE task_id = ?", (task_id,)
        ).fetchone()
        return row

    def _corrupted_row(
        self, task_id: str, row: Row | None, reason: str, *, journal: bool = False
    ) -> CheckpointCorruptedError:
        """Copy the bad row into ``lg_checkpoint_quarantine`` (once per distinct content).

        Called with ``self._lock`` held and no transaction open (autocommit), so the
        copy is committed before the error is raised.
        """
        version, digest, body = row if row is not None else (None, None, None)
        table = "lg_checkpoint_journal" if journal else "lg_checkpoints"
        where = f"{task_id!r}, version {version}" if journal else repr(task_id)
        location = f"{self.path}::{table}[{where}]"
        if journal:
            reason = f"journal record: {reason}"
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


def _typed(row: Row, part: str, index: int | None = None) -> tuple[int, str, bytes]:
    """A stored row with the column types a record needs, or
    [`CorruptData`][loop_governor.checkpoint.codec.CorruptData]."""
    version, digest, body = row
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(version, int) or not isinstance(digest, str) or not isinstance(body, bytes):
        raise CorruptData("version, checksum or body column has the wrong type", part=part, index=index)
    return version, digest, body
