"""Pruned views of a conversation for graph-built agents and chat-history memory.

Both keep the stored history complete and hand the model a pruned *copy*:

* [`make_pre_model_hook`][langchain_governor.memory.make_pre_model_hook] -- for LangGraph agents built with a
  ``pre_model_hook`` (``langgraph.prebuilt.create_react_agent`` or a hand-built graph): returns
  ``{"llm_input_messages": pruned}``, which LangGraph sends to the model without
  writing it to state;
* [`GovernedChatMessageHistory`][langchain_governor.memory.GovernedChatMessageHistory] -- wraps any
  ``BaseChatMessageHistory`` (for ``RunnableWithMessageHistory``): ``.messages`` is the pruned view, writes go to the
  wrapped history untouched, ``.full_messages`` is everything.

The pruner (``loop_governor.context.ContextPruner``) is stateful by design (it moves the
pruned boundary in batches to keep the provider's prompt cache warm): use one pruner
per conversation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig

import loop_governor as lg
from langchain_governor._common import state_value, thread_id_of
from langchain_governor.middleware import emit_pruning
from loop_governor.adapter import MessagePruner, PrunerPool


def make_pre_model_hook(
    pruner: MessagePruner | None = None,
    governor: lg.Governor | None = None,
    *,
    pruner_factory: Callable[[], MessagePruner] | None = None,
    count_steps: bool = False,
) -> Callable[..., dict[str, list[BaseMessage]]]:
    """A LangGraph ``pre_model_hook`` node returning the pruned ``llm_input_messages``.

    ``pruner_factory`` gives each thread_id its own pruner (a graph serves many
    conversations); a single ``pruner`` is shared behind a lock. With a ``governor``,
    each pruning is recorded as a ``pruning`` event and, when ``count_steps`` is true,
    each model turn counts a step of the current task (so a ``max_steps`` budget applies
    to graph-built agents as well).
    """
    if (pruner is None) == (pruner_factory is None):
        raise ValueError("pass exactly one of pruner or pruner_factory")
    pool = PrunerPool(pruner, pruner_factory)

    def pre_model_hook(state: Any, config: RunnableConfig | None = None) -> dict[str, list[BaseMessage]]:
        messages = list(state_value(state, "messages") or [])
        if governor is not None and count_steps:
            governor.count_step("model")
        pruned = pool.prune(thread_id_of(config), messages)
        assert pruned is not None  # the pool has a pruner
        if governor is not None:
            emit_pruning(governor, messages, pruned)
        return {"llm_input_messages": pruned}

    return pre_model_hook


class GovernedChatMessageHistory(BaseChatMessageHistory):
    """A chat history whose ``messages`` are the pruned view of the wrapped history."""

    def __init__(
        self,
        history: BaseChatMessageHistory,
        pruner: MessagePruner,
        governor: lg.Governor | None = None,
    ) -> None:
        self.history = history
        self.pruner = pruner
        self.governor = governor

    def _view(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        full = list(messages)
        pruned = self.pruner.prune(full)
        if self.governor is not None:
            emit_pruning(self.governor, full, pruned)
        return pruned

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return self._view(self.history.messages)

    @property
    def full_messages(self) -> list[BaseMessage]:
        """The complete stored history (what was written, never pruned)."""
        return list(self.history.messages)

    async def aget_messages(self) -> list[BaseMessage]:
        return self._view(await self.history.aget_messages())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.history.add_messages(messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self.history.aadd_messages(messages)

    def clear(self) -> None:
        self.history.clear()

    async def aclear(self) -> None:
        await self.history.aclear()
