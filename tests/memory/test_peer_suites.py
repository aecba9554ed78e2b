"""The memory wrappers' peer suites in ``make compat`` (compat/run.py, issue 34): the plugin's
``store`` and ``memory`` modes make every backend those suites build a governed one, so the
"wrapped" column of the report is really the wrappers (not a vacuous pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

COMPAT = Path(__file__).resolve().parents[2] / "compat"


def test_the_store_and_memory_modes_wrap_every_backend_a_test_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import crewai_memory_core.testing as testing
    import langgraph.store.memory as memory
    from crewai.memory.storage import lancedb_storage

    from crewai_governor import GovernedStorage
    from langchain_governor import GovernedStore

    for module, name in ((memory, "InMemoryStore"), (testing, "InMemoryBackend"), (lancedb_storage, "LanceDBStorage")):
        monkeypatch.setattr(module, name, getattr(module, name))  # put back after the test
    monkeypatch.syspath_prepend(str(COMPAT))
    import governor_inject

    governor_inject._patch_store()
    governor_inject._patch_memory_backends()

    store = memory.InMemoryStore()
    store.put(("a",), "k", {"v": 1})
    assert isinstance(store, GovernedStore) and store.get(("a",), "k").value == {"v": 1}
    assert store.guard.tool == "memory:InMemoryStore"
    backend = testing.InMemoryBackend()
    lance = lancedb_storage.LanceDBStorage(path=str(tmp_path / "lance"))
    assert isinstance(backend, GovernedStorage) and isinstance(lance, GovernedStorage)
    assert type(lance.inner).__module__ == "crewai.memory.storage.lancedb_storage"
