"""Overhead of a governed LangChain tool call on the success path.

Prints the median wall time of ``tool.invoke`` for a plain ``@tool`` function and for
the same tool wrapped with ``langchain_governor.govern_tool`` (inside and outside a task
scope, with a dict input and with a model tool call), and the ratio governed/plain.
Target: ratio <= 1.05.

    .venv/bin/python benchmarks/langchain_overhead.py [--rounds 31] [--calls 500]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

from langchain_core.tools import tool

import loop_governor as lg
from langchain_governor import govern_tool


@tool
def lookup(key: str, limit: int = 3) -> str:
    """Look a key up."""
    return f"{key}:{limit}"


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def medians(cases: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    for fn in cases.values():  # warm caches (schemas, policies)
        per_call_us(fn, 200)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc.disable()
    try:
        for _ in range(rounds):  # interleaved rounds: drift hits every case alike
            for name, fn in cases.items():
                samples[name].append(per_call_us(fn, calls))
    finally:
        gc.enable()
    best = {f"{name} (min)": min(values) for name, values in samples.items()}
    return {**{name: statistics.median(values) for name, values in samples.items()}, **best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--calls", type=int, default=500)
    opts = parser.parse_args()

    governor = lg.Governor(lg.GovernorConfig())
    governed = govern_tool(lookup, governor)
    args = {"key": "k", "limit": 2}
    call = {"name": "lookup", "args": args, "id": "call_1", "type": "tool_call"}

    cases = {
        "plain dict": lambda: lookup.invoke(args),
        "governed dict": lambda: governed.invoke(args),
        "plain tool_call": lambda: lookup.invoke(call),
        "governed tool_call": lambda: governed.invoke(call),
    }
    result = medians(cases, opts.rounds, opts.calls)
    # Inside a task the governor's loop guard would (rightly) stop a model that repeats the
    # identical call with the identical result, so each call asks for a new key.
    counter = itertools.count()

    def fresh_call() -> dict[str, Any]:
        return {**call, "args": {"key": f"k{next(counter)}", "limit": 2}}

    with governor.task("bench"):
        scoped = medians(
            {
                "plain in task": lambda: lookup.invoke(fresh_call()),
                "governed in task": lambda: governed.invoke(fresh_call()),
            },
            opts.rounds,
            opts.calls,
        )
    result.update(scoped)

    print(f"{'case':<22}{'median us/call':>16}")
    for name, value in result.items():
        print(f"{name:<22}{value:>16.1f}")
    for label, plain, gov in (
        ("dict input", "plain dict", "governed dict"),
        ("tool call", "plain tool_call", "governed tool_call"),
        ("tool call in a task", "plain in task", "governed in task"),
    ):
        print(
            f"ratio governed/plain, {label:<20} median {result[gov] / result[plain]:.3f}x"
            f"  min {result[gov + ' (min)'] / result[plain + ' (min)']:.3f}x  (target <= 1.05x)"
        )


if __name__ == "__main__":
    main()
