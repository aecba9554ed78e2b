"""The governor's event bus: every policy reports through it, the trace subscribes.

One small object instead of a method on the facade, so policies can report without
importing the [`Governor`][loop_governor.governor.Governor] (no import circle). Building an
event costs a dict; with no subscriber (and the ``loop_governor`` logger off for the
event), ``emit`` returns before doing even that, and callers check
[`Events.emitting`][loop_governor.events.Events.emitting] before computing expensive fields.

A subscriber is a sink like any other: it receives the event redacted with the rule set
of every sink ([`redact_value`][loop_governor.redaction.redact_value]: strings masked, values
under secret-named keys masked whole, an object as its redacted JSON form), and so does
the ``loop_governor`` logger. The strings are memoized ([`TextMemo`][loop_governor.redaction.TextMemo]), because a
conversation re-sends its messages in every ``model_call``. Only the governor's own
trace subscribes ``raw``: it redacts in its writer thread, off the agent's path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from loop_governor.logs import level_of, log_event
from loop_governor.redaction import TextMemo, is_secret_key, redact_value
from loop_governor.scope_vars import _CALL_META, _SCOPE

Subscriber = Callable[[dict[str, Any]], None]

_MiB = 1 << 20
# the messages of a conversation repeat in every model_call event: memoize strings up to
# this size, within this many bytes (then the memo starts over)
MEMO_CHARS = 64 * 1024
MEMO_BYTES = 4 * _MiB
_SCALARS = frozenset({bool, int, float})


class Events:
    """Subscribers and the one ``emit`` every policy uses. A failing subscriber never
    breaks the agent: it is counted in [`sink_failures`][loop_governor.events.Events.sink_failures]."""

    __slots__ = ("_clock", "_raw", "_subscribers", "_text", "emitting", "sink_failures")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._subscribers: tuple[Subscriber, ...] = ()  # receive the redacted event
        self._raw: tuple[Subscriber, ...] = ()  # receive the event as built (the trace)
        self._text = TextMemo(MEMO_BYTES, max_chars=MEMO_CHARS)
        self.emitting = False  # a plain attribute: read on every call of the hot path
        self.sink_failures = 0

    def subscribe(self, fn: Subscriber, *, raw: bool = False) -> Callable[[], None]:
        """Receive every event dict, redacted; returns a function that unsubscribes.

        ``raw=True`` hands over the event as built, secrets and all: only for a sink that
        redacts before anything leaves it (the governor's trace)."""
        if raw:
            self._raw = (*self._raw, fn)
        else:
            self._subscribers = (*self._subscribers, fn)
        self.emitting = True

        def unsubscribe() -> None:
            self._subscribers = tuple(s for s in self._subscribers if s is not fn)
            self._raw = tuple(s for s in self._raw if s is not fn)
            self.emitting = bool(self._subscribers or self._raw)

        return unsubscribe

    def redacted(self, record: dict[str, Any]) -> dict[str, Any]:
        """A redacted copy of ``record``, as subscribers and the logger receive it.

        Field by field: most are scalars or short strings the memo has seen (tool names,
        task ids), so a ``tool_call`` event costs a few dict lookups."""
        text = self._text
        out: dict[str, Any] = {}
        try:
            for key, value in record.items():
                kind = type(value)
                if value is None or kind in _SCALARS:
                    out[key] = value
                elif kind is str and not is_secret_key(key):
                    out[key] = text(value)
                else:
                    out[key] = redact_value({key: value}, objects=True, text=text)[key]
        except Exception:  # an object whose form cannot be read: say so rather than leak it
            self.sink_failures += 1
            return {k: record.get(k) for k in ("event", "ts", "task_id")} | {"redaction_failed": True}
        return out

    def emit(self, event: str, **fields: Any) -> None:
        """Send one event to the subscribers, and to the ``loop_governor`` logger when it
        is enabled for the event's level ([`loop_governor.logs`][loop_governor.logs]): the logger is not
        a subscriber, so it never turns the governor's no-listener fast paths off."""
        level = level_of(event)
        if not self.emitting and level is None:
            return
        scope = _SCOPE.get()
        record = {"event": event, "ts": self._clock(), "task_id": scope.task_id if scope is not None else None}
        meta = _CALL_META.get()
        if meta:
            record.update(meta)
        record.update(fields)
        for fn in self._raw:
            try:
                fn(record)
            except Exception:
                self.sink_failures += 1
        if level is None and not self._subscribers:
            return
        clean = self.redacted(record)
        if level is not None:
            try:
                log_event(level, clean, scope.name if scope is not None else None)
            except Exception:
                self.sink_failures += 1
        for fn in self._subscribers:
            try:
                fn(clean)
            except Exception:
                self.sink_failures += 1


@contextlib.contextmanager
def call_context(**fields: Any) -> Iterator[None]:
    """Attach framework facts (``tool_call_id=...``) to every event of the calls made
    inside: an extra keyword on ``Governor.call`` would collide with the tool's arguments."""
    token = _CALL_META.set(fields)
    try:
        yield
    finally:
        _CALL_META.reset(token)
