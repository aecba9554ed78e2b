"""How a trace's records read to a person: task names, and what became of each tool call.

The report and `loop-governor report`'s terminal lines share these, so a task is called
the same everywhere and a call the governor answered without making it is never shown as
a call that was made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from loop_governor.reasons import StopReason

# What became of a tool call (a `tool_call` event), by the flags the governor set on it.
OK = "ok"
FAILED = "failed"
FROM_MEMORY = "from_memory"
FROM_CHECKPOINT = "from_checkpoint"
REFUSED_BREAKER = "refused_breaker"
REFUSED_RATE_LIMIT = "refused_rate_limit"
REFUSED_WITHDRAWN = "refused_withdrawn"
REFUSED_POLL_BOUND = "refused_poll_bound"
REFUSED = "refused"

OUTCOMES: dict[str, str] = {
    OK: "called: ok",
    FAILED: "called: failed",
    FROM_MEMORY: "answered from memory, not called (the identical call failed before)",
    FROM_CHECKPOINT: "answered from the checkpoint, not called (it completed before a resume)",
    REFUSED_BREAKER: "refused, not called: its circuit breaker was open",
    REFUSED_RATE_LIMIT: "refused, not called: over its rate limit",
    REFUSED_WITHDRAWN: "refused, not called: the tool was withdrawn, so the run stopped",
    REFUSED_POLL_BOUND: "refused, not called: the polled job reached its bound",
    REFUSED: "refused, not called",
}
"""Each outcome as the report's tool-call table says it."""

NOT_MADE = frozenset(OUTCOMES) - {OK, FAILED}
"""The outcomes of calls the governor answered without calling the tool."""


def call_outcome(event: Mapping[str, Any]) -> str:
    """What became of the tool call `event` records (one of [`OUTCOMES`][loop_governor.trace.reading.OUTCOMES])."""
    if event.get("resumed"):
        return FROM_CHECKPOINT
    if event.get("known_bad"):
        return FROM_MEMORY
    if event.get("circuit_open"):
        return REFUSED_BREAKER
    if event.get("rate_limited"):
        return REFUSED_RATE_LIMIT
    if event.get("stop_reason") == StopReason.WITHDRAWN:
        return REFUSED_WITHDRAWN
    if event.get("stop_reason") == StopReason.POLL_BOUND:
        return REFUSED_POLL_BOUND
    if event.get("status") == "ok":
        return OK
    attempts = event.get("attempts")
    if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts == 0:
        return REFUSED  # refused before a first attempt (a budget, a hook)
    return FAILED


def model_read(event: Mapping[str, Any]) -> str:
    """The failure as the model read it: the tool's own message, then the governor's
    advice; a trace written before events carried them shows the signature instead."""
    message, advice = event.get("message"), event.get("advice")
    if isinstance(message, str) and message:
        return f"{message} — {advice}" if isinstance(advice, str) and advice else message
    signature = event.get("signature")
    return str(signature) if signature else ""


def task_names(events: Iterable[Mapping[str, Any]]) -> dict[Any, str]:
    """Task id -> the name a person reads: the `name` its `task_start` carries (the thread
    id, the crew's task description, the run's first request, a name the user gave), else
    the id. Two tasks with one name (the same question asked twice) are told apart by the
    start of their ids."""
    given: dict[Any, str] = {}
    for event in events:
        task = event.get("task_id")
        if task is None:
            continue
        name = event.get("name") if event.get("event") == "task_start" else None
        if isinstance(name, str) and name.strip():
            given[task] = name
        else:
            given.setdefault(task, str(task))
    counts: dict[str, int] = {}
    for name in given.values():
        counts[name] = counts.get(name, 0) + 1
    return {
        task: name if counts[name] == 1 or name == str(task) else f"{name} · {str(task)[:8]}"
        for task, name in given.items()
    }
