"""Checkpoints as files in a directory: a snapshot per task plus an append-only journal.

``<stem>.ckpt.json`` is the snapshot, plain JSON (readable with ``jq .checkpoint``):

    {"lg_checkpoint":3,"version":N,"xxh3":"<16 hex>","checkpoint":{...}}

``<stem>.ckpt.journal`` holds one framed record per save since that snapshot (see
[`loop_governor.checkpoint.file_journal`][loop_governor.checkpoint.file_journal]). A save appends its record and fsyncs
the
journal: the same cost at call 5000 as at call 5. Once the journal outgrows the snapshot
([`Compaction`][loop_governor.checkpoint.journal.Compaction]), a save writes a new snapshot
instead, the crash-atomic way (temp file, fsync, ``os.replace``, directory fsync), and
only then empties the journal: a kill at any instant leaves either the old snapshot with
its journal, or the new snapshot with a journal that names the old one and is ignored.
Loading is the snapshot plus the journal's complete records; a torn last record (a
writer killed mid-append, never acknowledged) is dropped, any other damage raises
``CheckpointCorruptedError`` and is copied to ``.quarantine/``.

Writers in one directory take an ``flock`` on the directory (readers a shared one) for
the version-check-and-write, so the two-writer rule also holds across processes, and a
reader never pairs a snapshot with a journal from a different moment. Checkpoint files
are never followed through symbolic links. Layout 3 is written; snapshots of layout 2
(XXH3) and layout 1 (CRC-32), from earlier releases, still load, and a save over one
continues it with a journal. (An earlier release cannot read layout 3 and says so,
rather than silently ignoring the journal.)
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import stat
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loop_governor.checkpoint import file_journal
from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, checksum_parts
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.journal import PendingSave, compaction, replay
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint

if sys.platform != "win32":
    import fcntl

SUFFIX = ".ckpt.json"
JOURNAL_SUFFIX = ".ckpt.journal"
QUARANTINE_DIR = ".quarantine"
# Layout 3 is written; 2 (XXH3) and 1 (CRC-32), from earlier releases, are still read.
_HEADER = re.compile(
    rb'\{"lg_checkpoint":(?:[23],"version":(\d{1,19}),"xxh3":"([0-9a-f]{16})"'
    rb'|1,"version":(\d{1,19}),"crc32":"([0-9a-f]{8})"),"checkpoint":'
)
_HEADER_MAX = 160
_PATH_CACHE_BYTES = 1 << 20
_PROCESS_STATE = frozenset({"_temp_seq", "_files", "_files_bytes", "_lock"})
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
# Checkpoint files are opened without following a symbolic link (a planted link must
# not make load copy its target into the quarantine, or a save write through it) and
# without blocking (a FIFO planted under a checkpoint's name must not hang the agent).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_BINARY", 0)
_JOURNAL_FLAGS = os.O_RDWR | _NOFOLLOW | getattr(os, "O_BINARY", 0)
_IOV_MAX = 512  # below every platform's IOV_MAX (1024 on Linux and macOS)
# File names stay well under the common 255-byte limit, leaving room for the
# quarantine suffix. Longer encodings keep a readable prefix plus a hash.
_MAX_NAME = 180
_LONG_PREFIX = 100
# Bytes kept as-is in file names. Deliberately *lower-case only*: on case-insensitive
# file systems (macOS, Windows) "Task" and "task" must not map to the same file, so
# upper-case letters are escaped too. '.' is escaped so no name is '.', '..' or hidden.
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_")
_HASHED_STEM = re.compile(rf"[a-z0-9_%-]{{{_LONG_PREFIX}}}~[0-9a-f]{{64}}")
_BODY_TASK_ID = re.compile(rb'\{"schema_version":\d{1,19},"task_id":')


def encode_task_id(task_id: str) -> str:
    """The file-name stem for ``task_id``: percent-encoding over UTF-8 bytes.

    Hand-written instead of ``urllib.parse.quote`` because quote keeps '.', '~' and
    upper case, which allow '..' and case-insensitive collisions. The encoding is
    injective (two ids never share a file) and its output holds only ``[a-z0-9_%-~]``:
    no separator, NUL or dot can reach the file system, so no id can escape the
    directory. Ids whose encoding is too long for a file name become
    ``<prefix>~<sha256 of the id>``; '~' never occurs in a plain encoding (it is
    escaped), so a plain name and a hashed one never coincide, and the file itself
    still holds the full id.
    """
    raw = check_task_id(task_id).encode("utf-8")
    stem = "".join(chr(b) if b in _SAFE else f"%{b:02x}" for b in raw)
    if len(stem) > _MAX_NAME:
        stem = stem[:_LONG_PREFIX] + "~" + hashlib.sha256(raw).hexdigest()
    return stem


def decode_task_id(stem: str) -> str | None:
    """Inverse of [`encode_task_id`][loop_governor.checkpoint.file_store.encode_task_id]; ``None`` for hashed (long) or
    foreign names.

    Only the canonical spelling decodes ("%61" is not another name for "a"), so one id
    is never listed twice.
    """
    if "~" in stem:
        return None
    out = bytearray()
    i = 0
    try:
        while i < len(stem):
            if stem[i] == "%":
                out.append(int(stem[i + 1 : i + 3], 16))
                i += 3
            else:
                out.append(ord(stem[i]))
                i += 1
        task_id = out.decode("utf-8")
        return task_id if encode_task_id(task_id) == stem else None
    except (ValueError, IndexError):
        return None


def _header_fields(match: re.Match[bytes]) -> tuple[int, str]:
    """``(version, checksum)`` from a header match of any layout."""
    version, digest = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return int(version), digest.decode()


def snapshot_header(data: bytes) -> tuple[int, str] | None:
    """``(version, checksum)`` from the first bytes of a snapshot file, ``None`` if none."""
    match = _HEADER.match(data)
    return _header_fields(match) if match else None


def _writev_all(fd: int, parts: builtins.list[bytes]) -> None:
    """Write ``parts`` in order with ``writev`` (no joined copy of a large body)."""
    start = 0
    while start < len(parts):
        batch = parts[start : start + _IOV_MAX]
        written = os.writev(fd, batch)
        expected = sum(map(len, batch))
        if written < expected:  # short write: finish this batch the simple way
            _write_all(fd, b"".join(batch)[written:])
        start += len(batch)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_and_replace(fd: int, tmp: str, parts: builtins.list[bytes], dest: str | os.PathLike[str]) -> None:
    """Write ``parts`` to the open temp file ``tmp``, fsync and close it, and rename it
    over ``dest``; on any failure the temp file is removed."""
    try:
        try:
            _writev_all(fd, parts)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _NotAFile(Exception):
    """Internal: a checkpoint path is a symbolic link, FIFO, directory...: not opened."""

    def __init__(self, path: str, kind: str, evidence: bytes) -> None:
        super().__init__(f"is a {kind}, not a regular file (not followed)")
        self.path = path
        self.evidence = evidence  # what the quarantine keeps instead of the content


def _open_file(path: str, flags: int) -> int | None:
    """An fd on the regular file ``path`` (never through a symlink), ``None`` if absent."""
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EMLINK, errno.ENXIO):  # ENXIO: FIFO opened O_WRONLY
            raise
        fd = -1
    if fd >= 0:
        mode = os.fstat(fd).st_mode
        if stat.S_ISREG(mode):
            return fd
        os.close(fd)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path)
        raise _NotAFile(path, "symbolic link", b"symbolic link to " + os.fsencode(target))
    kind = "directory" if stat.S_ISDIR(info.st_mode) else "special file"
    raise _NotAFile(path, kind, f"{kind}, mode {info.st_mode:o}".encode())


def _read_file(path: str) -> bytes | None:
    """The bytes of the regular file ``path`` (never through a symlink), ``None`` if absent."""
    fd = _open_file(path, _READ_FLAGS)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        chunks = []
        while True:
            chunk = os.read(fd, max(size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _DirectoryLock:
    """Exclusive (writers) or shared (readers) use of a checkpoint directory, within and
    across processes.

    One lock per directory rather than per task: a lock file per task would have to
    outlive its checkpoint (deleting a lock file others may hold is a race), and the
    lock is held only for one check-and-write, about one fsync. Readers take it shared
    so they never read a snapshot from before a compaction with the journal from after.
    ``with`` yields the directory fd (saves fsync it).

    The directory stays open between saves (opening it each time costs ~5 us).
    ``flock`` belongs to the open file description, which this process's threads share,
    hence the thread lock (readers of one process take turns too); and which a forked
    child would share with its parent, so a child opens its own
    (``os.register_at_fork``).
    """

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._fd = -1
        self._threads = threading.Lock()
        self._finalizer: weakref.finalize[[int], _DirectoryLock] | None = None
        _LIVE_LOCKS.add(self)

    def __enter__(self) -> int:
        return self._acquire(True)

    def __exit__(self, *exc_info: object) -> None:
        self._release()

    @contextlib.contextmanager
    def shared(self) -> Iterator[int]:
        fd = self._acquire(False)
        try:
            yield fd
        finally:
            self._release()

    def _acquire(self, exclusive: bool) -> int:
        self._threads.acquire()
        try:
            if self._fd < 0:
                self._fd = os.open(self._directory, os.O_RDONLY)
                self._finalizer = weakref.finalize(self, os.close, self._fd)
            if sys.platform != "win32":
                fcntl.flock(self._fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except BaseException:
            self._threads.release()
            raise
        return self._fd

    def _release(self) -> None:
        try:
            if sys.platform != "win32":
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def close(self) -> None:
        with self._threads:
            self._drop_fd()

    def _drop_fd(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the fd (in a forked child: the child's copy only)
            self._finalizer = None
        elif self._fd >= 0:  # forked between the open and its finalizer
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1

    def after_fork_in_child(self) -> None:
        """A lock of its own, and its own directory fd on next use."""
        self._threads = threading.Lock()  # a copy taken mid-save would stay locked
        self._drop_fd()


_LIVE_LOCKS: weakref.WeakSet[_DirectoryLock] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lock in list(_LIVE_LOCKS):
        lock.after_fork_in_child()


if hasattr(os, "register_at_fork"):  # one hook for every store (not one per store: those are never removed)
    os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass
class _OnDisk:
    """What a save found for one task (read under the directory lock)."""

    snapshot: tuple[int, str] | None = None  # version, checksum
    snapshot_bytes: int = 0
    journal_fd: int = -1
    journal_current: bool = False  # the journal's header names this snapshot
    journal_start: int = 0  # end of the header line
    journal_end: int = 0  # after the last complete record: where the next one goes
    torn: bool = False  # bytes after journal_end (truncated before appending)
    version: int = 0  # the stored version (last record, else the snapshot)
    tail: str | None = None  # checksum of the last record, else of the snapshot

    def close(self) -> None:
        if self.journal_fd >= 0:
            os.close(self.journal_fd)
            self.journal_fd = -1


class FileCheckpointStore:
    """Per task under ``directory``: a crash-atomic JSON snapshot and an append-only journal.

    ``compact_min_bytes`` / ``compact_ratio``: a save writes a new snapshot instead of a
    journal record once the journal holds at least that many bytes and that many times
    the snapshot's size (defaults 1 MiB and 1.0). ``path_cache_bytes`` bounds the
    memo of task id -> file names (about the bytes of the ids and paths it holds).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
        stale_temp_s: float | None = 3600.0,
        compact_min_bytes: int | None = None,
        compact_ratio: float | None = None,
        path_cache_bytes: int = _PATH_CACHE_BYTES,
    ) -> None:
        # Absolute: the directory stays open between saves, so a relative path followed
        # by os.chdir would lock one directory and write into another. (Not resolved:
        # "link/../x" keeps meaning what the OS makes of it.)
        self.directory = Path(directory).absolute()
        # 0o700: checkpoints hold tool results, which are nobody else's business.
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.serializer = serializer
        self.compaction = compaction(compact_min_bytes, compact_ratio)
        self.path_cache_bytes = path_cache_bytes
        self._clock = clock
        self._dir_path = os.fspath(self.directory)
        self._open_process_state()
        if stale_temp_s is not None:
            self.remove_stale_temp_files(stale_temp_s)

    def __repr__(self) -> str:
        return f"FileCheckpointStore({str(self.directory)!r})"

    def _open_process_state(self) -> None:
        # The directory fd, the thread lock and the caches belong to one process: a
        # store handed to a worker process (spawn, ProcessPoolExecutor) gets new ones.
        self._temp_seq = itertools.count()
        self._files: dict[str, str] = {}
        self._files_bytes = 0
        self._lock = _DirectoryLock(self._dir_path)

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in _PROCESS_STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_process_state()

    def path_for(self, task_id: str) -> Path:
        """The snapshot file of ``task_id`` (always inside the directory)."""
        return Path(self._file_for(task_id))

    def journal_path_for(self, task_id: str) -> Path:
        """The journal file of ``task_id`` (next to its snapshot)."""
        return Path(self._journal_for(self._file_for(task_id)))

    def _file_for(self, task_id: str) -> str:
        # A plain string, cached: a task saves after every call, and encoding the id
        # each time costs more than the flock. Bounded in bytes (ids can be long).
        file = self._files.get(task_id)
        if file is None:
            file = f"{self._dir_path}{os.sep}{encode_task_id(task_id)}{SUFFIX}"
            cost = 2 * (len(task_id) + len(file)) + 200
            if self._files_bytes + cost > self.path_cache_bytes:
                self._files.clear()
                self._files_bytes = 0
            if cost <= self.path_cache_bytes:
                self._files[task_id] = file
                self._files_bytes += cost
        return file

    @staticmethod
    def _journal_for(file: str) -> str:
        return file[: -len(SUFFIX)] + JOURNAL_SUFFIX

    # -- public API ------------------------------------------------------------------------

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        path = self._file_for(cp.task_id)
        with PendingSave(cp, self.serializer, self._clock()) as pending, self._lock as dir_fd:
            disk = self._on_disk(cp.task_id, path, force)
            try:
                if not force and disk.version != cp.version:
                    raise CheckpointConflictError(cp.task_id, cp.version, disk.version)
                if (
                    not force
                    and disk.snapshot is not None
                    and pending.appendable(disk.version, disk.tail)
                    and not pending.compaction_due(
                        self.compaction, disk.journal_end - disk.journal_start, disk.snapshot_bytes
                    )
                ):
                    new = disk.version + 1
                    self._append(path, disk, pending, new, dir_fd)
                else:
                    new = max(disk.version, cp.version) + 1
                    self._snapshot(path, disk, pending, new, dir_fd)
            finally:
                disk.close()
        return new

    def load(self, task_id: str) -> TaskCheckpoint | None:
        path = self._file_for(task_id)
        journal_path = self._journal_for(path)
        with self._lock.shared():
            try:
                data = _read_file(path)
                journal = None if data is None else _read_file(journal_path)
            except _NotAFile as exc:
                raise self._corrupted(task_id, exc.path, exc.evidence, str(exc), ".link") from None
        if data is None:
            return None
        try:
            version, digest, body = self._parse(data)
            records: builtins.list[file_journal.Record] = []
            if journal:
                records = file_journal.parse(journal, (version, digest)).records
            return replay(task_id, (version, digest, body), records)
        except CorruptData as exc:
            if exc.part == "journal" and journal is not None:
                raise self._corrupted(task_id, journal_path, journal, str(exc)) from None
            raise self._corrupted(task_id, path, data, str(exc)) from None

    def delete(self, task_id: str) -> bool:
        path = self._file_for(task_id)
        with self._lock as dir_fd:
            try:
                os.unlink(path)  # first: a kill between the two leaves no checkpoint, not an old one
                existed = True
            except FileNotFoundError:
                existed = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._journal_for(path))
            os.fsync(dir_fd)
        return existed

    def list(self) -> builtins.list[str]:
        """Task ids with a checkpoint, sorted.

        A hashed (long-id) file name does not spell its id: the id is read from the
        file. Files whose task cannot be told are not task ids:
        [`unidentified`][loop_governor.checkpoint.file_store.FileCheckpointStore.unidentified] names them (``checkpoints
        ls`` shows them as corrupt).
        """
        return sorted(task_id for task_id, _ in self._scan() if task_id is not None)

    def unidentified(self) -> builtins.list[tuple[str, str]]:
        """``(file name, reason)`` of snapshot files no task id leads to: a long-id file
        too damaged to name its task, or a link or special file under a long-id name."""
        return sorted((name, reason) for task_id, (name, reason) in self._scan() if task_id is None)

    def close(self) -> None:
        """Close the directory handle (the store reopens it if used again)."""
        self._lock.close()

    def remove_stale_temp_files(self, older_than_s: float) -> int:
        """Delete temp files left by writers killed mid-save; returns how many.

        Runs when a store is created (a restarted agent clears its predecessor's
        debris). Only files older than ``older_than_s`` go: no save takes that long, so
        a temp file that old belongs to no live writer.
        """
        removed = 0
        cutoff = self._clock() - older_than_s
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.startswith(".tmp-") and entry.name.endswith(".part"):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(entry.path)
                            removed += 1
        return removed

    # -- saving ----------------------------------------------------------------------------

    def _on_disk(self, task_id: str, path: str, force: bool) -> _OnDisk:
        """The stored version and tail of ``task_id``, from a few small reads.

        The snapshot's header and the journal's header and last record are all a save
        needs; the whole journal is read only when its end does not verify (a torn
        append to cut off, or damage to report). With ``force``, damage is overwritten
        rather than reported.
        """
        disk = _OnDisk()
        try:
            fd = _open_file(path, _READ_FLAGS)
        except _NotAFile as exc:
            if not force:
                raise self._corrupted(task_id, path, exc.evidence, str(exc), ".link") from None
            fd = None
        if fd is not None:
            try:
                head = os.pread(fd, _HEADER_MAX, 0)
                disk.snapshot_bytes = os.fstat(fd).st_size
            finally:
                os.close(fd)
            disk.snapshot = snapshot_header(head)
            if disk.snapshot is not None:
                disk.version, disk.tail = disk.snapshot
            elif not force:
                data = _read_file(path) or b""
                raise self._corrupted(task_id, path, data, "header is not a checkpoint header")
        journal_path = self._journal_for(path)
        try:
            journal_fd = _open_file(journal_path, _JOURNAL_FLAGS)
            disk.journal_fd = -1 if journal_fd is None else journal_fd
        except _NotAFile as exc:
            if not force:
                raise self._corrupted(task_id, journal_path, exc.evidence, str(exc), ".link") from None
            os.unlink(journal_path)  # a link or special file where the journal goes: removed, never followed
        if disk.journal_fd >= 0 and disk.snapshot is not None:
            try:
                self._read_journal(disk, force)
            except CorruptData as exc:
                data = self._journal_bytes(disk)
                disk.close()
                raise self._corrupted(task_id, journal_path, data, str(exc)) from None
        return disk

    def _read_journal(self, disk: _OnDisk, force: bool) -> None:
        fd = disk.journal_fd
        size = os.fstat(fd).st_size
        try:
            header, start = file_journal.parse_header(os.pread(fd, file_journal.HEADER_MAX, 0))
        except CorruptData:
            if not force:
                raise
            # overwritten below; the new version stays ahead of any record it held
            disk.version = max(disk.version, file_journal.max_version(self._journal_bytes(disk)))
            return
        if header is None or header != disk.snapshot:
            return  # torn or stale: the next record restarts the journal for this snapshot
        disk.journal_current = True
        disk.journal_start = disk.journal_end = start
        if size == start:
            return
        last = file_journal.tail(fd, size, start)
        if last is not None:
            disk.version, disk.tail = last
            disk.journal_end = size
            return
        data = self._journal_bytes(disk)
        try:
            journal = file_journal.parse(data, disk.snapshot)
        except CorruptData:
            if not force:
                raise
            disk.version = max(disk.version, file_journal.max_version(data))
            disk.journal_current = False
            return
        if journal.records:
            disk.version, disk.tail = journal.records[-1][:2]
        disk.journal_end, disk.torn = journal.end, journal.torn

    @staticmethod
    def _journal_bytes(disk: _OnDisk) -> bytes:
        size = os.fstat(disk.journal_fd).st_size
        return os.pread(disk.journal_fd, size, 0)

    def _append(self, path: str, disk: _OnDisk, pending: PendingSave, new: int, dir_fd: int) -> None:
        """One record, appended and fsynced (the journal restarted first if it must be)."""
        assert pending.record is not None and disk.snapshot is not None
        line, digest = file_journal.frame(new, pending.record)
        if disk.journal_current:
            fd = disk.journal_fd
            if disk.torn:  # a killed writer's partial record: cut it off, or the next one is glued to it
                os.ftruncate(fd, disk.journal_end)
            _pwrite_all(fd, line, disk.journal_end)
            os.fsync(fd)
            pending.appended(new, digest, disk.journal_end + len(line) - disk.journal_start)
            return
        created = disk.journal_fd < 0
        if created:
            disk.journal_fd = os.open(self._journal_for(path), _JOURNAL_FLAGS | os.O_CREAT, 0o600)
        fd = disk.journal_fd
        os.ftruncate(fd, 0)  # stale or torn: its records are in the snapshot already, or were never saved
        _pwrite_all(fd, file_journal.header_line(*disk.snapshot) + line, 0)
        os.fsync(fd)
        if created:
            os.fsync(dir_fd)  # the new journal's name must survive a power loss too
        pending.appended(new, digest, len(line))

    def _snapshot(self, path: str, disk: _OnDisk, pending: PendingSave, new: int, dir_fd: int) -> None:
        """The whole checkpoint, crash-atomically; then the journal it folds in is emptied.

        The order is what makes a kill harmless: the journal is emptied only after the
        new snapshot is durable, and until then it names the old snapshot, so a loader
        ignores it either way.
        """
        parts = pending.snapshot_parts()
        digest = checksum_parts(new, parts)
        header = b'{"lg_checkpoint":3,"version":%d,"xxh3":"%s","checkpoint":' % (new, digest.encode())
        file_parts = [header, *parts, b"}"]
        _write_and_replace(*self._open_temp(), file_parts, path)
        os.fsync(dir_fd)  # make the rename itself durable before the journal is let go
        if disk.journal_fd >= 0:
            os.ftruncate(disk.journal_fd, 0)
        pending.snapshotted(new, digest, sum(map(len, file_parts)))

    def _open_temp(self) -> tuple[int, str]:
        """A new, exclusively created temp file in the directory: ``(fd, path)``.

        Not ``tempfile.mkstemp``: it draws each name from a Python random generator and
        costs ~25 us more. ``O_EXCL`` is what keeps names safe: a name already taken
        (another store instance in this process, or the debris of a killed writer whose
        pid came back) is refused and the next number is tried; pid + counter only
        makes that rare.
        """
        while True:
            tmp = f"{self._dir_path}{os.sep}.tmp-{os.getpid()}-{next(self._temp_seq)}.part"
            try:
                return os.open(tmp, _TEMP_FLAGS, 0o600), tmp
            except FileExistsError:
                continue

    # -- reading -----------------------------------------------------------------------------

    @staticmethod
    def _parse(data: bytes) -> tuple[int, str, bytes]:
        match = _HEADER.match(data)
        if not match or not data.endswith(b"}"):
            raise CorruptData("not a checkpoint file (header or trailer missing)")
        version, digest = _header_fields(match)
        return version, digest, data[match.end() : -1]

    def _scan(self) -> Iterator[tuple[str | None, tuple[str, str]]]:
        """Every snapshot file: ``(task id or None, (file name, why it has no id))``."""
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(".") or not name.endswith(SUFFIX):
                    continue
                stem = name[: -len(SUFFIX)]
                task_id = decode_task_id(stem)
                if task_id is not None:
                    yield task_id, (name, "")
                elif _HASHED_STEM.fullmatch(stem):
                    # a long id: the file holds it; it must hash to this very name
                    found, reason = self._id_from_file(entry.path)
                    if found is not None and encode_task_id(found) == stem:
                        yield found, (name, "")
                    else:
                        yield None, (name, reason or f"holds task {found!r}, whose file this is not")
                # anything else is no checkpoint of ours (no task id is spelled that way)

    @staticmethod
    def _id_from_file(path: str) -> tuple[str | None, str]:
        """The task id a snapshot names, read from its first bytes (never parses the
        rest, so no body, however damaged or deeply nested, can break ``list``)."""
        try:
            data = _read_file(path)
        except (_NotAFile, OSError) as exc:
            return None, str(exc)
        if data is None:
            return None, "removed meanwhile"
        match = _HEADER.match(data)
        body = _BODY_TASK_ID.match(data, match.end()) if match else None
        if body is None:
            return None, "not a checkpoint file (damaged header); its task id cannot be read"
        try:
            task_id, _ = json.JSONDecoder().raw_decode(data.decode("ascii", "replace"), body.end())
        except ValueError:
            return None, "damaged task id"
        return (task_id, "") if isinstance(task_id, str) and task_id else (None, "damaged task id")

    def _corrupted(
        self, task_id: str, path: str, data: bytes, reason: str, kind: str = ".corrupt"
    ) -> CheckpointCorruptedError:
        """Write a quarantine copy of ``data`` (once per distinct content) and build the error."""
        name = os.path.basename(path)
        qdir = self.directory / QUARANTINE_DIR
        qpath = qdir / f"{name}.{hashlib.sha256(data).hexdigest()[:16]}{kind}"
        quarantine: str | None = None
        try:
            qdir.mkdir(mode=0o700, exist_ok=True)
            if stat.S_ISDIR(os.lstat(qdir).st_mode):  # a link planted as .quarantine is not written through
                if not os.path.lexists(qpath):
                    # No directory lock here: callers may hold it already, and the copy has
                    # its own content-derived name, so concurrent quarantines write the same.
                    _write_and_replace(*tempfile.mkstemp(dir=qdir, prefix=".tmp-"), [data], qpath)
                quarantine = str(qpath)
        except OSError:
            quarantine = None
        return CheckpointCorruptedError(task_id, path, reason, quarantine)
