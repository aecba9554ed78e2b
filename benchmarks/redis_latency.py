"""Governed call latency with the Redis store, against a bare Redis GET, in one run.

    python benchmarks/redis_latency.py [--url redis://host:port/0] [--calls 3000] [--rate-check]

Without ``--url`` it starts its own throw-away redis-server on a free local port. The
cases run interleaved in blocks (so drift on a shared machine hits all of them alike) and
each call is timed on its own; the figures are medians in microseconds:

- ``GET``: one bare redis-py GET (the network round trip floor);
- ``breaker_admit``: the store's closed-breaker check (one HMGET);
- ``governed (redis)``: ``Governor.call`` on a no-op tool inside a task scope;
- ``governed (memory)``: the same with the default in-process store, for reference;
- ``rate_acquire``: one token from the shared bucket (one EVALSHA);
- ``rate_acquire_all``: a request and a token bucket in one EVALSHA (a rate-limited model call).

``--rate-check`` also runs 4 processes against one shared limit of ``--rate`` requests/s
for ``--seconds`` of wall time (burst 5; a refused caller sleeps the returned wait and
asks again) and prints the achieved fleet rate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

import redis

import loop_governor as lg
from loop_governor.stores.redis import RedisStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: str, binary: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A throwaway server on a free 127.0.0.1 port (``binary``: redis-server by default, or a
    valkey-server), without persistence; its URL once it answers PING."""
    binary = binary or shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server not found; install it or pass --url")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(500):
        try:
            client.ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.01)
    proc.kill()
    sys.exit(f"{binary} did not start")


def measure(cases: dict[str, Callable[[], object]], calls: int, block: int = 100) -> dict[str, float]:
    samples: dict[str, list[int]] = {name: [] for name in cases}
    for fn in cases.values():  # warm up: connections, script load, caches
        for _ in range(200):
            fn()
    for _ in range(max(1, calls // block)):
        for name, fn in cases.items():
            out = samples[name]
            for _ in range(block):
                t0 = time.perf_counter_ns()
                fn()
                out.append(time.perf_counter_ns() - t0)
    return {name: statistics.median(v) / 1000 for name, v in samples.items()}


def rate_worker(url: str, ns: str, rate: float, burst: float, seconds: float, start: float) -> None:
    store = RedisStore(url, namespace=ns)
    admitted = 0
    time.sleep(max(0.0, start - time.time()))  # all workers start together
    while (now := time.time()) < start + seconds:
        wait = store.rate_acquire("search", rate, burst, now)
        if wait:
            time.sleep(wait)
        else:
            admitted += 1
    print(json.dumps({"admitted": admitted, "seconds": time.time() - start}))


def rate_check(url: str, rate: float, seconds: float, processes: int = 4) -> None:
    ns = f"bench-rate-{uuid.uuid4().hex[:8]}"
    burst = 5.0
    start = time.time() + 2.0  # after every worker process is up
    cmd = [
        sys.executable,
        __file__,
        "--url",
        url,
        "--rate-worker",
        ns,
        "--rate",
        str(rate),
        "--seconds",
        str(seconds),
        "--burst",
        str(burst),
        "--start",
        repr(start),
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE) for _ in range(processes)]
    reports = [json.loads(p.communicate()[0].decode().strip().splitlines()[-1]) for p in procs]
    total = sum(r["admitted"] for r in reports)
    achieved = (total - burst) / seconds
    per = ", ".join(str(r["admitted"]) for r in reports)
    print(f"\nshared rate limit: {processes} processes, limit {rate:.0f}/s for {seconds:.1f}s wall time")
    print(f"  admitted {total} ({per}) -> {achieved:.1f}/s = {achieved / rate:.3f} x limit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="use this Redis instead of starting one")
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per case")
    parser.add_argument("--rate-check", action="store_true", help="also measure a 4-process shared rate limit")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--burst", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--rate-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.rate_worker:
        rate_worker(args.url, args.rate_worker, args.rate, args.burst, args.seconds, args.start)
        return

    with tempfile.TemporaryDirectory() as tmp:
        proc = None
        url = args.url
        if url is None:
            proc, url = start_server(tmp)
        try:
            ns = f"bench-{uuid.uuid4().hex[:8]}"
            raw = redis.Redis.from_url(url, decode_responses=True)
            raw.set(f"{ns}:k", "v")
            store = RedisStore(url, namespace=ns)
            gov_redis = lg.Governor(lg.GovernorConfig(), store=store)
            gov_mem = lg.Governor(lg.GovernorConfig())
            policy = gov_redis.policy("search").breaker

            def noop(x: int) -> int:
                return x

            with gov_redis.task("bench"), gov_mem.task("bench"):
                medians = measure(
                    {
                        "GET": lambda: raw.get(f"{ns}:k"),
                        "breaker_admit": lambda: store.breaker_admit("search", time.time, policy),
                        "governed (redis)": lambda: gov_redis.call("search", noop, 1),
                        "governed (memory)": lambda: gov_mem.call("search", noop, 1),
                        "rate_acquire": lambda: store.rate_acquire("bench", 1e9, 1e9, time.time()),
                        "rate_acquire_all": lambda: store.rate_acquire_all(
                            [("bench", 1e9, 1e9, 1.0), ("bench:tokens", 1e9, 1e9, 500.0)], time.time()
                        ),
                    },
                    args.calls,
                )
            assert store.fallbacks == 0, "the store fell back during the benchmark"
            print(
                f"redis {raw.info('server')['redis_version']} at {store.safe_url}, {args.calls} calls per case, "
                "median us per call:"
            )
            get = medians["GET"]
            for name, us in medians.items():
                print(f"  {name:<18} {us:8.1f} us   {us / get:5.2f} x GET")
            print(f"governed call with redis store / bare GET: {medians['governed (redis)'] / get:.2f}")
            if args.rate_check:
                rate_check(url, args.rate, args.seconds)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
