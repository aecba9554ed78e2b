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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loop_governor.call import TOOL, Call, Policy
from loop_governor.fingerprint import Fingerprint, content_values, echoes, result_text, walks
from loop_governor.policies.fixes import fixed_since
from loop_governor.policies.ladder import OK, Verdict, annotate, withdraw, withdraw_at, withdraws_text

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

__all__ = [
    "NOTE",
    "NoProgress",
    "ProgressGuard",
    "result_text",
]

NOTE = (
    "[loop-governor] {tool} returned the same result {count} times in a row: its verdict has not "
    "changed. Do something different or give your final answer now; {ends}."
)


# An acknowledgement: a short positive answer that the action was done.
_ACK = re.compile(
    r"\b(?:success(?:ful(?:ly)?)?|succeeded|ok(?:ay)?|done|saved|sent|logged|recorded|noted|created|"
    r"updated|submitted|transferred|completed|accepted|scheduled|queued|posted|added|booked|confirmed)\b",
    re.I,
)
_NOT_ACK = re.compile(
    r"\b(?:not|no|fail\w*|error\w*|invalid|revise\w*|reject\w*|insufficient|again|unable|cannot|can't|"
    r"missing|wrong|incorrect|denied|refused|declined|still|off|needs?|should|must|lack\w*|unclear|weak|poor|"
    r"improve\w*|more|better|issues?|problems?|but|however|too|only|score\w*)\b|\d+\s*/\s*\d+|\?",
    re.I,
)
ACK_THRESHOLD = 12
ACK_CHARS = 80  # longer answers carry more than a confirmation


def is_ack(text: str) -> bool:
    """Whether a result only acknowledges that the action was done ("Transfer successful",
    "Text appended to report.", "Memory stored."): short, with nothing that judges or
    objects (a critic's verdict says "not", "revise", "needs", a score)."""
    text = text.strip()
    if not text or len(text) > ACK_CHARS or _NOT_ACK.search(text) is not None:
        return False
    return _ACK.search(text) is not None or len(text.split()) <= 6


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
    its score or timestamp aside: results are compared as [`Fingerprint`][loop_governor.fingerprint.Fingerprint] s
    (digits and ids normalized). Trivial results (an empty output, a bare exit code) never count:
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
        call: Call | None = None,
        decision: int | None = None,
        world: tuple[int, int] | None = None,
    ) -> Verdict:
        """Feed one successful tool result (the call that got it: its normalized arguments
        are read only when a result repeats; the model decision the call carries out; the
        task's world when it was made, and 1 if its own success moves the world on, else 0);
        returns what to do about it. The same answer again after something that may change
        state succeeded in between is a re-check after a fix, not a verdict repeating."""
        if result is None:
            return OK
        fp = result if isinstance(result, Fingerprint) else Fingerprint(result)
        by_tool = self._by_tool
        prev = by_tool.get(tool)
        if prev is not None and decision is not None and prev.decision == decision:
            return OK  # a parallel call of the same model turn: one decision, not a repeat
        seen = _Seen(fp, call, decision, world)
        relation = None if prev is None else seen.repeats(prev)
        if prev is None or relation is None or (relation != _WALKED and seen.fixed_since(prev)):
            # a new verdict (no streak; triviality doesn't matter yet), or the same question
            # (or a revision of it) again after something that may have fixed its cause: a
            # re-check after a fix, not a verdict repeating
            by_tool[tool] = seen
            return OK
        if is_trivial(fp.text, self.trivial_chars):
            # "0" again after "0": an exit code, not a verdict. pop, not del: parallel tool
            # calls of one task (LangGraph's threads) may both end the same streak.
            by_tool.pop(tool, None)
            return OK
        seen.streak = streak = prev.streak + 1
        # an acknowledgement of revised content ("Transfer successful", "Email sent") is the
        # action done again, not a verdict the model argues with: it counts only far later
        # (successful recorded runs repeated one up to 9 times in a row; real loops, 100)
        seen.acked = prev.acked or (relation == _REVISED and is_ack(fp.text))
        threshold = ACK_THRESHOLD if seen.acked else self.threshold
        by_tool[tool] = seen
        if streak < threshold:
            return OK
        limit = self.then if then is None else then
        over = streak - threshold  # repeats since the warning
        if over >= limit:
            return Verdict("stop", "no_progress", streak)
        return Verdict("warn" if over == 0 else "repeat", "no_progress", streak, limit - over)


