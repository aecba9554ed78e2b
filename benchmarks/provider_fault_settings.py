"""The governed arm of the bench's provider-fault scenarios under other governor settings.

    python benchmarks/provider_fault_settings.py [--seeds 0] [--runs 20] [--framework langchain]

`loop-governor bench` runs every arm at its defaults. This runs the same worlds (same
seeds, same faults, the obedient model) for the governed arm alone under other settings,
so the README can say what each one changes: no waiting for the provider
(`model_max_wait_s=0`: the tool-call rules, 3 attempts and Retry-After up to 8 s), the
key's real request limit as a shared rate limit (`ModelPolicy(rpm=12)`), a model breaker
that is harder to trip, more attempts per model call.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-bench-home-")

from loop_governor.bench import harness, policy, runner  # noqa: E402
from loop_governor.bench.world import SCENARIO_BY_NAME  # noqa: E402
from loop_governor.config import GovernorConfig, ModelPolicy  # noqa: E402

# the provider part of the scripted models' endpoints (LangChain's, crewAI's)
PROVIDERS = ("policychatmodel", "openai")


def _models(policy: ModelPolicy) -> GovernorConfig:
    return GovernorConfig(models={p: policy for p in PROVIDERS})


VARIANTS: dict[str, GovernorConfig] = {
    "GovernorConfig() (the bench)": GovernorConfig(),
    "GovernorConfig(model_max_wait_s=0)": GovernorConfig(model_max_wait_s=0),
    "ModelPolicy(rpm=12): the key's limit": _models(ModelPolicy(rpm=12)),
    "ModelPolicy(breaker_failure_threshold=50)": _models(ModelPolicy(breaker_failure_threshold=50)),
    "ModelPolicy(retry_max_attempts=6)": _models(ModelPolicy(retry_max_attempts=6)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--framework", choices=runner.FRAMEWORKS, default="langchain")
    args = parser.parse_args()
    bench_runner = runner.make_runner(args.framework)
    print(f"governed arm, {args.framework}, obedient model, seeds {args.seeds}, {args.runs} runs each")
    for label, config in VARIANTS.items():
        for scenario in ("provider_429_storm", "provider_overloaded_529"):
            with runner.quiet_frameworks():
                outcomes = [
                    o
                    for seed in args.seeds
                    for run in range(args.runs)
                    for o in harness.run_world(
                        bench_runner,
                        "governed",
                        SCENARIO_BY_NAME[scenario],
                        seed,
                        run,
                        policy.delivered_in,
                        config=config,
                    )
                ]
            failed = sum(o.failed for o in outcomes)
            calls = sum(o.model_calls for o in outcomes) / len(outcomes)
            print(f"  {label:44s} {scenario:24s} failed {failed}/{len(outcomes)}, {calls:.1f} model calls/task")


if __name__ == "__main__":
    main()
