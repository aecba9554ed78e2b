"""Overhead of the governed memory wrappers against the bare backend, per save and per search.

``crewai_governor.GovernedStorage`` around crewAI's LanceDB backend and around a dict backend
(the floor: a backend that costs nothing shows the wrapper's own cost), and
``langchain_governor.GovernedStore`` around LangGraph's ``InMemoryStore``. Every save writes a
new ~300-character record (distinct words: no record is a repeat of another), one record a
call; every search asks for 5 results. Prints the median microseconds of each case over
interleaved rounds, and the ratio governed/bare.

    PYTHONPATH=. .venv/bin/python benchmarks/memory_overhead.py [--rounds 21] [--calls 50]
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-bench-memory-")

from crewai.memory.storage.lancedb_storage import LanceDBStorage  # noqa: E402
from crewai.memory.types import MemoryRecord  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402

import loop_governor as lg  # noqa: E402
from crewai_governor import GovernedStorage  # noqa: E402
from langchain_governor import GovernedStore  # noqa: E402

DIMS = 64
_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber basil cedar dahlia ember "
    "fennel garnet hazel iris jasper kelp lotus maple nutmeg olive pepper quartz rowan sage thyme"
).split()


def texts(seed: int) -> Iterator[str]:
    """Endless distinct ~300-char memory texts (no two are repeats of each other)."""
    rng = random.Random(seed)
    while True:
        yield "The user mentioned " + " ".join(rng.choice(_WORDS) for _ in range(45)) + "."


def vector(rng: random.Random) -> list[float]:
    return [rng.random() for _ in range(DIMS)]


class DictBackend:
    """The cheapest possible crewAI StorageBackend: the wrapper's own cost shows."""

    def __init__(self) -> None:
        self.records: dict[str, MemoryRecord] = {}

    def save(self, records: list[MemoryRecord]) -> None:
        for r in records:
            self.records[r.id] = r

    def search(self, query_embedding: list[float], **kw: Any) -> list[tuple[MemoryRecord, float]]:
        return [(r, 1.0) for r in list(self.records.values())[:5]]

    def __getattr__(self, name: str) -> Any:  # the rest of the protocol, unused here
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def medians(cases: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    for fn in cases.values():
        per_call_us(fn, 5)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc.disable()
    try:
        names = list(cases)
        for n in range(rounds):
            # interleaved, and in reverse order every other round: drift hits every case
            # alike, and no case always runs first after the writes (LanceDB's first search
            # after a write pays for loading the new fragments)
            for name in names if n % 2 == 0 else reversed(names):
                samples[name].append(per_call_us(cases[name], calls))
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def crewai_cases(inner: Any, governor: lg.Governor, label: str) -> dict[str, Callable[[], Any]]:
    wrapped = GovernedStorage(inner, governor, name=f"{label}-bench")
    rng = random.Random(7)
    bare_texts, gov_texts = texts(1), texts(2)
    query = vector(rng)

    def record(source: Iterator[str]) -> MemoryRecord:
        return MemoryRecord(content=next(source), embedding=vector(rng))

    return {
        f"{label} save bare": lambda: inner.save([record(bare_texts)]),
        f"{label} save governed": lambda: wrapped.save([record(gov_texts)]),
        f"{label} search bare": lambda: inner.search(query, limit=5),
        f"{label} search governed": lambda: wrapped.search(query, limit=5),
    }


def langgraph_cases(governor: lg.Governor) -> dict[str, Callable[[], Any]]:
    inner = InMemoryStore()
    wrapped = GovernedStore(inner, governor)
    bare_texts, gov_texts = texts(3), texts(4)
    keys = iter(range(10**9))
    ns = ("users", "u1")
    return {
        "InMemoryStore put bare": lambda: inner.put(ns, f"k{next(keys)}", {"text": next(bare_texts)}),
        "InMemoryStore put governed": lambda: wrapped.put(ns, f"k{next(keys)}", {"text": next(gov_texts)}),
        "InMemoryStore search bare": lambda: inner.search(ns, limit=5),
        "InMemoryStore search governed": lambda: wrapped.search(ns, limit=5),
    }


def breakdown_cases(governor: lg.Governor) -> dict[str, Callable[[], Any]]:
    """Where a governed save's time goes: the write filter (failure check, redaction and
    size rules, the repeat index), and the governed call itself."""
    from loop_governor.memory import MemoryGuard, failure_reason

    guard = MemoryGuard(governor, "breakdown")
    source, ids = texts(5), iter(range(10**9))
    sample = next(texts(6))

    def noop(_: Any) -> None:
        return None

    return {
        "filter (admit one record)": lambda: guard.admit("/", next(ids), next(source)),
        "  of which the failure check": lambda: failure_reason(sample),
        "  of which redact": lambda: lg.redact(sample),
        "governed backend call (no-op)": lambda: guard.write(noop, None, keys=[("/", "k")]),
    }


def report(result: dict[str, float]) -> None:
    print(f"{'case':<34}{'bare us':>10}{'governed us':>14}{'overhead us':>14}{'ratio':>8}")
    for name in result:
        if not name.endswith(" bare"):
            continue
        base = name.removesuffix(" bare")
        bare, gov = result[name], result[f"{base} governed"]
        print(f"{base:<34}{bare:>10.1f}{gov:>14.1f}{gov - bare:>14.1f}{gov / bare:>8.2f}")
    print(f"\n{'per save, where the time goes':<34}{'us':>10}")
    for name, value in result.items():
        if not name.endswith((" bare", " governed")):
            print(f"{name:<34}{value:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--lance-calls", type=int, default=5, help="calls per round against LanceDB (ms each)")
    opts = parser.parse_args()
    governor = lg.Governor(lg.GovernorConfig())

    fast = {**crewai_cases(DictBackend(), governor, "dict"), **langgraph_cases(governor), **breakdown_cases(governor)}
    result = medians(fast, opts.rounds, opts.calls)
    # LanceDB may still be writing index files when the table is dropped: ignore them
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        # one table for both cases, in interleaved rounds: both pay for its growth alike
        lance = LanceDBStorage(path=os.path.join(tmp, "lance"))
        result.update(medians(crewai_cases(lance, governor, "LanceDB"), opts.rounds, opts.lance_calls))
    report(result)


if __name__ == "__main__":
    main()
