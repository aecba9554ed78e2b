"""One agent process of a simulated fleet (run by the fleet tests as a subprocess).

``python fleet_worker.py '<json plan>'`` runs one scenario and prints one JSON report
line. Processes synchronize through barriers kept in the same Redis (a counter plus a
release list), and share a virtual clock that moves only between barriers, so what
each process sees is deterministic.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import loop_governor as lg
from loop_governor.stores.redis import RedisStore


class Fleet:
    """The process's view of the fleet: its id, a raw Redis client and barriers."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.ns: str = plan["ns"]
        self.id: int = plan["id"]
        self.n: int = plan["n"]
        self.raw = redis.Redis.from_url(plan["url"], decode_responses=True)

    def barrier(self, name: str, timeout: int = 60) -> None:
        key = f"{self.ns}:barrier:{name}"
        if self.raw.incr(key) == self.n:
            self.raw.rpush(key + ":go", *["go"] * self.n)
        if self.raw.blpop([key + ":go"], timeout=timeout) is None:
            raise RuntimeError(f"barrier {name} timed out")

    def wait_for(self, key: str, at_least: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while int(self.raw.get(f"{self.ns}:{key}") or 0) < at_least:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{key} never reached {at_least}")
            time.sleep(0.001)


def scenario_breaker(fleet: Fleet) -> dict[str, Any]:
    """Process 0 trips the shared breaker; all see it open; then one burst, one probe."""
    plan = fleet.plan
    threshold, cooldown, threads = plan["threshold"], plan["cooldown"], plan["threads"]
    now = [1000.0]
    store = RedisStore(plan["url"], namespace=fleet.ns, server_time=False)
    events: list[dict[str, Any]] = []
    store.on_event = events.append
    config = lg.GovernorConfig(retry_max_attempts=1, breaker_failure_threshold=threshold, breaker_cooldown_s=cooldown)
    gov = lg.Governor(config, store=store, clock=lambda: now[0])
    gov.subscribe(lambda e: events.append(e) if e["event"] == "breaker" else None)
    report: dict[str, Any] = {"id": fleet.id, "tripped": [], "cooldown": [], "burst": [], "ran": 0}

    def failing() -> str:
        raise ConnectionError("upstream refused the connection")

    def run(fn: Callable[[], str]) -> str:
        try:
            gov.call("flaky_api", fn)
            return "ok"
        except lg.AgentToolError as exc:
            return type(exc).__name__

    fleet.barrier("start")
    if fleet.id == 0:
        report["tripped"] = [run(failing) for _ in range(threshold)]
    fleet.barrier("tripped")

    now[0] = 1000.0 + cooldown / 2
    ran = [0]

    def counted() -> str:
        ran[0] += 1
        return "ok"

    report["cooldown"] = [run(counted) for _ in range(3)]
    fleet.barrier("cooled")

    now[0] = 1000.0 + cooldown + 1
    total = fleet.n * threads

    def probe() -> str:
        ran[0] += 1
        fleet.raw.incr(f"{fleet.ns}:probes")
        # Hold the probe open until every other caller in the burst has been refused,
        # so no caller can arrive after the breaker closed again.
        fleet.wait_for("refused", total - 1, timeout=20.0)
        return "ok"

    results: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def caller() -> None:
        start.wait()
        outcome = run(probe)
        if outcome == "CircuitOpenError":
            fleet.raw.incr(f"{fleet.ns}:refused")
        with lock:
            results.append(outcome)

    fleet.barrier("burst")
    pool = [threading.Thread(target=caller) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    fleet.barrier("done")
    report["burst"] = sorted(results)
    report["ran"] = ran[0]
    report["final_state"] = store.breaker_get("flaky_api").state.value
    report["events"] = events
    report["fallbacks"] = store.fallbacks
    return report


def scenario_rate(fleet: Fleet) -> dict[str, Any]:
    """Every virtual tick each process asks for tokens until refused; count admissions."""
    plan = fleet.plan
    store = RedisStore(plan["url"], namespace=fleet.ns, server_time=False)
    rate, burst, ticks, dt = plan["rate"], plan["burst"], plan["ticks"], plan["dt"]
    admitted = refused = 0
    for i in range(ticks):
        fleet.barrier(f"tick{i}")
        now = 1000.0 + i * dt
        for _ in range(plan["tries_per_tick"]):
            if store.rate_acquire("search", rate, burst, now) == 0.0:
                admitted += 1
            else:
                refused += 1
                break
    return {"id": fleet.id, "admitted": admitted, "refused": refused, "fallbacks": store.fallbacks}


def scenario_outage(fleet: Fleet) -> dict[str, Any]:
    """Govern calls in a loop on wall time while the test kills and restarts Redis."""
    plan = fleet.plan
    workdir = Path(plan["dir"])
    log = (workdir / f"events-{fleet.id}.jsonl").open("a", buffering=1)

    def on_event(event: dict[str, Any]) -> None:
        log.write(json.dumps(event, default=str) + "\n")

    store = RedisStore(plan["url"], namespace=fleet.ns, server_time=False, reconnect_base_s=0.05, reconnect_max_s=0.2)
    config = lg.GovernorConfig(
        retry_max_attempts=2,
        retry_base_delay=0.0,
        retry_max_delay=0.0,
        breaker_failure_threshold=3,
        breaker_cooldown_s=3600,
    )
    gov = lg.Governor(config, store=store)
    wanted = ("store_fallback", "store_recovered", "breaker")
    gov.subscribe(lambda e: on_event(e) if e["event"] in wanted else None)
    store.on_event = lambda e: gov.emit(e.pop("event"), **e)
    counts = {"ok": 0, "governed_errors": 0, "in_outage_ok": 0}
    unexpected: list[str] = []

    def broken() -> str:
        raise TimeoutError("upstream timed out")

    stop = workdir / "stop"
    i = 0
    while not stop.exists():
        i += 1
        try:
            with gov.task(f"task-{fleet.id}-{i}"):
                gov.call("healthy_api", lambda: "ok")
                counts["ok"] += 1
                if store.degraded:
                    counts["in_outage_ok"] += 1
                    # Only during the outage: trips this process's local breaker, which
                    # must reach the fleet once Redis is back.
                    gov.call("down_api", broken)
        except lg.AgentToolError:
            counts["governed_errors"] += 1
        except BaseException as exc:  # the property under test: nothing else escapes
            unexpected.append(f"{type(exc).__name__}: {exc}")
        time.sleep(0.002)
    log.close()
    return {"id": fleet.id, "calls": i, **counts, "unexpected": unexpected, "fallbacks": store.fallbacks}


SCENARIOS = {"breaker": scenario_breaker, "rate": scenario_rate, "outage": scenario_outage}

if __name__ == "__main__":
    plan = json.loads(sys.argv[1])
    print(json.dumps(SCENARIOS[plan["scenario"]](Fleet(plan)), default=str))
