"""Governed crewAI memory: a ``StorageBackend`` that keeps failures, secrets and repeats out.

crewAI 1.15's one memory system, ``crewai.memory.unified_memory.Memory``, stores through a
pluggable `crewai.memory.storage.backend.StorageBackend`. [`GovernedStorage`][crewai_governor.memory.GovernedStorage]
wraps any of them (LanceDB, the default, included):

    from crewai.memory.unified_memory import Memory
    from crewai_governor import GovernedStorage

    memory = Memory(storage=GovernedStorage(LanceDBStorage(path="./memory")), embedder=...)
    crew = Crew(agents=[...], tasks=[...], memory=memory)

or for every ``Memory`` built from a spec string, ``with install(g, memory=True): ...``
(crewAI's ``set_memory_storage_factory``). What is filtered and why lives in the core,
[`loop_governor.memory`][loop_governor.memory]; this module maps ``MemoryRecord`` onto it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from crewai.memory.storage import factory as _factory
from crewai.memory.storage.backend import StorageBackend
from crewai.memory.types import MemoryRecord, ScopeInfo

import loop_governor as lg
from crewai_governor.hooks import Installation
from loop_governor.adapter import Guarded, Key, MemoryGuard, resolve_governor

__all__ = ["GovernedStorage", "MemoryFactory", "MemoryInstallation", "builtin_storage"]


class GovernedStorage(Guarded):
    """A crewAI ``StorageBackend`` around ``inner``: writes filtered, every call governed.

    ``save``/``asave``/``update``: a record that is a failure (it holds the governor's
    failure text, or is nothing but a traceback) is dropped; the rest are redacted and
    trimmed and written under their own id, always. A record whose content equals one
    stored under another id of its scope is counted as a repeat (a ``memory_repeat``
    event), never merged. A backend failure on a write is retried and breaker-protected as
    the tool ``memory:<name>`` (``name`` defaults to the backend's class name) and, if it
    still fails, becomes a ``memory_save_failed`` event and a WARNING naming the lost ids:
    the crew goes on without that memory. Reads (``search``, ``get_record``, ``list_*``,
    ``count``...) return the backend's answer untouched, through the same governed call.
    Anything else the backend offers (``touch_records``, ``close``...) is passed through.

    crewAI embeds a record before the backend sees it, so a redacted or trimmed record keeps
    the embedding of its original text unless ``embedder`` (the ``Memory``'s embedder, a
    callable ``list[str] -> embeddings``) is given: then changed records are embedded again.
    """

    def __init__(
        self,
        inner: StorageBackend,
        governor: lg.Governor | None = None,
        *,
        name: str | None = None,
        dedupe: bool = True,
        embedder: Callable[[list[str]], Any] | None = None,
    ) -> None:
        if not isinstance(inner, StorageBackend):
            raise TypeError(f"inner: expected a crewAI StorageBackend, got {type(inner).__name__}")
        if embedder is not None and not callable(embedder):
            raise TypeError("embedder: expected a callable list[str] -> embeddings (the Memory's embedder)")
        self.inner = inner
        self.embedder = embedder
        self.guard = MemoryGuard(resolve_governor(governor), name or type(inner).__name__, dedupe=dedupe)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy/unpickle probing): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"GovernedStorage({self.inner!r})"

    # -- writes --------------------------------------------------------------------------

    def _plan(self, records: list[MemoryRecord]) -> list[MemoryRecord]:
        """The records to write, after the filter (each under its own id)."""
        kept: list[MemoryRecord] = []
        changed: list[MemoryRecord] = []
        for record in records:
            metadata = record.metadata or None
            write = self.guard.admit(record.scope, record.id, record.content, extra=metadata)
            if write.action == "drop":
                continue
            changes: dict[str, Any] = {}
            if write.value is not record.content:
                changes["content"] = write.value
            if write.extra is not metadata:
                changes["metadata"] = write.extra
            out = record.model_copy(update=changes) if changes else record
            kept.append(out)
            if "content" in changes:
                changed.append(out)
        self._reembed(changed)
        return kept

    def _reembed(self, changed: list[MemoryRecord]) -> None:
        """Embed records whose text the filter changed (with the ``embedder``, if any)."""
        if not changed or self.embedder is None:
            return
        from crewai.memory.types import embed_texts

        for record, vector in zip(changed, embed_texts(self.embedder, [r.content for r in changed]), strict=True):
            record.embedding = vector

    @staticmethod
    def _keys(records: list[MemoryRecord]) -> list[Key]:
        return [(r.scope, r.id) for r in records]

    def save(self, records: list[MemoryRecord]) -> None:
        kept = self._plan(list(records))
        if kept:
            self.guard.write(self.inner.save, kept, keys=self._keys(kept))

    async def asave(self, records: list[MemoryRecord]) -> None:
        kept = self._plan(list(records))
        if kept:
            await self.guard.awrite(self.inner.asave, kept, keys=self._keys(kept))

    def update(self, record: MemoryRecord) -> None:
        for out in self._plan([record]):
            self.guard.write(self.inner.update, out, keys=self._keys([out]))

    # -- deletes (the user's own request: a failure raises) --------------------------------

    def delete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        self._forget(scope_prefix, categories, record_ids, older_than, metadata_filter)
        return self.guard.read(
            self.inner.delete,
            scope_prefix=scope_prefix,
            categories=categories,
            record_ids=record_ids,
            older_than=older_than,
            metadata_filter=metadata_filter,
        )

    async def adelete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        self._forget(scope_prefix, categories, record_ids, older_than, metadata_filter)
        return await self.guard.aread(
            self.inner.adelete,
            scope_prefix=scope_prefix,
            categories=categories,
            record_ids=record_ids,
            older_than=older_than,
            metadata_filter=metadata_filter,
        )

    def _forget(self, scope_prefix: Any, categories: Any, record_ids: Any, older_than: Any, metadata: Any) -> None:
        if record_ids is not None and scope_prefix is None and not categories and older_than is None and not metadata:
            self.guard.forget_ids(record_ids)
        else:
            self.guard.forget()

    def reset(self, scope_prefix: str | None = None) -> None:
        self.guard.forget()
        self.guard.read(self.inner.reset, scope_prefix=scope_prefix)

    # -- reads: the backend's answer, untouched -------------------------------------------

    def search(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        return self.guard.read(
            self.inner.search,
            query_embedding,
            scope_prefix=scope_prefix,
            categories=categories,
            metadata_filter=metadata_filter,
            limit=limit,
            min_score=min_score,
        )

    async def asearch(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        return await self.guard.aread(
            self.inner.asearch,
            query_embedding,
            scope_prefix=scope_prefix,
            categories=categories,
            metadata_filter=metadata_filter,
            limit=limit,
            min_score=min_score,
        )

    def get_record(self, record_id: str) -> MemoryRecord | None:
        return self.guard.read(self.inner.get_record, record_id)

    def list_records(self, scope_prefix: str | None = None, limit: int = 200, offset: int = 0) -> list[MemoryRecord]:
        return self.guard.read(self.inner.list_records, scope_prefix=scope_prefix, limit=limit, offset=offset)

    def get_scope_info(self, scope: str) -> ScopeInfo:
        return self.guard.read(self.inner.get_scope_info, scope)

    def list_scopes(self, parent: str = "/") -> list[str]:
        return self.guard.read(self.inner.list_scopes, parent)

    def list_categories(self, scope_prefix: str | None = None) -> dict[str, int]:
        return self.guard.read(self.inner.list_categories, scope_prefix=scope_prefix)

    def count(self, scope_prefix: str | None = None) -> int:
        return self.guard.read(self.inner.count, scope_prefix=scope_prefix)


def builtin_storage(spec: str) -> StorageBackend:
    """The backend crewAI's ``Memory`` builds itself for a ``storage`` spec string."""
    if spec == "qdrant-edge":
        from crewai.memory.storage.qdrant_edge_storage import QdrantEdgeStorage

        return QdrantEdgeStorage()
    from crewai.memory.storage.lancedb_storage import LanceDBStorage

    return LanceDBStorage() if spec == "lancedb" else LanceDBStorage(path=spec)


class MemoryFactory:
    """crewAI's process-wide memory storage factory, wrapping each backend in
    [`GovernedStorage`][crewai_governor.memory.GovernedStorage] (a factory registered before is asked first and wrapped
    too).

    ``activate()`` registers it, ``deactivate()`` restores the previous one. Only ``Memory``
    objects built while it is registered are governed (crewAI asks the factory at
    construction); an explicit ``Memory(storage=<backend>)`` is left as the user built it.
    """

    def __init__(self, governor: lg.Governor | None = None) -> None:
        self.governor = resolve_governor(governor)
        self._previous: Callable[[str], StorageBackend | None] | None = None
        self._active = False

    def __call__(self, spec: str) -> StorageBackend:
        inner = self._previous(spec) if self._previous is not None else None
        if inner is None:
            inner = builtin_storage(spec)
        return inner if isinstance(inner, GovernedStorage) else GovernedStorage(inner, self.governor)

    def activate(self) -> None:
        if not self._active:
            self._previous = _factory._factory
            _factory.set_memory_storage_factory(self)
            self._active = True

    def deactivate(self) -> None:
        if self._active:
            if _factory._factory is self:
                _factory.set_memory_storage_factory(self._previous)
            self._active = False


class MemoryInstallation(Installation):
    """An [`Installation`][crewai_governor.hooks.Installation] that registers a
    [`MemoryFactory`][crewai_governor.memory.MemoryFactory] for as long as its hooks are active: on ``__enter__``
    (scoped) or at once (``scoped=False``), until ``__exit__`` / ``uninstall()``."""

    memory: MemoryFactory

    def __enter__(self) -> Installation:
        self.memory.activate()
        return super().__enter__()

    def uninstall(self) -> None:
        try:
            super().uninstall()
        finally:
            self.memory.deactivate()

    @classmethod
    def adopt(cls, installation: Installation, governor: lg.Governor) -> MemoryInstallation:
        """``installation`` (from ``crewai_governor.hooks.install``) with memory governed too.

        Takes over its state rather than building a second one: a global installation has
        registered its hooks in its constructor already."""
        adopted = cls.__new__(cls)
        adopted.__dict__.update(vars(installation))
        adopted.memory = MemoryFactory(governor)
        if not installation.scoped:
            adopted.memory.activate()
        return adopted
