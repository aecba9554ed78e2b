"""No-progress detection: stop a loop because it stopped making progress.

A plan / execute / critique / repair loop whose critic is never satisfied runs until a
step limit, or for two weeks without one. Step limits only fail faster. What marks the
loop is that the critic's *verdict* no longer changes: the same tool returns the same
non-trivial result round after round, even though its input (a new draft) differs.

Calibrated on real runs (see ``benchmarks/loop_guard_calibration.py``): successful coding
agents do repeat trivial results -- an empty output, a bare exit code after ``sed -i`` --
three or more times in a row, so results of at most ``trivial_chars`` characters never
count; no successful run repeated a non-trivial result 3 times in a row, nor the
identical call with the identical result.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy
from loop_governor.checkpointing import stop_run
from loop_governor.errors import ErrorType, GovernedError, NoProgressError

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

NOTE = (
    "[loop-governor] {tool} returned the same result {count} times in a row: its verdict has not "
    "changed. Stop revising and give your final answer now."
)


def result_text(result: Any) -> str | None:
    """The text a model reads from a tool result, or None when there is none to compare.

    Duck-typed so the core needs no framework: a ``str``, an object with a ``str``
    ``.content`` (a LangChain ``ToolMessage``), or a mapping with a ``"content"`` string.
    """
    if isinstance(result, str):
        return result
    content = getattr(result, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(result, dict):
        value = result.get("content")
        if isinstance(value, str):
            return value
    return None


def annotate(result: Any, note: str) -> Any:
    """Append ``note`` to what the model will read; unchanged if that can't be done safely."""
    if isinstance(result, str):
        return f"{result}\n\n{note}"
    content = getattr(result, "content", None)
    copier = getattr(result, "model_copy", None)
    if isinstance(content, str) and callable(copier):
        return copier(update={"content": f"{content}\n\n{note}"})  # pydantic models (ToolMessage)
    if isinstance(result, dict) and isinstance(result.get("content"), str):
        return {**result, "content": f"{result['content']}\n\n{note}"}
    return result


@dataclass(slots=True)
class Verdict:
    """What the guard concluded about one result: nothing, warn the model, or stop."""

    action: str  # "ok" | "warn" | "stop"
    reason: str = ""
    count: int = 0


OK = Verdict("ok")


_MARKUP = re.compile(r"</?[A-Za-z_][\w\-]{0,40}/?>")
_NOISE = re.compile(r"[\W_]+")


def _is_trivial(text: str, limit: int) -> bool:
    """True for results with (almost) no information: an empty output or a bare exit code,
    also when a harness wraps them (``<returncode>0</returncode><output></output>``)."""
    if len(text) > 20 * limit + 200:
        return False
    body = _NOISE.sub("", _MARKUP.sub("", text))
    return len(body) <= limit


@dataclass(slots=True)
class ProgressGuard:
    """Per-task streaks: identical results per tool, identical call+result pairs.

    In-process and cheap on the success path: results are compared by ``hash(str)``
    (cached by CPython), and the call key (canonical JSON + digest) is computed only when
    a result repeats the previous one.
    """

    threshold: int = 3
    trivial_chars: int = 10
    _by_tool: dict[str, tuple[int, int]] = field(default_factory=dict)
    _last_hash: int | None = None
    _last_key_fn: Callable[[], str] | None = None
    _last_key: str | None = None
    _call_streak: int = 0
    _warned: set[str] = field(default_factory=set)

    def observe(self, tool: str, text: str | None, key_fn: Callable[[], str]) -> Verdict:
        """Feed one successful tool result; returns what to do about it."""
        if text is None:
            return OK
        digest = hash(text)
        # Identical call + identical result, consecutive in the task (crewAI's
        # REPEATED_CALL, generalized): the model keeps asking the same question.
        if digest == self._last_hash and self._last_key_fn is not None:
            if self._last_key is None:
                self._last_key = self._last_key_fn()
            key = key_fn()
            self._call_streak = self._call_streak + 1 if key == self._last_key else 1
            self._last_key = key
        else:
            self._call_streak = 1
            self._last_key = None
        self._last_hash, self._last_key_fn = digest, key_fn
        by_tool = self._by_tool
        prev = by_tool.get(tool)
        if prev is None or prev[0] != digest:
            by_tool[tool] = (digest, 1)  # a new result: no streak (triviality doesn't matter yet)
            streak = 1
        elif _is_trivial(text, self.trivial_chars):
            del by_tool[tool]  # "0" again after "0": an exit code, not a verdict
            streak = 0
        else:
            streak = prev[1] + 1
            by_tool[tool] = (digest, streak)
        return self._judge(tool, max(streak, self._call_streak))

    def _judge(self, tool: str, count: int) -> Verdict:
        if count < self.threshold:
            if self._warned:
                self._warned.discard(tool)
            return OK
        if tool not in self._warned:
            self._warned.add(tool)
            return Verdict("warn", "no_progress", count)
        return Verdict("stop", "no_progress", count)


class NoProgress(Policy):
    """Feeds each successful tool result to the task's :class:`ProgressGuard`: warns the
    model once in the result, then stops the run if the verdict still does not change."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        assert scope is not None
        tool = call.name
        verdict = scope.progress.observe(tool, result_text(result), lambda: call.key)
        if verdict is OK:
            return result
        self.rt.events.emit("no_progress", tool=tool, count=verdict.count, action=verdict.action)
        if verdict.action == "warn":
            return annotate(result, NOTE.format(tool=tool, count=verdict.count))
        info = GovernedError(
            error_type=ErrorType.FATAL,
            tool=tool,
            code="no_progress",
            message=f"{tool} returned the same result {verdict.count} times in a row after the model was told",
            signature=f"{tool}:NoProgressError:no progress",
            advice="the loop stopped making progress: stop and report what was done",
            count=verdict.count,
        )
        raise stop_run(self.rt, scope, NoProgressError(info))
