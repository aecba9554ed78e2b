"""Pruners per conversation for adapters that serve many conversations at once.

A ``ContextPruner`` keeps per-conversation state (what it already ingested, where the
cached prefix ends) and is not thread-safe, while one LangChain agent object serves
every thread_id (``agent.batch``, a web server). So either each task gets its own pruner
from a factory (cheap: O(new messages) a turn), or one shared pruner is used behind a
lock (still correct, since a pruner's output depends only on the messages it is given;
it just rebuilds its state whenever conversations interleave).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol


class MessagePruner(Protocol):
    """What the adapters need of a pruner (``loop_governor.context.ContextPruner``)."""

    def prune(self, messages: list[Any]) -> list[Any]: ...


class PrunerPool:
    """One pruner per task id (from ``factory``), or ``shared`` behind a lock."""

    def __init__(
        self,
        shared: MessagePruner | None,
        factory: Callable[[], MessagePruner] | None,
        *,
        max_conversations: int = 256,
    ) -> None:
        self._shared = shared
        self._factory = factory
        self._shared_lock = threading.Lock()
        self._lock = threading.Lock()
        self._by_task: OrderedDict[str, tuple[MessagePruner, threading.Lock]] = OrderedDict()
        self._max = max_conversations

    @property
    def enabled(self) -> bool:
        return self._shared is not None or self._factory is not None

    def prune(self, task_id: str | None, messages: list[Any]) -> list[Any] | None:
        """The pruned view, or ``None`` when no pruner is configured."""
        if self._factory is None:
            if self._shared is None:
                return None
            with self._shared_lock:
                return self._shared.prune(messages)
        if task_id is None:  # no conversation to keep state for: a one-off pruner
            return self._factory().prune(messages)
        with self._lock:
            entry = self._by_task.get(task_id)
            if entry is None:
                entry = (self._factory(), threading.Lock())
                self._by_task[task_id] = entry
                while len(self._by_task) > self._max:  # least recently used goes first
                    self._by_task.popitem(last=False)
            else:
                self._by_task.move_to_end(task_id)
        pruner, lock = entry
        with lock:
            return pruner.prune(messages)

    def drop(self, task_id: str) -> None:
        """Forget a finished conversation's pruner."""
        with self._lock:
            self._by_task.pop(task_id, None)
