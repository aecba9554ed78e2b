"""Several agent processes share one Redis: one breaker, one probe, one rate limit, and
they survive Redis dying under them. Each process is a real OS process (subprocess)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from loop_governor.state.breaker import BreakerState
from loop_governor.stores.redis import RedisStore

pytestmark = pytest.mark.redis

PROCESSES = 4


def test_processes_share_one_breaker_and_exactly_one_probe(redis_server: Any, namespace: str, fleet: Any) -> None:
    threads = 3
    plans = [
        {
            "scenario": "breaker",
            "url": redis_server.url,
            "ns": namespace,
            "id": i,
            "n": PROCESSES,
            "threshold": 3,
            "cooldown": 30.0,
            "threads": threads,
        }
        for i in range(PROCESSES)
    ]
    reports = sorted(fleet.run(plans), key=lambda r: r["id"])

    # Process 0 alone failed three times: that opened the breaker ...
    assert reports[0]["tripped"] == ["TransientError"] * 3
    trips = [(e["from_state"], e["to_state"]) for e in reports[0]["events"] if e["event"] == "breaker"]
    # (process 0 may also be the one whose burst caller won the probe: open -> half_open -> closed)
    assert trips[0] == ("closed", "open") and trips.count(("closed", "open")) == 1
    all_trips = [(e["from_state"], e["to_state"]) for r in reports for e in r["events"] if e["event"] == "breaker"]
    assert all_trips.count(("closed", "open")) == 1 and all_trips.count(("half_open", "closed")) == 1
    # ... for everyone: during the cooldown no process runs the tool.
    for r in reports:
        assert r["cooldown"] == ["CircuitOpenError"] * 3, r
    # After the cooldown, 12 callers (4 processes x 3 threads) arrive together: one probe.
    outcomes = [o for r in reports for o in r["burst"]]
    assert sorted(outcomes) == ["CircuitOpenError"] * (PROCESSES * threads - 1) + ["ok"]
    assert sum(r["ran"] for r in reports) == 1
    assert int(redis_server.client().get(f"{namespace}:probes")) == 1
    # The probe succeeded, so the breaker closed for the whole fleet.
    assert {r["final_state"] for r in reports} == {"closed"}
    assert all(r["fallbacks"] == 0 for r in reports)


def test_shared_rate_limit_holds_across_processes(redis_server: Any, namespace: str, fleet: Any) -> None:
    rate, burst, ticks, dt = 50.0, 5.0, 200, 0.02  # 4 virtual seconds, one token per tick
    plans = [
        {
            "scenario": "rate",
            "url": redis_server.url,
            "ns": namespace,
            "id": i,
            "n": PROCESSES,
            "rate": rate,
            "burst": burst,
            "ticks": ticks,
            "dt": dt,
            "tries_per_tick": 3,
        }
        for i in range(PROCESSES)
    ]
    reports = fleet.run(plans)
    admitted = sum(r["admitted"] for r in reports)
    allowed = rate * dt * (ticks - 1)  # R requests/s over the run (plus the initial burst)
    assert abs(admitted - burst - allowed) <= 0.1 * allowed, (admitted, allowed)
    # Every process kept asking for more than it got: the limit, not demand, set the total.
    assert all(r["refused"] >= ticks // 2 for r in reports), reports
    # Each process alone would have had up to 3 a tick; unshared limits would admit ~4x.
    assert admitted < 1.1 * (allowed + burst) < PROCESSES * allowed
    assert all(r["fallbacks"] == 0 for r in reports)


def _events(workdir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(workdir.glob("events-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_redis_killed_mid_run_calls_keep_completing_and_state_reconverges(
    own_redis_server: Any, namespace: str, fleet: Any, tmp_path: Path
) -> None:
    procs = [
        fleet.start(
            {
                "scenario": "outage",
                "url": own_redis_server.url,
                "ns": namespace,
                "id": i,
                "n": PROCESSES,
                "dir": str(tmp_path),
            }
        )
        for i in range(PROCESSES)
    ]
    try:
        monitor = own_redis_server.client()
        # Running: every process has governed calls through Redis (tasks come and go).
        _wait_for(
            lambda: monitor.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0) > 200,
            "the workers to start calling",
        )
        own_redis_server.kill()
        _wait_for(
            lambda: sum(e["event"] == "store_fallback" for e in _events(tmp_path)) == PROCESSES,
            "every worker to fall back",
        )
        own_redis_server.start()
        _wait_for(
            lambda: sum(e["event"] == "store_recovered" for e in _events(tmp_path)) == PROCESSES,
            "every worker to reconnect",
        )
    finally:
        (tmp_path / "stop").touch()
    reports = fleet.collect_reports(procs)

    for r in reports:
        assert r["unexpected"] == [], r  # nothing but governed errors reached the agent
        assert r["in_outage_ok"] > 0, r  # calls kept completing while Redis was gone
        assert r["fallbacks"] == 1
    # The breaker each process tripped on its own during the outage is now shared state.
    events = _events(tmp_path)
    assert {e["tool"] for e in events if e["event"] == "breaker"} == {"down_api"}
    recovered = [e for e in events if e["event"] == "store_recovered"]
    assert all(e["merged"]["breakers"] == 1 for e in recovered)
    assert all("ts" in e for e in recovered)  # went through the governor's event bus
    store = RedisStore(own_redis_server.url, namespace=namespace)
    assert store.breaker_get("down_api").state is BreakerState.OPEN
    assert store.breaker_get("healthy_api").state is BreakerState.CLOSED
    assert not store.degraded


def test_cli_sees_what_the_fleet_sees(redis_server: Any, namespace: str) -> None:
    """Operators' view: a breaker opened by hand is open for a governed process."""
    from typer.testing import CliRunner

    import loop_governor as lg
    from loop_governor.cli import app

    tool = "search"
    url = f"{redis_server.url}?namespace={namespace}"
    runner = CliRunner()
    assert runner.invoke(app, ["breakers", "open", tool, "--store", url]).exit_code == 0
    gov = lg.Governor(lg.GovernorConfig(store_url=url))
    with pytest.raises(lg.CircuitOpenError):
        gov.call(tool, lambda: "ran")
    assert runner.invoke(app, ["breakers", "--store", url, "close", tool]).exit_code == 0
    assert gov.call(tool, lambda: "ran") == "ran"
