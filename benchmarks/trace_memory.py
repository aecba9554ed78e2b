"""Memory the Agent Lens keeps: RSS growth over many tasks with large distinct messages.

Run: ``.venv/bin/python benchmarks/trace_memory.py [--tasks 3000] [--kb 100]``

The workload of issue 17: ``--tasks`` tasks, each with one model call whose prompt holds one
distinct ``--kb`` KB message (plus a system prompt every task shares), every task ended,
the trace flushed to a JSONL file. Printed: the process's resident set size before and after
(``/proc/self/statm``, after a warm-up of 50 tasks and a ``gc.collect()``), the growth,
and the bytes the Lens's caches hold against their budgets (``TraceBudget``). Target: growth
<= 64 MB. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import loop_governor as lg
from loop_governor.trace import install

_WORDS = "the agent reads a file then calls search and writes a patch for the failing test suite".split()


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def corpus(size: int, rng: random.Random) -> str:
    """``size`` characters of words: text the redaction rules actually scan."""
    words: list[str] = []
    total = 0
    while total < size:
        word = rng.choice(_WORDS)
        words.append(word)
        total += len(word) + 1
    return " ".join(words)[:size]


def message(i: int, base: str) -> dict[str, Any]:
    """A distinct message of ``len(base)`` characters: the corpus rotated, numbered."""
    cut = (i * 7919) % len(base)
    text = f"task {i}: " + base[cut:] + base[:cut]
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": text[: len(base)]}


def run(tasks: int, kb: int, path: Path) -> dict[str, Any]:
    rng = random.Random(17)
    gov = lg.Governor(lg.GovernorConfig())
    lens = install(gov, path)
    system = {"role": "system", "content": "You fix failing tests. " * 20}
    base = corpus(kb * 1000, rng)

    def one(i: int) -> None:
        with gov.task(f"task-{i}"):
            gov.emit("model_call", model="m", input_tokens=kb * 256, messages=[system, message(i, base)])

    for i in range(50):
        one(-1 - i)
    lens.flush(timeout=600)
    gc.collect()
    before = rss_bytes()
    start = time.perf_counter()
    for i in range(tasks):
        one(i)
    lens.flush(timeout=600)
    elapsed = time.perf_counter() - start
    gc.collect()
    after = rss_bytes()
    stats: dict[str, Any] = {"before": before, "after": after, "elapsed": elapsed}
    memory = getattr(lens, "memory", None)
    if memory is not None:
        stats["caches"] = memory()
    lens.close()
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--kb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lg-trace-memory-") as tmp:
        stats = run(args.tasks, args.kb, Path(tmp) / "trace.jsonl")
    mb = 1 << 20
    growth = (stats["after"] - stats["before"]) / mb
    print(f"{args.tasks} tasks x one distinct {args.kb} KB message, all ended ({stats['elapsed']:.1f} s)")
    print(f"RSS before {stats['before'] / mb:.1f} MB, after {stats['after'] / mb:.1f} MB: growth {growth:+.1f} MB")
    for name, (held, budget) in stats.get("caches", {}).items():
        print(f"  {name:<16}{held / mb:8.2f} MB of {budget / mb:.2f} MB budget")
    print(f"target <= 64 MB growth: {'OK' if growth <= 64 else 'ABOVE TARGET'}")


if __name__ == "__main__":
    main()
