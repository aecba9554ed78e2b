"""What a framework adapter needs from the core, in one module.

An adapter (``langchain_governor``, ``crewai_governor``, ``pydantic_ai_governor``) imports
``loop_governor`` (the public API: ``Governor``, the errors, ``classify``) and this module,
nothing else of the core. Everything here is something at least two adapters need and
would otherwise each write again:

* [`PassThrough`][loop_governor.adapter.PassThrough] -- the one way to hand an exception
  back through a governed call unjudged: a framework's control flow (a LangGraph
  interrupt, a crewAI hook's deny), another middleware's failure. The governor re-raises
  it as it came; it is neither a failure nor a success (a half-open breaker's probe is
  handed back, the task's world does not move on).
* [`resolve_governor`][loop_governor.adapter.resolve_governor] -- the governor an adapter
  object uses: the one passed, or the process-wide default (shared breakers for every
  adapter), checked at construction.
* [`PrunerPool`][loop_governor.adapter.PrunerPool] -- one context pruner per conversation,
  or one shared pruner behind a lock.
* tool withdrawal ([`tool_offer`][loop_governor.policies.ladder.tool_offer],
  [`keep_listed`][loop_governor.policies.ladder.keep_listed]), compaction after a context
  overflow, usage readers, the texts a stop leaves in the conversation, and the
  construction checks adapters share.

The page "Writing an adapter" in the documentation walks through using them. Imports stay
one per line at the top: the modules behind them move, this interface does not.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

import loop_governor as lg
from loop_governor.call import PassThrough
from loop_governor.checkpoint import (
    CheckpointConflictError,
    CheckpointSerializationError,
    CheckpointStore,
    TaskCheckpoint,
    checkpoint_store_from_url,
)
from loop_governor.classify import retried_by_class
from loop_governor.config import check_pruner, check_tool_list, not_a_tool
from loop_governor.context.compact import emergency_compact
from loop_governor.context.tokens import approx_tokens
from loop_governor.conversation import links, not_run_text, pending_tool_calls, stop_text
from loop_governor.errors import STOP_PREFIX, stop_reason
from loop_governor.memory import Guarded, Key, MemoryGuard
from loop_governor.policies.compaction import is_context_overflow
from loop_governor.policies.ladder import keep_listed, tool_offer
from loop_governor.redaction import redact_obj
from loop_governor.task import NAME_CHARS, RunAbandoned, readable_name
from loop_governor.usage import Usage, usage_of

__all__ = [
    "NAME_CHARS",
    "STOP_PREFIX",
    "CheckpointConflictError",
    "CheckpointSerializationError",
    "CheckpointStore",
    "Guarded",
    "Key",
    "MemoryGuard",
    "MessagePruner",
    "PassThrough",
    "PrunerPool",
    "RunAbandoned",
    "TaskCheckpoint",
    "Usage",
    "approx_tokens",
    "check_pruner",
    "check_tool_list",
    "checkpoint_store_from_url",
    "emergency_compact",
    "is_context_overflow",
    "keep_listed",
    "links",
    "not_a_tool",
    "not_run_text",
    "pending_tool_calls",
    "readable_name",
    "redact_obj",
    "resolve_governor",
    "retried_by_class",
    "stop_reason",
    "stop_text",
    "tool_offer",
    "usage_of",
]


def resolve_governor(governor: lg.Governor | None = None) -> lg.Governor:
    """``governor`` itself, else the core's process-wide default governor.

    ``govern_tool(tool)`` without a governor must still share one breaker table and one
    retry budget with every other tool in the process (a governor per tool would let each
    tool trip its own breaker in isolation). Anything else fails here, at construction,
    naming the parameter: a ``GovernorConfig`` passed where the governor goes would
    otherwise fail only at the first call."""
    if governor is None:
        return lg.default_governor()
    if not isinstance(governor, lg.Governor):
        hint = " (build one: governor=lg.Governor(config))" if isinstance(governor, lg.GovernorConfig) else ""
        raise TypeError(f"governor must be a loop_governor.Governor or None, not {type(governor).__name__}{hint}")
    return governor


class MessagePruner(Protocol):
    """What the adapters need of a pruner (``loop_governor.context.ContextPruner``)."""

    def prune(self, messages: list[Any]) -> list[Any]: ...


class PrunerPool:
    """One pruner per conversation (from ``factory``), or ``shared`` behind a lock.

    A ``ContextPruner`` keeps per-conversation state (what it already ingested, where the
    cached prefix ends) and is not thread-safe, while one agent object serves many
    conversations at once (``agent.batch``, a web server, a crew's agents). So either each
    conversation gets its own pruner from a factory (cheap: O(new messages) a turn), or one
    shared pruner is used behind a lock (still correct, since a pruner's output depends
    only on the messages it is given; it just rebuilds its state whenever conversations
    interleave).

    A conversation is named by a key: a task id (``weak=False``: the
    ``max_conversations`` least recently used are kept), or the framework object that
    holds the conversation (``weak=True``: its pruner lives as long as that object).
    ``None`` is no conversation to keep state for: a one-off pruner.
    """

    def __init__(
        self,
        shared: MessagePruner | None,
        factory: Callable[[], MessagePruner] | None,
        *,
        weak: bool = False,
        max_conversations: int = 256,
    ) -> None:
        self._shared = shared
        self._factory = factory
        self._shared_lock = threading.Lock()
        self._lock = threading.Lock()
        self._weak = weak
        self._by_key: MutableMapping[Any, tuple[MessagePruner, threading.Lock]] = (
            weakref.WeakKeyDictionary() if weak else OrderedDict()
        )
        self._max = max_conversations

    @property
    def enabled(self) -> bool:
        return self._shared is not None or self._factory is not None

    def pruner_for(self, key: Any) -> tuple[MessagePruner, threading.Lock] | None:
        """The pruner of conversation ``key`` and the lock to hold while it prunes, or
        ``None`` when no pruner is configured."""
        if self._factory is None:
            return None if self._shared is None else (self._shared, self._shared_lock)
        if key is None:
            return self._factory(), threading.Lock()
        with self._lock:
            entry = self._by_key.get(key)
            if entry is None:
                entry = (self._factory(), threading.Lock())
                self._by_key[key] = entry
                if isinstance(self._by_key, OrderedDict):
                    while len(self._by_key) > self._max:  # least recently used goes first
                        self._by_key.popitem(last=False)
            elif isinstance(self._by_key, OrderedDict):
                self._by_key.move_to_end(key)
        return entry

    def prune(self, key: Any, messages: list[Any]) -> list[Any] | None:
        """The pruned view of conversation ``key``, or ``None`` when no pruner is configured."""
        entry = self.pruner_for(key)
        if entry is None:
            return None
        pruner, lock = entry
        with lock:
            return pruner.prune(messages)

    def drop(self, key: Any) -> None:
        """Forget a finished conversation's pruner."""
        with self._lock:
            self._by_key.pop(key, None)
