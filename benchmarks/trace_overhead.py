"""Tracing overhead per governed call: what the Agent Lens adds to ``Governor.call``.

Run: ``.venv/bin/python benchmarks/trace_overhead.py [--calls 20000] [--rounds 7]``

Prints the median time per governed call (a trivial tool, inside a task scope) for:

* ``baseline``      no subscriber (the governor skips building events at all);
* ``emit-only``     a subscriber doing nothing: the governor's own cost of emitting events;
* ``lens``          Lens installed: JSONL file + spans through the default (no-op) global
                    TracerProvider; time on the caller's thread, the writer thread drains
                    concurrently;
* ``lens+drain``    the same including the wait until every record is on disk, i.e. the
                    total CPU the trace costs per call;
* ``lens-deferred`` the Lens with its writer thread held back until the loop is over: the
                    caller's critical path alone; ``writer/record`` is then the writer's
                    time per record (redaction, JSON, file, spans), paid off the hot path;
* ``lens+sdk``      Lens with an SDK TracerProvider (BatchSpanProcessor, in-memory exporter);
* peers: ``naive-jsonl`` a subscriber that redacts, serializes and writes each event on the
  caller's thread (what a hand-rolled JSONL sink does), and ``otel-manual`` an SDK span
  opened around every call by hand (what a user instrumenting tools directly pays).

Overhead = median(variant) - median(baseline). Target for ``lens``: <= 10 us per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loop_governor as lg
from loop_governor.redaction import redact_obj
from loop_governor.trace import Lens, install


def _tool(x: int) -> int:
    return x


def _sdk_provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter(), max_queue_size=1 << 20))
    return provider


def _time_calls(gov: lg.Governor, calls: int, wrap: Callable[[Callable[[], Any]], Any] | None = None) -> float:
    """Seconds per call for ``calls`` governed calls inside one task."""
    with gov.task("bench"):
        start = time.perf_counter()
        if wrap is None:
            for i in range(calls):
                gov.call("echo", _tool, i)
        else:
            for i in range(calls):
                wrap(lambda i=i: gov.call("echo", _tool, i))
        return (time.perf_counter() - start) / calls


def run(calls: int, rounds: int) -> dict[str, float]:
    results: dict[str, list[float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="lg-trace-bench-"))

    def record(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds * 1e6)

    for r in range(rounds):
        gov = lg.Governor(lg.GovernorConfig())
        _time_calls(gov, 1000)  # warm up
        record("baseline", _time_calls(gov, calls))

        gov = lg.Governor(lg.GovernorConfig())
        gov.subscribe(lambda event: None)
        _time_calls(gov, 1000)
        record("emit-only", _time_calls(gov, calls))

        gov = lg.Governor(lg.GovernorConfig())
        lens = install(gov, tmp / f"lens-{r}.jsonl")
        _time_calls(gov, 1000)
        lens.flush()
        start = time.perf_counter()
        record("lens", _time_calls(gov, calls))
        lens.flush(timeout=600)
        record("lens+drain", (time.perf_counter() - start) / calls)
        lens.close()

        # The same Lens with its writer held back until the loop ends: the caller's
        # critical path alone, then the writer's cost per record on its own.
        gov = lg.Governor(lg.GovernorConfig())
        lens = Lens(tmp / f"deferred-{r}.jsonl", emit=gov.emit, flush_interval_s=3600, wake_batch=1 << 30)
        gov.subscribe(lens)
        _time_calls(gov, 1000)
        lens.flush()
        record("lens-deferred", _time_calls(gov, calls))
        start = time.perf_counter()
        lens.flush(timeout=600)
        record("writer/record", (time.perf_counter() - start) / calls)
        lens.close()

        gov = lg.Governor(lg.GovernorConfig())
        provider = _sdk_provider()
        lens = install(gov, tmp / f"sdk-{r}.jsonl", tracer_provider=provider)
        _time_calls(gov, 1000)
        lens.flush()
        record("lens+sdk", _time_calls(gov, calls))
        lens.close()
        provider.shutdown()

        gov = lg.Governor(lg.GovernorConfig())
        out = open(tmp / f"naive-{r}.jsonl", "a", encoding="utf-8")

        def naive(event: dict[str, Any], out: Any = out) -> None:
            out.write(json.dumps(redact_obj(event), default=str) + "\n")

        gov.subscribe(naive)
        _time_calls(gov, 1000)
        record("naive-jsonl", _time_calls(gov, calls))
        out.close()

        gov = lg.Governor(lg.GovernorConfig())
        provider = _sdk_provider()
        tracer = provider.get_tracer("bench")

        def manual(fn: Callable[[], Any], tracer: Any = tracer) -> Any:
            with tracer.start_as_current_span("execute_tool echo"):
                return fn()

        _time_calls(gov, 1000, manual)
        record("otel-manual", _time_calls(gov, calls, manual))
        provider.shutdown()
    return {name: statistics.median(values) for name, values in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    medians = run(args.calls, args.rounds)
    base = medians["baseline"]
    print(f"governed calls: {args.calls} x {args.rounds} rounds (median per call)")
    print(f"{'variant':<14}{'us/call':>10}{'overhead us':>14}{'x baseline':>12}")
    for name, value in medians.items():
        if name == "writer/record":
            print(f"{name:<14}{value:>10.2f}{'':>14}{'':>12}")
            continue
        print(f"{name:<14}{value:>10.2f}{value - base:>14.2f}{value / base:>12.2f}")
    lens_overhead = medians["lens"] - base
    verdict = "OK" if lens_overhead <= 10 else "ABOVE TARGET"
    print(f"tracing overhead on the caller's thread: {lens_overhead:.2f} us/call (target <= 10 us): {verdict}")
    print(
        f"  of which the governor's event emission: {medians['emit-only'] - base:.2f} us, "
        f"the Lens itself: {medians['lens'] - medians['emit-only']:.2f} us"
    )
    print(f"total trace CPU per call incl. the writer thread: {medians['lens+drain'] - base:.2f} us")
    print(
        f"critical path with the writer held back: {medians['lens-deferred'] - base:.2f} us/call; "
        f"writer per record: {medians['writer/record']:.2f} us"
    )


if __name__ == "__main__":
    main()
