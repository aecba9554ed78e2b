"""Governed LangGraph long-term memory: a ``BaseStore`` that keeps failures, secrets and repeats out.

``create_agent(..., store=...)`` hands the store to every node and tool of the graph; what
an agent writes there is read back in every later thread. [`GovernedStore`][langchain_governor.store.GovernedStore]
wraps any ``langgraph.store.base.BaseStore`` (``InMemoryStore``, ``PostgresStore``, ``SqliteStore``):

    from langgraph.store.memory import InMemoryStore
    from langchain_governor import GovernedStore

    agent = create_agent(model, tools, store=GovernedStore(InMemoryStore()))

Only ``batch``/``abatch`` are implemented: ``BaseStore`` derives ``put``/``get``/
``search``/``delete``/``list_namespaces`` and their async twins from them. The decisions
live in the core ([`loop_governor.memory`][loop_governor.memory]); this module maps ``PutOp`` onto them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langgraph.store.base import BaseStore, Op, PutOp, Result

import loop_governor as lg
from loop_governor.adapter import Guarded, Key, MemoryGuard, resolve_governor

__all__ = ["GovernedStore"]


class GovernedStore(Guarded, BaseStore):
    """A LangGraph ``BaseStore`` around ``inner``: puts filtered, every batch governed.

    A put whose value is a failure (it holds the governor's failure text, or is nothing
    but a traceback) is dropped; the rest are redacted (secret-named keys masked whole)
    and trimmed, and written under their own namespace and key, always. A value equal to
    one stored under another key of its namespace is counted as a repeat (a
    ``memory_repeat`` event), never merged. A batch of puts that still fails after the
    governor's retries becomes a ``memory_save_failed`` event and a WARNING naming the
    lost keys (the agent goes on); a batch with reads returns the backend's results
    untouched, or raises the typed error. The governor's tool name is ``memory:<name>``
    (default: the backend's class name).
    """

    def __init__(
        self,
        inner: BaseStore,
        governor: lg.Governor | None = None,
        *,
        name: str | None = None,
        dedupe: bool = True,
    ) -> None:
        if not isinstance(inner, BaseStore):
            raise TypeError(f"inner: expected a langgraph BaseStore, got {type(inner).__name__}")
        self.inner = inner
        self.guard = MemoryGuard(resolve_governor(governor), name or type(inner).__name__, dedupe=dedupe)
        # put() resolves its default TTL from these before batch() sees the op.
        self.supports_ttl = inner.supports_ttl
        self.ttl_config = inner.ttl_config

    def __repr__(self) -> str:
        return f"GovernedStore({self.inner!r})"

    def _plan(self, ops: list[Op]) -> tuple[list[Op], list[int | None], list[Key] | None]:
        """The ops to send, where each original op's result comes from (None: dropped), and
        the ``(namespace, key)`` of each value written when the batch only writes (None: it
        reads too)."""
        sent: list[Op] = []
        where: list[int | None] = []
        keys: list[Key] = []
        writes_only = True
        guard = self.guard
        for op in ops:
            if isinstance(op, PutOp):
                if op.value is None:  # a delete
                    guard.forget([(op.namespace, op.key)])
                else:
                    write = guard.admit(op.namespace, op.key, op.value)
                    if write.action == "drop":
                        where.append(None)
                        continue
                    if write.value is not op.value:
                        op = op._replace(value=write.value)  # the caller's namespace and key, always
                    keys.append((op.namespace, op.key))
            else:
                writes_only = False
            where.append(len(sent))
            sent.append(op)
        return sent, where, keys if writes_only else None

    @staticmethod
    def _results(where: list[int | None], results: list[Result] | None) -> list[Result]:
        return [None if i is None or results is None else results[i] for i in where]

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        sent, where, keys = self._plan(list(ops))
        if not sent:
            return self._results(where, None)
        if keys is not None:
            self.guard.write(self.inner.batch, sent, keys=keys)
            return self._results(where, None)
        return self._results(where, self.guard.read(self.inner.batch, sent))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        sent, where, keys = self._plan(list(ops))
        if not sent:
            return self._results(where, None)
        if keys is not None:
            await self.guard.awrite(self.inner.abatch, sent, keys=keys)
            return self._results(where, None)
        return self._results(where, await self.guard.aread(self.inner.abatch, sent))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
