"""Containers that remember what changed in a checkpoint since it was last saved.

A task saves its checkpoint after every call, and the save should write what changed
(one journal record), not the whole task again. Finding the change by comparing the
checkpoint with what was saved would cost O(task) per save, so ``completed``,
``known_bad`` and ``results`` record their changes as they happen instead. Hand-written
because no library tracks dict and list mutations in the form a replay needs: per key,
whether it was inserted at the end, replaced in place or removed, so that replaying the
changes on the stored state rebuilds the same keys *in the same order*.

Every mutator is overridden (``dict.update`` and friends do not go through
``__setitem__``), each under a lock, so a save taking the changes never misses one made
by another thread at the same moment. Copies (``copy.copy``, ``copy.deepcopy``,
``model_copy``) are tracked containers with everything marked unconverted: a copy knows
nothing about any store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

ADD, SET, DEL = 0, 1, 2
"""A key (re)inserted at the end, replaced in place, or removed."""


def fold(changes: dict[str, int], key: str, op: int) -> None:
    """Add one change to an ordered change set, keeping replay order exact.

    ``changes`` keeps one entry per key. An insertion moves the key to the end (replayed
    as remove-then-insert, as the dict itself did); a replacement keeps whatever the key
    already has (an inserted key replaced in place is still an insertion, at its place).
    """
    if op == SET:
        if key not in changes:
            changes[key] = SET
        return
    changes.pop(key, None)
    changes[key] = op


class TrackedDict(dict[str, Any]):
    """A dict that records, per key, how it changed since the last
    [`take`][loop_governor.checkpoint.tracking.TrackedDict.take].

    ``raw`` keys hold values put in directly (``cp.completed[k] = v``), which a save must
    still convert (JSON check, redaction); values recorded through the checkpoint's
    ``record_*`` methods are converted already.
    """

    __slots__ = ("_changes", "_lock", "_raw")

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), *, raw: bool = True) -> None:
        dict.__init__(self, items)
        self._lock = threading.Lock()
        self._changes: dict[str, int] = {}
        self._raw: set[str] = set(self) if raw else set()

    def __reduce__(self) -> tuple[Any, ...]:
        return (TrackedDict, (dict(self),))

    # -- mutators ------------------------------------------------------------------------

    def _put(self, key: str, value: Any, raw: bool) -> None:
        # lock held
        op = SET if dict.__contains__(self, key) else ADD
        dict.__setitem__(self, key, value)
        fold(self._changes, key, op)
        if raw:
            self._raw.add(key)
        else:
            self._raw.discard(key)

    def _removed(self, key: str) -> None:
        # lock held
        fold(self._changes, key, DEL)
        self._raw.discard(key)

    def __setitem__(self, key: str, value: Any) -> None:
        with self._lock:
            self._put(key, value, True)

    def put_converted(self, key: str, value: Any) -> None:
        """Set ``key`` to a value that is already JSON and redacted (``record_*``)."""
        with self._lock:
            self._put(key, value, False)

    def __delitem__(self, key: str) -> None:
        with self._lock:
            dict.__delitem__(self, key)
            self._removed(key)

    def pop(self, key: str, *default: Any) -> Any:
        with self._lock:
            if dict.__contains__(self, key):
                value = dict.pop(self, key)
                self._removed(key)
                return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[str, Any]:
        with self._lock:
            key, value = dict.popitem(self)
            self._removed(key)
            return key, value

    def setdefault(self, key: str, default: Any = None) -> Any:
        with self._lock:
            if dict.__contains__(self, key):
                return dict.__getitem__(self, key)
            self._put(key, default, True)
            return default

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        # dict.update's own rules: a mapping (anything with keys()) or (key, value) pairs
        pairs: Iterable[tuple[Any, Any]]
        if hasattr(other, "keys"):
            pairs = [(key, other[key]) for key in other.keys()]
        else:
            pairs = [(key, value) for key, value in other]
        with self._lock:
            for key, value in pairs:
                self._put(key, value, True)
            for key, value in kwargs.items():
                self._put(key, value, True)

    def __ior__(self, other: Any) -> TrackedDict:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        with self._lock:
            for key in dict.keys(self):
                fold(self._changes, key, DEL)
            dict.clear(self)
            self._raw.clear()

    # -- what a save uses --------------------------------------------------------------------

    def take(self) -> tuple[dict[str, int], list[tuple[str, int, Any, bool]]]:
        """The changes since the last take, and each changed key's current value.

        Returns ``(changes, entries)``: ``changes`` to hand back with
        [`untake`][loop_governor.checkpoint.tracking.TrackedDict.untake] if the save fails; ``entries`` as ``(key, op,
        value, raw)`` (value ``None`` for a removal), read in the same locked step as the changes, so a value and its
        ``raw`` flag always belong together.
        """
        with self._lock:
            changes, self._changes = self._changes, {}
            entries = []
            for key, op in changes.items():
                if op == DEL or not dict.__contains__(self, key):
                    # removed (or removed again since): a removal is what the store must hear
                    entries.append((key, DEL, None, False))
                else:
                    entries.append((key, op, dict.__getitem__(self, key), key in self._raw))
        return changes, entries

    def untake(self, changes: dict[str, int]) -> None:
        """Put back changes a failed save took: they come before anything changed since."""
        with self._lock:
            later, self._changes = self._changes, dict(changes)
            for key, op in later.items():
                fold(self._changes, key, op)

    def snapshot(self) -> tuple[dict[str, Any], set[str]]:
        """A consistent copy of the items and of the keys still to convert."""
        with self._lock:
            return dict.copy(self), set(self._raw)

    def mark_converted(self) -> None:
        """Everything in here is stored data (just loaded): nothing left to convert."""
        with self._lock:
            self._raw.clear()
            self._changes.clear()


class TrackedList(list[Any]):
    """A list that knows which items were appended since the last save.

    Appending is the only change a journal record carries for ``results``; anything else
    (replace, insert, remove, sort) marks the list rewritten, and the next save writes a
    full snapshot.
    """

    __slots__ = ("_all_raw", "_lock", "_raw", "_rewritten")

    def __init__(self, items: Iterable[Any] = (), *, raw: bool = True) -> None:
        list.__init__(self, items)
        self._lock = threading.Lock()
        self._rewritten = False
        self._all_raw = raw
        self._raw: set[int] = set()

    def __reduce__(self) -> tuple[Any, ...]:
        return (TrackedList, (list(self),))

    def _rewrite(self) -> None:
        # lock held
        self._rewritten = True
        self._all_raw = True
        self._raw.clear()

    def append(self, value: Any) -> None:
        with self._lock:
            list.append(self, value)
            if not self._all_raw:
                self._raw.add(len(self) - 1)

    def append_converted(self, value: Any) -> None:
        """Append a value that is already JSON and redacted (``add_result``)."""
        with self._lock:
            list.append(self, value)
            if self._all_raw:  # only the unconverted ones need a mark, one at a time
                self._all_raw = False
                self._raw.update(range(len(self) - 1))

    def extend(self, values: Iterable[Any]) -> None:
        items = list(values)
        with self._lock:
            start = len(self)
            list.extend(self, items)
            if not self._all_raw:
                self._raw.update(range(start, len(self)))

    def __iadd__(self, values: Iterable[Any]) -> TrackedList:  # type: ignore[misc]
        self.extend(values)
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        with self._lock:
            list.__setitem__(self, index, value)
            self._rewrite()

    def __delitem__(self, index: Any) -> None:
        with self._lock:
            list.__delitem__(self, index)
            self._rewrite()

    def __imul__(self, count: Any) -> TrackedList:  # type: ignore[misc]
        with self._lock:
            list.__imul__(self, count)
            self._rewrite()
        return self

    def insert(self, index: Any, value: Any) -> None:
        with self._lock:
            list.insert(self, index, value)
            self._rewrite()

    def pop(self, index: Any = -1) -> Any:
        with self._lock:
            value = list.pop(self, index)
            self._rewrite()
            return value

    def remove(self, value: Any) -> None:
        with self._lock:
            list.remove(self, value)
            self._rewrite()

    def clear(self) -> None:
        with self._lock:
            list.clear(self)
            self._rewrite()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            list.sort(self, *args, **kwargs)
            self._rewrite()

    def reverse(self) -> None:
        with self._lock:
            list.reverse(self)
            self._rewrite()

    # -- what a save uses --------------------------------------------------------------------

    def take(self, start: int) -> tuple[bool, int, list[tuple[Any, bool]]]:
        """``(rewritten, end, entries)``: items ``start:end`` as ``(value, raw)``.

        ``rewritten`` is reset (hand it back with [`untake`][loop_governor.checkpoint.tracking.TrackedList.untake] if
        the save fails); when it is set, ``entries`` is empty: the save writes everything anyway.
        """
        with self._lock:
            rewritten, self._rewritten = self._rewritten, False
            end = len(self)
            if rewritten or start > end:
                return True, end, []
            entries = [(list.__getitem__(self, i), self._all_raw or i in self._raw) for i in range(start, end)]
        return False, end, entries

    def untake(self, rewritten: bool) -> None:
        if rewritten:
            with self._lock:
                self._rewritten = True

    def snapshot(self) -> tuple[list[Any], set[int] | None]:
        """A consistent copy of the items and the indices still to convert (``None``: all)."""
        with self._lock:
            return list.copy(self), None if self._all_raw else set(self._raw)

    def mark_converted(self) -> None:
        with self._lock:
            self._all_raw = False
            self._raw.clear()
            self._rewritten = False
