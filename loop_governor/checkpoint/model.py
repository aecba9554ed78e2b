"""The task checkpoint: what a crashed task needs to resume without repeating itself.

A task that dies after ten tool calls should not pay for (or repeat the side effects of)
those ten calls again. The checkpoint remembers, per call key (tool + canonical JSON
arguments), the result of every completed call and the error of every known-bad call,
plus the sub-task results accumulated so far. The governor consults it before running a
call and records into it after.

Everything stored is plain JSON (never pickle: a checkpoint is loaded from disk, and
unpickling is code execution), and every string is passed through
[`loop_governor.redaction.redact`][loop_governor.redaction.redact] before it is kept (values under secret-named keys,
``{"password": ...}``, are masked whole), so secrets never reach disk.

A save writes only what changed since the last one (see
[`loop_governor.checkpoint.journal`][loop_governor.checkpoint.journal]): ``completed``, ``known_bad`` and ``results``
are containers that record their own changes ([`loop_governor.checkpoint.tracking`][loop_governor.checkpoint.tracking]).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, field_validator

from loop_governor.checkpoint.errors import CheckpointSerializationError
from loop_governor.checkpoint.tracking import TrackedDict, TrackedList
from loop_governor.errors import GovernedError
from loop_governor.redaction import is_secret_key, mask_secret, redact

SCHEMA_VERSION = 1
"""Bumped when the stored layout changes incompatibly; newer data is refused, not guessed."""

MAX_DEPTH = 200
"""How deeply a recorded value may nest. Deeper values are refused when recorded: the
loader (pydantic's JSON validation) stops at about 250 levels, and a checkpoint that
saves but never loads again would lose the task."""

Serializer = Callable[[Any], Any]
"""Turns a non-JSON value into a JSON value (like ``json.dumps(default=...)``)."""

HASHED_KEY_PREFIX = "sha256:"
"""What a stored key starts with when it is the SHA-256 of a call key (see :func:`storage_key`)."""


def storage_key(call_key: str) -> str:
    """The key a call is stored under.

    Call keys embed the call's arguments, and arguments can carry secrets (an API key
    passed to a tool). Masking them would make two different calls collide, so a key
    that redaction would change is stored as its SHA-256 instead: still unique, still
    found again by hashing the same key, and the secret is not recoverable from it.
    """
    if redact(call_key) == call_key:
        return call_key
    return HASHED_KEY_PREFIX + hashlib.sha256(call_key.encode("utf-8", "surrogatepass")).hexdigest()


# Dict keys inside tool results repeat on every call ("hits", "title"...), and redacting
# one costs about a microsecond, so the storage keys of *short* names are memoized. Only
# short ones: an entry then holds at most ~_MEMO_ENTRY_BYTES, and the memo's size is
# bounded in bytes (an entry-bounded memo of whole strings kept every 100 KB result it
# saw: +295 MB after 3000 tasks, issue 17). Longer names, and whole values, are never
# memoized. redaction.is_secret_key memoizes every name it sees, so long names skip it.
_MEMO_NAME_MAX = 64
_MEMO_ENTRY_BYTES = 512  # two strings of <= 64 characters plus the LRU's own node and slot
_is_secret_key_uncached: Callable[[str], bool] = getattr(is_secret_key, "__wrapped__", is_secret_key)


def configure_key_memo(max_bytes: int) -> None:
    """Bound the memo of short dict keys' storage keys to about ``max_bytes`` (0: off).

    Default 2 MiB. The checkpoint model keeps no other cache: per-checkpoint state lives
    in the checkpoint object and goes with it.
    """
    global _memo_storage_key
    _memo_storage_key = lru_cache(maxsize=max(0, max_bytes) // _MEMO_ENTRY_BYTES)(storage_key)


def key_memo_bytes() -> int:
    """The most the key memo holds now (entries x the bound on an entry), in bytes."""
    return _memo_storage_key.cache_info().currsize * _MEMO_ENTRY_BYTES


def to_json_value(value: Any, serializer: Serializer | None = None, where: str = "value") -> JsonValue:
    """A detached, redacted JSON copy of ``value``; non-JSON raises a typed error.

    Stricter than ``json.dumps``: tuples, non-string dict keys and NaN/infinity are
    refused, because they would come back *different* on resume (a list, a string key,
    invalid JSON), and so is nesting deeper than [`MAX_DEPTH`][loop_governor.checkpoint.model.MAX_DEPTH]. A
    ``serializer`` is asked to convert any value that is not JSON.
    """
    try:
        return _convert(value, serializer, 0)
    except _NotJson as exc:
        raise CheckpointSerializationError(f"{where}{''.join(reversed(exc.path))}: {exc}") from None
    except RecursionError:
        raise CheckpointSerializationError(f"{where}: nested too deeply (or circular)") from None


class _NotJson(Exception):
    """Internal: a value is not JSON; ``path`` collects where it sits on the way up
    (built only on failure, so a conversion that succeeds formats no location)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.path: list[str] = []