class _Seen:
    """One tool's latest result, with what is needed to compare the next one to it."""

    __slots__ = ("acked", "call", "decision", "fp", "step", "streak", "world")

    def __init__(
        self, fp: Fingerprint, call: Call | None, decision: int | None, world: tuple[int, int] | None
    ) -> None:
        self.fp = fp
        self.call = call  # its normalized arguments and their text are computed once, when asked
        self.decision = decision
        self.world = world
        scope = call.scope if call is not None else None
        self.step: int | None = scope.tool_calls if scope is not None else None
        self.streak = 1
        self.acked = False  # the streak is one of acknowledgements of revised content

    def fixed_since(self, prev: _Seen) -> bool:
        """Whether something that may have fixed the cause succeeded between ``prev`` and this
        call ([`loop_governor.policies.fixes`][loop_governor.policies.fixes]); without the calls, whether the world
        moved on by something else than ``prev``'s own success."""
        call = self.call
        if call is not None and call.scope is not None and prev.step is not None:
            return fixed_since(call, prev.step)
        if self.world is None or prev.world is None:
            return False
        then, own = prev.world
        return self.world[0] - then > own

    def walked_from(self, prev: _Seen) -> bool:
        """Whether the arguments differ from ``prev``'s only in numbers that walk (a line
        range moves: ``sed -n '400,449p'`` then ``'450,499p'``)."""
        if self.call is None or prev.call is None:
            return False
        return walks(prev.call.args_text, self.call.args_text)

    def repeats(self, prev: _Seen) -> str | None:
        """How this result repeats ``prev``'s verdict: ``"same"`` (the same question, the same
        answer but for numbers, ids and timestamps), ``"revised"`` (a revision of the same
        question -- another draft for the same critic -- got the same verdict), ``"walked"``
        (a walk on to the next page got the very same answer), or None (no repeat).

        A different question is progress: calls about other entities (five cities' weather,
        ten order ids, alike but for the numbers) are five answers, whatever they say. A
        critic's score moves, its verdict does not: revisions are compared normalized.
        """
        fp, before = self.fp, prev.fp
        if fp.cheap != before.cheap and (fp.size > 4096 or abs(fp.size - before.size) > fp.slack):
            return None  # not the same shape: no normalization can make them equal (most calls)
        if self.call is None or prev.call is None:  # no question given: the answers alone
            return _SAME if self.call is None and prev.call is None and fp.same_as(before) else None
        mine, theirs = self.call.args_signature, prev.call.args_signature
        if mine == theirs:
            return _SAME if fp.text == before.text or fp.same_as(before) else None
        if mine[0] == theirs[0]:  # the same call but for a walking argument (page, offset, cursor)
            return _WALKED if fp.text == before.text else None
        if self.call.entity == prev.call.entity:
            if fp.text != before.text and fp.named != before.named:
                return None
            mine_c = content_values(self.call.args, self.call.kwargs)
            theirs_c = content_values(prev.call.args, prev.call.kwargs)
            return None if echoes(fp.text, before.text, mine_c, theirs_c) else _REVISED
        # other entities: no repeat, unless only numbers that walk moved (a line range through
        # a file) and the answer is the very same
        return _WALKED if fp.text == before.text and self.walked_from(prev) else None


_SAME, _REVISED, _WALKED = "same", "revised", "walked"


class NoProgress(Policy):
    """Feeds each successful tool result to the task's [`ProgressGuard`][loop_governor.policies.progress.ProgressGuard]:
    warns the model in the result, then withdraws the tool if the verdict still does not change
    (calling it anyway ends the run, [`loop_governor.policies.ladder`][loop_governor.policies.ladder])."""

    kinds = frozenset({TOOL})
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def after_success(self, call: Call, result: Any) -> Any:
        scope = call.scope
        assert scope is not None
        if call.same_decision or call.policy.poll or call.policy.wait:
            return result  # a retrying middleware re-ran the same tool call; a poll or a wait repeats by design
        tool = call.name
        guard = scope.progress
        if guard is None:  # the task's own guard, made at its first result
            config = self.rt.config
            guard = scope.progress = ProgressGuard(
                config.no_progress_threshold, config.trivial_result_chars, config.escalation_repeats
            )
        verdict = guard.observe(
            tool,
            call.fingerprint(result),
            withdraw_at(call.policy.escalation_repeats),
            call,
            scope.decision,
            (scope.world, 0 if call.policy.read_only else 1),
        )
        if verdict is OK:
            return result
        action = "withdraw" if verdict.action == "stop" else verdict.action
        self.rt.events.emit("no_progress", tool=tool, count=verdict.count, action=action)
        call.warned = True
        if verdict.action != "stop":
            ends = withdraws_text(verdict.remaining, tool, "identical verdict")
            return annotate(result, NOTE.format(tool=tool, count=verdict.count, ends=ends))
        note = withdraw(self.rt, call, "no_progress", f"it returned the same result {verdict.count} times in a row")
        return annotate(result, f"[loop-governor] {note}")
