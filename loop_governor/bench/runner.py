"""Run the benchmark: every model policy, scenario, arm and framework, ``runs`` times; aggregate.

A *run* is one pass over all scenarios (19 tasks: one per incident, five in each
concurrent one). Run ``r`` of every arm sees the same worlds (same seed-derived faults
and model latencies), so the arms differ only in the system around the model; every
model policy sees the same worlds too.

The top-level arms (``result["baseline"]`` ...) are the seed's control table: the first
policy run (``obedient`` by default) on the seed's incidents (tool faults only), beside
the seed's published column. ``result["model_policies"][policy][arm]`` covers every
scenario, provider faults included.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from statistics import fmean
from typing import Any

from loop_governor.bench import policy, provider, world
from loop_governor.bench.harness import ARMS, Runner, TaskOutcome, run_world
from loop_governor.bench.jitter import jitter_ablation
from loop_governor.bench.world import SCENARIO_BY_NAME, SCENARIOS, Scenario

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
    "tool_calls_per_task": "requests that reached the simulated services, per task (retries included)",
    "model_calls_per_task": "requests that reached the model provider, per task: every model turn, every "
    "retry of one (the SDK's, the framework's, the governor's), failed ones included",
    "failed_model_calls_per_task": "of those, the requests the provider refused (429, 529, quota)",
    "prompt_tokens_per_task": "prompt tokens of the requests the provider answered (billed), ~4 chars a token",
    "failure_rate": "tasks that did not deliver every required sub-result (or stopped: deadline, crash, an "
    "error out of the run) / tasks",
    "subtasks_delivered_on_failure": "sub-results a failed task still delivers: its final answer's, or for "
    "the governed arm the completed calls in its checkpoint",
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
def quiet_frameworks() -> Iterator[None]:
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


def summarize(outcomes: Sequence[TaskOutcome], *, real: bool = False) -> dict[str, Any]:
    """The per-arm figures the table, JSON and HTML report show (``real``: a real model's
    latency and empty or malformed replies too)."""
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
        "model_calls_per_task": round(fmean(o.model_calls for o in outcomes), 3) if n else 0.0,
        "failed_model_calls_per_task": round(fmean(o.failed_model_calls for o in outcomes), 3) if n else 0.0,
        "prompt_tokens_per_task": round(fmean(o.prompt_tokens for o in outcomes), 1) if n else 0.0,
        "mean_duration_s": round(fmean(o.duration_s for o in outcomes), 1) if n else 0.0,
        "failed_duration_s": round(fmean(o.duration_s for o in failed), 1) if failed else 0.0,
        "subtasks_delivered_on_failure": round(fmean(o.delivered for o in failed), 3) if failed else 0.0,
        "peak_downstream_concurrency": max(concurrent_peaks.values(), default=0),
        "mean_peak_downstream_concurrency": round(fmean(concurrent_peaks.values()), 3) if concurrent_peaks else 0.0,
        "peak_retry_rate_per_s": max(retry_peaks.values(), default=0),
        "mean_peak_retry_rate_per_s": round(fmean(retry_peaks.values()), 3) if retry_peaks else 0.0,
        "failure_reasons": dict(sorted(_count(o.reason for o in failed).items())),
        **(_real_figures(outcomes) if real else {}),
    }


def _real_figures(outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    calls = sum(o.model_calls for o in outcomes)
    wall = sum(o.model_wall_s for o in outcomes)
    return {
        "model_wall_s_per_task": round(wall / len(outcomes), 3) if outcomes else 0.0,
        "model_wall_s_per_call": round(wall / calls, 3) if calls else 0.0,
        "empty_replies": sum(o.empty_replies for o in outcomes),
        "malformed_replies": sum(o.malformed_replies for o in outcomes),
    }


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def settings(calibration: dict[str, Any]) -> dict[str, Any]:
    """Every knob of the simulation, so a reader can see nothing differs between arms."""
    return {
        "model_policy": {
            "patience_identical_plain_errors": policy.PATIENCE,
            "model_turn_s": f"{world.MODEL_BASE_S} + {world.MODEL_PER_MESSAGE_S}*messages"
            f" + seeded 0..{world.MODEL_NOISE_S}",
            "policies": {
                "obedient": "plain error: the identical call again, up to patience; structured error: follows "
                "retryable / advice",
                "stubborn": "every error read as a plain string: the identical call again, up to patience",
                "calibrated": "per failure, a seeded draw of identical / changed arguments / switch tool / give up, "
                "per kind and streak position, measured on the corpus (calibration)",
            },
            "calibration": {
                "corpus": calibration.get("corpus"),
                "sources": {
                    name: {k: src[k] for k in ("runs", "failures", "identical_next_rate", "longest_streak") if k in src}
                    for name, src in calibration.get("sources", {}).items()
                },
                "min_count": policy.MIN_COUNT,
            },
        },
        "provider": {
            "sdk_max_retries": provider.SDK_MAX_RETRIES,
            "sdk_backoff": f"retry-after up to {provider.SDK_MAX_RETRY_AFTER_S:g} s, else "
            f"min({provider.SDK_INITIAL_RETRY_DELAY_S:g}*2^n, {provider.SDK_MAX_RETRY_DELAY_S:g})*(1-0.25*random())",
            "error_latency_s": provider.PROVIDER_ERROR_LATENCY_S,
        },
        "world": {
            "tool_latency_s": world.TOOL_LATENCY_S,
            "task_deadline_s": world.TASK_DEADLINE_S,
            "restart_after_crash_s": world.RESTART_DELAY_S,
            "scenarios": {s.name: s.title for s in SCENARIOS},
        },
        "arms": {
            "baseline": "langchain: create_agent + a wrap_tool_call returning 'Error: <exc>', the model's SDK "
            "retries (2); crewai: plain crew, tools raise, max_iter=60, max_retry_limit=2, crewAI's LLM "
            "rate-limit retry (3 attempts) around the SDK retries (2)",
            "builtins": "langchain: ToolCallLimitMiddleware(run_limit=40, exit_behavior='end') > "
            "ToolErrorMiddleware('<Type>: <exc>') > ToolRetryMiddleware(defaults, on_failure='error') > "
            "ModelRetryMiddleware(defaults), SDK retries (2); "
            "crewai: tools return ToolFailure(code=status, retryable=429/5xx), policy WARN, "
            "REPEATED_CALL guard, max_iter=40, max_retry_limit=2, LLM retries as in baseline",
            "governed": "langchain: GovernorMiddleware + govern_tools; crewai: govern_tools + install(); "
            "GovernorConfig() defaults (SDK retries off on the model it calls), memory checkpoint store that "
            "survives the simulated crash",
        },
    }


COMPARED: tuple[str, ...] = ("tool_calls_per_task", "model_calls_per_task", "prompt_tokens_per_task", "failure_rate")
"""The metrics on which the governed arm is compared with the better of the other two arms."""


def governed_not_best(arms: dict[str, dict[str, Any]], where: dict[str, str]) -> list[dict[str, Any]]:
    """Each compared metric on which the governed arm is above the better of the other two."""
    out = []
    for metric in COMPARED:
        best_arm = min(("baseline", "builtins"), key=lambda a: arms[a][metric])
        if arms["governed"][metric] > arms[best_arm][metric]:
            out.append(
                {**where, "metric": metric, "governed": arms["governed"][metric], best_arm: arms[best_arm][metric]}
            )
    return out


def _policy_summary(
    outcomes: dict[str, dict[str, list[TaskOutcome]]],
    frameworks: Sequence[str],
    scenarios: Sequence[Scenario] = SCENARIOS,
) -> dict[str, Any]:
    """Per arm over every scenario, per framework, per scenario (one model policy's outcomes),
    and where the governed arm is not the best."""
    out: dict[str, Any] = {arm: summarize([o for f in frameworks for o in outcomes[f][arm]]) for arm in ARMS}
    out["per_framework"] = {f: {arm: summarize(outcomes[f][arm]) for arm in ARMS} for f in frameworks}
    out["per_scenario"] = {
        s.name: {
            arm: summarize([o for f in frameworks for o in outcomes[f][arm] if o.scenario == s.name]) for arm in ARMS
        }
        for s in scenarios
    }
    provider = {s.name for s in scenarios if s.provider_fault}

    def of_fault(fault: str, chosen: Sequence[str]) -> dict[str, Any]:
        wanted = fault == "provider"
        return {
            arm: summarize([o for f in chosen for o in outcomes[f][arm] if (o.scenario in provider) == wanted])
            for arm in ARMS
        }

    # the seed's incidents (tool faults) apart from the faults of the model call itself
    out["by_fault"] = {
        fault: {"all": of_fault(fault, frameworks), **{f: of_fault(fault, [f]) for f in frameworks}}
        for fault in ("tool", "provider")
    }
    losses = governed_not_best(out, {"framework": "all", "scenario": "all"})
    for f in frameworks:
        losses += governed_not_best(out["per_framework"][f], {"framework": f, "scenario": "all"})
    for fault, parts in out["by_fault"].items():
        losses += governed_not_best(parts["all"], {"framework": "all", "scenario": f"{fault}-fault scenarios"})
    for name, arms in out["per_scenario"].items():
        losses += governed_not_best(arms, {"framework": "all", "scenario": name})
    out["governed_not_best"] = losses
    return out


def _shared_world(behaviour: policy.Behaviour, arm: str, scenario: Scenario) -> str:
    """Which runs of a world give the same outcome whatever the model policy, by construction:
    they run once and are shared (``make demo`` stays fast).

    * with healthy tools (the provider-fault scenarios) every policy sees only successes,
      and every policy treats a success alike;
    * outside the governed arm a model only ever reads plain error strings, and the
      obedient and stubborn policies read those alike (they differ only on the governor's
      structured error). ``tests/bench`` checks both against separate runs.
    """
    if scenario.provider_fault and not scenario.faults() and not scenario.capacity:
        return "healthy-tools"
    if arm != "governed" and behaviour.name in ("obedient", "stubborn"):
        return "plain-errors"
    return behaviour.name


def run_bench(
    *,
    seed: int = 0,
    runs: int = 2,
    frameworks: Sequence[str] = FRAMEWORKS,
    policies: Sequence[str] = policy.POLICY_NAMES,
    calibration: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    scenarios: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run everything; returns the JSON-ready result (deterministic for a given seed).
    ``scenarios``: a subset by name (default: all). A real model runs through
    [`loop_governor.bench.model_bench`][loop_governor.bench.model_bench] instead."""
    calibration = calibration if calibration is not None else policy.load_calibration()
    chosen = select_scenarios(scenarios)
    behaviours = [policy.make_behaviour(name, calibration) for name in dict.fromkeys(policies)]
    outcomes: dict[str, dict[str, dict[str, list[TaskOutcome]]]] = {
        b.name: {f: {a: [] for a in ARMS} for f in frameworks} for b in behaviours
    }
    for framework in frameworks:
        runner = make_runner(framework)
        done: dict[tuple[int, str, str, str], list[TaskOutcome]] = {}
        with quiet_frameworks():
            for behaviour in behaviours:
                for run_index in range(runs):
                    for scenario in chosen:
                        for arm in ARMS:
                            key = (run_index, scenario.name, arm, _shared_world(behaviour, arm, scenario))
                            if key not in done:
                                done[key] = run_world(
                                    runner, arm, scenario, seed, run_index, policy.delivered_in, behaviour
                                )
                            outcomes[behaviour.name][framework][arm].extend(
                                replace(o, policy=behaviour.name) for o in done[key]
                            )
                            if progress is not None:
                                progress(f"{framework} {behaviour.name} {arm} {scenario.name} run {run_index + 1}")
    headline = behaviours[0].name
    seed_incidents = {s.name for s in chosen if not s.provider_fault}
    table = {
        f: {a: [o for o in outcomes[headline][f][a] if o.scenario in seed_incidents] for a in ARMS} for f in frameworks
    }
    result: dict[str, Any] = {
        "note": NOTE,
        "seed": seed,
        "runs": runs,
        "frameworks": list(frameworks),
        "scenarios": [s.name for s in chosen],
        "model_policies_run": [b.name for b in behaviours],
        "headline_policy": headline,
    }
    for arm in ARMS:
        result[arm] = summarize([o for f in frameworks for o in table[f][arm]])
    result["per_framework"] = {f: {arm: summarize(table[f][arm]) for arm in ARMS} for f in frameworks}
    result["per_scenario"] = {
        s.name: {arm: summarize([o for f in frameworks for o in table[f][arm] if o.scenario == s.name]) for arm in ARMS}
        for s in chosen
        if s.name in seed_incidents
    }
    result["model_policies"] = {b.name: _policy_summary(outcomes[b.name], frameworks, chosen) for b in behaviours}
    result["jitter_ablation"] = jitter_ablation(seed)
    result["seed_published"] = SEED_PUBLISHED
    result["metric_definitions"] = METRIC_DEFINITIONS
    result["settings"] = settings(calibration)
    result["tasks"] = [
        asdict(o) for b in behaviours for f in frameworks for arm in ARMS for o in outcomes[b.name][f][arm]
    ]
    return result


def select_scenarios(names: Sequence[str] | None) -> list[Scenario]:
    """The scenarios to run, in the benchmark's order (a real model's: ``model_bench.select``)."""
    if not names:
        return list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIO_BY_NAME]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIO_BY_NAME)}")
    return [s for s in SCENARIOS if s.name in set(names)]


def total_steps(
    runs: int,
    frameworks: Sequence[str],
    policies: int = len(policy.POLICY_NAMES),
    scenarios: int = len(SCENARIOS),
) -> int:
    return runs * scenarios * len(ARMS) * len(frameworks) * policies
