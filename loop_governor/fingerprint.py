"""What "the same call" and "the same result" mean to the loop guards.

A loop rarely repeats byte for byte: a critic's verdict changes its score ("6/10", then
"7/10"), a status line its timestamp, a pager its page number while every page comes
back empty. So the guards compare

* results after the normalization error signatures use (numbers, ids, uuids,
  timestamps, quoted values, paths: :func:`loop_governor.classify.normalize_message`),
  computed in two steps because it runs on every governed call: a cheap form first
  (digits dropped, bounded length: C-speed ``bytes.translate``), and the full
  normalization only when two results have the same shape but differ in the cheap form;
* arguments after whitespace and key-order normalization, with arguments that only walk
  through a collection (``page``, ``offset``, ``cursor``...) masked: walking while the
  result stays the same is no progress.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from loop_governor.classify import normalize_message
from loop_governor.keys import call_key

# Arguments that walk through a collection: a new value is no progress by itself.
WALK_KEYS = frozenset(
    {
        "page",
        "page_number",
        "pagenumber",
        "page_no",
        "offset",
        "start",
        "skip",
        "cursor",
        "page_token",
        "pagetoken",
        "next_token",
        "nexttoken",
        "continuation",
        "after",
        "before",
        "since",
        "from",
        "limit",
        "per_page",
        "page_size",
        "pagesize",
    }
)
_WALKING = "<walk>"
_DIGITS = b"0123456789"
_BOUND = 4096  # results longer than this are compared on their head, tail and length


def result_text(result: Any) -> str | None:
    """The text a model reads from a tool result, or None when there is none to compare.

    Duck-typed so the core needs no framework: a ``str``, an object with a ``str``
    ``.content`` (a LangChain ``ToolMessage``), or a mapping with a ``"content"`` string.
    """
    if isinstance(result, str):
        return result
    content = getattr(result, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(result, dict):
        value = result.get("content")
        if isinstance(value, str):
            return value
    return None


def _bounded(text: str) -> str:
    if len(text) <= _BOUND:
        return text
    half = _BOUND // 2
    return f"{text[:half]}\x00{len(text) // 256}\x00{text[-half:]}"


class Fingerprint:
    """A result as the loop guards compare it (see the module docstring)."""

    __slots__ = ("_full", "cheap", "size", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        bounded = _bounded(text).encode("utf-8", "surrogatepass")
        stripped = bounded.translate(None, _DIGITS)
        self.cheap = hash(stripped)
        self.size = len(stripped)
        self._full: str | None = None

    @property
    def full(self) -> str:
        if self._full is None:
            text = self.text
            if len(text) <= _BOUND:
                self._full = normalize_message(text, limit=None)
            else:
                half = _BOUND // 2
                self._full = (
                    f"{normalize_message(text[:half], limit=None)}\x00{len(text) // 256}\x00"
                    f"{normalize_message(text[-half:], limit=None)}"
                )
        return self._full

    def same_as(self, other: Fingerprint, *, full: bool = True) -> bool:
        """Equal after normalization. ``full=False``: the cheap form only (numbers and
        timestamps aside), for comparisons made on every call whatever the arguments."""
        if self.cheap == other.cheap:
            return True
        if not full or abs(self.size - other.size) > max(16, self.size // 8):
            return False  # not the same shape: no normalization can make them equal
        return self.full == other.full


_SCALARS = frozenset({int, float, bool, type(None)})


def _spaced(text: str) -> str:
    """Whitespace runs collapsed (cheap checks first: tool arguments are often big)."""
    if len(text) < 64 or "  " in text or "\n" in text or "\t" in text or "\r" in text:
        return " ".join(text.split())
    return text.strip()


def _norm(value: Any, walks: list[Any], depth: int = 0) -> Any:
    kind = type(value)
    if kind is str:
        return _spaced(value)
    if kind in _SCALARS:
        return value
    if depth > 8:
        return repr(kind)
    if kind is dict or isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            name = k if type(k) is str else str(k)
            # strings and scalars inline: they are most values, and a call each adds up
            vkind = type(v)
            if vkind is str:
                normed = _spaced(v)
            elif vkind in _SCALARS:
                normed = v
            else:
                normed = _norm(v, walks, depth + 1)
            if name.lower() in WALK_KEYS:
                walks.append((name, normed))
                items.append((name, _WALKING))
            else:
                items.append((name, normed))
        items.sort()
        return tuple(items)
    if isinstance(value, (list, tuple)):
        return tuple([_norm(v, walks, depth + 1) for v in value])
    if isinstance(value, str):
        return _spaced(value)
    if isinstance(value, (int, float)):
        return value
    return repr(value)[:200]


def args_signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """``(the normalized arguments with walking ones masked, the walking values)`` as
    hashes: two calls that differ only in where they walk share the first."""
    walks: list[Any] = []
    try:
        masked = hash((_norm(args, walks), _norm(kwargs, walks) if kwargs else ()))
        return masked, hash(tuple(sorted(walks))) if walks else 0
    except Exception:  # a repr or hash that fails, keys that do not sort: the call key's
        return hash(call_key("", args, dict(kwargs))), 0  # canonical form (never raises)


def args_text(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The arguments as text, bounded (None: an argument's repr failed)."""
    try:
        return repr((args, dict(kwargs)))[:8192]
    except Exception:
        return None


def args_shape(text: str) -> int:
    """The arguments' text (:func:`args_text`) with digits dropped and whitespace
    collapsed, as one hash."""
    return hash(" ".join(text.split()).encode("utf-8", "surrogatepass").translate(None, _DIGITS))


_NUMBER = re.compile(r"\d+")
# a number that moves a window: an end of a range ("400,449p", "10:20", "5-9") or one
# that follows a word naming a position ("offset=50", "--page 3", "head -n 40", "+120")
_RANGE_END = re.compile(r"\d+\s*[,:-]\s*$")
_RANGE_START = re.compile(r"^\s*[,:-]\s*\d")
_POSITION = re.compile(
    r"(?:page|offset|start|skip|limit|cursor|from|after|before|lines?|rows?|-n|-c|\+)[\s=:'\"]*$", re.IGNORECASE
)


def walks(before: str, after: str) -> bool:
    """Whether two argument texts that differ only in numbers differ only in numbers
    that walk (a range or a position moves) -- ``sed -n '400,449p' f`` then ``'450,499p'``
    -- rather than in ones that name another thing (``file2.py``, ``user 17``)."""
    old, new = list(_NUMBER.finditer(before)), list(_NUMBER.finditer(after))
    if len(old) != len(new):
        return False
    moved = False
    for a, b in zip(old, new, strict=True):
        if a.group() == b.group():
            continue
        moved = True
        head, tail = after[max(0, b.start() - 16) : b.start()], after[b.end() : b.end() + 4]
        if not (_RANGE_END.search(head) or _RANGE_START.search(tail) or _POSITION.search(head)):
            return False
    return moved
