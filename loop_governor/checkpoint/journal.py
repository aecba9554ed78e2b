"""Saving only what changed: journal records, snapshots, compaction, and replay on load.

Every store keeps, per task, a *snapshot* (the whole checkpoint, the layout it always
had) and a *journal*: one record per save since the snapshot, holding that save's
changes. The governor saves after every call, so a record is one completed call, one
known-bad call or one sub-result, and a save costs the same at call 5000 as at call 5.
Loading is the snapshot plus its records, in order.

A record is one line of compact JSON (ASCII, so never a raw newline):

    {"v":7,"t":1712345678.5,"step":7,
     "c":[["+",key,value],["=",key,value],["-",key]],     completed: insert, replace, remove
     "b":[...],                                           known_bad, the same three
     "r":[6,[value,...]],                                 results appended at index 6
     "m":{...}}                                           metadata, when it changed

``v`` is the version the save created; records follow their snapshot's version without
a gap, so a record can neither be lost in the middle nor applied twice unnoticed.

When the journal has grown past ``max(min_bytes, ratio x snapshot size)``, a save
writes a new snapshot instead of a record (*compaction*) and the store drops the
records it folds in. With ``ratio=1`` snapshots double in size between compactions:
O(log n) compactions per task, every byte rewritten O(1) times on average.

A change the record format cannot say (a results item replaced, a section swapped for
a plain dict, a schema change), a checkpoint that is not in sync with the store (first
save, loaded from another store, a copy) and ``force=True`` write a snapshot too.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from loop_governor.checkpoint.codec import CorruptData, checksum, parse_body
from loop_governor.checkpoint.model import (
    HASHED_KEY_PREFIX,
    SCHEMA_VERSION,
    Serializer,
    TaskCheckpoint,
    dump,
    entry,
    error_entry,
    item,
    storage_key,
)
from loop_governor.checkpoint.tracking import ADD, DEL, SET, TrackedDict, TrackedList

_OPS = {ADD: b'"+"', SET: b'"="'}


@dataclass(frozen=True)
class Compaction:
    """When a save writes a snapshot instead of a journal record.

    ``min_bytes``: journals smaller than this are never compacted (small tasks write one
    snapshot, then records). ``ratio``: compact once the journal is this many times the
    snapshot's size (1.0: total bytes written stay within ~2x of what a task records).
    """

    min_bytes: int = 1 << 20
    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.min_bytes < 0 or not math.isfinite(self.ratio) or self.ratio < 0:
            raise ValueError("compaction needs min_bytes >= 0 and a finite ratio >= 0")

    def due(self, journal_bytes: int, snapshot_bytes: int) -> bool:
        return journal_bytes >= self.min_bytes and journal_bytes >= self.ratio * snapshot_bytes


def compaction(min_bytes: int | None, ratio: float | None) -> Compaction:
    """A store's compaction policy from its constructor options (``None``: the default)."""
    default = Compaction()
    return Compaction(
        default.min_bytes if min_bytes is None else int(min_bytes),
        default.ratio if ratio is None else float(ratio),
    )


