"""The scripted model: a simulation of how an agent's model reacts to tool results.

This is not a language model. It is a fixed policy, the same for every arm, that
reproduces the behaviour the seeds observed in real agents:

* a tool result that starts with ``RESULT`` is a success: keep it, go to the next sub-task;
* a plain error string (a traceback, "Error: HTTP 429 ...", crewAI's "Error executing
  tool", LangChain's "failed after 3 attempts ... Please try again"): the model calls
  the *same* tool with the *same* arguments again. The seed watched a model do this 31
  times in a row against a rate limit, so the simulated model gives up on a call only
  after ``PATIENCE`` identical failures (then it tries its next option, or skips);
* the governor's structured error (``{"error": {...}}``): the model follows it.
  ``retryable: true`` -> call again; ``type: fatal`` -> stop and report; otherwise it
  follows the advice: switch to its next option (another tool, corrected arguments) or
  skip the sub-task and continue.

At the end (or when told to stop) it answers ``DONE delivered=<ids> skipped=<ids>``: the
sub-results it has. The policy is a pure function of the tool results it has been shown,
so it gives the same decisions when a framework re-sends a conversation or a task is
restarted with a fresh one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loop_governor.bench.world import (
    MODEL_BASE_S,
    MODEL_NOISE_S,
    MODEL_PER_MESSAGE_S,
    RESULT_PREFIX,
    Option,
    TaskSpec,
    unit_hash,
)

PATIENCE = 30
"""Identical plain-error failures the simulated model accepts before trying something else."""


@dataclass(frozen=True)
class CallTool:
    tool: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    text: str
    delivered: tuple[str, ...]


@dataclass
class _State:
    index: int = 0
    option: int = 0
    plain_failures: int = 0
    stop: bool = False
    delivered: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def governed_error(text: str) -> dict[str, Any] | None:
    """The governor's error body if ``text`` carries one (crewAI may wrap it in prose)."""
    start = text.find('{"error":')
    if start < 0:
        return None
    try:
        body, _ = json.JSONDecoder().raw_decode(text, start)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def _next_option(state: _State, spec: TaskSpec) -> None:
    sub = spec.plan[state.index]
    state.plain_failures = 0
    state.option += 1
    if state.option >= len(sub.options):
        state.skipped.append(sub.sid)
        state.index += 1
        state.option = 0


def replay(spec: TaskSpec, results: Sequence[str]) -> _State:
    """Where the model stands after reading ``results`` (one per call it made, in order)."""
    state = _State()
    for text in results:
        if state.stop or state.index >= len(spec.plan):
            break
        if text.startswith(RESULT_PREFIX):
            state.delivered.append(spec.plan[state.index].sid)
            state.index += 1
            state.option = 0
            state.plain_failures = 0
            continue
        error = governed_error(text)
        if error is None:
            state.plain_failures += 1
            if state.plain_failures >= PATIENCE:
                _next_option(state, spec)
            continue
        if error.get("type") == "fatal":
            state.stop = True
        elif error.get("retryable") is True:
            continue
        else:
            _next_option(state, spec)
    return state


def decide(spec: TaskSpec, results: Sequence[str], *, tools_offered: bool = True) -> CallTool | Answer:
    """The model's next move given every tool result of this conversation so far."""
    state = replay(spec, results)
    if state.stop or state.index >= len(spec.plan) or not tools_offered:
        delivered = tuple(state.delivered)
        text = f"DONE delivered={','.join(delivered) or '-'} skipped={','.join(state.skipped) or '-'}"
        return Answer(text, delivered)
    option: Option = spec.plan[state.index].options[state.option]
    return CallTool(option.tool, option.kwargs)


def delivered_in(text: str) -> list[str]:
    """The sub-result ids a final answer lists."""
    for part in text.split():
        if part.startswith("delivered="):
            value = part.removeprefix("delivered=")
            return [] if value == "-" else value.split(",")
    return []


def model_latency(seed: int, task_id: str, turn: int, messages: int) -> float:
    """Simulated latency of one model turn (the same formula in both frameworks)."""
    return MODEL_BASE_S + MODEL_PER_MESSAGE_S * messages + MODEL_NOISE_S * unit_hash(seed, task_id, "turn", turn)
