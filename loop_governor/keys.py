"""Call keys: "this tool with these arguments" as a short, stable string.

Known-bad memory and checkpoints key on it, so two different calls must never share a
key and the same call must get the same key in every process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import threading
import weakref
from typing import Any

_OPAQUE_IDS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_OPAQUE_COUNTER = itertools.count()
_OPAQUE_LOCK = threading.Lock()


def _canonical(value: Any) -> Any:
    """JSON for an argument ``json`` can't encode, stable for equal values.

    Never ``repr``: reprs abbreviate (large arrays print ``...``) and vary between
    processes (set order), so two different calls could share a key and one would get
    the other's known-bad error or checkpointed result.
    """
    dump = getattr(value, "model_dump", None)  # pydantic models
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(v, sort_keys=True, default=_canonical) for v in value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes_sha256": hashlib.sha256(bytes(value)).hexdigest()}
    tolist = getattr(value, "tolist", None)  # numpy / array-likes, in full
    if callable(tolist):
        try:
            return {"array": tolist()}
        except Exception:
            pass
    # Nothing stable to say: the object's identity, so different objects never share a
    # key (in another process the call simply runs again, which is safe).
    try:
        with _OPAQUE_LOCK:
            serial = _OPAQUE_IDS.setdefault(value, next(_OPAQUE_COUNTER))
    except TypeError:  # not weak-referenceable
        serial = id(value)
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}", "serial": serial}


def call_key(tool: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> str:
    """A stable key for "this tool with these arguments": tool + digest of canonical JSON."""
    payload = json.dumps([list(args), kwargs or {}], sort_keys=True, separators=(",", ":"), default=_canonical)
    return f"{tool}:{hashlib.sha256(payload.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"
