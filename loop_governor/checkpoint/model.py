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
from collections.abc import Callable, Mapping
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
    _sections: tuple[_Section, _Section, _Section] = PrivateAttr(
        default_factory=lambda: (_Section(keyed=True), _Section(keyed=True), _Section(keyed=False))
    )

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
        # Private attributes are looked up through BaseModel.__getattr__ (~2 us, on
        # every save); their dict is direct.
        private = self.__pydantic_private__
        assert private is not None  # pydantic sets it on every model with private attributes
        completed_section, known_bad_section, results_section = private["_sections"]
        completed = completed_section.encode(
            tuple(self.completed), tuple(self.completed.values()), ser, "completed", _plain
        )
        known_bad = known_bad_section.encode(
            tuple(self.known_bad), tuple(self.known_bad.values()), None, "known_bad", _error_doc
        )
        results = results_section.encode((), tuple(self.results), ser, "results", _plain)
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

    Written by hand because no serializer caches by identity: a save checks the cached
    keys and values (C-speed tuple comparisons, ~5 ns an entry) and encodes only
    entries appended since. Holding the values (not their ``id``) keeps a recycled id
    from matching a different object. A section changed anywhere else is rebuilt from
    the per-entry fragment cache, so only the changed entries are encoded again.
    """

    __slots__ = ("cache", "data", "keys", "values")

    def __init__(self, *, keyed: bool) -> None:
        self.keys: tuple[str, ...] = ()
        self.values: tuple[object, ...] = ()
        self.data = b""
        # A keyed section's "key":value fragments by key; a list section has none.
        self.cache: dict[str, tuple[object, bytes]] | None = {} if keyed else None

    def encode(
        self,
        keys: tuple[str, ...],
        values: tuple[object, ...],
        serializer: Serializer | None,
        section: str,
        convert: Callable[[Any, Serializer | None, str], JsonValue],
    ) -> bytes:
        """The comma-joined entries (``"key":value`` when keyed, else list items)."""
        cache = self.cache
        n = len(self.values)
        if len(values) >= n and keys[:n] == self.keys and all(map(operator.is_, values, self.values)):
            if len(values) == n:
                return self.data
            start, head = n, [self.data] if n else []
        else:
            start, head = 0, []
        if cache is None:
            new = [_dump(convert(v, serializer, f"{section}[{i}]")) for i, v in enumerate(values[start:], start)]
        else:
            new = [
                _entry(k, v, cache, serializer, section, convert)
                for k, v in zip(keys[start:], values[start:], strict=True)
            ]
            if start == 0 and len(cache) > len(keys):  # drop fragments of removed keys
                for key in cache.keys() - set(keys):
                    del cache[key]
        self.keys, self.values, self.data = keys, values, b",".join(head + new)
        return self.data


def _entry(
    key: str,
    value: Any,
    cache: dict[str, tuple[object, bytes]],
    serializer: Serializer | None,
    section: str,
    convert: Callable[[Any, Serializer | None, str], JsonValue],
) -> bytes:
    """One ``"key":value`` fragment, from ``cache`` when the value is the same object."""
    hit = cache.get(key)
    if hit is not None and hit[0] is value:
        return hit[1]
    frag = _dump(storage_key(key)) + b":" + _dump(convert(value, serializer, f"{section}[{key!r}]"))
    cache[key] = (value, frag)
    return frag
