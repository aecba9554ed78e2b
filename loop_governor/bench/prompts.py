"""What a real model is told in each scenario (``loop-governor bench --model``).

Written once, here: both frameworks send these texts (LangChain as the system prompt and
the user message, crewAI as the agent's goal and the task's description), the docs page
``docs/real-model-bench.md`` quotes them (a test keeps it in step), and
``loop-governor bench prompts`` prints them.

A scripted model follows its plan without being told; a real one has to be told the plan.
In tier 2 each task prompt is the scenario's goal followed by its steps: the tool call each
step needs, with its exact arguments, and the fallback tool where the plan has one. In
tier 1 it is one request in a user's words ([`GoalTask`][loop_governor.bench.tiers.GoalTask]).
No prompt names the fault or gives advice on errors: how the model reacts to a failing
call is what the benchmark measures.
"""

from __future__ import annotations

import json
from typing import Any

from loop_governor.bench.tiers import TIERS, GoalTask
from loop_governor.bench.world import Option, TaskSpec

SYSTEM_PROMPT = (
    "You are an operations agent. Do the task with the tools provided: call one tool at a time "
    "with exactly the arguments the task gives. When every step is done, or cannot be done, reply "
    "with a short summary of what you got and what you could not get."
)


def _call(option: Option) -> str:
    args = ", ".join(f"{key}={json.dumps(value)}" for key, value in option.args)
    return f"{option.tool}({args})"


def task_prompt(spec: TaskSpec) -> str:
    """The user message of one task: a one-goal task's request, else its goal and numbered steps."""
    if isinstance(spec, GoalTask):
        return spec.prompt
    lines = [spec.goal, "", "Steps:"]
    for n, sub in enumerate(spec.plan, 1):
        first = sub.options[0]
        # a later option of the same tool is the plan's corrected arguments: the model must
        # find that fix from the service's error, so only other tools are named as fallbacks
        fallbacks = [o for o in sub.options[1:] if o.tool != first.tool]
        line = f"{n}. {_call(first)}"
        if fallbacks:
            line += " -- if that fails, " + ", then ".join(_call(o) for o in fallbacks)
        lines.append(line)
    return "\n".join(lines)


def scenario_prompts() -> dict[str, dict[str, Any]]:
    """Every scenario a real model runs, tier by tier: its tier, title and first task's
    prompt (the concurrent scenario's tasks differ only in their arguments)."""
    out: dict[str, dict[str, Any]] = {}
    for scenario in (s for tier in TIERS.values() for s in tier.scenarios):
        specs = scenario.tasks(scenario.name)
        out[scenario.name] = {
            "tier": next(t.number for t in TIERS.values() if scenario in t.scenarios),
            "title": scenario.title,
            "tasks": len(specs),
            "prompt": task_prompt(specs[0]),
            "tools": specs[0].tools,
        }
    return out
