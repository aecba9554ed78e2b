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
from loop_governor.fingerprint import Fingerprint, result_text

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

__all__ = ["NOTE", "OK", "NoProgress", "ProgressGuard", "Verdict", "annotate", "ends_text", "result_text"]

NOTE = (
    "[loop-governor] {tool} returned the same result {count} times in a row: its verdict has not "
    "changed. Stop revising and give your final answer now; {ends}."
)


def ends_text(remaining: int, what: str = "repeat", whats: str | None = None) -> str:
    """The plain sentence every warning carries: how many more repeats end the task."""
    if remaining <= 1:
        return f"the next {what} ends the task"
    return f"{remaining} more {whats or what + 's'} end the task"


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
    """What a guard concluded about one step: nothing, warn the model, or stop.

    ``remaining``: how many more repeats the model has before the stop (for the warning).
    """

    action: str  # "ok" | "warn" | "stop"
    reason: str = ""
    count: int = 0
    remaining: int = 0


OK = Verdict("ok")


_MARKUP = re.compile(r"</?[A-Za-z_][\w\-]{0,40}/?>")
_NOISE = re.compile(r"[\W_]+")


def is_trivial(text: str, limit: int) -> bool:
    """True for results with (almost) no information: an empty output or a bare exit code,
    also when a harness wraps them (``<returncode>0</returncode><output></output>``)."""
    if len(text) > 20 * limit + 200:
        return False
    body = _NOISE.sub("", _MARKUP.sub("", text))
    return len(body) <= limit


@dataclass(slots=True)
class ProgressGuard:
    """Per-task, per-tool streaks of the same (normalized) result.

    A critic that is never satisfied answers with the same verdict round after round,
    its score or timestamp aside: results are compared as :class:`Fingerprint` s (digits
    and ids normalized). Trivial results (an empty output, a bare exit code) never count:
    successful coding agents repeat those. At ``threshold`` the model is warned; ``then``
    more identical verdicts stop the run.
    """

    threshold: int = 3
    trivial_chars: int = 10
    then: int = 2
    _by_tool: dict[str, _Seen] = field(default_factory=dict)

    def observe(
        self,
        tool: str,
        result: str | Fingerprint | None,
        then: int | None = None,
        args: Any = None,
        signature: tuple[int, int] | Callable[[], tuple[int, int]] | None = None,
    ) -> Verdict:
        """Feed one successful tool result (the arguments it answered, and their
        :func:`~loop_governor.fingerprint.args_signature`, or a function computing it: it is
        needed only when a result repeats); returns what to do about it."""
        if result is None:
            return OK
        fp = result if isinstance(result, Fingerprint) else Fingerprint(result)
        by_tool = self._by_tool
        seen = _Seen(fp, args, signature)
        prev = by_tool.get(tool)
        if prev is None or not seen.repeats(prev):
            by_tool[tool] = seen  # a new verdict: no streak (triviality doesn't matter yet)
            return OK
        if is_trivial(fp.text, self.trivial_chars):
            # "0" again after "0": an exit code, not a verdict. pop, not del: parallel tool
            # calls of one task (LangGraph's threads) may both end the same streak.
            by_tool.pop(tool, None)
            return OK
        seen.streak = streak = prev.streak + 1
        by_tool[tool] = seen
        if streak < self.threshold:
            return OK
        limit = self.then if then is None else then
        over = streak - self.threshold  # repeats since the warning
        if over >= limit:
            return Verdict("stop", "no_progress", streak)
        return Verdict("warn" if over == 0 else "repeat", "no_progress", streak, limit - over)


_NUMBER = re.compile(r"\d+")


class _Seen:
    """One tool's latest result, with what is needed to compare the next one to it."""

    __slots__ = ("_numbers", "_signature", "_text_numbers", "args", "fp", "streak")

    def __init__(
        self, fp: Fingerprint, args: Any, signature: tuple[int, int] | Callable[[], tuple[int, int]] | None
    ) -> None:
        self.fp = fp
        self.args = args
        self._signature = signature
        self.streak = 1
        self._numbers: frozenset[str] | None = None
        self._text_numbers: list[str] | None = None

    @property
    def signature(self) -> tuple[int, int] | None:
        sig = self._signature
        if callable(sig):
            sig = self._signature = sig()
        return sig

    def text_numbers(self) -> list[str]:
        """The numbers in the result, in order (computed once: the next result asks again)."""
        if self._text_numbers is None:
            self._text_numbers = _NUMBER.findall(self.fp.text[:4096])
        return self._text_numbers

    def numbers(self) -> frozenset[str]:
        """The numbers the call's arguments carry (computed once, when first asked)."""
        if self._numbers is None:
            try:
                text = repr(self.args)[:4000]
            except Exception:  # the caller's repr: a guard's bookkeeping must not lose the result
                text = ""
            self._numbers = frozenset(_NUMBER.findall(text))
        return self._numbers

    def repeats(self, prev: _Seen) -> bool:
        """Whether this result repeats ``prev``: equal but for numbers, unless those numbers
        are the ones the arguments asked for ("item 4 done" for item 4 after "item 3 done"
        for item 3 is progress through a batch; a verdict whose score alone moves is not);
        for a call that only walked on (another page of the same query), equal outright."""
        fp, before = self.fp, prev.fp
        if not fp.same_as(before, full=False):
            return False
        if fp.text == before.text:
            return True
        if self.args is not None and prev.args is not None:
            # the cheap forms are equal, so the texts differ only in their numbers, position
            # by position: a changed number both calls' arguments carry is the batch moving
            # on (checked first: cheaper than normalizing the arguments, and a batch is the
            # common case of results alike but for numbers)
            now, then = self.text_numbers(), prev.text_numbers()
            changed = [(a, b) for a, b in zip(now, then, strict=False) if a != b]
            if any(a in self.numbers() and b in prev.numbers() for a, b in changed):
                return False
        mine, theirs = self.signature, prev.signature
        # a new page whose answer differs (new ids) is progress
        return not (mine is not None and theirs is not None and mine[0] == theirs[0] and mine[1] != theirs[1])


class NoProgress(Policy):
    """Feeds each successful tool result to the task's :class:`ProgressGuard`: warns the
    model in the result, then stops the run if the verdict still does not change."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        assert scope is not None
        if call.same_decision:
            return result  # a retrying middleware re-ran the same tool call
        tool = call.name
        verdict = scope.progress.observe(
            tool,
            call.fingerprint(result),
            call.policy.escalation_repeats,
            (call.args, call.kwargs),
            lambda: call.args_signature,
        )
        if verdict is OK:
            return result
        self.rt.events.emit("no_progress", tool=tool, count=verdict.count, action=verdict.action)
        if verdict.action != "stop":
            call.warned = True
            ends = ends_text(verdict.remaining, "identical verdict")
            return annotate(result, NOTE.format(tool=tool, count=verdict.count, ends=ends))
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
