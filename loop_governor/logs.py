"""The ``loop_governor`` logger: what the governor did, one line per decision.

The governor reports every decision as an event (:mod:`loop_governor.events`); this
module maps the ones an operator needs to see to standard ``logging`` records, so a
throttled or failing run is not silent:

* INFO -- each retry, each wait (an open breaker, a rate limit), each model fallback,
  each breaker transition, and the loop guards' warnings to the model;
* WARNING -- each stop (a :class:`~loop_governor.errors.FatalError` ending the run) and
  each refusal (a call not made: open breaker, rate limit, a known-bad call replayed).

Each line names the tool or endpoint, the reason and the wait; its text is redacted,
and the event itself rides along as ``record.lg_event``. The library installs no
handler (the standard rule for libraries): turn it on with
``logging.basicConfig(level=logging.INFO)`` or
``logging.getLogger("loop_governor").setLevel(logging.INFO)`` plus a handler.

Nothing is formatted unless the logger is enabled for the event's level:
:meth:`Events.emit` asks :func:`level_of` and ``Logger.isEnabledFor`` (cached by
``logging``) before it builds anything, so a disabled logger costs a dict lookup on the
failure paths and nothing on the success path, which emits none of these events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from loop_governor.redaction import redact

logger = logging.getLogger("loop_governor")

INFO, WARNING = logging.INFO, logging.WARNING


def _s(value: Any) -> str:
    return "-" if value is None else str(value)


def _secs(value: Any) -> str:
    try:
        return f"{float(value):.2f}s"
    except (TypeError, ValueError):
        return "?"


def _retry(e: Mapping[str, Any]) -> str:
    kind = " ".join(str(x) for x in (e.get("error_type"), e.get("status"), e.get("code")) if x is not None)
    return (
        f"retrying {_s(e.get('tool'))} in {_secs(e.get('delay_s'))} after attempt {_s(e.get('attempt'))} failed "
        f"({kind or '-'}: {_s(e.get('signature'))})"
    )


def _breaker_wait(e: Mapping[str, Any]) -> str:
    return f"waiting {_secs(e.get('delay_s'))} for {_s(e.get('tool'))}: its circuit breaker is {_s(e.get('state'))}"


def _rate_limited(e: Mapping[str, Any]) -> str:
    return f"waiting {_secs(e.get('delay_s'))} for {_s(e.get('tool'))}: over its shared rate limit"


def _fallback(e: Mapping[str, Any]) -> str:
    reason = e.get("reason") or e.get("error_type")
    return f"model {_s(e.get('from_model'))} is down ({_s(reason)}); falling back to {_s(e.get('model'))}"


def _breaker(e: Mapping[str, Any]) -> str:
    return f"circuit breaker of {_s(e.get('tool'))}: {_s(e.get('from_state'))} -> {_s(e.get('to_state'))}"


def _probe_abandoned(e: Mapping[str, Any]) -> str:
    return f"circuit breaker of {_s(e.get('tool'))}: half-open probe cancelled in flight, handed back"


def _guard(e: Mapping[str, Any]) -> str:
    what = {"no_progress": "same result", "cycle": "cycle", "loop_detected": "same error"}.get(str(e.get("event")))
    action = e.get("action") or "warn"
    count = e.get("count") or e.get("period") or e.get("remaining")
    return f"loop guard on {_s(e.get('tool'))}: {what or 'repeated call'} ({_s(count)}); {action}"


def _escalation(e: Mapping[str, Any]) -> str:
    action, subject = _s(e.get("action") or "warn"), _s(e.get("subject"))
    left = f"; {_s(e.get('remaining'))} more before the next step" if e.get("remaining") is not None else ""
    return f"escalation on {_s(e.get('tool'))} ({subject}): {action}{left}"


def _withdrawn(e: Mapping[str, Any]) -> str:
    return (
        f"withdrew {_s(e.get('tool'))} from the model for the rest of the task ({_s(e.get('code'))}): "
        f"{_s(e.get('reason'))}; calling it again ends the run"
    )


def _refused(e: Mapping[str, Any]) -> str:
    wait = e.get("retry_after")
    tail = f"; retry in {_secs(wait)}" if wait is not None else ""
    why = f"({_s(e.get('reason'))}): {_s(e.get('message'))}"
    return f"refused a call to {_s(e.get('tool'))} without making it {why}{tail}"


def _stopped(e: Mapping[str, Any]) -> str:
    task = e.get("task_id")
    where = f"task {task}: " if task is not None else ""
    return f"{where}loop-governor stopped the run: {_s(e.get('reason'))} [{_s(e.get('error_class'))}]"


def _store(e: Mapping[str, Any]) -> str:
    return f"store {_s(e.get('event'))}: {_s(e.get('error') or e.get('reason'))}"


def _checkpoint_failed(e: Mapping[str, Any]) -> str:
    return f"checkpoint of task {_s(e.get('task_id'))} not saved: {_s(e.get('error'))}"


# event kind -> (level, message). Only these events are logged.
MESSAGES: dict[str, tuple[int, Callable[[Mapping[str, Any]], str]]] = {
    "retry": (INFO, _retry),
    "breaker_wait": (INFO, _breaker_wait),
    "rate_limited": (INFO, _rate_limited),
    "model_fallback": (INFO, _fallback),
    "breaker": (INFO, _breaker),
    "breaker_probe_abandoned": (INFO, _probe_abandoned),
    "no_progress": (INFO, _guard),
    "cycle": (INFO, _guard),
    "loop_detected": (INFO, _guard),
    "escalation": (INFO, _escalation),
    "tool_withdrawn": (WARNING, _withdrawn),
    "store_fallback": (WARNING, _store),
    "store_recovered": (INFO, _store),
    "checkpoint_failed": (WARNING, _checkpoint_failed),
    "call_refused": (WARNING, _refused),
    "run_stopped": (WARNING, _stopped),
}

LEVELS: dict[str, int] = {kind: level for kind, (level, _) in MESSAGES.items()}


def level_of(event: str) -> int | None:
    """The level ``event`` is logged at, or None if the logger is off for it (or it is
    not a logged event): the caller then builds nothing."""
    level = LEVELS.get(event)
    if level is None or not logger.isEnabledFor(level):
        return None
    return level


def log_event(level: int, record: Mapping[str, Any]) -> None:
    """Log one event (the logger is known to be enabled for ``level``)."""
    try:
        text = redact(MESSAGES[str(record["event"])][1](record))
    except Exception:  # a malformed event must not break the agent: log it raw
        text = redact(f"{record.get('event')}: {dict(record)!r}")[:1000]
    event = {k: redact(v) if isinstance(v, str) else v for k, v in record.items()}
    logger.log(level, "%s", text, extra={"lg_event": event})
