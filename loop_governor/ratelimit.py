"""Shared rate limits: the token bucket, as pure functions every store runs, and the policy.

``rate_per_s`` tokens flow into a bucket holding at most ``burst``; a request takes
``cost`` tokens (1 for a request, its estimated tokens for a token limit). A caller
that finds too few takes nothing and is told how long to wait. A call may need several
buckets at once (a provider's requests-per-minute *and* tokens-per-minute): it takes
from all of them or from none, so a request held back by one limit spends nothing of
the other. The Redis store runs the same arithmetic in Lua, so a fleet shares one bucket
per tool or provider key and waits its turn instead of collecting 429s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from loop_governor.call import MODEL, AttemptPolicy, Call, Refused
from loop_governor.outcome import rate_limited

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime

State = tuple[float, float]  # tokens, last refill time
# A bucket refilled for exactly the wait it was told can fall short by a rounding error:
# the wait that follows (~1e-16 s) does not move a float clock, and the caller would wait
# forever. A shortfall this small (relative to the cost) is admitted.
_SLACK = 1e-9
Bucket = tuple[str, float, float, float]  # key, rate_per_s, burst, cost


def _refill(state: State | None, rate_per_s: float, burst: float, now: float) -> State:
    if rate_per_s <= 0 or burst < 1:
        raise ValueError("rate_per_s must be > 0 and burst >= 1")
    tokens, ts = state if state is not None else (burst, now)
    if now > ts:  # a clock that steps back (another host's) neither refills nor rewinds
        tokens, ts = min(burst, tokens + (now - ts) * rate_per_s), now
    return tokens, ts


def take_token(
    state: State | None, rate_per_s: float, burst: float, now: float, cost: float = 1.0
) -> tuple[State, float]:
    """Apply one request to ``state``; returns (new state, seconds to wait; 0 = admitted)."""
    states, wait = take_all([state], [("", rate_per_s, burst, cost)], now)
    return states[0], wait


def take_all(states: Sequence[State | None], buckets: Sequence[Bucket], now: float) -> tuple[list[State], float]:
    """Take each bucket's cost from its state, all or nothing; returns the new states and
    the wait (the longest any bucket needs; 0 = admitted). A cost above the burst waits
    for a full bucket (not forever) and then takes its whole cost: the bucket goes into
    debt, which later requests wait out, so large prompts stay within the rate too."""
    refilled = [_refill(s, b[1], b[2], now) for s, b in zip(states, buckets, strict=True)]
    wait = 0.0
    for (tokens, _), (_, rate, burst, cost) in zip(refilled, buckets, strict=True):
        need = min(cost, burst)
        if need - tokens > _SLACK * need:
            wait = max(wait, (need - tokens) / rate)
    if wait > 0:
        return refilled, wait
    return [(t - b[3], ts) for (t, ts), b in zip(refilled, buckets, strict=True)], 0.0


def buckets_for(call: Call) -> list[Bucket]:
    """The buckets a call takes from: requests, and for a model call its estimated tokens."""
    pol = call.policy
    out: list[Bucket] = []
    if pol.rate_per_s is not None:
        out.append((pol.rate_key, pol.rate_per_s, pol.burst, 1.0))
    per_s = pol.tokens_per_s
    tokens = call.model.estimated_tokens() if per_s is not None and call.model is not None else None
    if per_s is not None and tokens:
        out.append((f"{pol.rate_key}:tokens", per_s, pol.token_burst, float(tokens)))
    return out


def _limit_text(call: Call) -> str:
    pol = call.policy
    if call.kind != MODEL:
        return f"{pol.rate_per_s:g}/s"
    parts = []
    if pol.rate_per_s is not None:
        parts.append(f"{pol.rate_per_s * 60:g} requests/min")
    if pol.tokens_per_s is not None:
        parts.append(f"{pol.tokens_per_s * 60:g} tokens/min")
    return " and ".join(parts)


class RateLimit(AttemptPolicy):
    """Every attempt (retries too) takes its tokens from the shared buckets, or waits.

    A wait longer than the call may wait -- what is left of ``max_wait`` and the task's
    ``max_wall_s`` (model calls with no fallback left: :attr:`Call.may_wait`), else the
    retry cap -- is a refusal: the first attempt's outcome is a transient ``rate_limited``
    error; a retry just stops retrying.
    """

    rated_only = True
    __slots__ = ("rt",)

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def before_attempt(self, call: Call) -> float:
        pol = call.policy
        buckets = buckets_for(call)
        if not buckets:
            return 0.0
        rt = self.rt
        wait = rt.store.rate_acquire_all(buckets, rt.clock())
        if wait <= 0:
            return 0.0
        if wait > (call.wait_left if call.may_wait else pol.max_delay):
            if call.attempt:
                raise Refused("rate_limited")
            raise Refused("rate_limited", rate_limited(call.kind, call.name, wait, _limit_text(call)))
        rt.events.emit("rate_limited", tool=call.name, delay_s=wait)
        return wait