class PendingSave:
    """One save in progress: the checkpoint's changes, taken out and encoded.

    Use as a context manager around the store's write: if the block raises (conflict,
    I/O error, unencodable value), the changes go back into the checkpoint for the next
    save, so nothing recorded is ever dropped by a failed save.

    The record is encoded before the store takes its lock (for version
    ``cp.version + 1``), so other writers wait only for the write itself.
    """

    def __init__(self, cp: TaskCheckpoint, serializer: Serializer | None, now: float) -> None:
        self.cp = cp
        self.serializer = cp.serializer or serializer
        self.now = now
        self._done = False
        sync = cp.sync_state()
        completed, known_bad, results = self._sections = cp.sections()
        self._completed = completed.take() if isinstance(completed, TrackedDict) else None
        self._known_bad = known_bad.take() if isinstance(known_bad, TrackedDict) else None
        if isinstance(results, TrackedList):
            self._rewritten, self._results_end, self._results = results.take(sync.results_saved)
        else:
            self._rewritten, self._results_end, self._results = True, len(results), []
        self.record: bytes | None = None
        try:
            self.metadata = cp.encode_metadata(self.serializer)
            if (
                sync.tail is not None
                and cp.version > 0
                and sync.sections is not None
                and all(map(operator.is_, sync.sections, (completed, known_bad, results)))
                and self._completed is not None
                and self._known_bad is not None
                and not self._rewritten
                and sync.schema == cp.schema_version == SCHEMA_VERSION
            ):
                self.record = self._encode_record(cp.version + 1)
        except BaseException:
            self._give_back()
            raise

    def __enter__(self) -> PendingSave:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None or not self._done:
            self._give_back()

    def appendable(self, stored_version: int, stored_tail: str | None) -> bool:
        """Whether a journal record can carry this save onto what the store holds."""
        return (
            self.record is not None
            and stored_version == self.cp.version
            and stored_tail is not None
            and stored_tail == self.cp.sync_state().tail
        )

    def compaction_due(self, policy: Compaction, journal_bytes: int, snapshot_bytes: int) -> bool:
        assert self.record is not None
        return policy.due(journal_bytes + len(self.record), snapshot_bytes)

    def snapshot_parts(self) -> list[bytes]:
        """The whole checkpoint as body parts (see
        [`TaskCheckpoint.encode_parts`][loop_governor.checkpoint.model.TaskCheckpoint.encode_parts]).

        ``results`` stop where the changes were taken: one appended since (by another
        thread) belongs to the next save's record, and must not be in both.
        """
        return self.cp.encode_parts(self.now, self.serializer, results_end=self._results_end)

    def appended(self, version: int, digest: str, journal_bytes: int | None = None) -> None:
        """The record is stored as ``version`` (``journal_bytes``: the store's own count)."""
        assert self.record is not None
        sync = self.cp.sync_state()
        sync.journal_bytes = sync.journal_bytes + len(self.record) if journal_bytes is None else journal_bytes
        self._finish(version, digest)

    def snapshotted(self, version: int, digest: str, snapshot_bytes: int) -> None:
        """A snapshot is stored as ``version``; the store has no journal records left."""
        sync = self.cp.sync_state()
        sync.journal_bytes = 0
        sync.snapshot_bytes = snapshot_bytes
        sync.schema = self.cp.schema_version
        sync.sections = self._sections
        self._finish(version, digest)

    def _finish(self, version: int, digest: str) -> None:
        sync = self.cp.sync_state()
        sync.tail = digest
        sync.results_saved = self._results_end
        sync.metadata = self.metadata
        self.cp.version = version
        self.cp.updated_at = self.now
        self._done = True

    def _give_back(self) -> None:
        if self._done:
            return
        self._done = True  # once
        completed, known_bad, results = self._sections  # where they were taken from
        if self._completed is not None and isinstance(completed, TrackedDict):
            completed.untake(self._completed[0])
        if self._known_bad is not None and isinstance(known_bad, TrackedDict):
            known_bad.untake(self._known_bad[0])
        if isinstance(results, TrackedList):
            results.untake(self._rewritten)

    def _encode_record(self, version: int) -> bytes:
        cp, ser = self.cp, self.serializer
        parts = [b'{"v":%d,"t":%s,"step":%d' % (version, dump(self.now), cp.step)]
        for name, taken in ((b"c", self._completed), (b"b", self._known_bad)):
            assert taken is not None
            if not taken[1]:
                continue
            ops = []
            for key, op, value, raw in taken[1]:
                if op == DEL:
                    # The key as stored: a key put in directly was stored by its hash, and
                    # its own spelling (which may hold a secret) never reaches the store.
                    stored = storage_key(key)
                    ops.append(b'["-",' + dump(stored) + b"]")
                    if stored != key and key.startswith(HASHED_KEY_PREFIX):  # a hash: safe, and maybe what is stored
                        ops.append(b'["-",' + dump(key) + b"]")
                    continue
                if name == b"c":
                    name_json, value_json = entry(key, value, raw, ser, "completed")
                else:
                    name_json, value_json = error_entry(key, value, raw)
                ops.append(b"[" + _OPS[op] + b"," + name_json + b"," + value_json + b"]")
            parts.append(b',"' + name + b'":[' + b",".join(ops) + b"]")
        if self._results:
            start = self._results_end - len(self._results)
            values = b",".join(
                [item(value, raw, ser, f"results[{start + i}]") for i, (value, raw) in enumerate(self._results)]
            )
            parts.append(b',"r":[%d,[' % start + values + b"]]")
        if self.metadata != cp.sync_state().metadata:
            parts.append(b',"m":' + self.metadata)
        parts.append(b"}")
        return b"".join(parts)


# -- load ---------------------------------------------------------------------------------


