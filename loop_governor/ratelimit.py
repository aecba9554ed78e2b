"""The token bucket, as one pure function shared by every store.

``rate_per_s`` tokens flow into a bucket holding at most ``burst``; a call takes one. A
caller that finds less than one token takes nothing and is told how long to wait. The
Redis store runs the same arithmetic in Lua so a fleet shares one bucket per tool.
"""

from __future__ import annotations


def take_token(
    state: tuple[float, float] | None, rate_per_s: float, burst: float, now: float
) -> tuple[tuple[float, float], float]:
    """Apply one request to ``state`` = (tokens, last refill time); returns (new state, wait)."""
    if rate_per_s <= 0 or burst < 1:
        raise ValueError("rate_per_s must be > 0 and burst >= 1")
    tokens, ts = state if state is not None else (burst, now)
    if now > ts:
        tokens, ts = min(burst, tokens + (now - ts) * rate_per_s), now
    if tokens >= 1:
        return (tokens - 1, ts), 0.0
    return (tokens, ts), (1 - tokens) / rate_per_s
