"""The retry loop of one governed call, on tenacity.

The first attempt runs outside tenacity (building a ``Retrying`` costs ~10 us, paid on
every success otherwise). Only after a failure does the call enter tenacity, which then
owns the loop: [`RetryLoop`][loop_governor.retry.RetryLoop] supplies its ``retry`` / ``wait`` / ``stop`` /
``before_sleep`` callbacks. The same object drives ``tenacity.Retrying`` and
``tenacity.AsyncRetrying``, so the sync and async governed calls share every decision.

Each attempt's failure is classified on its own: the loop runs outside the ``except``
block that caught the first failure, so a later attempt's exception does not carry an
earlier one as its implicit ``__context__`` (a 404 on the second attempt of a 503 is a
404). Cancellation and interpreter exits (``CancelledError``, ``KeyboardInterrupt``,
``SystemExit``, ``GeneratorExit``) are never classified, never retried, never counted
against a breaker: the predicate refuses them and tenacity re-raises them at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, retry_if_exception

from loop_governor.call import Call, Refused, StopReason
from loop_governor.errors import ErrorType

if TYPE_CHECKING:
    from loop_governor.config import ResolvedPolicy
    from loop_governor.runtime import Runtime


def backoff_delay(retry_index: int, policy: ResolvedPolicy, rnd: float) -> float:
    """The seeds' backoff: ``min(cap, base * 2**n) * (0.5 + random() * jitter)``.

    With the default jitter 0.5 the factor spans [0.5, 1.0): callers that failed together
    spread out instead of hammering the service in lock-step.
    """
    return min(policy.max_delay, math.ldexp(policy.base_delay, retry_index)) * (0.5 + rnd * policy.jitter)


# A throttle waited out waits at least _TURN_BASE_S * 2**k (k: the throttles this call
# has waited out so far), at most _TURN_CAP_S, whatever the backoff settings: with
# retry_base_delay=0 a provider answering "try again in 6ms" (OpenAI's TPM text) or
# "Retry-After: 0" again and again would otherwise be sent thousands of requests within
# one call's wait. Below the default backoff (0.8 s * 2**n, jittered down to half, capped
# at 8 s) at every step, so the defaults and their jitter are unchanged.
_TURN_BASE_S = 0.1
_TURN_CAP_S = 2.0


def turn_floor(throttles: int) -> float:
    """The least a call waits before its next turn after ``throttles`` throttles waited out."""
    return min(_TURN_CAP_S, math.ldexp(_TURN_BASE_S, min(throttles, 32)))


class RetryLoop:
    """tenacity's callbacks for one governed call (see the module docstring).

    A throttle (HTTP 429, a provider's rate-limit code:
    [`ErrorInfo.throttled`][loop_governor.classify.ErrorInfo.throttled]) on a call that may wait
    ([`Call.may_wait`][loop_governor.call.Call.may_wait]: ``max_wait``, model calls by default, once no fallback is
    left) is a turn to wait for, not a failed attempt: it does not count against ``max_attempts``, and its Retry-After
    is honoured up to what is left of ``max_wait`` rather than ``retry_max_delay``. Five
    agents on one API key then take turns instead of spending their attempts together.
    """

    __slots__ = ("_counted", "_planned", "after_failure", "call", "rt")

    def __init__(self, rt: Runtime, call: Call, after_failure: tuple[Callable[[Call], None], ...]) -> None:
        self.rt = rt
        self.call = call
        self.after_failure = after_failure
        self._planned: tuple[int, float] = (0, 0.0)
        self._counted = 0  # the last attempt number whose throttle was judged

    def _retry(self, exc: BaseException) -> bool:
        """``retry`` predicate: classify this attempt's failure, let the attempt policies
        record it (breaker, budget, compaction), retry transients (and a compaction)."""
        if not isinstance(exc, Exception) or isinstance(exc, Refused):
            return False  # cancellation, exits and refusals end the loop as they are
        call = self.call
        call.exc = exc
        call.info = info = self.rt.classify(exc, call.name, call.policy)
        for moment in self.after_failure:
            moment(call)
        return info.error_type is ErrorType.TRANSIENT or call.pending is not None

    def _delay(self, state: RetryCallState) -> float:
        """The pause before the next attempt, drawn once per attempt: tenacity asks
        ``wait`` and ``stop`` in either order, depending on its version."""
        number, delay = self._planned
        if number == state.attempt_number:
            return delay
        call = self.call
        if call.pending is not None:
            delay = 0.0  # a compacted prompt is a new request: no backoff
        else:
            delay = backoff_delay(state.attempt_number - 1, call.policy, self.rt.random())
            retry_after = call.info.retry_after if call.info is not None else None
            if retry_after is not None:
                delay = max(delay, retry_after)
            if call.waits_out_throttle:
                delay = max(delay, turn_floor(call.throttles))
        self._planned = (state.attempt_number, delay)
        return delay

    def _wait(self, state: RetryCallState) -> float:
        return self._delay(state)

    def _stop(self, state: RetryCallState) -> bool:
        call = self.call
        if call.pending is not None:
            return False  # one retry with the compacted prompt, whatever the attempt count
        policy, info = call.policy, call.info
        if call.waits_out_throttle and self._counted < state.attempt_number:
            self._delay(state)  # planned on this throttle count (the floor grows with it)
            self._counted = state.attempt_number  # once per attempt, whichever asks first
            call.throttles += 1  # a turn waited for is not an attempt
        if call.attempt - int(call.compacted) - call.throttles >= policy.max_attempts:
            call.stop_reason = StopReason.ATTEMPTS
            return True
        if call.waits_out_throttle:
            if self._delay(state) > call.wait_left:
                # Waiting out this throttle would pass the call's wait limit: hand back now.
                asked = info.retry_after if info is not None else None
                longer = asked is not None and asked > call.wait_left
                call.stop_reason = StopReason.RETRY_AFTER if longer else StopReason.WAIT
                return True
        elif info is not None and info.retry_after is not None and info.retry_after > policy.max_delay:
            # The service asked for a longer pause than we may wait: hand back now.
            call.stop_reason = StopReason.RETRY_AFTER
            return True
        if call.veto is not None:
            call.stop_reason = call.veto
            return True
        return False

    def _before_sleep(self, state: RetryCallState) -> None:
        call, info = self.call, self.call.info
        delay = state.upcoming_sleep  # counted against the wait limit as it is slept (Chain._sleep)
        self.rt.events.emit(
            "retry",
            tool=call.name,
            attempt=state.attempt_number,
            delay_s=delay,
            error_type=info.error_type.value if info else None,
            signature=info.signature if info else None,
            status=info.status if info else None,
            code=info.code if info else None,
            message=info.message if info else None,  # the tool's own words (the log line's)
            max_attempts=call.policy.max_attempts,
            throttle=call.waits_out_throttle,  # a turn waited for, not an attempt spent
        )

    def tenacity_kwargs(self) -> dict[str, Any]:
        return {
            "retry": retry_if_exception(self._retry),
            "wait": self._wait,
            "stop": self._stop,
            "before_sleep": self._before_sleep,
            "reraise": True,
        }