def _convert(value: Any, serializer: Serializer | None, depth: int) -> JsonValue:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return redact(str.__str__(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
    elif isinstance(value, (dict, list)):
        if depth >= MAX_DEPTH:
            raise _NotJson(f"nested deeper than {MAX_DEPTH} levels (a checkpoint that deep could not be loaded back)")
        if isinstance(value, list):
            items: list[JsonValue] = []
            for i, item in enumerate(value):
                try:
                    items.append(_convert(item, serializer, depth + 1))
                except _NotJson as exc:
                    exc.path.append(f"[{i}]")
                    raise
            return items
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                if serializer is None:
                    raise _NotJson(
                        f"dict key {key!r} is a {type(key).__name__}, not a string; JSON would turn it into a string"
                    )
                break
            name = str.__str__(key)
            try:
                converted = _convert(item, serializer, depth + 1)
            except _NotJson as exc:
                exc.path.append(f"[{key!r}]")
                raise
            # {"password": "correct horse"}: neither string looks secret alone, and a
            # password has no shape to match, so the whole value goes.
            if len(name) <= _MEMO_NAME_MAX:
                secret, stored = is_secret_key(name), _memo_storage_key(name)
            else:
                secret, stored = _is_secret_key_uncached(name), storage_key(name)
            out[stored] = mask_secret(converted) if secret else converted
        else:
            return out
    if serializer is None:
        raise _NotJson(
            f"{type(value).__name__} is not JSON; checkpoints store JSON only "
            "(pass serializer=... to the checkpoint or the store to convert it)"
        )
    converted = serializer(value)
    if type(converted) is type(value):
        raise _NotJson(f"serializer returned a {type(value).__name__} again for {type(value).__name__}")
    return _convert(converted, serializer, depth)


_memo_storage_key = lru_cache(maxsize=(2 << 20) // _MEMO_ENTRY_BYTES)(storage_key)


class SyncState:
    """What a checkpoint object knows about its stored copy (this process only).

    ``tail`` is the checksum of the last record the store holds for this checkpoint
    (its journal's last record, or its snapshot): a store appends the changes only when
    its own tail is still that one, i.e. when the stored state is exactly the state
    these changes were made on. Anything else (never saved, loaded elsewhere, a copy)
    gets a full snapshot. The byte counts feed the compaction policy.
    """

    __slots__ = (
        "journal_bytes",
        "last_key",
        "metadata",
        "results_saved",
        "schema",
        "sections",
        "snapshot_bytes",
        "tail",
    )

    def __init__(self) -> None:
        self.tail: str | None = None
        # the very containers whose changes are tracked against the store: a section
        # swapped for another (even another checkpoint's tracked one) is saved whole
        self.sections: tuple[object, object, object] | None = None
        self.results_saved = 0
        self.metadata: bytes | None = None
        self.schema: int | None = None
        self.journal_bytes = 0
        self.snapshot_bytes = 0
        # the governor asks get_result, get_failure and record_* with one call key in a row
        self.last_key: tuple[str, str] = ("", "")

    def __reduce__(self) -> tuple[Any, ...]:
        return (SyncState, ())  # a copy is in sync with nothing


class TaskCheckpoint(BaseModel):
    """The resumable state of one task.

    ``version`` is the store's write counter for this task: ``store.load`` sets it, and
    ``store.save`` refuses (``CheckpointConflictError``) when the stored counter moved
    since, so two writers on one task never silently overwrite each other.

    Recorded values are snapshots: change one by recording it again (or assigning it),
    not by mutating it in place: a save writes the entries that changed since the last
    one, and an object changed inside is not seen as changed.
    """

    model_config = ConfigDict(extra="forbid", validate_default=True)

    task_id: str = Field(min_length=1)
    step: int = Field(default=0, ge=0)
    completed: dict[str, JsonValue] = Field(default_factory=dict)
    known_bad: dict[str, GovernedError] = Field(default_factory=dict)
    results: list[JsonValue] = Field(default_factory=list)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    version: int = Field(default=0, ge=0)
    updated_at: float | None = None
    serializer: Serializer | None = Field(default=None, exclude=True, repr=False)

    _sync: SyncState = PrivateAttr(default_factory=SyncState)

    @field_validator("task_id")
    @classmethod
    def _valid_task_id(cls, value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("task_id must be valid Unicode (no lone surrogates)") from None
        return value

    @field_validator("completed", "known_bad")
    @classmethod
    def _tracked_dict(cls, value: dict[str, Any]) -> dict[str, Any]:
        return TrackedDict(value)

    @field_validator("results")
    @classmethod
    def _tracked_list(cls, value: list[Any]) -> list[Any]:
        return TrackedList(value)

    # -- what the governor calls -------------------------------------------------------

    def record_success(self, call_key: str, result: Any) -> None:
        """Remember a completed call; raises ``CheckpointSerializationError`` if not JSON.

        The stored copy is detached from ``result`` (later mutation of the tool's return
        value does not change the checkpoint) and redacted.
        """
        key = self._storage_key(call_key)
        value = to_json_value(result, self.serializer, f"result of {call_key!r}")
        _put(self.completed, key, value)
        if key in self.known_bad:
            self.known_bad.pop(key, None)

    def record_failure(self, call_key: str, error: GovernedError | Mapping[str, Any]) -> None:
        """Remember a known-bad call (permanent failure) and the error the model saw."""
        info = error if isinstance(error, GovernedError) else GovernedError.model_validate(dict(error))
        _put(self.known_bad, self._storage_key(call_key), info)

    def add_result(self, obj: Any) -> None:
        """Append a sub-task result (JSON, redacted, detached)."""
        value = to_json_value(obj, self.serializer, f"results[{len(self.results)}]")
        results = self.results
        if isinstance(results, TrackedList):
            results.append_converted(value)
        else:
            results.append(value)

    def get_result(self, call_key: str) -> tuple[bool, JsonValue]:
        """``(True, result)`` if the call completed before, else ``(False, None)``.

        A pair, because ``None`` is a legitimate stored result.
        """
        key = self._storage_key(call_key)
        if key in self.completed:
            return True, self.completed[key]
        return False, None

    def get_failure(self, call_key: str) -> GovernedError | None:
        """The stored error of a known-bad call, or ``None``."""
        return self.known_bad.get(self._storage_key(call_key))

    def _storage_key(self, call_key: str) -> str:
        sync = self.sync_state()
        last = sync.last_key
        if last[0] == call_key and last[1]:
            return last[1]
        key = storage_key(call_key)
        sync.last_key = (call_key, key)
        return key

    # -- what the stores call ------------------------------------------------------------

    def sync_state(self) -> SyncState:
        """This object's knowledge of its stored copy (stores read and update it)."""
        # Private attributes are looked up through BaseModel.__getattr__ (~2 us, on
        # every save); their dict is direct.
        private = self.__pydantic_private__
        sync = None if private is None else private.get("_sync")
        if sync is None:  # built without pydantic's init (model_construct): start afresh
            sync = SyncState()
            if private is not None:
                private["_sync"] = sync
            else:
                object.__setattr__(self, "__pydantic_private__", {"_sync": sync})
        return sync

    def sections(self) -> tuple[dict[str, JsonValue], dict[str, GovernedError], list[JsonValue]]:
        """``completed``, ``known_bad`` and ``results``, the containers a save tracks."""
        return self.completed, self.known_bad, self.results

    def encode_body(self, updated_at: float | None, serializer: Serializer | None = None) -> bytes:
        """The whole checkpoint as the JSON body stores write (ASCII bytes): redacted,
        validated, no ``version``."""
        return b"".join(self.encode_parts(updated_at, serializer))

    def encode_parts(
        self, updated_at: float | None, serializer: Serializer | None = None, *, results_end: int | None = None
    ) -> list[bytes]:
        """[`encode_body`][loop_governor.checkpoint.model.TaskCheckpoint.encode_body] as a list of byte strings, for
        stores that write them without joining (``writev``).

        ``version`` lives in each store's envelope (file header, SQL column, Redis
        field) because the store, not the writer, decides it. Values recorded through
        ``record_*``/``add_result`` were converted when recorded and are only
        serialized; values put in directly are converted (checked, redacted) here.
        ``results_end`` stops ``results`` there (a store's save: see ``PendingSave``).
        """
        ser = self.serializer or serializer
        completed, raw_completed = _section_snapshot(self.completed)
        known_bad, raw_known_bad = _section_snapshot(self.known_bad)
        if isinstance(self.results, TrackedList):
            results, raw_results = self.results.snapshot()
        else:
            results, raw_results = list(self.results), None
        if results_end is not None:
            del results[results_end:]
        parts = [
            b'{"schema_version":%d,"task_id":%s,"step":%d,"updated_at":%s,"completed":{'
            % (self.schema_version, dump(self.task_id), self.step, dump(updated_at)),
            b",".join(
                [pair(entry(key, value, key in raw_completed, ser, "completed")) for key, value in completed.items()]
            ),
            b'},"known_bad":{',
            b",".join([pair(error_entry(key, value, key in raw_known_bad)) for key, value in known_bad.items()]),
            b'},"results":[',
            b",".join(
                [
                    item(value, raw_results is None or i in raw_results, ser, f"results[{i}]")
                    for i, value in enumerate(results)
                ]
            ),
            b'],"metadata":',
            self.encode_metadata(ser),
            b"}",
        ]
        return parts

    def encode_metadata(self, serializer: Serializer | None = None) -> bytes:
        """``metadata`` as JSON: small and edited in place, so converted on every save."""
        return dump(to_json_value(self.metadata, self.serializer or serializer, "metadata"))

    def mark_loaded(self, tail: str, journal_bytes: int, snapshot_bytes: int) -> None:
        """Called by a store on a checkpoint it just loaded: in sync with ``tail``."""
        for section in (self.completed, self.known_bad, self.results):
            if isinstance(section, (TrackedDict, TrackedList)):
                section.mark_converted()
        sync = self.sync_state()
        sync.tail = tail
        sync.sections = self.sections()
        sync.results_saved = len(self.results)
        sync.metadata = None
        sync.schema = self.schema_version
        sync.journal_bytes = journal_bytes
        sync.snapshot_bytes = snapshot_bytes


def _put(section: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(section, TrackedDict):
        section.put_converted(key, value)
    else:
        section[key] = value


def _section_snapshot(section: dict[str, Any]) -> tuple[dict[str, Any], set[str] | _All]:
    if isinstance(section, TrackedDict):
        return section.snapshot()
    return dict(section), _ALL


class _All:
    """Contains everything: an untracked section, all of whose values must be converted."""

    def __contains__(self, item: object) -> bool:
        return True


_ALL = _All()

# ensure_ascii (the default) keeps bodies pure ASCII: any str, even one with lone
# surrogates, encodes without error and decodes back identically; and no raw newline
# ever appears (the file journal frames one record per line). One encoder instance:
# json.dumps with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dump(value: Any) -> bytes:
    """Compact ASCII JSON of an already-JSON value."""
    return _ENCODER.encode(value).encode("ascii")


def item(value: Any, raw: bool, serializer: Serializer | None, where: str) -> bytes:
    """One value as JSON, converted first if it was put in directly."""
    return dump(to_json_value(value, serializer, where) if raw else value)


def entry(key: str, value: Any, raw: bool, serializer: Serializer | None, section: str) -> tuple[bytes, bytes]:
    """One ``completed`` entry as ``(key JSON, value JSON)``, converted if put in directly."""
    if raw:
        return dump(storage_key(key)), dump(to_json_value(value, serializer, f"{section}[{key!r}]"))
    return dump(key), dump(value)


def error_doc(value: Any, where: str) -> JsonValue:
    """A known-bad entry's error as stored JSON (redacted)."""
    if isinstance(value, Mapping):
        value = GovernedError.model_validate(dict(value))
    if not isinstance(value, GovernedError):
        raise CheckpointSerializationError(f"{where}: {type(value).__name__} is not a GovernedError")
    return to_json_value(value.model_dump(mode="json", exclude_none=True), None, where)


def error_entry(key: str, value: Any, raw_key: bool) -> tuple[bytes, bytes]:
    """One ``known_bad`` entry as ``(key JSON, error JSON)`` (errors are always
    converted: they are few and small)."""
    name = storage_key(key) if raw_key else key
    return dump(name), dump(error_doc(value, f"known_bad[{key!r}]"))


def pair(kv: tuple[bytes, bytes]) -> bytes:
    """``"key":value``."""
    return kv[0] + b":" + kv[1]
