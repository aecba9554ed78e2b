"""The `loop_governor` logger: what the governor did, one line per decision.

The governor reports every decision as an event ([`loop_governor.events`][]); this
module renders the ones a person needs to follow a run as standard `logging` records,
in the order they happened:

* INFO: each retry, each wait (an open breaker, a rate limit, a throttle), each model
  fallback, each breaker transition, each tool offered to the model again, each failure
  the model is told about, and the loop guards' warnings;
* WARNING: each call whose retries ran out, each refusal (a call not made: an open
  breaker, a rate limit, a known-bad call answered from memory), each withdrawal of a
  tool from the model (and for how long), and each stop (a
  [`FatalError`][loop_governor.errors.FatalError] ending the run).

Each line starts with the task's name (`task "<name>": `, see
[`Governor.task`][loop_governor.governor.Governor.task]) and carries the tool's own
message, the text the model read, never the normalized signature that groups failures
alike. Every line is redacted; the event itself rides along as `record.lg_event`.

The library adds only a `logging.NullHandler` (the standard rule for libraries): without
logging configured, nothing is printed, not even by Python's last-resort handler. Turn it
on with `logging.basicConfig(level=logging.INFO)`, or give the `loop_governor` logger a
handler of its own (the README's snippet, which also stops propagation so a framework
that logs from the root logger does not print each line twice).

Nothing is formatted unless the logger is enabled for an event's level:
[`Events.emit`][loop_governor.events.Events.emit] asks [`level_of`][loop_governor.logs.level_of]
and `Logger.isEnabledFor` (cached by `logging`) before it builds anything, so a disabled
logger costs a dict lookup on the failure paths and nothing on the success path, which
emits none of these events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from loop_governor.reasons import StopReason
from loop_governor.redaction import redact

logger = logging.getLogger("loop_governor")
# Without it, Python's last-resort handler prints WARNINGs to stderr in a program that
# configured no logging at all: a library must stay silent until the application asks.
logger.addHandler(logging.NullHandler())

INFO, WARNING = logging.INFO, logging.WARNING

Line = tuple[int, str]
"""A rendered record: its level and its text."""


def _s(value: Any) -> str:
    return "-" if value is None else str(value)


def _secs(value: Any) -> str:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return "?"
    return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.0f}s"


def _kind(e: Mapping[str, Any], status: str = "status", code: str = "code") -> str:
    """``transient, HTTP 503, code overloaded``: the classification, in words."""
    parts = [str(e["error_type"])] if e.get("error_type") else []
    if e.get(status) is not None:
        parts.append(f"HTTP {e[status]}")
    if e.get(code):
        parts.append(f"code {e[code]}")
    return ", ".join(parts) or "error"


def _said(e: Mapping[str, Any]) -> str:
    """The tool's own message, as the model read it."""
    return str(e.get("message") or "no message")


def _told(e: Mapping[str, Any]) -> str:
    advice = e.get("advice")
    return f"; the model was told: {advice}" if advice else ""


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _retry(e: Mapping[str, Any]) -> Line:
    tool, wait = _s(e.get("tool")), _secs(e.get("delay_s"))
    if e.get("throttle"):
        return INFO, f"{tool} is throttled ({_kind(e)}): {_said(e)}; waiting {wait} for its turn"
    attempt, most = e.get("attempt"), e.get("max_attempts")
    of = f" of {most}" if most is not None else ""
    nxt = attempt + 1 if isinstance(attempt, int) else "?"
    return INFO, f"{tool} failed ({_kind(e)}): {_said(e)}; retrying in {wait} (attempt {nxt}{of})"


# why a failed call's retries ended (``Call.stop_reason``), for the line saying so
_GAVE_UP: dict[str, str] = {
    StopReason.ATTEMPTS: "retries exhausted after {n}",
    StopReason.RETRY_AFTER: "gave up after {n}: the service asked for a longer wait than the retries may take",
    StopReason.WAIT: "gave up after {n}: waiting on would pass the call's wait limit",
    StopReason.BREAKER: "gave up after {n}: its circuit breaker opened",
    StopReason.BUDGET: "gave up after {n}: the task's retry budget is spent",
    StopReason.COMPACTION: "gave up after {n}: the prompt cannot be cut any shorter",
}

# a refusal's reason -> what the governor did instead of calling
_REFUSED = {
    "known_bad": "answered a call to {tool} from memory without making it (the identical call failed before)",
    "circuit_open": "refused a call to {tool} without making it (circuit breaker open)",
    "rate_limited": "refused a call to {tool} without making it (over its rate limit)",
}


