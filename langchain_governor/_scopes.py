"""Task scopes that span a whole LangGraph run.

A governor task (budgets, known-bad calls, the repeated-error guard, ``max_steps``) must
cover every model and tool call of one agent run. LangGraph runs each node in its own
copy of the context, so a ``with governor.task(...)`` opened inside one node is gone in
the next, and leaving it ends the task (the store forgets the task's state). So the
adapter keeps one live [`loop_governor.TaskScope`][loop_governor.scope.TaskScope] per task id, entered once in a
context of its own, attaches it to each node while that node runs, and ends it when
the agent finishes. A run that crashes leaves its task open, so resuming the same
thread continues with the same known-bad memory and budget.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator

import loop_governor as lg


class LiveTasks:
    """Live task scopes by id for one governor (thread-safe)."""

    def __init__(self, governor: lg.Governor, resume: bool | None = None) -> None:
        self.governor = governor
        self.resume = resume
        self._lock = threading.Lock()
        self._live: dict[str, tuple[lg.TaskScope, contextvars.Context]] = {}

    def scope(self, task_id: str, name: Callable[[], str | None] | None = None) -> lg.TaskScope:
        """The live scope for ``task_id``, opened (task_start) on first use, named by
        ``name()`` then (asked only then: what a person reads for the task)."""
        with self._lock:
            entry = self._live.get(task_id)
            if entry is None:
                # Entered in a private context copy: its token stays valid there, so the
                # scope can be exited later from whichever node ends the run.
                home = contextvars.copy_context()
                scope = self.governor.task(task_id, name=name() if name else None, resume=self.resume)
                home.run(scope.__enter__)
                entry = (scope, home)
                self._live[task_id] = entry
            return entry[0]

    def end(self, task_id: str, exc: BaseException | None = None) -> None:
        """End the task (task_end, whose ``outcome`` says how: ``exc`` is what aborted
        the run, if anything; the store drops its per-task state)."""
        with self._lock:
            entry = self._live.pop(task_id, None)
        if entry is not None:
            scope, home = entry
            home.run(scope.__exit__, type(exc) if exc is not None else None, exc, None)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._live

    @contextlib.contextmanager
    def attached(self, task_id: str, name: Callable[[], str | None] | None = None) -> Iterator[lg.TaskScope]:
        """Make the task current for the duration of one node (or one handler call)."""
        with self.governor.attach(self.scope(task_id, name)) as scope:
            yield scope
