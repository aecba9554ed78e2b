"""The token bucket, as pure functions every store runs (memory and SQLite here, Redis in Lua).

``rate_per_s`` tokens flow into a bucket holding at most ``burst``; a request takes
``cost`` tokens. A caller that finds too few takes nothing and is told how long to wait;
a call that needs several buckets at once takes from all of them or from none. The rate
limit policy ([`loop_governor.policies.ratelimit`][loop_governor.policies.ratelimit]) decides which buckets a call takes
from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

State = tuple[float, float]  # tokens, last refill time
# A bucket refilled for exactly the wait it was told can fall short by a rounding error:
# the wait that follows (~1e-16 s) does not move a float clock, and the caller would wait
# forever. A shortfall this small (relative to the cost, or to one token) is admitted.
_SLACK = 1e-9
Bucket = tuple[str, float, float, float]  # key, rate_per_s, burst, cost


def _refill(state: State | None, rate_per_s: float, burst: float, now: float) -> State:
    if rate_per_s <= 0 or burst < 1:
        raise ValueError("rate_per_s must be > 0 and burst >= 1")
    tokens, ts = state if state is not None else (burst, now)
    # Elapsed time clamped at zero: a clock that steps back neither refills nor rewinds the
    # bucket, and the refill starts again from the new time (keeping the old stamp froze
    # the bucket until the clock caught up: a 600 s step back refused every call).
    return min(burst, tokens + max(0.0, now - ts) * rate_per_s), now


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
    debt, which later requests wait out, so large prompts stay within the rate too. A cost
    at or below zero is a refund: never waits, and never fills a bucket past its burst."""
    refilled = [_refill(s, b[1], b[2], now) for s, b in zip(states, buckets, strict=True)]
    wait = 0.0
    for (tokens, _), (_, rate, burst, cost) in zip(refilled, buckets, strict=True):
        need = min(cost, burst)
        if need > 0 and need - tokens > _SLACK * max(need, 1.0):  # a wait that moves no clock is none
            wait = max(wait, (need - tokens) / rate)
    if wait > 64 * math.ulp(now):  # a wait below the clock's resolution moves no clock either
        return refilled, wait
    return [(min(b[2], t - b[3]), ts) for (t, ts), b in zip(refilled, buckets, strict=True)], 0.0
