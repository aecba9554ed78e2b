"""A durable tool-call journal so a resumed LangGraph run never repeats a side effect.

LangGraph's checkpointer saves a tool's result only after the tool node finished. A
process killed between the tool's side effect (an e-mail sent, a row written, a file
appended) and that save leaves no trace of the call, and ``agent.invoke(None, config)``
runs the tool again: the side effect happens twice. The journal closes that window:
[`ToolJournalMiddleware`][langchain_governor.journal.ToolJournalMiddleware] writes each finished call's ``ToolMessage``
to a checkpoint store atomically *before* handing it back to LangGraph, and on resume returns
the journaled message instead of running the tool.

What is left: a kill between the tool's own return and the journal write (microseconds,
no I/O of the tool in between) still repeats the call. Only an idempotent tool closes
that last gap; the journal makes it as narrow as an in-process hook can. Run with
``durability="sync"`` for the full guarantee: with LangGraph's default ``"async"`` the
model step that asked for the call may still be unsaved at the kill, the model is then
asked again on resume, and its new tool calls (new ids) are new calls to the journal.

Entries are keyed on (thread_id, id of the AIMessage that asked, tool_call_id) and
checked against the tool name and arguments: some providers number tool-call ids per
message (``call_0`` again on the next turn), so the call id alone could hand back an
older call's result. The journal is stored through [`loop_governor.checkpoint`][loop_governor.checkpoint]
(one ``TaskCheckpoint`` per thread): JSON only, redacted, atomic, and a corrupt journal
raises instead of being silently reset (a reset would repeat side effects).

Usage, with the journal outermost so a replayed call is not governed (or counted) again:

    journal = ToolCallJournal("sqlite:///agent-journal.db")
    agent = create_agent(model, tools, checkpointer=SqliteSaver(conn),
                         middleware=[ToolJournalMiddleware(journal), GovernorMiddleware(g)])
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain_core.messages import AIMessage, ToolMessage, message_to_dict, messages_from_dict
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

import loop_governor as lg
from langchain_governor._common import state_value, thread_id_of
from loop_governor.adapter import (
    CheckpointConflictError,
    CheckpointSerializationError,
    CheckpointStore,
    TaskCheckpoint,
    checkpoint_store_from_url,
)

__all__ = ["ToolCallJournal", "ToolJournalMiddleware"]


def _digest(fingerprint: str) -> str:
    """The fingerprint as stored: checkpoints redact every string they keep, and a tool
    named like a secret (``reset-password``) would come back masked and never match."""
    return hashlib.sha256(fingerprint.encode("utf-8", "surrogatepass")).hexdigest()


log = logging.getLogger(__name__)

ToolResult = ToolMessage | Command[Any]

_SAVE_ATTEMPTS = 5


class ToolCallJournal:
    """Finished tool calls per conversation thread, in a checkpoint store.

    Framework-neutral: it stores JSON documents under ``(thread_id, entry_key)`` and
    knows nothing of LangChain messages. Thread-safe; several processes may share one
    store (a concurrent writer of the same thread is merged, never overwritten).

    Args:
        store: a `loop_governor.checkpoint.CheckpointStore`, or a store
            URL (``sqlite:///journal.db``, ``file:///dir``, ``redis://...``).
        namespace: prefix of the checkpoint task ids (``<namespace>:<thread_id>``), so a
            journal can share a store with task checkpoints.
        cache_threads: how many threads' journals are kept decoded in memory (LRU);
            others are re-read from the store when needed.
    """

    def __init__(self, store: CheckpointStore | str, *, namespace: str = "lc-journal", cache_threads: int = 64) -> None:
        self.store: CheckpointStore = checkpoint_store_from_url(store) if isinstance(store, str) else store
        self.namespace = namespace
        self._cache_threads = max(1, cache_threads)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, TaskCheckpoint] = OrderedDict()

    def task_id(self, thread_id: str) -> str:
        """The checkpoint task id holding ``thread_id``'s journal."""
        return f"{self.namespace}:{thread_id}"

    def _checkpoint(self, thread_id: str, *, fresh: bool = False) -> TaskCheckpoint:
        # Called with self._lock held.
        cp = None if fresh else self._cache.get(thread_id)
        if cp is None:
            task_id = self.task_id(thread_id)
            cp = self.store.load(task_id) or TaskCheckpoint(task_id=task_id)
            self._cache[thread_id] = cp
        self._cache.move_to_end(thread_id)
        while len(self._cache) > self._cache_threads:
            self._cache.popitem(last=False)
        return cp

    def get(self, thread_id: str, entry_key: str, fingerprint: str) -> Any:
        """The stored document for this call, or ``None``.

        ``fingerprint`` (tool name + arguments) must match what was stored: an entry
        key that came back for a different call is not a replay of it.
        """
        with self._lock:
            found, entry = self._checkpoint(thread_id).get_result(entry_key)
        if not found or not isinstance(entry, Mapping) or entry.get("call") != _digest(fingerprint):
            return None
        return entry.get("doc")

    def put(self, thread_id: str, entry_key: str, fingerprint: str, doc: Any) -> bool:
        """Store ``doc`` durably (returns after the store's atomic save).

        Returns ``False`` (and logs) when ``doc`` is not JSON: the call succeeded, and
        failing the agent because its result cannot be journaled would be worse than
        not being able to skip it on resume.
        """
        entry = {"call": _digest(fingerprint), "doc": doc}
        with self._lock:
            cp = self._checkpoint(thread_id)
            try:
                cp.record_success(entry_key, entry)
            except CheckpointSerializationError as exc:
                log.warning("tool call %s not journaled: %s", entry_key, exc)
                return False
            for attempt in range(_SAVE_ATTEMPTS):
                try:
                    self.store.save(cp)
                    return True
                except CheckpointConflictError:
                    if attempt == _SAVE_ATTEMPTS - 1:
                        raise
                    # Another writer of this thread (another process resuming it): take
                    # its entries and add ours, never overwrite them.
                    cp = self._checkpoint(thread_id, fresh=True)
                    cp.record_success(entry_key, entry)
            return False  # unreachable: the loop returns or raises

    def forget(self, thread_id: str) -> bool:
        """Drop a thread's journal (once LangGraph has saved the run); ``True`` if there was one."""
        with self._lock:
            self._cache.pop(thread_id, None)
            return self.store.delete(self.task_id(thread_id))

    def threads(self) -> builtins.list[str]:
        """Thread ids that have a journal in the store."""
        prefix = f"{self.namespace}:"
        return [t[len(prefix) :] for t in self.store.list() if t.startswith(prefix)]


def _asking_message_id(state: Any, tool_call_id: str) -> str | None:
    """Id of the newest AIMessage in ``state`` that issued ``tool_call_id``."""
    messages = state_value(state, "messages") or []
    for message in reversed(messages):
        if isinstance(message, AIMessage) and any(c.get("id") == tool_call_id for c in message.tool_calls):
            return message.id
    return None


class ToolJournalMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Journal every finished tool call; on resume, return the journaled result.

    Put it first in ``middleware=[...]`` (outermost): a replayed call then skips the
    governor and the tool alike. Runs without a ``thread_id`` (no checkpointer, so no
    resume) and tool calls without an id pass through untouched. A tool returning a
    ``Command`` is not journaled (a Command can carry graph jumps that are not JSON).

    Args:
        journal: a [`ToolCallJournal`][langchain_governor.journal.ToolCallJournal], a checkpoint store, or a store URL.
        governor: if given, a replayed call is reported as a ``tool_call`` event with
            ``resumed=True`` (the same shape the core emits for a checkpointed call).
    """

    def __init__(
        self, journal: ToolCallJournal | CheckpointStore | str, *, governor: lg.Governor | None = None
    ) -> None:
        super().__init__()
        self.journal = journal if isinstance(journal, ToolCallJournal) else ToolCallJournal(journal)
        self.governor = governor

    @staticmethod
    def _where(request: ToolCallRequest) -> tuple[str, str, str] | None:
        """``(thread_id, entry_key, fingerprint)`` of the call, or ``None`` if not journaled."""
        call = request.tool_call
        call_id = call.get("id")
        runtime = request.runtime
        info = getattr(runtime, "execution_info", None)
        thread = getattr(info, "thread_id", None) or thread_id_of(getattr(runtime, "config", None))
        if not call_id or thread is None:
            return None
        asked_by = _asking_message_id(request.state, call_id)
        entry_key = f"{asked_by}/{call_id}" if asked_by else str(call_id)
        return str(thread), entry_key, lg.call_key(call["name"], (), dict(call.get("args") or {}))

    def _replayed(self, request: ToolCallRequest, doc: Any, fingerprint: str) -> ToolMessage | None:
        try:
            (message,) = messages_from_dict([doc])
        except (KeyError, TypeError, ValueError):
            log.warning("journal entry for %s is not a message; running the tool", fingerprint)
            return None
        if not isinstance(message, ToolMessage):
            return None
        if self.governor is not None:
            self.governor.emit(
                "tool_call",
                tool=request.tool_call["name"],
                status=message.status,
                error_type=None,
                signature=None,
                attempts=0,
                duration_s=0.0,
                call_key=fingerprint,
                resumed=True,
                journal=True,
            )
        return message

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        where = self._where(request)
        if where is None:
            return handler(request)
        thread, key, fingerprint = where
        doc = self.journal.get(thread, key, fingerprint)
        if doc is not None:
            replayed = self._replayed(request, doc, fingerprint)
            if replayed is not None:
                return replayed
        result = handler(request)
        if isinstance(result, ToolMessage):
            self.journal.put(thread, key, fingerprint, message_to_dict(result))
        return result

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolResult]]
    ) -> ToolResult:
        where = self._where(request)
        if where is None:
            return await handler(request)
        thread, key, fingerprint = where
        # Store I/O (fsync) off the event loop.
        doc = await asyncio.to_thread(self.journal.get, thread, key, fingerprint)
        if doc is not None:
            replayed = self._replayed(request, doc, fingerprint)
            if replayed is not None:
                return replayed
        result = await handler(request)
        if isinstance(result, ToolMessage):
            await asyncio.to_thread(self.journal.put, thread, key, fingerprint, message_to_dict(result))
        return result