def replay(
    task_id: str,
    snapshot: tuple[int, str, bytes],
    records: list[tuple[int, str, bytes]] | tuple[()] = (),
) -> TaskCheckpoint:
    """The checkpoint a snapshot ``(version, checksum, body)`` and its journal records
    ``[(version, checksum, payload), ...]`` (in order) describe.

    Raises [`CorruptData`][loop_governor.checkpoint.codec.CorruptData] (``part`` says whether the snapshot or the
    journal is bad) or ``CheckpointSchemaError``.
    """
    version, digest, body = snapshot
    doc = parse_body(task_id, version, digest, body)
    for section, kind in (("completed", dict), ("known_bad", dict), ("results", list)):
        if not isinstance(doc.setdefault(section, kind()), kind):
            raise CorruptData(f"{section} is not a JSON {'object' if kind is dict else 'array'}")
    tail, journal_bytes = digest, 0
    for index, (record_version, record_digest, payload) in enumerate(records):
        where = f"journal record {index + 1} (version {record_version})"
        if record_version != version + 1:
            raise CorruptData(f"{where} does not follow version {version}", part="journal", index=index)
        if checksum(record_version, payload) != record_digest:
            raise CorruptData(f"{where}: checksum mismatch (torn or modified data)", part="journal", index=index)
        try:
            _apply(doc, _loads(payload, where), record_version, where)
        except CorruptData as exc:
            exc.index = index
            raise
        version, tail, journal_bytes = record_version, record_digest, journal_bytes + len(payload)
    cp = _validate(task_id, doc, "journal" if records else "snapshot")
    cp.version = version
    cp.mark_loaded(tail, journal_bytes, len(body))
    return cp


def _loads(payload: bytes, where: str) -> dict[str, Any]:
    try:
        rec = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise CorruptData(f"{where} is not JSON: {type(exc).__name__}", part="journal") from None
    if not isinstance(rec, dict):
        raise CorruptData(f"{where} is not a JSON object", part="journal")
    return rec


def _apply(doc: dict[str, Any], rec: dict[str, Any], version: int, where: str) -> None:
    def bad(reason: str) -> CorruptData:
        return CorruptData(f"{where}: {reason}", part="journal")

    step = rec.get("step")
    if rec.get("v") != version or not isinstance(step, int) or isinstance(step, bool):
        raise bad("version or step field is wrong")
    problem = _out_of_range(step, rec.get("t"))
    if problem:
        raise bad(problem)
    doc["step"] = step
    doc["updated_at"] = rec.get("t")
    for name, section in (("c", "completed"), ("b", "known_bad")):
        ops = rec.get(name)
        if ops is None:
            continue
        target = doc[section]
        if not isinstance(ops, list):
            raise bad(f"{name} is not a list")
        for op in ops:
            if not isinstance(op, list) or len(op) not in (2, 3) or not isinstance(op[1], str):
                raise bad(f"malformed {section} change")
            if op[0] == "-" and len(op) == 2:
                target.pop(op[1], None)
            elif op[0] == "+" and len(op) == 3:
                target.pop(op[1], None)
                target[op[1]] = op[2]
            elif op[0] == "=" and len(op) == 3:
                target[op[1]] = op[2]
            else:
                raise bad(f"unknown {section} change {str(op[0])[:20]!r}")
    appended = rec.get("r")
    if appended is not None:
        results = doc["results"]
        if (
            not isinstance(appended, list)
            or len(appended) != 2
            or appended[0] != len(results)
            or not isinstance(appended[1], list)
        ):
            raise bad(f"results appended at the wrong place (holds {len(results)})")
        results.extend(appended[1])
    metadata = rec.get("m")
    if metadata is not None:
        doc["metadata"] = metadata


# Ranges a record must keep: JSON parses 1e999 as infinity and has no integer bound, and a
# checkpoint holding either would load as valid and break every comparison and write after.
_MAX_STEP = 2**63 - 1  # what every store (SQLite INTEGER, Redis) can hold
_MAX_TIME = 1e11  # seconds since 1970: the year 5138


def _out_of_range(step: Any, updated_at: Any) -> str | None:
    """Why a step count or timestamp is out of range (None when both are fine)."""
    if isinstance(step, int) and not isinstance(step, bool) and not 0 <= step <= _MAX_STEP:
        return "step is out of range"
    if updated_at is None:
        return None
    if isinstance(updated_at, bool) or not isinstance(updated_at, int | float):
        return "timestamp is not a number"
    if not 0.0 <= updated_at <= _MAX_TIME:  # NaN and infinities fail this too
        return "timestamp is out of range"
    return None


def _validate(task_id: str, doc: dict[str, Any], part: str) -> TaskCheckpoint:
    problem = _out_of_range(doc.get("step"), doc.get("updated_at"))
    if problem:
        raise CorruptData(f"stored data is out of range: {problem}", part=part)
    try:
        cp = TaskCheckpoint.model_validate(doc)
    except ValidationError as exc:
        raise CorruptData(
            f"stored data does not match the checkpoint schema: {exc.error_count()} error(s)", part=part
        ) from None
    except RecursionError:
        raise CorruptData("stored data is nested too deeply", part=part) from None
    if cp.task_id != task_id:
        raise CorruptData(f"body belongs to task {cp.task_id!r}")
    return cp
