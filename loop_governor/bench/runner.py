"""Run the benchmark: every scenario, every arm, every framework, ``runs`` times; aggregate.

A *run* is one pass over all scenarios (12 tasks: one per incident, five in the
concurrent one). Run ``r`` of every arm sees the same worlds (same seed-derived faults
and model latencies), so the arms differ only in the system around the model.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from statistics import fmean
from typing import Any

from loop_governor.bench import policy, world
from loop_governor.bench.harness import ARMS, Runner, TaskOutcome, run_world
from loop_governor.bench.world import SCENARIOS

FRAMEWORKS: tuple[str, ...] = ("langchain", "crewai")

NOTE = (
    "Simulation: a scripted model policy on virtual time against seeded faults. It measures "
    "the system around a model (retries, error handling, budgets, resume), not a real model."
)

# Seed 004, 20 controlled runs, ungoverned vs governed (the published column).
SEED_PUBLISHED: dict[str, dict[str, float | str]] = {
    "ungoverned": {
        "tool_calls_per_task": 41,
        "mean_duration_s": 41 * 60,
        "failed_tasks": "27/40",
        "failure_rate": 27 / 40,
        "failed_duration_s": 27 * 60,
        "subtasks_delivered_on_failure": 0,
    },
    "governed": {
        "tool_calls_per_task": 11,
        "mean_duration_s": 6 * 60 + 20,
        "failed_tasks": "6/20",
        "failure_rate": 6 / 20,
        "failed_duration_s": 7.8 * 60,
        "subtasks_delivered_on_failure": 7.8,
    },
}

METRIC_DEFINITIONS: dict[str, str] = {
    "peak_downstream_concurrency": "most requests in flight at once to one service in the concurrent_flaky "
    "scenario (max over its worlds; mean_* averages the worlds). Set by the first wave of 5 tasks.",
    "peak_retry_rate_per_s": "most retries starting within any sliding 1-second window at one service in the "
    "concurrent_flaky scenario (max over its worlds; mean_* averages the worlds). A retry is a request whose "
    "task's previous request to the same service failed, whoever re-sent it (model, framework middleware or "
    "governor); first attempts never count.",
}


def make_runner(framework: str) -> Runner:
    """Import a framework's runner on demand (LangChain / crewAI load only here)."""
    if framework == "langchain":
        from loop_governor.bench.lc_runner import LangChainRunner

        return LangChainRunner()
    if framework == "crewai":
        from loop_governor.bench.crew_runner import CrewAIRunner

        return CrewAIRunner()
    raise ValueError(f"unknown framework {framework!r}; choose from {', '.join(FRAMEWORKS)}")


