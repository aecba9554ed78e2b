"""Emergency compaction: a prompt the model refused as too long, made to fit.

When a provider answers ``context_length_exceeded`` the cached prefix is lost anyway, so
the cache-aware batching of [`ContextPruner`][loop_governor.context.pruner.ContextPruner] has nothing to
protect: a one-off pruner with the tightest settings stubs every old tool result and
tool-call argument, trims old prose and huge fresh results, and keeps the system
prompt, the first user message, pinned messages and every tool-call/result pair intact.
The governed model call retries once on the result (see
[`loop_governor.policies.compaction`][loop_governor.policies.compaction]).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .pruner import ContextPruner
from .tokens import TokenCounter, approx_tokens


def emergency_compact(
    messages: Sequence[Any], *, keep_last: int = 1, token_counter: TokenCounter | None = None
) -> list[Any] | None:
    """The messages pruned as hard as is safe, or None when that saves nothing."""
    count = token_counter or approx_tokens
    pruner = ContextPruner(
        keep_last=keep_last,
        batch_tokens=0,
        stub_min_chars=0,
        prose_threshold=300,
        trim_threshold=2000,
        trim_head=600,
        trim_tail=600,
        max_verbatim_chars=20_000,
        token_counter=count,
    )
    compacted = pruner.prune(messages)
    before = sum(count(m) for m in messages)
    after = sum(count(m) for m in compacted)
    return compacted if after < before else None
