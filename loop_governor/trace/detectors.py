"""Detectors that read the event stream and flag runs that work but cost too much.

A run can call the right tools, get 200s everywhere, and still burn money: the classic
case is a prompt cache that never hits (``cache_read_tokens == 0`` on every turn after the
first) even though the prompt prefix did not change, which only shows when consecutive
prompts are compared message by message. Each detector returns anomaly field dicts; the
Lens emits them as ``"anomaly"`` events so they land in the trace, the spans and any
other subscriber.

Detector state is per task and dropped at ``task_end``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from loop_governor.context.tokens import approx_tokens

CACHE_READ_ZERO = "cache_read_zero"
REPEATED_ERROR = "repeated_error"
CONTEXT_GROWTH = "context_growth"
LOW_CONTEXT_HEALTH = "low_context_health"

_MAX_SIGNATURES = 1024  # error signatures counted per task; the oldest is forgotten first


class DetectorConfig(BaseModel):
    """Thresholds for the detectors."""

    model_config = ConfigDict(frozen=True)

    cache_min_input_tokens: int = Field(
        default=1024,
        ge=0,
        description="Providers only cache a prompt prefix of ~1024 tokens or more (OpenAI, Anthropic): a "
        "turn whose prefix shared with the previous prompt is smaller reads 0 cached tokens as expected, "
        "however long the whole prompt is.",
    )
    repeated_error_threshold: int = Field(default=3, ge=2, description="Same error signature this often in a task.")
    growth_tokens_per_turn: int = Field(
        default=8000, ge=1, description="Input tokens added between two consecutive model calls."
    )
    health_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    health_min_tool_results: int = Field(
        default=4, ge=1, description="Health is not judged on fewer tool results than this."
    )


def _is_error_result(message: Mapping[str, Any]) -> bool:
    if message.get("status") == "error":
        return True
    content = message.get("content")
    if not isinstance(content, str):
        return False
    head = content.lstrip()[:32]
    # The governor's structured error text, and the prefixes LangChain ("Error: ...") and
    # CrewAI ("Error executing tool ...") put on tool failures.
    return head.startswith('{"error"') or head.lower().startswith("error")


def _prefix_tokens(messages: Sequence[Any], prefix: int, prev_input_tokens: int | None) -> int | None:
    """Tokens of a prompt's first ``prefix`` messages when they are the whole previous
    prompt: the provider's count for that prompt, else an estimate of the messages."""
    if prev_input_tokens is not None:
        return prev_input_tokens
    if not messages:
        return None
    return sum(approx_tokens(m) for m in messages[:prefix])


def context_health(messages: Sequence[Any]) -> tuple[float, int]:
    """Share of tool results in a prompt that are neither errors nor repeats of an earlier one.

    Returns ``(health, tool_results)``; health is 1.0 when there are no tool results.
    Computed here because the trace must judge any prompt, pruned by the governor or not.
    """
    seen: set[str] = set()
    results = bad = 0
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "tool":
            continue
        results += 1
        content = message.get("content")
        text = content if isinstance(content, str) else repr(content)
        if _is_error_result(message) or text in seen:
            bad += 1
        seen.add(text)
    if results == 0:
        return 1.0, 0
    return 1.0 - bad / results, results


