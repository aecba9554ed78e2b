"""Offline crewAI for the benchmark tests: its switches and HOME are set before anything
imports crewai (importing it writes under ~/.local/share/crewai otherwise)."""

from __future__ import annotations

from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-bench-home-")

from typing import Any  # noqa: E402

import pytest  # noqa: E402

from loop_governor.bench.runner import run_bench  # noqa: E402

SEED = 11


@pytest.fixture(scope="session")
def bench_result() -> dict[str, Any]:
    """Both frameworks, all arms, two passes over every scenario (the tests' budget)."""
    return run_bench(seed=SEED, runs=2)
