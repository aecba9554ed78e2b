"""crewai-memory-core's StorageBackend contract on crewAI's own ``LanceDBStorage``.

Written for loop-governor's compat run (``compat/run.py`` copies it into the
crewai-memory-core sdist's ``tests/`` beside the sdist's own provider module, which runs
the contract on its dict-backed ``InMemoryBackend``): the provider supplies a fresh, empty
``backend``, as the contract asks. In mode ``memory`` the governor_inject plugin makes
``LanceDBStorage(...)`` a ``GovernedStorage`` around one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from crewai.memory.storage import lancedb_storage
from crewai_memory_core.contract import *  # noqa: F403


@pytest.fixture()
def backend(tmp_path: Path) -> object:
    # looked up at call time: the plugin replaces the class before the tests run
    return lancedb_storage.LanceDBStorage(path=str(tmp_path / "lance"))
