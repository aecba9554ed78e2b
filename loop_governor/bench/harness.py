"""Runs one scenario instance ("world") for one framework and arm, task by task.

The harness plays the supervisor around the agent, identically for every arm: it
starts each task, stops it at the deadline, restarts it once after a crash, and
records what reached the downstream services and what the agent delivered.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from loop_governor.bench.clock import DeadlineExceeded, VirtualClock, participant
from loop_governor.bench.determinism import CURRENT_TASK, unit_hash
from loop_governor.bench.policy import OBEDIENT, Behaviour
from loop_governor.bench.provider import Provider
from loop_governor.bench.world import (
    RESTART_DELAY_S,
    TASK_DEADLINE_S,
    Downstream,
    Scenario,
    SimulatedCrash,
    TaskSpec,
    identical_repeats,
)
from loop_governor.checkpoint import MemoryCheckpointStore
from loop_governor.config import GovernorConfig
from loop_governor.governor import Governor

ARMS: tuple[str, ...] = ("baseline", "builtins", "governed")


@dataclass
class TaskOutcome:
    task_id: str
    scenario: str
    framework: str
    arm: str
    failed: bool
    reason: str
    duration_s: float
    tool_calls: int
    delivered: int
    required: int
    restarts: int
    policy: str = "obedient"
    model_calls: int = 0
    failed_model_calls: int = 0
    prompt_tokens: int = 0
    peak_concurrency: int = 0
    peak_retry_rate_per_s: int = 0
    model_wall_s: float = 0.0  # a real model's own latency (real seconds; 0 for a scripted one)
    empty_replies: int = 0  # a real model's replies with neither text nor a tool call
    malformed_replies: int = 0  # ... with a tool call the framework cannot run (bad JSON, unknown tool)
    identical_repeats: int = 0  # requests re-sending a call whose last answer was a failure (world.identical_repeats)


@dataclass
class World:
    """What the runners need of one scenario instance."""

    seed: int
    name: str
    clock: VirtualClock
    downstream: Downstream
    rng: random.Random
    provider: Provider
    behaviour: Behaviour = OBEDIENT
    config: GovernorConfig = field(default_factory=GovernorConfig)
    checkpoints: MemoryCheckpointStore = field(default_factory=MemoryCheckpointStore)
    governor: Governor | None = None
    real_started: dict[str, float] = field(default_factory=dict)  # a real model's first request, per task

    def new_governor(self) -> Governor:
        """A governor for a (re)started worker: fresh in-memory state, durable checkpoints.

        A restarted process loses the breakers and budgets it held in memory; the
        checkpoint store is the durable part (a file or SQLite store in production).
        """
        self.governor = Governor(
            self.config,
            clock=self.clock,
            sleep=self.clock.sleep,
            asleep=self.clock.asleep,
            random=self.rng.random,
            checkpoint_store=self.checkpoints,
        )
        return self.governor


class Runner(Protocol):
    """One framework: runs a task through a real agent of that framework."""

    name: str

    def world(self, arm: str, world: World) -> Any:
        """A context manager around one world (patches, hook installation)."""

    def run(self, arm: str, spec: TaskSpec, world: World, attempt: int) -> str:
        """Run the task to its final answer text; raises what the framework raises."""


def _run_task(
    runner: Runner, arm: str, spec: TaskSpec, world: World, delivered_of: Callable[[str], list[str]]
) -> TaskOutcome:
    CURRENT_TASK.set(spec.task_id)
    clock = world.clock
    started = clock()
    clock.set_deadline(started + TASK_DEADLINE_S, participant())
    restarts = 0
    answer: str | None = None
    reason = "ok"
    attempt_started = started
    try:
        while True:
            try:
                attempt_started = clock()
                answer = runner.run(arm, spec, world, restarts)
                break
            except SimulatedCrash:
                if restarts >= 1:
                    reason = "crash"
                    break
                restarts += 1
                clock.sleep(RESTART_DELAY_S)
                if arm == "governed":
                    world.new_governor()
    except DeadlineExceeded as exc:  # the task's deadline, or a real model's call or time cap
        reason = getattr(exc, "reason", "deadline")
    except Exception as exc:  # the framework stopped the run: that is the outcome
        reason = _reason_of(exc)
    delivered: list[str] = []
    if getattr(world.behaviour, "observed", False):
        delivered = _observed(spec, world, arm, answer, attempt_started)
    elif answer is not None:
        delivered = delivered_of(answer)
    elif arm == "governed":
        # The governor checkpointed every completed call: those sub-results survive the stop.
        cp = world.checkpoints.load(spec.task_id)
        delivered = [spec.plan[i].sid for i in range(min(len(cp.completed), len(spec.plan)))] if cp else []
    required = [s.sid for s in spec.plan if s.required]
    missing = [sid for sid in required if sid not in delivered]
    if reason == "ok" and missing:
        reason = "incomplete"
    elif reason == "ok" and not spec.answered(answer):
        reason = "no_answer"
    requests = [r for r in world.downstream.requests if r.task == spec.task_id]
    model = [r for r in world.provider.requests if r.task == spec.task_id]
    return TaskOutcome(
        task_id=spec.task_id,
        scenario=spec.scenario,
        framework=runner.name,
        arm=arm,
        failed=reason != "ok",
        reason=reason,
        duration_s=round(clock() - started, 3),
        tool_calls=len(requests),
        delivered=len(set(delivered)),
        required=len(required),
        restarts=restarts,
        policy=world.behaviour.name,
        model_calls=len(model),
        failed_model_calls=sum(1 for r in model if not r.ok),
        # billed tokens: the prompts of the requests the provider answered
        prompt_tokens=sum(r.prompt_tokens for r in model if r.ok),
        model_wall_s=round(sum(r.wall_s for r in model), 3),
        empty_replies=sum(1 for r in model if r.reply == "empty"),
        malformed_replies=sum(1 for r in model if r.reply == "malformed"),
        identical_repeats=identical_repeats(requests),
    )


def _observed(spec: TaskSpec, world: World, arm: str, answer: str | None, attempt_started: float) -> list[str]:
    """What a real model's task delivered, read from the services' request log (its answer is
    prose): the sub-tasks its calls did (``TaskSpec.delivered_from``), under the scripted
    runs' rules -- a run that ended normally has the results of its last attempt (a crashed
    worker's conversation is gone); one stopped by an error has nothing, except under the
    governor, whose checkpoint holds every completed call of every attempt."""
    if arm != "governed" and answer is None:
        return []
    requests = [
        r
        for r in world.downstream.requests
        if r.task == spec.task_id and (arm == "governed" or r.start >= attempt_started)
    ]
    return spec.delivered_from(requests, answer)


def run_world(
    runner: Runner,
    arm: str,
    scenario: Scenario,
    seed: int,
    run_index: int,
    delivered_of: Callable[[str], list[str]],
    behaviour: Behaviour = OBEDIENT,
    config: GovernorConfig | None = None,
) -> list[TaskOutcome]:
    """Run one world of ``scenario``; ``config`` is the governed arm's (the bench uses the
    defaults everywhere; ``benchmarks/provider_fault_settings.py`` tries others)."""
    name = f"{scenario.name}-r{run_index}"
    clock = VirtualClock(0.0)
    downstream = Downstream(clock, seed, name, scenario.faults(), dict(scenario.capacity), answers=scenario.answers())
    provider = Provider(clock, seed, name, scenario.model_fault() if scenario.model_fault is not None else None)
    rng = random.Random(int(unit_hash(seed, name, arm) * 2**32))
    world = World(seed, name, clock, downstream, rng, provider, behaviour, config or GovernorConfig())
    world.checkpoints = MemoryCheckpointStore(clock=clock)
    if arm == "governed":
        world.new_governor()
    specs = scenario.tasks(name)
    with runner.world(arm, world):
        if len(specs) == 1:
            outcomes = [_run_task(runner, arm, specs[0], world, delivered_of)]
        else:
            jobs = [(lambda spec=spec: _run_task(runner, arm, spec, world, delivered_of)) for spec in specs]
            results = clock.run_concurrently(jobs)
            outcomes = []
            for (value, error), spec in zip(results, specs, strict=True):
                if error is not None:
                    raise RuntimeError(f"benchmark harness failed on {spec.task_id}") from error
                outcomes.append(value)
    peak = downstream.peak_concurrency()
    retry_rate = downstream.peak_retry_rate()
    for outcome in outcomes:
        outcome.peak_concurrency = peak
        outcome.peak_retry_rate_per_s = retry_rate
    return outcomes


def _reason_of(exc: Exception) -> str:
    """The governor's error class when it ended the run (an adapter's error may also be
    the model exception's own class: LangChain's governed model failures are both)."""
    for klass in type(exc).__mro__:
        if klass.__module__ == "loop_governor.errors" and klass is not Exception:
            return klass.__name__
    return type(exc).__name__
