"""Offline crewAI for the benchmark tests: its switches and HOME are set before anything
imports crewai (importing it writes under ~/.local/share/crewai otherwise)."""

from __future__ import annotations

import os
import tempfile

os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_DISABLE_TRACKING"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["HOME"] = tempfile.mkdtemp(prefix="lg-bench-home-")

from typing import Any

import pytest

from loop_governor.bench.runner import run_bench

SEED = 11


@pytest.fixture(scope="session")
def bench_result() -> dict[str, Any]:
    """Both frameworks, all arms, two passes over every scenario (the tests' budget)."""
    return run_bench(seed=SEED, runs=2)
