"""``context_length_exceeded``: one retry after an emergency compaction, else permanent.

A prompt over the model's window fails the same way every time: retrying it as is
wastes a request, and giving up ends a run that a shorter prompt would finish. When the
caller supplies a way to shrink the prompt (the adapters pass the task's pruner or
summarizer), the call is retried once on the compacted prompt -- without backoff and
outside the retry budget: it is a different request, not a repeat. Without one, or when
the compacted prompt fails again, the error stands as the permanent failure it is.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loop_governor.call import MODEL, AttemptPolicy, Call
from loop_governor.classify import ErrorInfo
from loop_governor.errors import GovernedError

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
# How providers word it when no code says so (Anthropic: "prompt is too long: N tokens >
# M maximum"; Google and most OpenAI-compatible servers: "context length"/"window").
_OVERFLOW = re.compile(
    r"context[ _-]length|context window|maximum context|prompt is too long|too many (input )?tokens", re.I
)


def is_context_overflow(info: ErrorInfo | GovernedError) -> bool:
    """Whether a failure says the prompt does not fit the model's context window."""
    if info.code == CONTEXT_LENGTH_EXCEEDED:
        return True
    return info.error_type.value == "permanent" and bool(_OVERFLOW.search(info.message or ""))


class Compaction(AttemptPolicy):
    """Asks the next attempt to compact the prompt first (see the module docstring)."""

    kinds = frozenset({MODEL})
    __slots__ = ()

    def __init__(self, rt: Runtime | None = None) -> None:
        """Keeps nothing of the runtime: what to compact is the call's."""

    def after_attempt_failure(self, call: Call) -> None:
        info, options = call.info, call.model
        if info is None or options is None or options.compact is None or call.compacted:
            return
        if is_context_overflow(info):
            call.pending = "compact"
