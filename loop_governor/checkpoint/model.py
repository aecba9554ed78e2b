"""The task checkpoint: what a crashed task needs to resume without repeating itself.

A task that dies after ten tool calls should not pay for (or repeat the side effects of)
those ten calls again. The checkpoint remembers, per call key (tool + canonical JSON
arguments), the result of every completed call and the error of every known-bad call,
plus the sub-task results accumulated so far. The governor consults it before running a
call and records into it after.

Everything stored is plain JSON (never pickle: a checkpoint is loaded from disk, and
unpickling is code execution), and every string is passed through
:func:`loop_governor.redaction.redact` before it is kept (values under secret-named keys,
``{"password": ...}``, are masked whole), so secrets never reach disk.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, field_validator

from loop_governor.checkpoint.errors import CheckpointSerializationError
from loop_governor.errors import GovernedError
from loop_governor.redaction import is_secret_key, mask_secret, redact

SCHEMA_VERSION = 1
"""Bumped when the stored layout changes incompatibly; newer data is refused, not guessed."""

Serializer = Callable[[Any], Any]
"""Turns a non-JSON value into a JSON value (like ``json.dumps(default=...)``)."""

_HASHED_KEY_PREFIX = "sha256:"


@lru_cache(maxsize=8192)
def _redact_cached(text: str) -> str:
    # A checkpoint is rewritten whole on every save, so the same strings are redacted
    # again and again; ``str`` caches its hash, which makes this lookup O(1) for them.
    return redact(text)


def storage_key(call_key: str) -> str:
    """The key a call is stored under.

    Call keys embed the call's arguments, and arguments can carry secrets (an API key
    passed to a tool). Masking them would make two different calls collide, so a key
    that redaction would change is stored as its SHA-256 instead: still unique, still
    found again by hashing the same key, and the secret is not recoverable from it.
    """
    if _redact_cached(call_key) == call_key:
        return call_key
    return _HASHED_KEY_PREFIX + hashlib.sha256(call_key.encode("utf-8", "surrogatepass")).hexdigest()


def to_json_value(value: Any, serializer: Serializer | None = None, where: str = "value") -> JsonValue:
    """A detached, redacted JSON copy of ``value``; non-JSON raises a typed error.

    Stricter than ``json.dumps``: tuples, non-string dict keys and NaN/infinity are
    refused, because they would come back *different* on resume (a list, a string key,
    invalid JSON). A ``serializer`` is asked to convert any value that is not JSON.
    """
    try:
        return _convert(value, serializer, where)
    except RecursionError:
        raise CheckpointSerializationError(f"{where}: nested too deeply (or circular)") from None


def _convert(value: Any, serializer: Serializer | None, where: str) -> JsonValue:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _redact_cached(str.__str__(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return float(value)
    elif isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                if serializer is None:
                    raise CheckpointSerializationError(
                        f"{where}: dict key {key!r} is a {type(key).__name__}, not a string; "
                        "JSON would turn it into a string"
                    )
                break
            name = str.__str__(key)
            converted = _convert(item, serializer, f"{where}[{key!r}]")
            # {"password": "correct horse"}: neither string looks secret alone, and a
            # password has no shape to match, so the whole value goes.
            out[storage_key(name)] = mask_secret(converted) if is_secret_key(name) else converted
        else:
            return out
    elif isinstance(value, list):
        return [_convert(item, serializer, f"{where}[{i}]") for i, item in enumerate(value)]
    if serializer is None:
        raise CheckpointSerializationError(
            f"{where}: {type(value).__name__} is not JSON; checkpoints store JSON only "
            "(pass serializer=... to the checkpoint or the store to convert it)"
        )
    converted = serializer(value)
    if type(converted) is type(value):
        raise CheckpointSerializationError(
            f"{where}: serializer returned a {type(value).__name__} again for {type(value).__name__}"
        )
    return _convert(converted, serializer, where)


class TaskCheckpoint(BaseModel):
    """The resumable state of one task.

    ``version`` is the store's write counter for this task: ``store.load`` sets it, and
    ``store.save`` refuses (``CheckpointConflictError``) when the stored counter moved
    since, so two writers on one task never silently overwrite each other.

    Recorded values are snapshots: change one by recording it again, not by mutating
    it in place (saves reuse the encoding of values they have seen, by identity).
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

    # completed, known_bad, results
    _sections: tuple[_Section, _Section, _Section] = PrivateAttr(default_factory=lambda: _new_sections())

    @field_validator("task_id")
    @classmethod
    def _valid_task_id(cls, value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("task_id must be valid Unicode (no lone surrogates)") from None
        return value

    # -- what the governor calls -------------------------------------------------------

    def record_success(self, call_key: str, result: Any) -> None:
        """Remember a completed call; raises ``CheckpointSerializationError`` if not JSON.

        The stored copy is detached from ``result`` (later mutation of the tool's return
        value does not change the checkpoint) and redacted.
        """
        key = storage_key(call_key)
        self.completed[key] = to_json_value(result, self.serializer, f"result of {call_key!r}")
        self.known_bad.pop(key, None)

    def record_failure(self, call_key: str, error: GovernedError | Mapping[str, Any]) -> None:
        """Remember a known-bad call (permanent failure) and the error the model saw."""
        info = error if isinstance(error, GovernedError) else GovernedError.model_validate(dict(error))
        self.known_bad[storage_key(call_key)] = info

    def add_result(self, obj: Any) -> None:
        """Append a sub-task result (JSON, redacted, detached)."""
        self.results.append(to_json_value(obj, self.serializer, f"results[{len(self.results)}]"))

    def get_result(self, call_key: str) -> tuple[bool, JsonValue]:
        """``(True, result)`` if the call completed before, else ``(False, None)``.

        A pair, because ``None`` is a legitimate stored result.
        """
        key = storage_key(call_key)
        if key in self.completed:
            return True, self.completed[key]
        return False, None

    def get_failure(self, call_key: str) -> GovernedError | None:
        """The stored error of a known-bad call, or ``None``."""
        return self.known_bad.get(storage_key(call_key))

    # -- what the stores call ------------------------------------------------------------

    def _encoded_sections(self) -> tuple[_Section, _Section, _Section]:
        # Private attributes are looked up through BaseModel.__getattr__ (~2 us, on
        # every save); their dict is direct.
        private = self.__pydantic_private__
        sections = None if private is None else private.get("_sections")
        if sections is None:  # built without pydantic's init (e.g. an old pickle): start afresh
            sections = _new_sections()
            if private is not None:
                private["_sections"] = sections
        return sections

    def encode_body(self, updated_at: float | None, serializer: Serializer | None = None) -> bytes:
        """The JSON body stores write (ASCII bytes): redacted, validated, no ``version``."""
        return b"".join(self.encode_parts(updated_at, serializer))

    def encode_parts(self, updated_at: float | None, serializer: Serializer | None = None) -> list[bytes]:
        """The JSON body as a short list of byte strings whose concatenation is the body.

        ``version`` lives in each store's envelope (file header, SQL column, Redis
        field) because the store, not the writer, decides it.

        A task saves after every call, and re-encoding hundreds of unchanged results
        each time would cost more than the fsync. So each section (``completed``,
        ``known_bad``, ``results``) keeps its encoded bytes and is reused while it only
        grew: then only the new entries are encoded. Entries are matched by identity,
        so replacing a value (``record_success`` again, or assigning a new object)
        re-encodes it; values are snapshots and must not be mutated in place after
        they were recorded. Only ``metadata``, small and edited in place, is encoded
        every time.
        """
        ser = self.serializer or serializer
        completed_section, known_bad_section, results_section = self._encoded_sections()
        # Each section is copied in one C-level step before it is read, so a thread
        # editing the checkpoint meanwhile cannot pair one state's keys with another's
        # values (a dict copy is also cheaper than building an item tuple per entry).
        completed_copy, known_bad_copy = self.completed.copy(), self.known_bad.copy()
        completed = completed_section.encode(
            tuple(completed_copy), tuple(completed_copy.values()), ser, "completed", _plain
        )
        known_bad = known_bad_section.encode(
            tuple(known_bad_copy), tuple(known_bad_copy.values()), None, "known_bad", _error_doc
        )
        results = results_section.encode(None, tuple(self.results), ser, "results", _plain)
        return [
            b'{"schema_version":%d,"task_id":%s,"step":%d,"updated_at":%s,"completed":{'
            % (
                self.schema_version,
                _dump(self.task_id),
                self.step,
                _dump(updated_at),
            ),
            completed,
            b'},"known_bad":{',
            known_bad,
            b'},"results":[',
            results,
            b'],"metadata":',
            _dump(to_json_value(self.metadata, ser, "metadata")),
            b"}",
        ]


# ensure_ascii (the default) keeps bodies pure ASCII: any str, even one with lone
# surrogates, encodes without error and decodes back identically. One encoder instance:
# json.dumps with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _dump(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("ascii")


def _plain(value: Any, serializer: Serializer | None, where: str) -> JsonValue:
    return to_json_value(value, serializer, where)


def _error_doc(value: Any, serializer: Serializer | None, where: str) -> JsonValue:
    return to_json_value(value.model_dump(mode="json", exclude_none=True), None, where)


class _Section:
    """The encoded bytes of one checkpoint section, reused while the section only grows.

    Written by hand because no serializer caches by identity: a save compares the
    section's keys and values with those it last encoded (C-speed tuple comparisons,
    values by identity) and encodes only entries appended since. Holding the values
    (not their ``id``) keeps a recycled id from matching a different object. A section
    changed anywhere else is rebuilt from the per-entry fragment cache, so only the
    changed entries are encoded again. Keys, values and bytes are one tuple, read and
    replaced whole, so concurrent saves of one checkpoint never mix states.
    """

    __slots__ = ("cache", "state")

    def __init__(self) -> None:
        self.state: tuple[tuple[str, ...] | None, tuple[object, ...], bytes] = (None, (), b"")
        # entry key (dict key, or list index) -> (value, fragment)
        self.cache: dict[str | int, tuple[object, bytes]] = {}

    def encode(
        self,
        keys: tuple[str, ...] | None,
        values: tuple[object, ...],
        serializer: Serializer | None,
        section: str,
        convert: Callable[[Any, Serializer | None, str], JsonValue],
    ) -> bytes:
        """The comma-joined entries: ``"key":value`` pairs, or list items when ``keys`` is None."""
        cached_keys, cached_values, data = self.state
        n = len(cached_values)
        if (
            len(values) >= n
            and (keys is None or keys[:n] == cached_keys or n == 0)
            and all(map(operator.is_, values, cached_values))
        ):
            if len(values) == n:
                return data
            start, head = n, [data] if n else []
        else:
            start, head = 0, []
        entry_keys: Sequence[str | int] = range(len(values)) if keys is None else keys
        new = [
            self._entry(entry_keys[i], values[i], keys is not None, serializer, section, convert)
            for i in range(start, len(values))
        ]
        cache = self.cache
        if start == 0 and len(cache) > len(values):  # drop fragments of removed entries
            for key in cache.keys() - set(entry_keys):
                cache.pop(key, None)
        data = b",".join(head + new)
        self.state = (keys, values, data)
        return data

    def _entry(
        self,
        key: str | int,
        value: Any,
        keyed: bool,
        serializer: Serializer | None,
        section: str,
        convert: Callable[[Any, Serializer | None, str], JsonValue],
    ) -> bytes:
        """One entry's fragment, from the cache when the value is the same object."""
        hit = self.cache.get(key)
        if hit is not None and hit[0] is value:
            return hit[1]
        encoded = _dump(convert(value, serializer, f"{section}[{key!r}]"))
        frag = _dump(storage_key(str(key))) + b":" + encoded if keyed else encoded
        self.cache[key] = (value, frag)
        return frag


def _new_sections() -> tuple[_Section, _Section, _Section]:
    """Encoding state for ``completed``, ``known_bad`` and ``results``."""
    return _Section(), _Section(), _Section()
