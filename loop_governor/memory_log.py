"""The ``loop_governor`` logger's lines for governed memory ([`loop_governor.memory`][loop_governor.memory]).

Every record the wrappers drop, trim or lose to a failing backend is a WARNING naming its
key and the reason: a memory that silently forgets is worse than one that says so. The
guard calls [`log`][loop_governor.memory_log.log] beside emitting the event, so these lines do not depend on how
[`loop_governor.logs`][loop_governor.logs] renders the governor's other events; like those, the text is
redacted and the event rides along as ``record.lg_event``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from loop_governor.redaction import redact

logger = logging.getLogger("loop_governor")

_REASONS = {
    "governed_error": "it holds the governor's failure text of a tool call",
    "traceback": "it is nothing but a Python traceback",
}
_SHOWN_KEYS = 20  # a failed batch names this many keys, then how many more


def _where(e: Mapping[str, Any]) -> str:
    return f"record {e.get('key')!s} in {e.get('scope')!s}"


def _dropped(e: Mapping[str, Any]) -> str:
    reason = str(e.get("reason"))
    return f"{e.get('tool')!s}: dropped {_where(e)}: {_REASONS.get(reason, reason)} ({reason})"


def _trimmed(e: Mapping[str, Any]) -> str:
    return f"{e.get('tool')!s}: stored {_where(e)} shorter: {e.get('detail')!s}"


def _lost(e: Mapping[str, Any]) -> str:
    keys = [str(k) for k in e.get("keys") or []]
    shown = ", ".join(keys[:_SHOWN_KEYS]) + (f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else "")
    n = e.get("records")
    return (
        f"{e.get('tool')!s}: lost {n} record{'s' if n != 1 else ''} ({shown or 'no key'}): the backend failed "
        f"({e.get('error_type')!s}: {e.get('signature')!s}) after {e.get('attempts')!s} attempt(s)"
    )


# event kind -> its WARNING line. Only these memory events are logged.
LINES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "memory_dropped": _dropped,
    "memory_trimmed": _trimmed,
    "memory_save_failed": _lost,
}


def log(event: Mapping[str, Any]) -> None:
    """Log one memory event as a WARNING (nothing is formatted while the logger is off)."""
    render = LINES.get(str(event.get("event")))
    if render is None or not logger.isEnabledFor(logging.WARNING):
        return
    clean = {k: redact(v) if isinstance(v, str) else v for k, v in event.items()}
    logger.warning("%s", redact(render(event)), extra={"lg_event": clean})
