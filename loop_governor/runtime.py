"""What every policy of a governed call may use: config, store, clock, sleep, events.

The [`Governor`][loop_governor.governor.Governor] builds one [`Runtime`][loop_governor.runtime.Runtime] and hands it to
each policy, so a policy never reaches back into the facade (no import circle) and tests
can build a policy with nothing but a runtime.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from loop_governor.classify import ErrorInfo, Rule, classify
from loop_governor.config import GovernorConfig, ResolvedPolicy
from loop_governor.errors import AgentToolError, ErrorType
from loop_governor.events import Events
from loop_governor.stores import Store

if TYPE_CHECKING:
    from loop_governor.checkpoint import CheckpointStore


class Runtime:
    """The shared services of one governor. Attributes are read on the hot path: plain slots."""

    __slots__ = (
        "_policy_lock",
        "asleep",
        "checkpoint_failures",
        "checkpoints",
        "clock",
        "config",
        "events",
        "limited",
        "models",
        "random",
        "rules",
        "sleep",
        "store",
        "tools",
        "tools_limited",
    )

    def __init__(
        self,
        config: GovernorConfig,
        store: Store,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        asleep: Callable[[float], Awaitable[None]],
        random: Callable[[], float],
        rules: tuple[Rule, ...],
        checkpoints: CheckpointStore | None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.asleep = asleep
        self.random = random
        self.rules = rules
        self.checkpoints = checkpoints
        self.checkpoint_failures = 0
        self.events = Events(clock)
        # Whether any budget a tool call is checked against is set: without one, counting a
        # tool call is all a budget does (the model-call ceiling is checked on model calls).
        self.tools_limited = any(
            limit is not None
            for limit in (
                config.max_steps,
                config.max_tool_calls,
                config.max_tokens,
                config.max_cost,
                config.max_wall_s,
            )
        ) or any((p.max_calls is not None or p.max_wall_s is not None) and not p.poll for p in config.tools.values())
        self.limited = self.tools_limited or config.max_model_calls is not None
        # resolved settings per tool and per model endpoint (read on every call)
        self.tools: dict[str, ResolvedPolicy] = {}
        self.models: dict[str, ResolvedPolicy] = {}
        self._policy_lock = threading.Lock()

    def policy(self, kind: str, name: str) -> ResolvedPolicy:
        """The effective settings of a tool or model endpoint, resolved once and cached."""
        cache = self.models if kind == "model" else self.tools
        pol = cache.get(name)
        if pol is None:
            resolve = self.config.model_policy_for if kind == "model" else self.config.policy_for
            with self._policy_lock:
                pol = cache.setdefault(name, resolve(name))
        return pol

    def classify(self, exc: BaseException, name: str, policy: ResolvedPolicy) -> ErrorInfo:
        """Classify one attempt's own failure; a governed error keeps the governor's verdict."""
        if isinstance(exc, AgentToolError):
            i = exc.info
            return ErrorInfo(
                i.error_type,
                i.retryable,
                i.status,
                i.code,
                i.signature,
                i.retry_after,
                i.message,
                type(exc).__name__,
                "governed",
            )
        info = classify(exc, name, rules=self.rules, unknown=policy.unknown_error)
        if policy.model and info.evidence == "session":
            # a model provider's "not authenticated" (FastAPI's default 401 body, behind many
            # OpenAI-compatible proxies) is its key: the agent cannot log in to renew it
            return dataclasses.replace(info, error_type=ErrorType.FATAL, retryable=False)
        return info
