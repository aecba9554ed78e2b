"""The context variables a governed call reads: the task scope and the call's framework facts.

A module of their own, below everything that reads them: the events and the memory
wrapper read the current task through the small `CurrentTask` Protocol, without
importing the task module.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Protocol


class CurrentTask(Protocol):
    """What the layers below the task read of the current one: its id (events carry it)
    and its readable name (log lines show it). Only a [`TaskScope`][loop_governor.task.TaskScope]
    sets the variable; the task module reads it back typed as one."""

    @property
    def task_id(self) -> str: ...

    @property
    def name(self) -> str: ...


_SCOPE: ContextVar[CurrentTask | None] = ContextVar("loop_governor_task", default=None)
# Framework facts about the call in flight (e.g. LangChain's tool_call_id) for its events.
_CALL_META: ContextVar[dict[str, Any] | None] = ContextVar("loop_governor_call_meta", default=None)
