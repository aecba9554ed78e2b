"""The scripted model: how an agent's model reacts to tool results, under three policies.

This is not a language model. It is a fixed policy, the same for every arm, chosen with
``--model-policy``:

* a tool result that starts with ``RESULT`` is a success: keep it, go to the next
  sub-task (every policy);
* ``obedient`` (the seeds' model): a plain error string (a traceback, "Error: HTTP 429
  ...", crewAI's "Error executing tool", LangChain's "failed after 3 attempts ...
  Please try again") makes it call the *same* tool with the *same* arguments again; the
  seed watched a model do this 31 times in a row against a rate limit, so it gives up on
  a call only after ``PATIENCE`` identical failures (then it tries its next option, or
  skips). The governor's structured error (``{"error": {...}}``) it follows:
  ``retryable: true`` -> call again; ``type: fatal`` -> stop and report; otherwise the
  advice: its next option (another tool, corrected arguments) or skip the sub-task;
* ``stubborn``: reads the structured error like a plain string -- it repeats the call
  until its patience runs out, whatever ``retryable`` and ``advice`` say. The model the
  governor must bound;
* ``calibrated``: after each failure it repeats the identical call, retries with changed
  arguments, switches to another tool or gives up on the sub-task with the
  probabilities real agents showed on the shared corpus, per kind of failure and per
  position in a streak ([`loop_governor.bench.calibrate`][loop_governor.bench.calibrate] measures them; the shipped
  ``calibration.json`` holds them). Its choices are seeded draws, one per failure.

At the end (or when told to stop) it answers ``DONE delivered=<ids> skipped=<ids>``: the
sub-results it has. Each policy is a pure function of the tool results it has been shown
(and the seed), so it gives the same decisions when a framework re-sends a conversation
or a task is restarted with a fresh one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

from loop_governor.bench.calibrate import FORMAT, MOVES, POSITIONS
from loop_governor.bench.determinism import unit_hash
from loop_governor.bench.world import (
    MODEL_BASE_S,
    MODEL_NOISE_S,
    MODEL_PER_MESSAGE_S,
    RESULT_PREFIX,
    TaskSpec,
    varied,
)
from loop_governor.errors import read_model_text

PATIENCE = 30
"""Identical plain-error failures the obedient and stubborn models accept before trying something else."""

MIN_COUNT = 5
"""A calibrated (kind, position) cell needs this many observed failures, else the pooled default is used."""

POLICY_NAMES: tuple[str, ...] = ("obedient", "stubborn", "calibrated")

Move = Literal["repeat", "vary", "switch", "next", "skip", "stop"]
_MOVE_OF: dict[str, Move] = {"identical": "repeat", "changed": "vary", "switch": "switch", "give_up": "skip"}


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
    variant: int = 0  # how often the current option's arguments were changed (``world.varied``)
    repeats: int = 0  # failures of the current call in a row
    streak: int = 0  # failures in a row on the current sub-task and tool (changed arguments included)
    failures: int = 0  # failures seen in this conversation: the calibrated policy's draw index
    stop: bool = False
    delivered: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


_STATUS = re.compile(r"HTTP (\d{3})\b|\bcode:? ?(\d{3})\b")


@dataclass(frozen=True)
class Seen:
    """A failed tool result as the model reads it: its text and the governor's error body, if any."""

    text: str
    error: dict[str, Any] | None

    @property
    def status(self) -> int | None:
        """The HTTP status the result states (the structured error's, or one quoted in the text)."""
        if self.error is not None and isinstance(self.error.get("status"), int):
            return int(self.error["status"])
        match = _STATUS.search(self.text)
        return int(match.group(1) or match.group(2)) if match else None


def governed_error(text: str) -> dict[str, Any] | None:
    """The governor's error fields if ``text`` carries them, in either rendering (crewAI may
    wrap them in prose)."""
    return read_model_text(text)


class Behaviour(Protocol):
    """A model policy: the next move after a failed tool call."""

    name: str

    def react(self, seen: Seen, state: _State, draw: float) -> Move: ...


class Obedient:
    name = "obedient"

    def react(self, seen: Seen, state: _State, draw: float) -> Move:
        if seen.error is None:
            return "next" if state.repeats >= PATIENCE else "repeat"
        if seen.error.get("type") == "fatal":
            return "stop"
        if seen.error.get("retryable") is True:
            return "repeat"
        return "next"


class Stubborn:
    name = "stubborn"

    def react(self, seen: Seen, state: _State, draw: float) -> Move:
        return "next" if state.repeats >= PATIENCE else "repeat"


def failure_kind(seen: Seen) -> str:
    """The corpus kind a bench failure is read as (see calibrate's definitions).

    404 -> ``not_found``; a refused request (400, 409, 422) -> ``invalid``; everything the
    corpus has no example of (rate limits, outages, expired credentials, the governor's
    own refusals) -> ``default``, the pooled reactions of the API agents.
    """
    status = seen.status
    if status == 404:
        return "not_found"
    if status in (400, 409, 422):
        return "invalid"
    return "default"


