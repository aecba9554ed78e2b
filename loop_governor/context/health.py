"""Context health: how much of what the model re-reads is errors and repeated calls.

A context full of stack traces and identical retries "poisons" the next decision (the
model keeps imitating its failures). The figure goes to the trace so a detector can flag
runs whose health falls below a threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .view import ASSISTANT, TOOL, Codec, codec_for, dump_args, text_of

ErrorPredicate = Callable[[Any], bool]

_ERROR_PREFIXES = ('{"error"', "Error executing tool", "Error:")


def default_is_error(message: Any, codec: Codec | None = None) -> bool:
    """A tool result is an error when the framework says so (LangChain ``status="error"``)
    or its text is one of the error shapes agents actually see: the governor's structured
    JSON, CrewAI's "Error executing tool", LangChain ToolNode's "Error: ..."."""
    c = codec or codec_for(message)
    if c.is_error_status(message):
        return True
    content = c.content(message)
    text = content if isinstance(content, str) else text_of(content)
    return text.lstrip()[:24].startswith(_ERROR_PREFIXES)


def call_key(name: str, args: Any) -> str:
    """Tool name plus canonical JSON arguments: equal keys mean an identical call."""
    return f"{name}\x00{dump_args(args)}"


@dataclass(frozen=True, slots=True)
class ContextHealth:
    """``score`` is the share of tool results that are neither errors nor answers to a
    repeated identical call (1.0 = clean, 0.0 = every result is an error or a repeat)."""

    tool_results: int
    errors: int
    duplicates: int
    bad: int

    @property
    def error_share(self) -> float:
        return self.errors / self.tool_results if self.tool_results else 0.0

    @property
    def duplicate_share(self) -> float:
        return self.duplicates / self.tool_results if self.tool_results else 0.0

    @property
    def score(self) -> float:
        return 1.0 - self.bad / self.tool_results if self.tool_results else 1.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "tool_results": self.tool_results,
            "errors": self.errors,
            "duplicates": self.duplicates,
            "error_share": round(self.error_share, 4),
            "duplicate_share": round(self.duplicate_share, 4),
            "score": round(self.score, 4),
        }


class HealthCounter:
    """Incremental counters (the pruner feeds it one message at a time)."""

    __slots__ = ("_dup_ids", "_seen", "bad", "duplicates", "errors", "results")

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._dup_ids: set[str] = set()
        self.results = self.errors = self.duplicates = self.bad = 0

    def add_call(self, call_id: str | None, key: str) -> bool:
        """Record a tool call; True when an identical call was made before."""
        dup = key in self._seen
        self._seen.add(key)
        if dup and call_id is not None:
            self._dup_ids.add(call_id)
        return dup

    def add_result(self, call_id: str | None, is_error: bool, dup: bool | None = None) -> None:
        self.results += 1
        is_dup = dup if dup is not None else (call_id is not None and call_id in self._dup_ids)
        self.errors += is_error
        self.duplicates += is_dup
        self.bad += is_error or is_dup

    def snapshot(self) -> ContextHealth:
        return ContextHealth(self.results, self.errors, self.duplicates, self.bad)


def context_health(messages: Sequence[Any], is_error: ErrorPredicate | None = None) -> ContextHealth:
    """Share of errors and duplicate calls among the tool results of ``messages``."""
    counter = HealthCounter()
    for m in messages:
        codec = codec_for(m)
        role = codec.role(m)
        if role == ASSISTANT:
            for call in codec.tool_calls(m):
                counter.add_call(call.id, call_key(call.name, call.args))
        elif role == TOOL:
            err = is_error(m) if is_error else default_is_error(m, codec)
            counter.add_result(codec.tool_call_id(m), err)
    return counter.snapshot()
