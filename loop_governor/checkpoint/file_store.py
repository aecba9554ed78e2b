"""Checkpoints as one JSON file per task in a directory.

A save is crash-atomic: write a temp file in the same directory, fsync it, ``os.replace``
it over the old file, fsync the directory. A process killed at any instant leaves either
the old or the new file, never a torn one (the checksum in the header catches disks that
lie). Writers in one directory take an ``flock`` on the directory for the
version-check-and-replace, so the two-writer rule also holds across processes.

File layout (plain JSON, readable with ``jq .checkpoint``)::

    {"lg_checkpoint":2,"version":N,"xxh3":"<16 hex>","checkpoint":{...}}

The fixed prefix lets a writer read the stored version from the first bytes alone and
lets a reader verify the body's checksum on the exact stored bytes. Files of layout 1
(``"lg_checkpoint":1`` with an 8-hex ``"crc32"``), written by earlier releases, still
load; saving over one writes layout 2.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loop_governor.checkpoint.base import check_task_id
from loop_governor.checkpoint.codec import CorruptData, decode, encode_parts
from loop_governor.checkpoint.errors import CheckpointConflictError, CheckpointCorruptedError
from loop_governor.checkpoint.model import Serializer, TaskCheckpoint

if sys.platform != "win32":
    import fcntl

SUFFIX = ".ckpt.json"
QUARANTINE_DIR = ".quarantine"
# Layout 2 (XXH3) is written; layout 1 (CRC-32), from earlier releases, is still read.
_HEADER = re.compile(
    rb'\{"lg_checkpoint":(?:2,"version":(\d{1,19}),"xxh3":"([0-9a-f]{16})"'
    rb'|1,"version":(\d{1,19}),"crc32":"([0-9a-f]{8})"),"checkpoint":'
)
_HEADER_MAX = 160
_FILE_CACHE_MAX = 4096
_PROCESS_STATE = frozenset({"_temp_seq", "_files", "_lock"})
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_IOV_MAX = 512  # below every platform's IOV_MAX (1024 on Linux and macOS)
# File names stay well under the common 255-byte limit, leaving room for the
# quarantine suffix. Longer encodings keep a readable prefix plus a hash.
_MAX_NAME = 180
_LONG_PREFIX = 100
# Bytes kept as-is in file names. Deliberately *lower-case only*: on case-insensitive
# file systems (macOS, Windows) "Task" and "task" must not map to the same file, so
# upper-case letters are escaped too. '.' is escaped so no name is '.', '..' or hidden.
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-_")
# The stem of a hashed (long-id) file name, as ``list`` reports it when the file is too
# damaged to name its task.
_HASHED_STEM = re.compile(rf"[a-z0-9_%-]{{{_LONG_PREFIX}}}~[0-9a-f]{{64}}")


def encode_task_id(task_id: str) -> str:
    """The file-name stem for ``task_id``: percent-encoding over UTF-8 bytes.

    Hand-written instead of ``urllib.parse.quote`` because quote keeps '.', '~' and
    upper case, which allow '..' and case-insensitive collisions. The encoding is
    reversible (so ``list`` recovers ids from names) and its output holds only
    ``[a-z0-9_%-]``: no separator, NUL or dot can reach the file system, so no id can
    escape the directory. Ids whose encoding is too long for a file name become
    ``<prefix>~<sha256>``; '~' never occurs in a plain encoding, and the file itself
    still holds the full id.
    """
    raw = check_task_id(task_id).encode("utf-8")
    stem = "".join(chr(b) if b in _SAFE else f"%{b:02x}" for b in raw)
    if len(stem) > _MAX_NAME:
        stem = stem[:_LONG_PREFIX] + "~" + hashlib.sha256(raw).hexdigest()
    return stem


def decode_task_id(stem: str) -> str | None:
    """Inverse of :func:`encode_task_id`; ``None`` for hashed (long) or foreign names."""
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
        return out.decode("utf-8")
    except (ValueError, IndexError):
        return None


def _header_fields(match: re.Match[bytes]) -> tuple[int, str]:
    """``(version, checksum)`` from a header match of either layout."""
    version, digest = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return int(version), digest.decode()


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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _DirectoryLock:
    """Exclusive use of a checkpoint directory, within and across processes.

    One lock per directory rather than per task: a lock file per task would have to
    outlive its checkpoint (deleting a lock file others may hold is a race), and the
    lock is held only for the check-and-replace, about one fsync. ``with`` yields the
    directory fd (saves fsync it).

    The directory stays open between saves (opening it each time costs ~5 us, a tenth
    of what a save adds to a bare write). ``flock`` belongs to the open file
    description, which this process's threads share, hence the thread lock; and which
    a forked child would share with its parent, so a child opens its own
    (``os.register_at_fork``).
    """

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._fd = -1
        self._threads = threading.Lock()
        self._finalizer: weakref.finalize[[int], _DirectoryLock] | None = None
        _LIVE_LOCKS.add(self)

    def __enter__(self) -> int:
        self._threads.acquire()
        try:
            if self._fd < 0:
                self._fd = os.open(self._directory, os.O_RDONLY)
                self._finalizer = weakref.finalize(self, os.close, self._fd)
            if sys.platform != "win32":
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        return self._fd

    def __exit__(self, *exc_info: object) -> None:
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


class FileCheckpointStore:
    """One crash-atomic JSON file per task under ``directory``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        serializer: Serializer | None = None,
        clock: Callable[[], float] = time.time,
        stale_temp_s: float | None = 3600.0,
    ) -> None:
        # Absolute: the directory stays open between saves, so a relative path followed
        # by os.chdir would lock one directory and write into another. (Not resolved:
        # "link/../x" keeps meaning what the OS makes of it.)
        self.directory = Path(directory).absolute()
        # 0o700: checkpoints hold tool results, which are nobody else's business.
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.serializer = serializer
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
        self._lock = _DirectoryLock(self._dir_path)

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in _PROCESS_STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_process_state()

    def path_for(self, task_id: str) -> Path:
        """The file that holds ``task_id``'s checkpoint (always inside the directory)."""
        return Path(self._file_for(task_id))

    def _file_for(self, task_id: str) -> str:
        # A plain string, cached: a task saves after every call, and building a Path
        # each time costs more than the flock.
        file = self._files.get(task_id)
        if file is None:
            if len(self._files) >= _FILE_CACHE_MAX:
                self._files.clear()
            file = self._files[task_id] = f"{self._dir_path}{os.sep}{encode_task_id(task_id)}{SUFFIX}"
        return file

    # -- public API ------------------------------------------------------------------------

    def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
        path = self._file_for(cp.task_id)
        now = self._clock()
        new = cp.version + 1
        if not force:  # serialize before taking the lock: other writers wait less
            body, digest = encode_parts(cp, new, now, cp.serializer or self.serializer)
        with self._lock as dir_fd:
            stored = self._stored_version(path, cp.task_id, force)
            if force:
                new = max(stored, cp.version) + 1
                body, digest = encode_parts(cp, new, now, cp.serializer or self.serializer)
            elif stored != cp.version:
                raise CheckpointConflictError(cp.task_id, cp.version, stored)
            header = b'{"lg_checkpoint":2,"version":%d,"xxh3":"%s","checkpoint":' % (new, digest.encode())
            self._replace(path, [header, *body, b"}"], dir_fd)
        cp.version = new
        cp.updated_at = now
        return new

    def load(self, task_id: str) -> TaskCheckpoint | None:
        path = self._existing_path(task_id)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return self._parse(task_id, data)
        except CorruptData as exc:
            raise self._corrupted(task_id, path, data, str(exc)) from None

    def delete(self, task_id: str) -> bool:
        path = self._existing_path(task_id)
        with self._lock as dir_fd:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            os.fsync(dir_fd)
        return True

    def list(self) -> builtins.list[str]:
        """Task ids with a checkpoint file, sorted.

        A hashed (long-id) file name does not spell its id: the id is read from the file.
        When the file is too damaged to name it, its stem is listed instead (never
        skipped, so ``checkpoints ls`` shows it as corrupt); ``load`` and ``delete``
        accept that stem too.
        """
        ids: builtins.list[str] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.name.endswith(SUFFIX):
                    continue
                stem = entry.name[: -len(SUFFIX)]
                task_id = decode_task_id(stem)
                if task_id is None:  # hashed long id: the file holds the full id
                    task_id = self._id_from_file(Path(entry.path))
                if task_id is None and _HASHED_STEM.fullmatch(stem):
                    task_id = stem
                if task_id is not None:
                    ids.append(task_id)
        return sorted(ids)

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
                        if entry.stat().st_mtime < cutoff:
                            os.unlink(entry.path)
                            removed += 1
        return removed

    # -- internals -------------------------------------------------------------------------

    def _existing_path(self, task_id: str) -> Path:
        """:meth:`path_for`, or the file a hashed stem from :meth:`list` names."""
        path = self.path_for(task_id)
        if _HASHED_STEM.fullmatch(task_id) and not path.exists():
            named = self.directory / (task_id + SUFFIX)
            if named.exists():
                return named
        return path

    def _open_temp(self) -> tuple[int, str]:
        """A new, exclusively created temp file in the directory: ``(fd, path)``.

        Not ``tempfile.mkstemp``: it draws each name from a Python random generator and
        costs ~25 us more, half of what the store adds to a bare write. ``O_EXCL`` is
        what keeps names safe: a name already taken (another store instance in this
        process, or the debris of a killed writer whose pid came back) is refused and
        the next number is tried; pid + counter only makes that rare.
        """
        while True:
            tmp = f"{self._dir_path}{os.sep}.tmp-{os.getpid()}-{next(self._temp_seq)}.part"
            try:
                return os.open(tmp, _TEMP_FLAGS, 0o600), tmp
            except FileExistsError:
                continue

    def _replace(self, path: str, parts: builtins.list[bytes], dir_fd: int) -> None:
        _write_and_replace(*self._open_temp(), parts, path)
        os.fsync(dir_fd)  # make the rename itself durable

    def _stored_version(self, path: str, task_id: str, force: bool) -> int:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            head = os.read(fd, _HEADER_MAX)
        finally:
            os.close(fd)
        match = _HEADER.match(head)
        if match:
            return _header_fields(match)[0]
        if force:
            return 0
        data = Path(path).read_bytes()
        raise self._corrupted(task_id, Path(path), data, "header is not a checkpoint header")

    def _parse(self, task_id: str, data: bytes) -> TaskCheckpoint:
        match = _HEADER.match(data)
        if not match or not data.endswith(b"}"):
            raise CorruptData("not a checkpoint file (header or trailer missing)")
        body = data[match.end() : -1]
        version, digest = _header_fields(match)
        return decode(task_id, version, digest, body)

    def _id_from_file(self, path: Path) -> str | None:
        try:
            data = path.read_bytes()
            match = _HEADER.match(data)
            if not match:
                return None
            doc = json.loads(data[match.end() : -1])
            task_id = doc.get("task_id") if isinstance(doc, dict) else None
            return task_id if isinstance(task_id, str) else None
        except (OSError, ValueError):
            return None

    def _corrupted(self, task_id: str, path: Path, data: bytes, reason: str) -> CheckpointCorruptedError:
        """Write a quarantine copy of ``data`` (once per distinct content) and build the error."""
        qdir = self.directory / QUARANTINE_DIR
        qpath = qdir / f"{path.name[: -len(SUFFIX)]}.{hashlib.sha256(data).hexdigest()[:16]}.corrupt"
        try:
            qdir.mkdir(mode=0o700, exist_ok=True)
            if not qpath.exists():
                # No directory lock here: callers may hold it already, and the copy has
                # its own content-derived name, so concurrent quarantines write the same.
                _write_and_replace(*tempfile.mkstemp(dir=qdir, prefix=".tmp-"), [data], qpath)
            quarantine: str | None = str(qpath)
        except OSError:
            quarantine = None
        return CheckpointCorruptedError(task_id, str(path), reason, quarantine)