# why a call was refused before any attempt, by its stop reason (the flagged refusals above aside)
_NOT_MADE: dict[str, str] = {
    StopReason.POLL_BOUND: "its polled job reached its bound",
    StopReason.BUDGET: "the task's retry budget is spent",
}


def _refusal(tool: str, reason: Any, e: Mapping[str, Any]) -> Line:
    what = _REFUSED.get(str(reason), "refused a call to {tool} without making it ({reason})")
    wait = e.get("retry_after")
    tail = f"; retry in {_secs(wait)}" if wait is not None and reason != "known_bad" else ""
    return WARNING, f"{what.format(tool=tool, reason=reason)}: {_said(e)}{tail}{_told(e)}"


def _tool_failed(e: Mapping[str, Any]) -> Line | None:
    if e.get("status") != "error" or e.get("replayed") or e.get("error_type") == "fatal":
        return None  # a success; a framework replaying an outcome; a stop (its own line)
    tool = _s(e.get("tool"))
    flag = next((f for f in ("known_bad", "circuit_open", "rate_limited") if e.get(f)), None)
    if flag is not None:
        # refused: the call_refused event says so, unless a framework hook refused it
        return _refusal(tool, flag, e) if e.get("blocked_by_hook") else None
    if e.get("attempts") == 0:  # refused before any attempt (a poll's bound, a budget)
        why = _NOT_MADE.get(str(e.get("stop_reason")), str(e.get("stop_reason") or "refused"))
        return WARNING, f"refused a call to {tool} without making it ({why}): {_said(e)}{_told(e)}"
    kind = _kind(e, "http_status", "error_code")
    attempts = e.get("attempts") or 1
    gave_up = _GAVE_UP.get(str(e.get("stop_reason")))
    if e.get("error_type") == "transient" and gave_up is not None:
        how = gave_up.format(n=_plural(attempts, "attempt"))
        return WARNING, f"{tool} failed ({kind}): {_said(e)}; {how}{_told(e)}"
    return INFO, f"{tool} failed ({kind}): {_said(e)}{_told(e)}"


def _model_failed(e: Mapping[str, Any]) -> Line | None:
    if e.get("status") != "error" or e.get("error_type") == "fatal":
        return None  # a stop has its own line
    model = _s(e.get("model") or e.get("endpoint"))
    kind = _kind(e, "http_status", "error_code")
    gave_up = _GAVE_UP.get(str(e.get("stop_reason")))
    how = f"; {gave_up.format(n=_plural(e.get('attempts') or 1, 'attempt'))}" if gave_up else ""
    return WARNING, f"model {model} failed ({kind}): {_said(e)}{how}"


def _breaker_wait(e: Mapping[str, Any]) -> Line:
    return (
        INFO,
        f"waiting {_secs(e.get('delay_s'))} for {_s(e.get('tool'))}: its circuit breaker is {_s(e.get('state'))}",
    )


def _rate_limited(e: Mapping[str, Any]) -> Line:
    return INFO, f"waiting {_secs(e.get('delay_s'))} for {_s(e.get('tool'))}: over its shared rate limit"


def _fallback(e: Mapping[str, Any]) -> Line:
    reason = e.get("reason") or e.get("error_type")
    return INFO, f"model {_s(e.get('from_model'))} is down ({_s(reason)}); falling back to {_s(e.get('model'))}"


def _breaker(e: Mapping[str, Any]) -> Line:
    tool, to = _s(e.get("tool")), e.get("to_state")
    text = f"circuit breaker of {tool}: {_s(e.get('from_state'))} -> {_s(to)}"
    if to == "open":
        cooldown = e.get("cooldown_s")
        text += f" for {_secs(cooldown)}" if cooldown is not None else ""
        text += f" after: {e['message']}" if e.get("message") else ""
    return INFO, text


def _probe_abandoned(e: Mapping[str, Any]) -> Line:
    return INFO, f"circuit breaker of {_s(e.get('tool'))}: half-open probe cancelled in flight, handed back"


def _guard(e: Mapping[str, Any]) -> Line | None:
    if e.get("action") not in (None, "warn") or e.get("failed"):
        return None  # a withdrawal or a stop follows, or the failure's line says what the model read
    tool = _s(e.get("tool"))
    if e.get("event") == "cycle":
        period = e.get("period")
        what = (
            "the same call keeps giving the same result" if period == 1 else f"its calls repeat in a cycle of {period}"
        )
    else:
        what = f"it returned the same result {_plural(e.get('count'), 'time')}"
    return INFO, f"{tool}: {what}; the model was told that repeating it withdraws {tool}"