class Calibrated:
    name = "calibrated"

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.longest_streak = int(params["default"].get("longest_streak") or 0)

    def row(self, kind: str, position: int) -> dict[str, int]:
        """The move counts for a failure of ``kind`` at ``position`` (1-based): the kind's own
        when it has ``MIN_COUNT`` failures there, else the pooled default's; a position with
        too few of either uses the nearest earlier one."""
        for bucket in range(min(position, POSITIONS), 0, -1):
            for source in (self.params["kinds"].get(kind), self.params["default"]):
                if source is None:
                    continue
                row: dict[str, int] = source["positions"][bucket - 1]
                if row["n"] >= MIN_COUNT:
                    return row
        raise ValueError("calibration has fewer than MIN_COUNT failures at position 1")

    def react(self, seen: Seen, state: _State, draw: float) -> Move:
        row = self.row(failure_kind(seen), state.streak)
        moves = list(MOVES)
        if self.longest_streak and state.streak >= self.longest_streak:
            moves = ["switch", "give_up"]  # no real streak went on longer: leave the call
        total = sum(row[m] for m in moves)
        if total == 0:
            return "skip"
        point, acc = draw * total, 0.0
        for move in moves:
            acc += row[move]
            if point < acc:
                return _MOVE_OF[move]
        return _MOVE_OF[moves[-1]]


def load_calibration(path: Path | str | None = None) -> dict[str, Any]:
    """Calibration parameters from ``path``, or the shipped ``calibration.json``."""
    if path is None:
        text = resources.files("loop_governor.bench").joinpath("calibration.json").read_text(encoding="utf-8")
        where = "the shipped calibration.json"
    else:
        text = Path(path).read_text(encoding="utf-8")
        where = str(path)
    try:
        params = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from None
    if not isinstance(params, dict) or params.get("format") != FORMAT:
        raise ValueError(f"{where} is not a {FORMAT} file (write one with `loop-governor bench calibrate CORPUS`)")
    return params


def make_behaviour(name: str, calibration: dict[str, Any] | None = None) -> Behaviour:
    if name == "obedient":
        return Obedient()
    if name == "stubborn":
        return Stubborn()
    if name == "calibrated":
        return Calibrated(calibration if calibration is not None else load_calibration())
    raise ValueError(f"unknown model policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


OBEDIENT = Obedient()


def _skip(state: _State, spec: TaskSpec) -> None:
    state.skipped.append(spec.plan[state.index].sid)
    state.index += 1
    state.option = state.variant = state.repeats = state.streak = 0


def _apply(state: _State, spec: TaskSpec, move: Move) -> None:
    options = spec.plan[state.index].options
    tool = options[state.option].tool
    if move == "repeat":
        return
    if move == "stop":
        state.stop = True
        return
    if move == "skip":
        _skip(state, spec)
        return
    state.repeats = 0
    if move == "vary":
        if state.option + 1 < len(options) and options[state.option + 1].tool == tool:
            state.option += 1  # the plan's corrected arguments
            state.variant = 0
        else:
            state.variant += 1
        return
    if move == "switch":
        others = [j for j in range(state.option + 1, len(options)) if options[j].tool != tool]
        if not others:
            _skip(state, spec)
            return
        state.option = others[0]
    else:  # next: the next option, whatever its tool
        if state.option + 1 >= len(options):
            _skip(state, spec)
            return
        state.option += 1
    state.variant = state.streak = 0


def replay(spec: TaskSpec, results: Sequence[str], behaviour: Behaviour = OBEDIENT, seed: int = 0) -> _State:
    """Where the model stands after reading ``results`` (one per call it made, in order)."""
    state = _State()
    for text in results:
        if state.stop or state.index >= len(spec.plan):
            break
        if text.startswith(RESULT_PREFIX):
            state.delivered.append(spec.plan[state.index].sid)
            state.index += 1
            state.option = state.variant = state.repeats = state.streak = 0
            continue
        state.failures += 1
        state.repeats += 1
        state.streak += 1
        draw = unit_hash(seed, spec.task_id, "move", state.failures)
        _apply(state, spec, behaviour.react(Seen(text, governed_error(text)), state, draw))
    return state


def _offered_only(state: _State, spec: TaskSpec, offered: Collection[str]) -> None:
    """A model cannot call a tool it is not offered (the governor withdrew it): it takes
    its next option that uses an offered tool, or gives up on the sub-task -- what every
    policy does once it leaves a call."""
    while not state.stop and state.index < len(spec.plan):
        options = spec.plan[state.index].options
        if options[state.option].tool in offered:
            return
        later = [j for j in range(state.option + 1, len(options)) if options[j].tool in offered]
        if later:
            state.option, state.variant = later[0], 0
            return
        _skip(state, spec)


def decide(
    spec: TaskSpec,
    results: Sequence[str],
    behaviour: Behaviour = OBEDIENT,
    seed: int = 0,
    *,
    tools_offered: bool = True,
    offered: Collection[str] | None = None,
) -> CallTool | Answer:
    """The model's next move given every tool result of this conversation so far, and the
    names of the tools its request offers (None: all of them)."""
    state = replay(spec, results, behaviour, seed)
    if offered is not None:
        _offered_only(state, spec, offered)
    if state.stop or state.index >= len(spec.plan) or not tools_offered:
        delivered = tuple(state.delivered)
        text = f"DONE delivered={','.join(delivered) or '-'} skipped={','.join(state.skipped) or '-'}"
        return Answer(text, delivered)
    option = varied(spec.plan[state.index].options[state.option], state.variant)
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
