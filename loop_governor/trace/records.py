"""Turning event dicts into redacted, JSON-safe trace records and content-addressed messages.

Why a module of its own: the same canonical form is used for three things that must agree
byte for byte — the hash that names a message in the snapshot store, the snapshot line
itself, and the prefix comparison the cache detector makes between consecutive model
calls. Redaction happens here, before anything is hashed or written, so a secret never
reaches the trace file, the snapshot store or an OTLP backend.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from loop_governor.redaction import MAX_DEPTH, TOO_DEEP, TextMemo, is_secret_key, mask_secret
from loop_governor.trace.budget import BoundedMemo, MiB

# Top-level record fields whose values are closed vocabularies written by the governor or
# the adapters (event names, states, enum values): they cannot carry a secret, and skipping
# them keeps the per-record redaction cost down (redaction is ~11 regex passes per string).
# Only at the top level: the same names inside tool arguments or messages are user data.
_SAFE_KEYS = frozenset(
    {
        "event",
        "status",
        "error_type",
        "from_state",
        "to_state",
        "finish_reason",
        "kind",
        "role",
        "tool",
        "message_hashes",  # hex digests of already-redacted messages
    }
)

_SCALARS = frozenset({int, float, bool})

# Hex digits kept from sha256: 128 bits is far beyond any trace's collision risk and halves
# the size of the hash lists every model-call record carries.
HASH_CHARS = 32


def canonical_json(value: Any) -> str:
    """Stable JSON text of ``value``: sorted keys, no whitespace, unknown types as str."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


class Redactor:
    """Redacts every string leaf of a JSON-like value, memoizing repeated short strings.

    Tool names, task ids and error signatures repeat on every event; the memo turns their
    redaction into a dict lookup. Bounded in bytes (``budget``): when full it starts over,
    which costs one redaction per string and keeps the hit path a plain ``dict.get``.
    """

    def __init__(self, budget: int = 1 * MiB) -> None:
        # longer strings rarely repeat; they are redacted each time
        self.text = TextMemo(budget, max_chars=256)

    @property
    def bytes(self) -> int:
        """Estimated bytes the memo holds (<= the budget)."""
        return self.text.bytes

    def record(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """A redacted copy of a flat event record (the hot case: mostly scalars).

        ``_SAFE_KEYS`` are trusted only here, as top-level fields the governor writes; the
        same names inside a nested value (tool arguments, messages) are redacted.
        """
        out: dict[str, Any] = {}
        for key, value in record.items():
            if value is None or key in _SAFE_KEYS or type(value) in _SCALARS:
                out[key] = value
            else:
                out[key] = self.value(value, key)
        return out

    def value(self, value: Any, key: str | None = None, depth: int = MAX_DEPTH) -> Any:
        """A redacted copy of ``value``; ``key`` is the dict key it sits under, if any.
        Containers nested deeper than ``MAX_DEPTH`` (or a cycle) become ``TOO_DEEP``."""
        if key is not None and is_secret_key(key):
            return self._masked(value, depth)
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, (Mapping, list, tuple)) and depth <= 0:
            return TOO_DEEP
        if isinstance(value, Mapping):
            return {str(k): self.value(v, str(k), depth - 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, None, depth - 1) for v in value]
        return self.text(str(value))

    def _masked(self, value: Any, depth: int) -> Any:
        """A value under a secret-named key (``{"password": ...}``): every string masked whole."""
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, (Mapping, list, tuple)) and depth <= 0:
            return TOO_DEEP
        if isinstance(value, Mapping):
            return {str(k): self._masked(v, depth - 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._masked(v, depth - 1) for v in value]
        return mask_secret(value if isinstance(value, str) else str(value))  # text, masked whole


class MessageHasher:
    """Names each message by the hash of its redacted canonical JSON.

    A conversation re-sends its whole prefix every turn, so the memo (keyed by the raw
    canonical text) makes hashing a turn cost O(new messages) in redaction work. Bounded in
    bytes, not entries (``budget``): 8192 memoized 100 KB messages would be 800 MB; a
    message evicted and seen again is redacted and hashed again, to the same hash.
    """

    def __init__(self, redactor: Redactor, budget: int = 8 * MiB) -> None:
        self._redactor = redactor
        self._memo: BoundedMemo[str, tuple[str, Any]] = BoundedMemo(budget)

    @property
    def memo(self) -> BoundedMemo[str, tuple[str, Any]]:
        return self._memo

    def digest(self, message: Any) -> tuple[str, Any]:
        """Return ``(hash, redacted message)`` for one message."""
        raw = canonical_json(message)
        hit = self._memo.get(raw)
        if hit is not None:
            return hit
        redacted = self._redactor.value(message)
        digest = hashlib.sha256(canonical_json(redacted).encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
        out = (digest, redacted)
        # The key, and the redacted copy (its strings are new when redaction changed them,
        # and kept alive by the memo either way): twice the raw text, plus the entry.
        self._memo.put(raw, out, 2 * sys.getsizeof(raw) + 200)
        return out


def attribute_value(value: Any) -> str | bool | int | float | list[str] | None:
    """Coerce a record field into something an OpenTelemetry attribute accepts."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    return canonical_json(value)