def _poll_near(e: Mapping[str, Any]) -> Line:
    return (
        INFO,
        f"{_s(e.get('tool'))}: the job was polled {_s(e.get('calls'))} times over {_secs(e.get('elapsed_s'))}; "
        "the model was told it nears its bound",
    )


def _withdrawn(e: Mapping[str, Any]) -> Line:
    tool, for_s = _s(e.get("tool")), e.get("for_s")
    why = f"{_s(e.get('code'))}: {_s(e.get('reason'))}"
    said = f"; its last error: {e['message']}" if e.get("message") else ""
    if for_s is None:
        return (
            WARNING,
            f"withdrew {tool} from the model for the rest of the task ({why}){said}; calling it again ends the run",
        )
    return (
        WARNING,
        f"withdrew {tool} from the model for {_secs(max(1.0, float(for_s)))} ({why}){said}; "
        "it is offered again after that, and calling it before then ends the run",
    )


def _restored(e: Mapping[str, Any]) -> Line:
    return INFO, f"offering {_s(e.get('tool'))} to the model again: its withdrawal ({_s(e.get('code'))}) is over"


def _refused(e: Mapping[str, Any]) -> Line:
    return _refusal(_s(e.get("tool")), e.get("reason"), e)


def _stopped(e: Mapping[str, Any]) -> Line:
    code = f", {e['code']}" if e.get("code") else ""
    return WARNING, f"loop-governor stopped the run: {_s(e.get('reason'))} [{_s(e.get('error_class'))}{code}]"


def _store(e: Mapping[str, Any]) -> Line:
    level = INFO if e.get("event") == "store_recovered" else WARNING
    return level, f"store {_s(e.get('event'))}: {_s(e.get('error') or e.get('reason'))}"


def _checkpoint_failed(e: Mapping[str, Any]) -> Line:
    return WARNING, f"checkpoint of task {_s(e.get('task_id'))} not saved: {_s(e.get('error'))}"


Render = Callable[[Mapping[str, Any]], Line | None]

# event kind -> (the highest level it may log at, its renderer: a line, or None for an
# event of that kind that needs none). Only these events are logged.
MESSAGES: dict[str, tuple[int, Render]] = {
    "retry": (INFO, _retry),
    "tool_call": (WARNING, _tool_failed),
    "model_call": (WARNING, _model_failed),
    "breaker_wait": (INFO, _breaker_wait),
    "rate_limited": (INFO, _rate_limited),
    "model_fallback": (INFO, _fallback),
    "breaker": (INFO, _breaker),
    "breaker_probe_abandoned": (INFO, _probe_abandoned),
    "no_progress": (INFO, _guard),
    "cycle": (INFO, _guard),
    "poll_near_bound": (INFO, _poll_near),
    "tool_withdrawn": (WARNING, _withdrawn),
    "tool_restored": (INFO, _restored),
    "store_fallback": (WARNING, _store),
    "store_recovered": (INFO, _store),
    "checkpoint_failed": (WARNING, _checkpoint_failed),
    "call_refused": (WARNING, _refused),
    "run_stopped": (WARNING, _stopped),
}

LEVELS: dict[str, int] = {kind: level for kind, (level, _) in MESSAGES.items()}


def level_of(event: str) -> int | None:
    """The highest level `event` may be logged at, or None if the logger is off for it
    (or it is not a logged event): the caller then builds nothing."""
    level = LEVELS.get(event)
    if level is None or not logger.isEnabledFor(level):
        return None
    return level


def log_event(level: int, record: Mapping[str, Any], task: str | None = None) -> None:
    """Log one event (the logger is known to be enabled for `level`), prefixed with the
    name of the `task` it belongs to."""
    try:
        line = MESSAGES[str(record["event"])][1](record)
    except Exception:  # a malformed event must not break the agent: log it raw
        line = (level, f"{record.get('event')}: {dict(record)!r}"[:1000])
    if line is None or not logger.isEnabledFor(line[0]):
        return
    where = f'task "{task}": ' if task else ""
    event = {k: redact(v) if isinstance(v, str) else v for k, v in record.items()}
    logger.log(line[0], "%s", redact(where + line[1]), extra={"lg_event": event})