@dataclass
class _TaskState:
    turn: int = 0
    prev_hashes: list[str] = field(default_factory=list)
    prev_input_tokens: int | None = None  # the last call that reported a count
    prev_prompt_tokens: int | None = None  # the previous call's count, if it reported one
    error_counts: dict[str, int] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Detectors:
    """Stateful anomaly detection over one governor's events. Not thread-safe (the Lens locks)."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self._tasks: dict[Any, _TaskState] = {}

    def _state(self, task_id: Any) -> _TaskState:
        state = self._tasks.get(task_id)
        if state is None:
            state = self._tasks[task_id] = _TaskState()
        return state

    def end_task(self, task_id: Any) -> None:
        self._tasks.pop(task_id, None)

    def on_tool_call(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        if event.get("status") != "error":
            return []
        signature = event.get("signature") or f"{event.get('tool')}:{event.get('error_type')}"
        state = self._state(event.get("task_id"))
        count = state.error_counts.get(signature, 0) + 1
        if count == 1 and len(state.error_counts) >= _MAX_SIGNATURES:
            # a task (or the no-task scope, which never ends) failing in ever new ways
            del state.error_counts[next(iter(state.error_counts))]
        state.error_counts[signature] = count
        if count < self.config.repeated_error_threshold or f"err:{signature}" in state.flagged:
            return []
        state.flagged.add(f"err:{signature}")
        return [
            {
                "kind": REPEATED_ERROR,
                "tool": event.get("tool"),
                "signature": signature,
                "count": count,
                "message": f"{event.get('tool')} failed {count} times with the same error signature",
            }
        ]

    def on_model_call(
        self, event: Mapping[str, Any], hashes: list[str], messages: Sequence[Any]
    ) -> tuple[int, float | None, int, list[dict[str, Any]]]:
        """Judge one model call. Returns ``(turn, health, prefix_kept, anomalies)``.

        ``prefix_kept`` is how many leading messages of the previous prompt this prompt
        repeats unchanged — the part a provider's prompt cache can serve.
        """
        cfg = self.config
        state = self._state(event.get("task_id"))
        state.turn += 1
        turn = state.turn
        out: list[dict[str, Any]] = []

        prev = state.prev_hashes
        prefix_kept = 0
        for a, b in zip(prev, hashes, strict=False):
            if a != b:
                break
            prefix_kept += 1
        input_tokens = _int(event.get("input_tokens"))
        cache_read = _int(event.get("cache_read_tokens"))
        prefix_tokens = _prefix_tokens(messages, prefix_kept, state.prev_prompt_tokens)
        if (
            turn > 1
            and prev
            and prefix_kept == len(prev)
            and cache_read == 0
            and (prefix_tokens is None or prefix_tokens >= cfg.cache_min_input_tokens)
            and CACHE_READ_ZERO not in state.flagged
        ):
            state.flagged.add(CACHE_READ_ZERO)
            out.append(
                {
                    "kind": CACHE_READ_ZERO,
                    "turn": turn,
                    "model": event.get("model"),
                    "prefix_messages": prefix_kept,
                    "prefix_tokens": prefix_tokens,
                    "input_tokens": input_tokens,
                    "message": f"turn {turn}: cache_read_tokens is 0 although the first {prefix_kept} "
                    "messages are identical to the previous call; the provider cache is not being hit "
                    "(caching disabled, prefix below the provider minimum, or a volatile header)",
                }
            )

        if input_tokens is not None and state.prev_input_tokens is not None:
            growth = input_tokens - state.prev_input_tokens
            if growth > cfg.growth_tokens_per_turn:
                out.append(
                    {
                        "kind": CONTEXT_GROWTH,
                        "turn": turn,
                        "growth_tokens": growth,
                        "input_tokens": input_tokens,
                        "message": f"turn {turn}: the prompt grew by {growth} tokens in one turn",
                    }
                )
        if input_tokens is not None:
            state.prev_input_tokens = input_tokens

        health, results = context_health(messages)
        if results >= cfg.health_min_tool_results and health < cfg.health_threshold:
            if LOW_CONTEXT_HEALTH not in state.flagged:
                state.flagged.add(LOW_CONTEXT_HEALTH)
                out.append(
                    {
                        "kind": LOW_CONTEXT_HEALTH,
                        "turn": turn,
                        "health": round(health, 3),
                        "tool_results": results,
                        "message": f"turn {turn}: only {health:.0%} of {results} tool results in the prompt "
                        "are useful; the rest are errors or repeats",
                    }
                )
        else:
            state.flagged.discard(LOW_CONTEXT_HEALTH)  # re-arm once the context recovers

        state.prev_hashes = hashes
        state.prev_prompt_tokens = input_tokens
        return turn, (round(health, 4) if results else None), prefix_kept, out
