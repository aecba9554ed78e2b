"""Fixtures for the checkpoint tests: every store kind behind one ``make_store`` factory.

The Redis store runs against the session's real redis-server (``redis_server`` in
tests/conftest.py), each test under its own key prefix.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loop_governor.checkpoint import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    RedisCheckpointStore,
    SQLiteCheckpointStore,
)

StoreFactory = Callable[[], CheckpointStore]

STORE_KINDS = ["memory", "file", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """A factory of stores that all see the same data (like several processes would).

    Memory stores are per instance, so for "memory" the factory returns the same one.
    """
    opened: list[CheckpointStore] = []
    namespace = uuid.uuid4().hex[:12]
    shared_memory = MemoryCheckpointStore()

    def factory() -> CheckpointStore:
        store: CheckpointStore
        if store_kind == "memory":
            return shared_memory
        if store_kind == "file":
            store = FileCheckpointStore(tmp_path / "checkpoints")
        elif store_kind == "sqlite":
            store = SQLiteCheckpointStore(tmp_path / "checkpoints.db")
        else:
            url = request.getfixturevalue("redis_server")
            store = RedisCheckpointStore(
                url, prefix=f"lg-test-{namespace}:ckpt:", quarantine_prefix=f"lg-test-{namespace}:quarantine:"
            )
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> CheckpointStore:
    return make_store()
