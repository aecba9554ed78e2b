"""The retry loop of one governed call, on tenacity.

The first attempt runs outside tenacity (building a ``Retrying`` costs ~10 us, paid on
every success otherwise). Only after a failure does the call enter tenacity, which then
owns the loop: this module supplies its ``retry`` / ``wait`` / ``stop`` / ``before`` /
``before_sleep`` callbacks. The same :class:`CallAttempts` object drives both
``tenacity.Retrying`` and ``tenacity.AsyncRetrying``, so the sync and async governed calls
share one implementation of every decision.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, retry_if_exception

from loop_governor.breaker import Admission, BreakerState
from loop_governor.classify import ErrorInfo
from loop_governor.errors import ErrorType

if TYPE_CHECKING:
    from loop_governor.config import ResolvedPolicy
    from loop_governor.governor import Governor, TaskScope


def backoff_delay(retry_index: int, policy: ResolvedPolicy, rnd: float) -> float:
    """The seeds' backoff: ``min(cap, base * 2**n) * (0.5 + random() * jitter)``.

    With the default jitter 0.5 the factor spans [0.5, 1.0): callers that failed together
    spread out instead of hammering the service in lock-step.
    """
    return min(policy.max_delay, math.ldexp(policy.base_delay, retry_index)) * (0.5 + rnd * policy.jitter)


class RetryRefused(Exception):
    """Internal: a retry was refused just before it ran (never escapes the governor)."""


class CallAttempts:
    """Everything one governed call learns across its attempts."""

    __slots__ = ("admission", "attempts", "gov", "last_exc", "last_info", "policy", "scope", "stop_reason", "tool")

    def __init__(
        self, gov: Governor, tool: str, policy: ResolvedPolicy, scope: TaskScope | None, admission: Admission
    ) -> None:
        self.gov = gov
        self.tool = tool
        self.policy = policy
        self.scope = scope
        self.admission = admission
        self.attempts = 0
        self.last_exc: BaseException | None = None
        self.last_info: ErrorInfo | None = None
        self.stop_reason: str | None = None

    # -- tenacity callbacks --------------------------------------------------------------

    def _is_transient(self, exc: BaseException) -> bool:
        """``retry`` predicate: classify, record in the breaker, retry only transients."""
        self.attempts += 1
        self.last_exc = exc
        info = self.gov.classify_failure(exc, self.tool, self.policy)
        self.last_info = info
        # A permanent error is an answer: the service is up. Transient and fatal count
        # against the tool's breaker.
        self.gov.record_breaker(self.tool, info.error_type is ErrorType.PERMANENT, self.admission.probe, self.policy)
        self.admission = Admission(True, dirty=True)
        return info.error_type is ErrorType.TRANSIENT

    def _wait(self, state: RetryCallState) -> float:
        delay = backoff_delay(state.attempt_number - 1, self.policy, self.gov.random())
        retry_after = self.last_info.retry_after if self.last_info is not None else None
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _stop(self, state: RetryCallState) -> bool:
        if state.attempt_number >= self.policy.max_attempts:
            self.stop_reason = "attempts"
            return True
        info = self.last_info
        if info is not None and info.retry_after is not None and info.retry_after > self.policy.max_delay:
            # The service asked for a longer pause than we may wait: hand back now.
            self.stop_reason = "retry_after"
            return True
        store, scope = self.gov.store, self.scope
        if store.breaker_get(self.tool).state is BreakerState.OPEN:
            # Our own failure (or another caller's) just opened the breaker: don't sleep for nothing.
            self.stop_reason = "breaker"
            return True
        if scope is not None and store.budget_used(scope.task_id) >= self.gov.config.task_retry_budget:
            self.stop_reason = "budget"
            return True
        return False  # the budget is taken in _before, after the sleep, when the retry really runs

    def _before(self, state: RetryCallState) -> None:
        if state.attempt_number == 1:
            return  # the replayed first failure: already admitted
        gov, store, scope = self.gov, self.gov.store, self.scope
        if store.breaker_get(self.tool).state is not BreakerState.CLOSED:
            self._refuse("breaker")  # opened during our sleep: nothing taken
        if scope is not None and not store.budget_take(scope.task_id, gov.config.task_retry_budget):
            self._refuse("budget")  # another call of the task spent it during our sleep
        admission = gov.admit(self.tool, self.policy)
        if not admission.allowed:
            # A breaker that opened between the read above and now: the budget unit taken
            # is lost (a narrow race, and erring towards fewer retries).
            self._refuse("breaker")
        self.admission = admission

    def _refuse(self, reason: str) -> None:
        self.stop_reason = reason
        raise RetryRefused(reason)

    def _before_sleep(self, state: RetryCallState) -> None:
        info = self.last_info
        self.gov.emit(
            "retry",
            tool=self.tool,
            attempt=state.attempt_number,
            delay_s=state.upcoming_sleep,
            error_type=info.error_type.value if info else None,
            signature=info.signature if info else None,
        )

    def tenacity_kwargs(self) -> dict[str, Any]:
        return {
            "retry": retry_if_exception(self._is_transient),
            "wait": self._wait,
            "stop": self._stop,
            "before": self._before,
            "before_sleep": self._before_sleep,
            "reraise": True,
        }

    # -- attempt callables ---------------------------------------------------------------

    @staticmethod
    def replay(
        first: BaseException, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[], Any]:
        """A callable whose first call re-raises the already-caught failure.

        Handing tenacity the first failure this way lets it own every decision (the
        first failure included) without the success path ever entering tenacity.
        """
        pending = [first]

        def attempt() -> Any:
            if pending:
                raise pending.pop()
            return fn(*args, **kwargs)

        return attempt

    @staticmethod
    def areplay(
        first: BaseException, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[], Awaitable[Any]]:
        pending = [first]

        async def attempt() -> Any:
            if pending:
                raise pending.pop()
            return await fn(*args, **kwargs)

        return attempt
