"""Fixtures for the classification corpus.

The corpus is built once per session: every exception in it is raised for real by an SDK
client talking to peers on 127.0.0.1 (see classification_servers.py), which takes ~10 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, so sibling helper modules are not importable by
# default; the benchmark script adds the same directory to sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from classification_corpus import Case, build_corpus


@pytest.fixture(scope="session")
def corpus() -> list[Case]:
    return build_corpus()
