"""``loop-governor bench --model``: a real model through every arm, by tier, over several runs.

Each run samples the model afresh: a temperature above 0 and a seed of its own (sent to
the endpoint; llama.cpp, vLLM and OpenAI honour it). Run ``r`` of every arm meets the
same worlds (the same faults at the same virtual times), so the arms differ only in the
system around the model and in what the model happened to sample.

Per tier and arm the result holds the success rate with its 95% interval
([`loop_governor.bench.stats`][loop_governor.bench.stats]), tool executions, model calls, identical repeats and
what a failed task still delivered; and a verdict that reads the figures: where no arm
finished any task, the model is too weak for the tier and the arms are not ranked;
otherwise it names the arms whose success rates differ beyond the interval, or says that
none do. ``--error-format both`` runs the governed arm once with each rendering of the
failure text the model reads (``GovernorConfig(error_format=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import combinations
from statistics import fmean
from typing import Any

from loop_governor.bench import policy
from loop_governor.bench.determinism import unit_hash
from loop_governor.bench.harness import ARMS, TaskOutcome, run_world
from loop_governor.bench.real_model import ModelSettings, RealModel
from loop_governor.bench.runner import FRAMEWORKS, make_runner, quiet_frameworks, settings, summarize
from loop_governor.bench.stats import Z95, difference, wilson
from loop_governor.bench.tiers import DEFAULT_TIERS, TIERS, Tier
from loop_governor.bench.world import Scenario
from loop_governor.config import GovernorConfig
from loop_governor.errors import ERROR_FORMATS, ErrorFormat

DEFAULT_RUNS = 3

ERROR_FORMAT_CHOICES: dict[str, tuple[ErrorFormat, ...]] = {
    **{f: (f,) for f in ERROR_FORMATS},
    "both": ERROR_FORMATS,
}
"""``--error-format``: the rendering(s) the governed arm runs with."""

NOTE = (
    "A real model ({model}) against simulated services: their faults run on virtual time, the model's own "
    "latency is real and reported apart. Success rates carry a 95% interval; arms are called different only "
    "where the interval of their difference leaves out zero."
)

METRIC_DEFINITIONS: dict[str, str] = {
    "success_rate": "tasks finished / tasks: every required sub-result delivered and, in tier 1, a final answer",
    "success_ci95": "Wilson score interval of the success rate, 95%",
    "tool_calls_per_task": "tool executions: requests that reached the simulated services, retries included",
    "model_calls_per_task": "requests to the model endpoint, failed ones included",
    "identical_repeats_per_task": "requests re-sending exactly (same tool, same arguments) a call whose last "
    "answer was a failure, whoever re-sent it: the model, a framework's retry or the governor's",
    "subtasks_delivered_on_failure": "sub-results a failed task still delivered (mean over failed tasks)",
    "delivered_share_on_failure": "the same as a share of the task's required sub-results",
    "failure_reasons": "how failed tasks ended: incomplete (the model stopped without the goal), "
    "model_call_cap / model_time_cap (the task's caps), or the error that ended the run",
    "verdict": "too_weak: no arm finished any task (the arms are not ranked); differ: some arms' success rates "
    "differ beyond the 95% interval of the difference (Newcombe); no_difference: none do",
}


@dataclass(frozen=True)
class Arm:
    """One column of the table: a harness arm, and for the governed one the rendering."""

    key: str
    runs_as: str
    error_format: ErrorFormat | None = None

    @property
    def label(self) -> str:
        return ARM_LABELS[self.key]

    def config(self) -> GovernorConfig | None:
        return GovernorConfig(error_format=self.error_format) if self.error_format is not None else None


ARM_LABELS: dict[str, str] = {
    "baseline": "plain agent",
    "builtins": "framework built-ins",
    "governed": "loop-governor",
    "governed_json": "loop-governor (JSON)",
}


def arms_for(error_formats: Sequence[ErrorFormat] = ("text",)) -> list[Arm]:
    """The plain and built-ins arms, then the governed arm once per rendering (the default
    rendering, plain text, keeps the key ``governed``)."""
    out = [Arm(a, a) for a in ARMS if a != "governed"]
    for fmt in dict.fromkeys(error_formats):
        if fmt not in ERROR_FORMATS:
            raise ValueError(f"--error-format must be one of {', '.join(ERROR_FORMAT_CHOICES)}, got {fmt!r}")
        out.append(Arm("governed" if fmt == "text" else f"governed_{fmt}", "governed", fmt))
    return out


def parse_tiers(value: str | None) -> tuple[int, ...] | None:
    """``--tier``: ``1``, ``2``, ``1,2`` or ``all``; ``None``: not given."""
    if value is None:
        return None
    if value.strip() == "all":
        return tuple(TIERS)
    picked: list[int] = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        if not part.isdigit() or int(part) not in TIERS:
            raise ValueError(f"--tier: unknown tier {part!r}; choose from {', '.join(map(str, TIERS))} or all")
        picked.append(int(part))
    if not picked:
        raise ValueError("--tier: name at least one tier")
    return tuple(sorted(set(picked)))


def select(tiers: Sequence[int] | None, names: Sequence[str] | None) -> list[tuple[Tier, Scenario]]:
    """The (tier, scenario) pairs to run, in tier order. No names: every scenario of the tiers
    (default [`DEFAULT_TIERS`][loop_governor.bench.model_bench.DEFAULT_TIERS]). Names without tiers: those scenarios,
    from any tier."""
    chosen = tiers if tiers is not None else (tuple(TIERS) if names else DEFAULT_TIERS)
    pairs = [(TIERS[t], s) for t in chosen for s in TIERS[t].scenarios]
    if not names:
        return pairs
    known = {s.name for t in TIERS.values() for s in t.scenarios}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown scenario(s) {unknown}; with --model choose from {', '.join(sorted(known))} "
            "(the provider-fault scenarios simulate the model provider, whose place a real endpoint takes)"
        )
    outside = [n for n in names if n not in {s.name for _, s in pairs}]
    if outside:
        raise ValueError(f"scenario(s) {outside} are not in tier {', '.join(map(str, chosen))}")
    return [(t, s) for t, s in pairs if s.name in set(names)]


def run_seed(seed: int, run_index: int) -> int:
    """The model's sampling seed in run ``run_index``: distinct per run, and per ``--seed``."""
    return int(unit_hash(seed, "model-sampling", run_index) * 2**31)


