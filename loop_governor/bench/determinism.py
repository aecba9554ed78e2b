"""What keeps a benchmark world reproducible and attributable: seeded draws, request owners.

Randomness in the simulation (flaky time slots, model latency, a model policy's choices,
an SDK's jitter) is [`unit_hash`][loop_governor.bench.determinism.unit_hash] of what the draw is about, never a shared
random generator, so the same seed gives the same world whatever each arm does in between.
Every request to a service or to the model provider is attributed to the task in
[`CURRENT_TASK`][loop_governor.bench.determinism.CURRENT_TASK].
"""

from __future__ import annotations

import contextvars
import hashlib

CURRENT_TASK: contextvars.ContextVar[str] = contextvars.ContextVar("lg_bench_task", default="-")
"""The benchmark task issuing a request (requests are attributed per task)."""


def unit_hash(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts`` (stable across processes, unlike hash())."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
