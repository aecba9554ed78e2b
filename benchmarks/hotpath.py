"""Governed success-path cost per call, against the peers, in one process.

    python benchmarks/hotpath.py [--calls 50000] [--repeats 7] [--clock cpu|wall] [CORPUS ...]

Prints the median cost of one successful call of a no-op tool for: a bare function call,
tenacity alone (a ``Retrying`` object reused, the cheapest way to use it), pybreaker +
tenacity (the usual hand-rolled pairing), and loop-governor outside a task and inside one,
where every default loop guard looks at every result:

* **lookups**: every call asks for another row and gets a different answer (a call that
  repeats nothing);
* **batch**: the answers differ only in the number asked for ("row 7", "row 8"): same-shaped
  answers, the guards' dearest healthy case (they must tell a batch from a repeat);
* **identical repeats**: every call made twice in a row, the second the identical call with
  the identical answer (a repeat the guards count, below any threshold).

Then the cost of call 1-10 against call 991-1000 of a task (goal: the same -- nothing a
guard keeps grows with the task), and, for each ``CORPUS`` folder given (the recorded runs
of ``benchmarks/loop_replay.py``, e.g. ``../shared/corpus/swe-dev``), p50 and p90 per call
when replaying every recorded tool call through ``Governor.call`` in a task, beside
trajectory-fuse's ``observe`` (the loop-guard peer) on the same steps.

Timing is the benchmark thread's CPU time by default (``--clock cpu``): on a shared machine
wall time also counts other processes' turns. The cases run interleaved, ``--repeats``
rounds of each, and each figure is the median of its rounds; every ratio is taken between
figures measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

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


def stock(x: int) -> str:
    """A tool whose answer is long enough to count as a verdict (not an exit code)."""
    return f"row {x}: in stock, ships today"


Case = tuple[Callable[[], object], int, str | None]  # (one call, calls per round, task name or None)


def per_call_us(gov: lg.Governor, cases: dict[str, Case], rounds: int, clock: Callable[[], float]) -> dict[str, float]:
    """Median µs a call of each case, the cases interleaved round by round (a neighbour's
    load then weighs on every case alike); an in-task case runs in a fresh task per round."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for number in range(rounds):
        for name, (fn, calls, task) in cases.items():
            with gov.task(f"{task}-{number}") if task else contextlib.nullcontext():
                start = clock()
                for _ in range(calls):
                    fn()
                samples[name].append((clock() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def task_length(gov: lg.Governor, tasks: int, clock: Callable[[], float]) -> tuple[float, float]:
    """Median µs a call of calls 1-10 and of calls 991-1000 of a task of lookups."""
    early: list[float] = []
    late: list[float] = []
    counter = itertools.count()
    for number in range(tasks):
        with gov.task(f"length-{number}"):
            for block in range(100):
                start = clock()
                for _ in range(10):
                    gov.call("lookup", lookup, next(counter))
                if block in (0, 99):
                    (early if block == 0 else late).append((clock() - start) / 10 * 1e6)
    return statistics.median(early), statistics.median(late)


def corpus_figures(paths: list[Path]) -> list[tuple[str, int, float, float, float, float]]:
    """Per corpus: (name, calls, governor p50, p90, trajectory-fuse p50, p90) in µs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import loop_replay as lr

    rows = []
    for path in paths:
        gov_us, fuse_us = lr.time_calls(lr.load_runs(path))
        g, f = statistics.quantiles(gov_us, n=10), statistics.quantiles(fuse_us, n=10)
        rows.append((path.name, len(gov_us), statistics.median(gov_us), g[8], statistics.median(fuse_us), f[8]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", nargs="*", type=Path, help="folders of recorded runs to replay (p50/p90 per call)")
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--tasks", type=int, default=100, help="tasks of 1000 calls for the task-length check")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    gov = lg.Governor()
    retrying = Retrying(
        stop=stop_after_attempt(3),
        wait=wait_random_exponential(multiplier=0.8, max=8.0),
        retry=retry_if_exception_type(Exception),
        reraise=True,
    )
    breaker = pybreaker.CircuitBreaker(fail_max=5, reset_timeout=60)
    counter = itertools.count()

    def twice() -> Callable[[], int]:
        """Every number twice in a row: each second call repeats the first exactly."""
        pairs = itertools.count()
        return lambda: next(pairs) // 2

    repeat_arg = twice()
    n, r = args.calls, args.repeats
    peers = max(n // 4, 1)
    cases: dict[str, Case] = {
        "bare call": (lambda: tool(next(counter)), n, None),
        "tenacity": (lambda: retrying(tool, next(counter)), peers, None),
        "pybreaker + tenacity": (lambda: retrying(breaker.call, tool, next(counter)), peers, None),
        "loop-governor": (lambda: gov.call("tool", tool, next(counter)), n, None),
        "in a task: lookups": (lambda: gov.call("lookup", lookup, next(counter)), n, "lookups"),
        "in a task: batch": (lambda: gov.call("tool", tool, next(counter)), n, "batch"),
        "in a task: identical repeats": (lambda: gov.call("stock", stock, repeat_arg()), n, "repeats"),
    }
    results = per_call_us(gov, cases, r, clock)
    early, late = task_length(gov, args.tasks, clock)

    tenacity_us, pair_us = results["tenacity"], results["pybreaker + tenacity"]
    header = f"success path ({args.clock} time, median of {r} rounds)"
    print(f"{header:48s} {'µs':>7s} {'/ tenacity':>11s} {'/ pybreaker+tenacity':>21s}")
    for name, us in results.items():
        print(f"{name:48s} {us:7.3f} {us / tenacity_us:10.2f}x {us / pair_us:20.2f}x")
    print(
        f"\ncall 1-10 of a task: {early:.2f} µs, call 991-1000: {late:.2f} µs "
        f"(late / early {late / early:.2f}x; median of {args.tasks} tasks of lookups)"
    )
    in_task = max(results[k] for k in results if k.startswith("in a task"))
    print(
        f"in a task, the dearest of the three: {in_task:.2f} µs = {in_task / tenacity_us:.2f}x tenacity, "
        f"{in_task / pair_us:.2f}x pybreaker + tenacity; outside a task "
        f"{results['loop-governor'] / tenacity_us:.3f}x tenacity ({tenacity_us / results['loop-governor']:.1f}x faster)"
    )

    if args.corpus:
        print("\nreplaying recorded runs (every tool call through Governor.call in a task; wall time, µs a call)")
        print(f"{'corpus':16s} {'calls':>6s} {'p50':>7s} {'p90':>7s} {'fuse p50':>9s} {'fuse p90':>9s}")
        for name, calls, p50, p90, f50, f90 in corpus_figures(args.corpus):
            print(f"{name:16s} {calls:6d} {p50:7.1f} {p90:7.1f} {f50:9.1f} {f90:9.1f}")


if __name__ == "__main__":
    main()