@dataclass(frozen=True)
class Plan:
    """What one ``bench --model`` command runs."""

    settings: ModelSettings
    chosen: tuple[tuple[Tier, Scenario], ...]
    arms: tuple[Arm, ...]
    frameworks: tuple[str, ...] = FRAMEWORKS
    runs: int = DEFAULT_RUNS
    seed: int = 0

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError("--runs must be at least 1")
        if self.runs > 1 and self.settings.temperature == 0:
            raise ValueError("--temperature must be above 0 with --runs above 1: at 0 every run is the same sample")
        unknown = [f for f in self.frameworks if f not in FRAMEWORKS]
        if unknown or not self.frameworks:
            raise ValueError(f"unknown framework(s) {unknown}; choose from {', '.join(FRAMEWORKS)}")

    @property
    def worlds(self) -> int:
        """Scenario instances per arm, framework and run."""
        return len(self.chosen)

    @property
    def steps(self) -> int:
        return self.runs * len(self.chosen) * len(self.arms) * len(self.frameworks)

    def tier_settings(self, tier: Tier) -> ModelSettings:
        return self.settings.for_tier(tier.max_model_calls, tier.task_seconds)

    def tasks(self) -> int:
        return sum(len(s.tasks(s.name)) for _, s in self.chosen) * len(self.arms) * len(self.frameworks) * self.runs

    def calls(self) -> tuple[int, int]:
        """(expected, most) model calls: what a model that does the task needs, and every task at its cap."""
        passes = len(self.arms) * len(self.frameworks) * self.runs
        expected = sum(spec.expected_model_calls for _, s in self.chosen for spec in s.tasks(s.name))
        most = sum(self.tier_settings(t).calls_cap * len(s.tasks(s.name)) for t, s in self.chosen)
        return expected * passes, most * passes

    def most_seconds(self) -> float:
        """Real seconds the run takes at most: every task at its time cap (one task at a time)."""
        passes = len(self.arms) * len(self.frameworks) * self.runs
        return passes * sum(self.tier_settings(t).seconds_cap * len(s.tasks(s.name)) for t, s in self.chosen)


