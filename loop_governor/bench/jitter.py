"""The jitter ablation: does the governor's backoff jitter flatten a synchronized retry wave?

The seed reported "jitter cut peak downstream load ~50 %". In the scenario benchmark no
arm retries in lock-step (model turns desynchronize the tasks), so the claim is tested
here where it applies: ``TASKS`` tasks call one service at the same instant and the
service fails them all at once (a ``OUTAGE_S`` outage whose errors come back in
``error_latency_s``). Each task's call is governed (``g.call``, no framework, no model:
the question is the backoff's spread); the governor runs once with its default jitter
(``retry_jitter=0.5``: each delay times ``0.5 + random() * 0.5``) and once with
``retry_jitter=0`` (each delay times exactly 0.5: no spread, and a shorter mean wait).

Measured: ``peak_concurrent_retries``, the most retries in flight at once at the service
([`loop_governor.bench.world.peak_concurrent_retries`][loop_governor.bench.world.peak_concurrent_retries]), per world;
the JSON gives the maximum and the mean over ``runs`` seeded worlds. Three settings:

* ``fast_errors`` (the comparison): errors in 0.1 s, the breaker's threshold raised
  above the number of failures so that every retry the backoff schedules is sent;
* ``default_breaker``: the same with ``GovernorConfig()`` defaults: five failures at once
  open the endpoint's breaker, so the pending retries are refused and none is sent;
* ``slow_errors``: errors that take 1.5 s (the scenario benchmark's latency): retries
  overlap in flight whatever their spread.
"""

from __future__ import annotations

import functools
import random
from statistics import fmean
from typing import Any

from loop_governor.bench.clock import VirtualClock
from loop_governor.bench.determinism import CURRENT_TASK, unit_hash
from loop_governor.bench.world import Downstream, ServiceError, peak_concurrent_retries, retries_of, window
from loop_governor.config import GovernorConfig
from loop_governor.errors import AgentToolError
from loop_governor.governor import Governor

TASKS = 5
OUTAGE_S = 2.0
RUNS = 50
SERVICE = "ledger"
JITTERS: tuple[float, ...] = (0.5, 0.0)

SETTINGS: dict[str, dict[str, Any]] = {
    "fast_errors": {"error_latency_s": 0.1, "breaker_failure_threshold": 1000},
    "default_breaker": {"error_latency_s": 0.1, "breaker_failure_threshold": None},
    "slow_errors": {"error_latency_s": 1.5, "breaker_failure_threshold": 1000},
}


def _world(seed: int, run: int, jitter: float, error_latency_s: float, threshold: int | None) -> dict[str, int]:
    name = f"jitter-r{run}"
    clock = VirtualClock(0.0)
    outage = window(0.0, OUTAGE_S, lambda: ServiceError(503, f"{SERVICE} unavailable"))
    downstream = Downstream(clock, seed, name, {SERVICE: outage}, error_latency_s=error_latency_s)
    config = GovernorConfig(retry_jitter=jitter)
    if threshold is not None:
        config = config.model_copy(update={"breaker_failure_threshold": threshold})
    rng = random.Random(int(unit_hash(seed, name) * 2**32))  # the same draws with and without jitter
    governor = Governor(config, clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=rng.random)

    def task(n: int) -> None:
        CURRENT_TASK.set(f"{name}-{n}")
        with governor.task(f"{name}-{n}"):
            try:
                governor.call(SERVICE, downstream.call, SERVICE, {"entry": f"e{n}"})
            except AgentToolError:
                pass  # the outcome is the request log

    results = clock.run_concurrently([functools.partial(task, n) for n in range(TASKS)])
    for _, error in results:
        if error is not None:
            raise RuntimeError("jitter ablation task failed") from error
    return {"peak": peak_concurrent_retries(downstream.requests), "retries": len(retries_of(downstream.requests))}


def _measure(seed: int, runs: int, jitter: float, setting: dict[str, Any]) -> dict[str, Any]:
    worlds = [
        _world(seed, run, jitter, setting["error_latency_s"], setting["breaker_failure_threshold"])
        for run in range(runs)
    ]
    peaks = [w["peak"] for w in worlds]
    return {
        "retry_jitter": jitter,
        "peak_concurrent_retries": max(peaks),
        "mean_peak_concurrent_retries": round(fmean(peaks), 3),
        "retries_per_world": round(fmean(w["retries"] for w in worlds), 3),
    }


def jitter_ablation(seed: int = 0, runs: int = RUNS) -> dict[str, Any]:
    """The ablation's JSON (deterministic for a seed): per setting, with and without jitter."""
    out: dict[str, Any] = {
        "tasks": TASKS,
        "outage_s": OUTAGE_S,
        "runs": runs,
        "definition": "peak_concurrent_retries: most retries (a request whose task's previous request to the "
        "service failed) in flight at once at the service, per world; max and mean over worlds. "
        f"{TASKS} tasks call the service at t=0; it fails every request for {OUTAGE_S} s.",
    }
    for name, setting in SETTINGS.items():
        with_jitter, without = (_measure(seed, runs, j, setting) for j in JITTERS)
        mean_without = without["mean_peak_concurrent_retries"]
        out[name] = {
            **setting,
            "with_jitter": with_jitter,
            "without_jitter": without,
            "mean_peak_reduction": round(1 - with_jitter["mean_peak_concurrent_retries"] / mean_without, 3)
            if mean_without
            else 0.0,
        }
    # the headline pair, where the question applies
    out["with_jitter"] = out["fast_errors"]["with_jitter"]
    out["without_jitter"] = out["fast_errors"]["without_jitter"]
    return out
