"""Governed success-path cost per call, against the peers, in one process.

    python benchmarks/hotpath.py [--calls 200000] [--repeats 7]

Prints the median cost of one successful call for: a bare function call, loop-governor
(outside and inside a task scope, where the loop guards look at every result: a batch
whose results differ only in the number asked for, and lookups whose results differ),
tenacity alone (a ``Retrying`` object reused, the cheapest way to use it) and pybreaker +
tenacity (the usual hand-rolled pairing), and
the ratios. Medians of several repeats; these machines are noisy.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import pybreaker
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

import loop_governor as lg


def tool(x: int) -> str:
    return f"row {x}"


def _letters(x: int) -> str:
    out = ""
    while True:
        out += chr(97 + x % 26)
        x //= 26
        if not x:
            return out


def lookup(x: int) -> str:
    """A tool whose answers differ in words, not only in the number asked for."""
    return f"row {_letters(x)}"


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    gov = lg.Governor()
    retrying = Retrying(
        stop=stop_after_attempt(3),
        wait=wait_random_exponential(multiplier=0.8, max=8.0),
        retry=retry_if_exception_type(Exception),
        reraise=True,
    )
    breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60)

    # Every call asks for a new row, as an agent does: inside a task the governor's loop
    # guard looks at each result, and the identical call with the identical result over
    # and over is exactly what it stops.
    counter = itertools.count()

    def bare() -> object:
        return tool(next(counter))

    def governed() -> object:
        return gov.call("tool", tool, next(counter))

    def governed_lookup() -> object:
        return gov.call("lookup", lookup, next(counter))

    def bare_lookup() -> object:
        return lookup(next(counter))

    def tenacity_only() -> object:
        return retrying(tool, next(counter))

    def pybreaker_tenacity() -> object:
        return retrying(breaker.call, tool, next(counter))

    n, r = args.calls, args.repeats
    results = {"bare call": per_call_us(bare, n, r), "loop-governor": per_call_us(governed, n, r)}
    # Inside a task the loop guards compare each result with the last ones: a batch
    # ("row 7" for 7, "row 8" for 8: alike but for the number asked) is their dearest case.
    with gov.task("bench"):
        results["loop-governor (in task)"] = per_call_us(governed, n, r)
    results["bare call (lookup)"] = per_call_us(bare_lookup, n, r)
    with gov.task("bench-lookup"):
        results["loop-governor (in task, lookup)"] = per_call_us(governed_lookup, n, r)
    results["tenacity"] = per_call_us(tenacity_only, max(n // 4, 1), r)
    results["pybreaker + tenacity"] = per_call_us(pybreaker_tenacity, max(n // 4, 1), r)

    gov_us = results["loop-governor"]
    print(f"{'success path':28s} {'us/call':>9s} {'vs loop-governor':>17s}")
    for name, us in results.items():
        print(f"{name:28s} {us:9.3f} {us / gov_us:16.1f}x")
    overhead = gov_us - results["bare call"]
    print(
        f"\nloop-governor overhead over a bare call: {overhead:.3f} us "
        f"(in a task: {results['loop-governor (in task)'] - results['bare call']:.3f} us for a batch, "
        f"{results['loop-governor (in task, lookup)'] - results['bare call (lookup)']:.3f} us for lookups)"
    )
    print(f"pybreaker + tenacity / loop-governor: {results['pybreaker + tenacity'] / gov_us:.1f}x")
    print(f"tenacity alone / loop-governor: {results['tenacity'] / gov_us:.1f}x")


if __name__ == "__main__":
    main()