def run_model_bench(plan: Plan, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the plan; returns the JSON-ready result (see the module docstring)."""
    outcomes: list[tuple[int, int, str, TaskOutcome]] = []  # (tier, run, arm key, outcome)
    seeds = [run_seed(plan.seed, r) for r in range(plan.runs)]
    for framework in plan.frameworks:
        runner = make_runner(framework)
        with quiet_frameworks():
            for run_index, model_seed in enumerate(seeds):
                for tier, scenario in plan.chosen:
                    model = RealModel(plan.tier_settings(tier).for_run(model_seed))
                    for arm in plan.arms:
                        done = run_world(
                            runner,
                            arm.runs_as,
                            scenario,
                            plan.seed,
                            run_index,
                            policy.delivered_in,
                            model,
                            arm.config(),
                        )
                        outcomes += [(tier.number, run_index, arm.key, replace(o, arm=arm.key)) for o in done]
                        if progress is not None:
                            progress(f"{framework} {arm.key} {scenario.name} run {run_index + 1}/{plan.runs}")
    keys = [a.key for a in plan.arms]
    tiers: dict[str, Any] = {}
    for number in dict.fromkeys(t.number for t, _ in plan.chosen):
        tier = TIERS[number]
        mine = [(a, o) for t, _, a, o in outcomes if t == number]
        names = [s.name for t, s in plan.chosen if t is tier]
        tiers[str(number)] = {
            "title": tier.title,
            "scenarios": names,
            "caps": {
                "max_model_calls": plan.tier_settings(tier).calls_cap,
                "task_seconds": plan.tier_settings(tier).seconds_cap,
            },
            **table(mine, keys),
            "per_scenario": {n: table([(a, o) for a, o in mine if o.scenario == n], keys) for n in names},
            "per_framework": {f: table([(a, o) for a, o in mine if o.framework == f], keys) for f in plan.frameworks},
        }
    world_settings = settings(policy.load_calibration())
    return {
        "note": NOTE.format(model=plan.settings.label),
        "model": {**plan.settings.describe(), "seeds_per_run": seeds},
        "seed": plan.seed,
        "runs": plan.runs,
        "frameworks": list(plan.frameworks),
        "tiers_run": [int(n) for n in tiers],
        "scenarios": [s.name for _, s in plan.chosen],
        "arms": keys,
        "arm_labels": {a.key: a.label for a in plan.arms},
        "error_formats": {a.key: a.error_format for a in plan.arms if a.error_format is not None},
        "tiers": tiers,
        "metric_definitions": METRIC_DEFINITIONS,
        "settings": {
            "world": world_settings["world"],
            "arms": world_settings["arms"],
            "virtual_time_per_model_turn_s": world_settings["model_policy"]["model_turn_s"],
            "prompts": "loop_governor/bench/prompts.py (loop-governor bench prompts)",
            "scored_by": "the services' request log (TaskSpec.delivered_from) and, in tier 1, a final answer",
            "interval": f"Wilson score, z = {Z95:.4f}; differences: Newcombe's hybrid score interval",
        },
        "tasks": [{**asdict(o), "tier": t, "run": r, "model_seed": seeds[r]} for t, r, _, o in outcomes],
    }


def figures(outcomes: Sequence[TaskOutcome]) -> dict[str, Any]:
    """One arm's figures over ``outcomes``."""
    n = len(outcomes)
    done = sum(1 for o in outcomes if not o.failed)
    failed = [o for o in outcomes if o.failed]
    low, high = wilson(done, n)
    return {
        **summarize(outcomes, real=True),
        "successes": done,
        "success_rate": round(done / n, 4) if n else 0.0,
        "success_ci95": [round(low, 4), round(high, 4)],
        "identical_repeats_per_task": round(fmean(o.identical_repeats for o in outcomes), 3) if n else 0.0,
        "delivered_share_on_failure": round(fmean(o.delivered / o.required for o in failed if o.required), 3)
        if any(o.required for o in failed)
        else 0.0,
    }


def table(outcomes: Sequence[tuple[str, TaskOutcome]], keys: Sequence[str]) -> dict[str, Any]:
    """Each arm's figures and the verdict that reads them."""
    arms = {k: figures([o for a, o in outcomes if a == k]) for k in keys}
    return {"arms": arms, "verdict": verdict(arms)}


def verdict(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the success rates say: ``too_weak`` (no arm finished a task: the model cannot do
    this tier, and ranking the arms would rank noise), ``differ`` (the pairs whose rates
    differ beyond the 95% interval of their difference) or ``no_difference``."""
    keys = [k for k, f in arms.items() if f["tasks"]]
    if not keys:
        return {"kind": "no_tasks", "differences": [], "text": "no tasks ran"}
    if all(arms[k]["successes"] == 0 for k in keys):
        return {
            "kind": "too_weak",
            "differences": [],
            "text": "no agent finished a task: the model is too weak for this tier, so the agents are not ranked",
        }
    pairs = []
    for b, a in combinations(keys, 2):  # later arm minus earlier: "loop-governor vs plain agent"
        d = difference(a, arms[a]["successes"], arms[a]["tasks"], b, arms[b]["successes"], arms[b]["tasks"])
        pairs.append(
            {
                "a": a,
                "b": b,
                "difference": round(d.difference, 4),
                "ci95": [round(d.low, 4), round(d.high, 4)],
                "beyond_interval": d.beyond_interval,
            }
        )
    differ = [p for p in pairs if p["beyond_interval"]]
    if differ:
        return {"kind": "differ", "differences": pairs, "text": "; ".join(_better(p) for p in differ)}
    return {
        "kind": "no_difference",
        "differences": pairs,
        "text": "the agents' success rates do not differ beyond the 95% interval",
    }


def _better(pair: dict[str, Any]) -> str:
    """ "X finished more tasks than Y: N points (95% interval L to H)", X the better arm."""
    (low, high), a, b, d = pair["ci95"], pair["a"], pair["b"], pair["difference"]
    if d < 0:
        a, b, d, low, high = b, a, -d, -high, -low
    return (
        f"{ARM_LABELS.get(a, a)} finished more tasks than {ARM_LABELS.get(b, b)}: {_points(d)} "
        f"(95% interval {round(100 * low):+d} to {round(100 * high):+d} points)"
    )


def _points(value: float) -> str:
    """A difference of rates in percentage points."""
    return f"{round(100 * value)} points"
