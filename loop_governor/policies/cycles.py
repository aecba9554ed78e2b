"""Cycles: periodic repetition of (tool, arguments, result), period 1 to 4, across the task.

A model that ignores the governor's text does not always repeat one call: it
ping-pongs between two tools whose results never change (A-B-A-B), walks a three-step
routine again and again (A-B-C-A-B-C), or pages through a collection whose every page
comes back the same (even empty). Each step is a token -- the tool, its normalized
arguments (walking ones such as ``page`` masked) and its normalized result (or the
error signature of a failure) -- and a cycle is the last block of ``p`` tokens repeating
the one before it: three identical steps for ``p = 1``, two full blocks for ``p >= 2``.
Results must repeat too, so a loop that makes progress (new results) is never a cycle.

The model is warned once, in the result it reads; ``escalation_repeats`` more steps of
the same cycle withdraw the tool ([`loop_governor.policies.ladder`][loop_governor.policies.ladder]: calling it anyway
ends the run with [`NoProgressError`][loop_governor.errors.NoProgressError]). A poll (``ToolPolicy(poll=True)``)
repeats by design: its steps never match. Parallel calls of one model turn are one
decision: a call repeating another of the same turn is not a step.
The check is O(1) a call: one running match count per period.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy
from loop_governor.errors import AgentToolError, FatalError
from loop_governor.fingerprint import Fingerprint, walks
from loop_governor.policies.ladder import OK, Verdict, annotate, withdraw, withdraw_at, withdraws_text

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

PERIODS = (1, 2, 3, 4)
_HISTORY = 2 * PERIODS[-1]
NOTE = (
    "[loop-governor] your recent tool calls repeat earlier ones ({cycle}) with the same results: this is a "
    "loop and it is not making progress. Do something different or give your final answer; {ends}."
)


def _cycle(period: int) -> str:
    return "the same call again" if period == 1 else f"a cycle of {period} calls"


class CycleTracker:
    """Per-task: the last steps and, per period, how many steps in a row matched."""

    __slots__ = ("_decision", "_first", "_history", "_period", "_runs", "_since", "_turn")

    def __init__(self) -> None:
        self._history: list[tuple[str, Fingerprint, Call]] = []
        self._runs = [0] * (PERIODS[-1] + 1)
        self._period = 0  # the cycle the model was warned about (0: none)
        self._since = 0  # its steps since the warning
        self._decision: int | None = None  # the model decision of the last step
        self._first: Call | None = None  # that decision's first call
        self._turn: set[tuple[str, int]] = set()  # (tool, arguments) of its calls, from its second call on

    def parallel_repeat(self, call: Call, decision: int | None) -> bool:
        """Whether ``call`` repeats a call of the same model decision (parallel calls of one
        turn are one decision, not a cycle). Arguments are normalized only for the second
        and later calls of a decision."""
        if decision is None or decision != self._decision:
            self._decision, self._first = decision, call
            if self._turn:  # (a new empty set only when the last decision had several calls)
                self._turn = set()
            return False
        turn, first = self._turn, self._first
        if first is not None:
            turn.add((first.name, first.args_signature[0]))
            self._first = None
        key = (call.name, call.args_signature[0])
        if key in turn:
            return True
        turn.add(key)
        return False

    def push_unique(self, call: Call) -> None:
        """A step that repeats nothing (a declared poll): every running match ends."""
        self._history.append((call.name, _UNIQUE, call))
        if len(self._history) > _HISTORY:
            del self._history[0]
        self.reset()

    def tools_of(self, period: int) -> set[str]:
        """The tools of the last ``period`` steps (the cycle's)."""
        return {tool for tool, _, _ in self._history[-period:]}

    def reset(self) -> None:
        """Start over (after a withdrawal: the next cycle is a new one)."""
        self._runs = [0] * (PERIODS[-1] + 1)
        self._period = self._since = 0

    def push(self, call: Call, result: Fingerprint) -> Verdict:
        """Add ``call``'s step; the verdict on it (``escalation_repeats`` of the call's tool
        decide how many steps after the warning withdraw it)."""
        history, runs, tool = self._history, self._runs, call.name
        n = len(history)
        period = 0
        for p in PERIODS:
            if n >= p and _same_step(history[-p], tool, result, call):
                runs[p] += 1
                if not period and runs[p] >= (2 if p == 1 else p):
                    period = p  # the shortest period that repeats
            else:
                runs[p] = 0
        history.append((tool, result, call))
        if n >= _HISTORY:
            del history[0]
        if not period:
            self._period = self._since = 0
            return OK
        then = withdraw_at(call.policy.escalation_repeats)
        if not self._period:
            self._period, self._since = period, 0
            return Verdict("warn", "cycle", period, then)
        self._since += 1
        if self._since >= then:
            return Verdict("stop", "cycle", self._period)
        return Verdict("repeat", "cycle", self._period, then - self._since)


_FULL_LIMIT = 1024  # longer results are compared in their cheap form only (cost per call)


_UNIQUE = Fingerprint("\x00a step that matches nothing\x00")


def _same_step(step: tuple[str, Fingerprint, Call], tool: str, result: Fingerprint, call: Call) -> bool:
    """Whether ``call`` (its ``result``) repeats an earlier step. Results first: they
    differ for most steps, and comparing them is cheaper than normalizing arguments."""
    t, r, c = step
    if t != tool or r is _UNIQUE:
        return False
    if result.cheap != r.cheap:
        # the same call answered alike but for ids or quoted values? Only short answers
        # (verdicts, statuses) are normalized in full; long ones differ, as they are
        size = result.size
        if size > _FULL_LIMIT or abs(size - r.size) > result.slack:
            return False  # (the size test is same_as's own, made before normalizing arguments)
        if call.args_signature != c.args_signature:
            return False
        return result.same_as(r)
    mine, theirs = call.args_signature, c.args_signature
    if mine[0] == theirs[0]:
        # the same call (or one that only walked on to another page: no progress if it got
        # the very same answer; normalized, "order 12" and "order 14" would look alike)
        return mine[1] == theirs[1] or result.text == r.text
    # other arguments: still no progress if only numbers that walk moved (a line range
    # through a file, ``sed -n '400,449p'`` then ``'450,499p'``) and the answer is the
    # very same; other numbers name other things (``file2.py``, item 17): a batch
    if result.text != r.text or call.args_shape != c.args_shape:
        return False
    return walks(c.args_text, call.args_text)


class Cycles(Policy):
    """Feeds every tool call's outcome to the task's [`CycleTracker`][loop_governor.policies.cycles.CycleTracker]."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    @classmethod
    def applies(cls, rt: Runtime) -> bool:
        return rt.config.cycle_detection

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def _verdict(self, call: Call, result: Fingerprint | None) -> Verdict:
        """The cycle verdict on this step (``result`` None: a step that matches nothing)."""
        scope = call.scope
        assert scope is not None
        tracker: CycleTracker | None = scope.cycles
        if tracker is None:
            tracker = scope.cycles = CycleTracker()
        if tracker.parallel_repeat(call, scope.decision):
            return OK
        if result is None or call.policy.poll or call.policy.wait:
            tracker.push_unique(call)  # a poll repeats by design: a step that matches nothing
            return OK
        return tracker.push(call, result)

    def after_success(self, call: Call, result: Any) -> Any:
        if call.same_decision:
            return result
        fp = call.fingerprint(result)
        if fp is None and not (call.policy.poll or call.policy.wait):
            return result
        verdict = self._verdict(call, fp)
        if verdict is OK:
            return result
        self._report(call, verdict)
        if verdict.action == "stop":
            if call.name in call.scope.withdrawn:  # type: ignore[union-attr]  # (the scope is set: _verdict)
                return result  # withdrawn already (no progress, for this very call)
            return annotate(result, f"[loop-governor] {self._withdraw(call, verdict)}")
        if call.warned:
            return result  # the no-progress note already said it
        return annotate(result, NOTE.format(cycle=_cycle(verdict.count), ends=_ends(call, verdict)))

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        if isinstance(error, FatalError) or call.same_decision:
            return error
        verdict = self._verdict(call, Fingerprint(f"\x00error\x00{error.info.signature}"))
        if verdict is OK:
            return error
        self._report(call, verdict, failed=True)
        info = error.info
        if verdict.action == "stop":
            if call.name in call.scope.withdrawn:  # type: ignore[union-attr]  # (the scope is set: _verdict)
                return error  # withdrawn already (by escalation, for this very call)
            note = self._withdraw(call, verdict)
            return type(error)(info.model_copy(update={"advice": note, "retryable": False}))
        if call.warned:
            return error
        advice = f"{info.advice or ''} This call is part of a loop; {_ends(call, verdict)}.".strip()
        return type(error)(info.model_copy(update={"advice": advice}))

    def _report(self, call: Call, verdict: Verdict, failed: bool = False) -> None:
        action = "withdraw" if verdict.action == "stop" else verdict.action
        self.rt.events.emit("cycle", tool=call.name, period=verdict.count, action=action, failed=failed)

    def _withdraw(self, call: Call, verdict: Verdict) -> str:
        call.warned = True
        scope = call.scope
        assert scope is not None and scope.cycles is not None
        tools = scope.cycles.tools_of(verdict.count)
        scope.cycles.reset()
        why = f"the calls kept repeating {_cycle(verdict.count)} with the same results after being told"
        return withdraw(self.rt, call, "cycle", why, tools)


def _ends(call: Call, verdict: Verdict) -> str:
    return withdraws_text(verdict.remaining, call.name)
