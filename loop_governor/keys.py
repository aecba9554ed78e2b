"""Call keys: "this tool with these arguments" as a short, stable string.

Known-bad memory and checkpoints key on it, so two different calls must never share a
key and the same call must get the same key in every process.

Equal means equal to the tool: values that compare equal and that a tool is handed as the
same JSON get one key. So ``-0.0`` keys as ``0.0`` (``0.0 == -0.0``, and no tool answers
a negative zero differently), while ``1``, ``1.0`` and ``True`` stay three keys (a tool
reads ``1``, ``1.0`` and ``true``).

Arguments ``json`` cannot encode with sorted keys -- dict keys that are tuples, or ints and
strings mixed, a structure nested deeper than the interpreter's recursion limit, a cycle --
get a key from [`_fallback_text`][loop_governor.keys._fallback_text], an explicit-stack encoder written here because no
library encodes such values canonically (``json`` recurses and sorts keys by comparing
them; ``pickle`` is neither canonical nor allowed). A governed call never fails on its
own key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import threading
import weakref
from collections.abc import Mapping
from typing import Any

_OPAQUE_IDS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_OPAQUE_COUNTER = itertools.count()
_OPAQUE_LOCK = threading.Lock()

_COMPACT = (",", ":")
_SPACED = (", ", ": ")  # json.dumps' default, which set members have always been keyed with
# A fallback key's text starts with this: JSON text never does, so a value keyed by the
# fallback can never share a key with one keyed by ``json``.
_FALLBACK = "\x00fallback:"


def _opaque(value: Any) -> dict[str, Any]:
    """Nothing stable to say: the object's identity, so different objects never share a
    key (in another process the call simply runs again, which is safe)."""
    try:
        with _OPAQUE_LOCK:
            serial = _OPAQUE_IDS.setdefault(value, next(_OPAQUE_COUNTER))
    except TypeError:  # not weak-referenceable
        serial = id(value)
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}", "serial": serial}


def model_json(value: Any) -> Any:
    """A pydantic model's JSON form (``model_dump(mode="json")``), or None when ``value`` is
    no model or its dump fails."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:
            pass
    return None


def _canonical(value: Any) -> Any:
    """JSON for an argument ``json`` can't encode, stable for equal values.

    Never ``repr``: reprs abbreviate (large arrays print ``...``) and vary between
    processes (set order), so two different calls could share a key and one would get
    the other's known-bad error or checkpointed result.
    """
    dumped = model_json(value)
    if dumped is not None:
        return dumped
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(_dumps(v, _SPACED) for v in value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes_sha256": hashlib.sha256(bytes(value)).hexdigest()}
    tolist = getattr(value, "tolist", None)  # numpy / array-likes, in full
    if callable(tolist):
        try:
            return {"array": tolist()}
        except Exception:
            pass
    return _opaque(value)


def _unsigned_zeros(value: Any) -> Any:
    """``value`` with every ``-0.0`` (a dict key too) made ``0.0``; the rest as it is."""
    if type(value) is float:
        return 0.0 if value == 0.0 else value
    if isinstance(value, Mapping):
        return {_unsigned_zeros(k): _unsigned_zeros(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_unsigned_zeros(v) for v in value]
    return value


def _canonical_unsigned(value: Any) -> Any:
    return _unsigned_zeros(_canonical(value))


def _dumps(value: Any, separators: tuple[str, str]) -> str:
    """The canonical JSON text of ``value`` (raises what ``json`` raises on odd shapes)."""
    text = json.dumps(value, sort_keys=True, separators=separators, default=_canonical)
    if "-0.0" in text:  # rare (a negative zero, or just "-0.0..." in a number or string)
        text = json.dumps(_unsigned_zeros(value), sort_keys=True, separators=separators, default=_canonical_unsigned)
    return text


def _scalar_text(value: Any) -> str | None:
    """A scalar's JSON text (``-0.0`` as ``0.0``), or None for anything else."""
    if value is None or isinstance(value, (bool, int, str)):
        try:
            return json.dumps(value)
        except ValueError:  # an int past Python's decimal-conversion limit (4,300 digits): hex has none
            return json.dumps(f"int:{value:#x}")
    if isinstance(value, float):
        return json.dumps(0.0 if value == 0.0 else float(value))
    return None


def _stand_in(value: Any) -> Any:
    """What the fallback encodes for a value that is no dict, list, tuple or scalar: a
    dataclass's fields one level at a time (``asdict`` recurses), else [`_canonical`][loop_governor.keys._canonical]."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"dataclass": {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    try:
        return _canonical(value)
    except Exception:  # a set of unorderable or too-deep members, a failing asdict
        if isinstance(value, (set, frozenset)):
            return {"set": sorted(_fallback_text(v) for v in value)}
        return _opaque(value)


def _fallback_text(value: Any) -> str:
    """A canonical text of any value, at any depth, without recursion.

    Like the JSON text, with three differences that keep it injective where JSON is not
    defined: dict keys are encoded values (``1`` and ``"1"`` differ, a tuple key is a list),
    entries are ordered by their encoded key, and a reference back to a container still
    being encoded is written ``<cycle N>`` (N: how many levels up)."""
    out: list[str] = []
    path: list[int] = []  # ids of the containers being encoded, outermost first
    # work items, last first: ("v", value) encodes a value, ("s", text) writes text,
    # ("pop", None) leaves the innermost container
    work: list[tuple[str, Any]] = [("v", value)]
    while work:
        kind, item = work.pop()
        if kind == "s":
            out.append(item)
            continue
        if kind == "pop":
            path.pop()
            continue
        text = _scalar_text(item)
        if text is not None:
            out.append(text)
            continue
        if not isinstance(item, (Mapping, list, tuple)):
            stand_in = _stand_in(item)
            if isinstance(stand_in, (Mapping, list, tuple)) or _scalar_text(stand_in) is not None:
                work.append(("v", stand_in))
            else:
                out.append(json.dumps(str(stand_in)))
            continue
        if id(item) in path:
            out.append(f"<cycle {len(path) - path.index(id(item))}>")
            continue
        path.append(id(item))
        work.append(("pop", None))
        if isinstance(item, Mapping):
            entries = sorted(((_fallback_text(k), v) for k, v in item.items()), key=lambda entry: entry[0])
            work.append(("s", "}"))
            for i, (key_text, v) in enumerate(reversed(entries)):
                work.append(("v", v))
                work.append(("s", f"{',' if i < len(entries) - 1 else ''}{key_text}:"))
            work.append(("s", "{"))
        else:
            items = list(item)
            work.append(("s", "]"))
            for i, v in enumerate(reversed(items)):
                work.append(("v", v))
                if i < len(items) - 1:
                    work.append(("s", ","))
            work.append(("s", "["))
    return "".join(out)


def call_key(tool: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> str:
    """A stable key for "this tool with these arguments": tool + digest of canonical JSON
    (of the fallback text for arguments JSON cannot encode canonically; see the module
    docstring)."""
    value = [list(args), kwargs or {}]
    try:
        payload = _dumps(value, _COMPACT)
    except Exception:  # TypeError (tuple or mixed keys), RecursionError, ValueError (a cycle)...
        payload = _FALLBACK + _fallback_text(value)
    return f"{tool}:{hashlib.sha256(payload.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"
