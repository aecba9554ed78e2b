"""The context variables a governed call reads: the task scope and the call's framework facts.

A module of their own, imported by everything that needs them, so no policy module has to
import the scope (which imports the guards) to read them.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loop_governor.task import TaskScope

_SCOPE: ContextVar[TaskScope | None] = ContextVar("loop_governor_task", default=None)
# Framework facts about the call in flight (e.g. LangChain's tool_call_id) for its events.
_CALL_META: ContextVar[dict[str, Any] | None] = ContextVar("loop_governor_call_meta", default=None)