@contextlib.contextmanager
def _quiet_frameworks() -> Iterator[None]:
    """crewAI prints event-bus warnings to stdout and logs every aborted run; the
    benchmark aborts runs on purpose (that is the outcome it measures)."""
    loggers = [logging.getLogger(n) for n in ("crewai", "langchain", "langgraph")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def summarize(outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    """The per-arm figures the table, JSON and HTML report show."""
    failed = [o for o in outcomes if o.failed]
    # one value per world: a world is a (framework, world name) pair, and both frameworks
    # name their worlds alike
    concurrent_peaks = {
        (o.framework, o.task_id.rsplit("-", 1)[0]): o.peak_concurrency
        for o in outcomes
        if o.scenario == "concurrent_flaky"
    }
    retry_peaks = {
        (o.framework, o.task_id.rsplit("-", 1)[0]): o.peak_retry_rate_per_s
        for o in outcomes
        if o.scenario == "concurrent_flaky"
    }
    n = len(outcomes)
    return {
        "tasks": n,
        "failed_tasks": len(failed),
        "failure_rate": round(len(failed) / n, 4) if n else 0.0,
        "tool_calls_per_task": round(fmean(o.tool_calls for o in outcomes), 3) if n else 0.0,
        "mean_duration_s": round(fmean(o.duration_s for o in outcomes), 1) if n else 0.0,
        "failed_duration_s": round(fmean(o.duration_s for o in failed), 1) if failed else 0.0,
        "subtasks_delivered_on_failure": round(fmean(o.delivered for o in failed), 3) if failed else 0.0,
        "peak_downstream_concurrency": max(concurrent_peaks.values(), default=0),
        "mean_peak_downstream_concurrency": round(fmean(concurrent_peaks.values()), 3) if concurrent_peaks else 0.0,
        "peak_retry_rate_per_s": max(retry_peaks.values(), default=0),
        "mean_peak_retry_rate_per_s": round(fmean(retry_peaks.values()), 3) if retry_peaks else 0.0,
        "failure_reasons": dict(sorted(_count(o.reason for o in failed).items())),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def settings() -> dict[str, Any]:
    """Every knob of the simulation, so a reader can see nothing differs between arms."""
    return {
        "model_policy": {
            "patience_identical_plain_errors": policy.PATIENCE,
            "model_turn_s": f"{world.MODEL_BASE_S} + {world.MODEL_PER_MESSAGE_S}*messages"
            f" + seeded 0..{world.MODEL_NOISE_S}",
        },
        "world": {
            "tool_latency_s": world.TOOL_LATENCY_S,
            "task_deadline_s": world.TASK_DEADLINE_S,
            "restart_after_crash_s": world.RESTART_DELAY_S,
            "scenarios": {s.name: s.title for s in SCENARIOS},
        },
        "arms": {
            "baseline": "langchain: create_agent + a wrap_tool_call returning 'Error: <exc>'; "
            "crewai: plain crew, tools raise, max_iter=60, max_retry_limit=2",
            "builtins": "langchain: ToolCallLimitMiddleware(run_limit=40, exit_behavior='end') > "
            "ToolErrorMiddleware('<Type>: <exc>') > ToolRetryMiddleware(defaults, on_failure='error'); "
            "crewai: tools return ToolFailure(code=status, retryable=429/5xx), policy WARN, "
            "REPEATED_CALL guard, max_iter=40, max_retry_limit=2",
            "governed": "langchain: GovernorMiddleware + govern_tools; crewai: govern_tools + install(); "
            "GovernorConfig() defaults, memory checkpoint store that survives the simulated crash",
        },
    }


def run_bench(
    *,
    seed: int = 0,
    runs: int = 2,
    frameworks: Sequence[str] = FRAMEWORKS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run everything; returns the JSON-ready result (deterministic for a given seed)."""
    outcomes: dict[str, dict[str, list[TaskOutcome]]] = {f: {a: [] for a in ARMS} for f in frameworks}
    for framework in frameworks:
        runner = make_runner(framework)
        with _quiet_frameworks():
            for run_index in range(runs):
                for scenario in SCENARIOS:
                    for arm in ARMS:
                        outcomes[framework][arm].extend(
                            run_world(runner, arm, scenario, seed, run_index, policy.delivered_in)
                        )
                        if progress is not None:
                            progress(f"{framework} {arm} {scenario.name} run {run_index + 1}")
    result: dict[str, Any] = {"note": NOTE, "seed": seed, "runs": runs, "frameworks": list(frameworks)}
    for arm in ARMS:
        result[arm] = summarize([o for f in frameworks for o in outcomes[f][arm]])
    result["per_framework"] = {f: {arm: summarize(outcomes[f][arm]) for arm in ARMS} for f in frameworks}
    result["per_scenario"] = {
        s.name: {
            arm: summarize([o for f in frameworks for o in outcomes[f][arm] if o.scenario == s.name]) for arm in ARMS
        }
        for s in SCENARIOS
    }
    result["seed_published"] = SEED_PUBLISHED
    result["metric_definitions"] = METRIC_DEFINITIONS
    result["settings"] = settings()
    result["tasks"] = [asdict(o) for f in frameworks for arm in ARMS for o in outcomes[f][arm]]
    return result


def total_steps(runs: int, frameworks: Sequence[str]) -> int:
    return runs * len(SCENARIOS) * len(ARMS) * len(frameworks)
