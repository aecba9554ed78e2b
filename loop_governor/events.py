"""The governor's event bus: every policy reports through it, the trace subscribes.

One small object instead of a method on the facade, so policies can report without
importing the [`Governor`][loop_governor.governor.Governor] (no import circle). Building an
event costs a dict; with no subscriber (and the ``loop_governor`` logger off for the
event), ``emit`` returns before doing even that, and callers check
[`Events.emitting`][loop_governor.events.Events.emitting] before computing expensive fields.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from loop_governor.logs import level_of, log_event
from loop_governor.scope_vars import _CALL_META, _SCOPE

Subscriber = Callable[[dict[str, Any]], None]


class Events:
    """Subscribers and the one ``emit`` every policy uses. A failing subscriber never
    breaks the agent: it is counted in [`sink_failures`][loop_governor.events.Events.sink_failures]."""

    __slots__ = ("_clock", "_subscribers", "emitting", "sink_failures")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._subscribers: tuple[Subscriber, ...] = ()
        self.emitting = False  # a plain attribute: read on every call of the hot path
        self.sink_failures = 0

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Receive every event dict; returns a function that unsubscribes."""
        self._subscribers = (*self._subscribers, fn)
        self.emitting = True

        def unsubscribe() -> None:
            self._subscribers = tuple(s for s in self._subscribers if s is not fn)
            self.emitting = bool(self._subscribers)

        return unsubscribe

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
        if level is not None:
            try:
                log_event(level, record, scope.name if scope is not None else None)
            except Exception:
                self.sink_failures += 1
        for fn in self._subscribers:
            try:
                fn(record)
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
