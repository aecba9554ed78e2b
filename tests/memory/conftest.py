"""Fixtures for the governed-memory tests: offline crewAI, a governor on virtual time, a
dict-backed crewAI ``StorageBackend`` and a LangGraph store that fail on request, and a
local embedder stand-in (hashed character trigrams: no network, no model download).

crewAI is switched offline at module top, before anything imports crewai.
"""

from __future__ import annotations

from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-memory-home-")

import hashlib  # noqa: E402
import math  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Iterable, Iterator  # noqa: E402
from datetime import datetime  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from crewai.memory.types import MemoryRecord, ScopeInfo  # noqa: E402
from langgraph.store.base import Op, Result  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402
from lg_testing import HTTPError, VirtualClock  # noqa: E402

import loop_governor as lg  # noqa: E402

GOVERNED_JSON = (
    '{"error":{"type":"permanent","retryable":false,"tool":"search_docs","status":404,'
    '"message":"HTTP 404: not found","attempts":1}}'
)
TRACEBACK = 'Traceback (most recent call last):\n  File "/app/x.py", line 3, in <module>\n    f()\nKeyError: "k"'
SECRET = "sk-proj-abcdefghijklmnopqrstuvwx0123456789"


def hash_embedder(texts: list[str], dims: int = 64) -> list[list[float]]:
    """A deterministic local embedding: hashed character trigrams, L2-normalized."""
    out = []
    for text in texts:
        vec = [0.0] * dims
        low = text.lower()
        for i in range(max(1, len(low) - 2)):
            h = int.from_bytes(hashlib.blake2s(low[i : i + 3].encode(), digest_size=4).digest(), "big")
            vec[h % dims] += 1.0
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        out.append([v / norm for v in vec])
    return out


class Faults:
    """Errors to raise, one per backend call, in order (``None``: that call succeeds)."""

    def __init__(self) -> None:
        self.queue: list[BaseException | None] = []
        self.forever: BaseException | None = None
        self.calls = 0
        self.lock = threading.Lock()

    def hit(self) -> None:
        with self.lock:
            self.calls += 1
            fault = self.queue.pop(0) if self.queue else self.forever
        if fault is not None:
            raise fault


class DictStorage:
    """A crewAI ``StorageBackend`` on a dict (what a user's custom backend looks like)."""

    def __init__(self) -> None:
        self.records: dict[str, MemoryRecord] = {}
        self.faults = Faults()

    def save(self, records: list[MemoryRecord]) -> None:
        self.faults.hit()
        for r in records:
            self.records[r.id] = r

    def search(
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        self.faults.hit()
        hits = []
        for r in self._in(scope_prefix):
            score = sum(a * b for a, b in zip(query_embedding, r.embedding or [], strict=False))
            if score >= min_score:
                hits.append((r, score))
        return sorted(hits, key=lambda h: -h[1])[:limit]

    def delete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        self.faults.hit()
        doomed = [r.id for r in self._in(scope_prefix) if record_ids is None or r.id in record_ids]
        for rid in doomed:
            del self.records[rid]
        return len(doomed)

    def update(self, record: MemoryRecord) -> None:
        self.faults.hit()
        self.records[record.id] = record

    def get_record(self, record_id: str) -> MemoryRecord | None:
        self.faults.hit()
        return self.records.get(record_id)

    def list_records(self, scope_prefix: str | None = None, limit: int = 200, offset: int = 0) -> list[MemoryRecord]:
        self.faults.hit()
        return sorted(self._in(scope_prefix), key=lambda r: r.created_at, reverse=True)[offset : offset + limit]

    def get_scope_info(self, scope: str) -> ScopeInfo:
        self.faults.hit()
        return ScopeInfo(path=scope, record_count=len(self._in(scope)))

    def list_scopes(self, parent: str = "/") -> list[str]:
        self.faults.hit()
        return sorted({r.scope for r in self._in(parent) if r.scope != parent})

    def list_categories(self, scope_prefix: str | None = None) -> dict[str, int]:
        self.faults.hit()
        counts: dict[str, int] = {}
        for r in self._in(scope_prefix):
            for c in r.categories:
                counts[c] = counts.get(c, 0) + 1
        return counts

    def count(self, scope_prefix: str | None = None) -> int:
        self.faults.hit()
        return len(self._in(scope_prefix))

    def reset(self, scope_prefix: str | None = None) -> None:
        self.faults.hit()
        for r in self._in(scope_prefix):
            del self.records[r.id]

    async def asave(self, records: list[MemoryRecord]) -> None:
        self.save(records)

    async def asearch(self, query_embedding: list[float], **kwargs: Any) -> list[tuple[MemoryRecord, float]]:
        return self.search(query_embedding, **kwargs)

    async def adelete(self, **kwargs: Any) -> int:
        return self.delete(**kwargs)

    def _in(self, scope_prefix: str | None) -> list[MemoryRecord]:
        prefix = (scope_prefix or "/").rstrip("/")
        return [r for r in self.records.values() if r.scope == prefix or r.scope.startswith(prefix + "/") or not prefix]

    def contents(self) -> list[str]:
        return [r.content for r in self.records.values()]


class FlakyStore(InMemoryStore):
    """LangGraph's ``InMemoryStore`` whose batches fail on request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults = Faults()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        self.faults.hit()
        return super().batch(ops)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        self.faults.hit()
        return await super().abatch(ops)

    def values(self) -> list[dict[str, Any]]:
        return [item.value for ns in self.list_namespaces() for item in self.search(ns, limit=1000)]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def governor(clock: VirtualClock) -> lg.Governor:
    """A governor on virtual time: retries back off and breakers cool down without sleeping."""
    return lg.Governor(lg.GovernorConfig(), clock=clock, sleep=clock.sleep, asleep=clock.asleep)


@pytest.fixture
def events(governor: lg.Governor) -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(record: dict[str, Any]) -> None:
        with lock:
            seen.append(record)

    unsubscribe = governor.subscribe(sink)
    yield seen
    unsubscribe()


class MemoryKit:
    DictStorage = DictStorage
    FlakyStore = FlakyStore
    HTTPError = HTTPError
    GOVERNED_JSON = GOVERNED_JSON
    TRACEBACK = TRACEBACK
    SECRET = SECRET
    hash_embedder = staticmethod(hash_embedder)

    @staticmethod
    def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        return [e for e in events if e["event"] == name]

    @staticmethod
    def record(content: str, scope: str = "/", **kw: Any) -> MemoryRecord:
        return MemoryRecord(content=content, scope=scope, embedding=hash_embedder([content])[0], **kw)


@pytest.fixture
def mk() -> type[MemoryKit]:
    return MemoryKit


@pytest.fixture
def storage() -> DictStorage:
    return DictStorage()


@pytest.fixture
def make_store() -> Callable[..., FlakyStore]:
    return FlakyStore
