"""Shared rate limits: the policy that takes every attempt's tokens from the shared buckets.

The bucket arithmetic is pure, in [`loop_governor.state.bucket`][loop_governor.state.bucket], shared by every store.

``rate_per_s`` tokens flow into a bucket holding at most ``burst``; a request takes
``cost`` tokens (1 for a request, its estimated tokens for a token limit). A caller
that finds too few takes nothing and is told how long to wait. A call may need several
buckets at once (a provider's requests-per-minute *and* tokens-per-minute): it takes
from all of them or from none, so a request held back by one limit spends nothing of
the other. The Redis store runs the same arithmetic in Lua, so a fleet shares one bucket
per tool or provider key and waits its turn instead of collecting 429s.

A model call's token bucket is charged what the call really used: the prompt's estimate
at admission, then, from the response's usage, the completion and any prompt tokens the
estimate missed (added to the key's next admission in this process: a bucket only ever
takes a cost with its consent), while an over-estimate, or a prompt the provider refused
unprocessed (any 4xx: context_length_exceeded, a 429), is given back at once, fleet-wide
(a cost below zero: a refund, always admitted).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from loop_governor.call import MODEL, AttemptPolicy, Call, Refused, StopReason
from loop_governor.outcome import rate_limited
from loop_governor.state.bucket import Bucket

if TYPE_CHECKING:
    from loop_governor.runtime import Runtime


def buckets_for(call: Call, owed: float = 0.0) -> list[Bucket]:
    """The buckets a call takes from: requests, and for a model call its estimated tokens
    (for this attempt's arguments) plus ``owed``, what earlier calls used beyond theirs."""
    pol = call.policy
    out: list[Bucket] = []
    if pol.rate_per_s is not None:
        out.append((pol.rate_key, pol.rate_per_s, pol.burst, 1.0))
    per_s = pol.tokens_per_s
    sent = call.upcoming if call.upcoming is not None else call.args
    tokens = call.model.estimated_tokens(sent) if per_s is not None and call.model is not None else None
    if per_s is not None and (tokens or owed > 0):
        out.append((_token_key(call), per_s, pol.token_burst, float(tokens or 0) + owed))
    return out


def _token_key(call: Call) -> str:
    return f"{call.policy.rate_key}:tokens"


def _unprocessed(status: int | None) -> bool:
    """A response status that says the provider refused the request before processing it."""
    return status is not None and 400 <= status < 500


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
    ``max_wall_s`` (model calls with no fallback left: [`Call.may_wait`][loop_governor.call.Call.may_wait]), else the
    retry cap -- is a refusal: the first attempt's outcome is a transient ``rate_limited``
    error; a retry just stops retrying.

    Waits are served in order within a process: a call told to wait joins its key's
    queue, and while anyone waits, a newcomer queues behind them instead of taking the
    tokens the first in line was waiting for (a bucket alone admits whoever asks first
    after a refill: 12 threads x 8 calls had a fair wait of 0.6 s and a longest of 2.3 s).
    Only the first in line asks the store; the others are told their turn.
    """

    rated_only = True
    __slots__ = ("_lock", "_owed", "_queues", "rt")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        # token-bucket key -> tokens used beyond what admission took (see the module doc)
        self._owed: dict[str, float] = {}
        # rate key -> the calls waiting their turn, first in line first, and when the first
        # expects to be admitted (a first in line that never comes back is passed over)
        self._queues: dict[str, tuple[deque[Call], list[float]]] = {}
        self._lock = threading.Lock()

    def _now(self) -> float:
        """Local buckets (memory, SQLite: one host) run on the monotonic clock, so a wall
        clock stepping back cannot freeze them; Redis buckets are shared across hosts and
        keep the governor's clock (the store may use the server's own time). An injected
        clock (tests, the benchmark) is used for both."""
        rt = self.rt
        if rt.clock is not time.time or rt.store.name == "redis":
            return rt.clock()
        return time.monotonic()

    def before_attempt(self, call: Call) -> float:
        pol = call.policy
        call.rate_tokens = None
        buckets = buckets_for(call)
        if not buckets:
            return 0.0
        now = self._now()
        behind = self._behind(call, buckets, now)
        if behind is not None:
            return self._wait_or_refuse(call, behind)
        owed = 0.0
        if pol.tokens_per_s is not None and self._owed:
            with self._lock:
                owed = self._owed.pop(_token_key(call), 0.0)
            if owed:
                buckets = buckets_for(call, owed)
        try:
            wait = self.rt.store.rate_acquire_all(buckets, now)
        except BaseException:
            self._leave(call)
            raise
        if wait <= 0:
            self._leave(call)
            if pol.tokens_per_s is not None and buckets[-1][0] == _token_key(call):
                call.rate_tokens = buckets[-1][3] - owed
            return 0.0
        if owed:
            self._owe(_token_key(call), owed)
        self._join(call, now + wait)
        return self._wait_or_refuse(call, wait)

    def _wait_or_refuse(self, call: Call, wait: float) -> float:
        pol = call.policy
        if wait > (call.wait_left if call.may_wait else pol.max_delay):
            self._leave(call)
            if call.attempt:
                raise Refused(StopReason.RATE_LIMITED)
            raise Refused(StopReason.RATE_LIMITED, rate_limited(call.kind, call.name, wait, _limit_text(call)))
        self.rt.events.emit("rate_limited", tool=call.name, delay_s=wait)
        return wait

    # -- the queue of waiting calls (one per rate key, in this process) --------------------

    def _behind(self, call: Call, buckets: list[Bucket], now: float) -> float | None:
        """How long ``call`` waits for the calls ahead of it; None when it is first in
        line (or nobody waits): then it asks the store itself."""
        if not self._queues:
            return None
        key = call.policy.rate_key
        with self._lock:
            entry = self._queues.get(key)
            if entry is None:
                return None
            queue, ready = entry
            turn = max(min(b[3], b[2]) / b[1] for b in buckets)
            if queue[0] is not call and now > ready[0] + max(1.0, 4 * turn):
                queue.popleft()  # the first in line never came back (its thread died): passed over
                ready[0] = now
            if not queue:
                del self._queues[key]
                return None
            if queue[0] is call:
                return None
            if call not in queue:
                queue.append(call)
            ahead = queue.index(call)
            return max(ready[0] - now, 0.0) + ahead * turn

    def _join(self, call: Call, ready_at: float) -> None:
        key = call.policy.rate_key
        with self._lock:
            entry = self._queues.get(key)
            if entry is None:
                self._queues[key] = (deque([call]), [ready_at])
                return
            queue, ready = entry
            if not queue or queue[0] is call:
                ready[0] = ready_at
            if call not in queue:
                queue.append(call)

    def _leave(self, call: Call) -> None:
        if not self._queues:
            return
        key = call.policy.rate_key
        with self._lock:
            entry = self._queues.get(key)
            if entry is None:
                return
            queue, ready = entry
            if queue and queue[0] is call:
                queue.popleft()
                ready[0] = self._now()  # the next in line asks the store at once
            elif call in queue:
                queue.remove(call)
            if not queue:
                del self._queues[key]

    def after_attempt_cancelled(self, call: Call) -> None:
        """A call cancelled while it waited gives up its place in line."""
        self._leave(call)

    def after_attempt_success(self, call: Call) -> None:
        """Settle the token bucket with the usage the response reports (or, without one,
        the estimate of its answer)."""
        charged, usage = call.rate_tokens, call.usage
        call.rate_tokens = None
        if charged is None or usage is None:
            return
        used = usage.input_tokens + usage.output_tokens
        if used > charged:
            self._charge(call, used - charged)
        elif used < charged:
            self._settle(call, used - charged)

    def after_attempt_failure(self, call: Call) -> None:
        """A prompt the provider refused unprocessed gives its tokens back."""
        charged, info = call.rate_tokens, call.info
        call.rate_tokens = None
        if charged and info is not None and _unprocessed(info.status):
            self._refund(call, charged)

    def _owe(self, key: str, tokens: float) -> None:
        with self._lock:
            self._owed[key] = self._owed.get(key, 0.0) + tokens

    def _refund(self, call: Call, tokens: float) -> None:
        self._settle(call, -tokens)

    def _charge(self, call: Call, tokens: float) -> None:
        """Take ``tokens`` now if the bucket holds them, else from the key's next admission."""
        if self._settle(call, tokens) != 0.0:
            self._owe(_token_key(call), tokens)

    def _settle(self, call: Call, cost: float) -> float | None:
        pol = call.policy
        assert pol.tokens_per_s is not None
        bucket = (_token_key(call), pol.tokens_per_s, pol.token_burst, cost)
        try:
            return self.rt.store.rate_acquire_all([bucket], self._now())
        except Exception:  # a store outage: the settlement is lost, the call's outcome stands
            return None
