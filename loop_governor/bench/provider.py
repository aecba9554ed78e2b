"""The simulated model provider: one API key, its faults, and the SDK client's own retries.

Every model turn of a benchmark task is a request to this provider (``Provider.request``),
whatever the arm, so the provider's request log is where model calls, their failures and
the billed prompt tokens are counted -- the cost driver beside the tool calls.

Faults are provider-shaped exceptions ([`ProviderError`][loop_governor.bench.provider.ProviderError]): ``status_code``,
``code``, ``type``, ``body`` and ``response.headers`` laid out like the openai SDK's
``APIStatusError`` (an Anthropic-style body for 529), so ``lg.classify``, crewAI's
rate-limit retry and the simulated SDK read them as they read the real ones. The bench
must not import ``openai`` (it is a test-only dependency; ``make demo`` installs only
``.[langchain,crewai]``), hence lookalikes.

``sdk_request`` is the client library's hidden retry loop as openai-python 2.x ships it
(``max_retries=2``; retries 408/409/429/5xx; honours ``retry-after`` up to 120 s, else
``min(0.5 * 2**n, 8) * (1 - 0.25 * random())``). The scripted models call through it with
their ``max_retries`` field, so the governor's adapters, which switch SDK retries off on
the model they call (``max_retries=0``), change what reaches the provider exactly as
they do with a real client. Written here because the real loop lives inside the openai
client's HTTP transport, which the simulation has no use for.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loop_governor.bench.clock import VirtualClock
from loop_governor.bench.determinism import CURRENT_TASK, unit_hash

PROVIDER_ERROR_LATENCY_S = 0.4  # a rejected request (429, 529, quota) comes back fast
COMPLETION_TOKENS = 40  # what the scripted model writes a turn: a tool call or a short answer
SDK_MAX_RETRIES = 2  # openai-python's DEFAULT_MAX_RETRIES
SDK_INITIAL_RETRY_DELAY_S = 0.5
SDK_MAX_RETRY_DELAY_S = 8.0
SDK_MAX_RETRY_AFTER_S = 120.0


class _Response:
    """The part of an ``httpx.Response`` that error readers look at."""

    def __init__(self, status_code: int, headers: dict[str, str], text: str) -> None:
        self.status_code = status_code
        self.headers = headers
        self.text = text


class ProviderError(Exception):
    """An HTTP error from the model provider, shaped like ``openai.APIStatusError``."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"Error code: {status} - {message}")
        self.message = message
        self.status_code = status
        self.code = code
        self.type = code
        self.param = None
        if status == 529:  # Anthropic's overload body
            self.body: dict[str, Any] = {"type": "error", "error": {"type": code, "message": message}}
        else:
            self.body = {"message": message, "type": code, "param": None, "code": code}
        self.response = _Response(status, dict(headers or {}), message)
        self.request_id = None


class RateLimitError(ProviderError):
    """429 (``openai.RateLimitError``): a rate limit, or the quota (``insufficient_quota``)."""


class InternalServerError(ProviderError):
    """5xx (``openai.InternalServerError``; Anthropic's 529 overload among them)."""


def rate_limited(retry_after_s: int, limit: int) -> ProviderError:
    return RateLimitError(
        429,
        "rate_limit_exceeded",
        f"Rate limit reached on requests per min (RPM): Limit {limit}. Please try again in {retry_after_s}s.",
        {"retry-after": str(retry_after_s), "x-ratelimit-limit-requests": str(limit)},
    )


def quota_exhausted() -> ProviderError:
    return RateLimitError(
        429,
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
    )


def overloaded() -> ProviderError:
    return InternalServerError(529, "overloaded_error", "Overloaded")


ModelFault = Callable[["Provider", float], BaseException | None]
"""(provider, seconds since the world started) -> the failure to answer with, or None."""


@dataclass
class ModelRequest:
    task: str
    start: float
    end: float
    ok: bool
    prompt_tokens: int
    status: int | None = None
    reply: str = ""  # a real model's reply: "tool_calls", "text", "empty" or "malformed"
    wall_s: float = 0.0  # a real model's own latency, in real seconds


@dataclass
class Provider:
    """One API key at the model provider, shared by every task of a world."""

    clock: VirtualClock
    seed: int
    world: str
    fault: ModelFault | None = None
    started_at: float = 0.0
    requests: list[ModelRequest] = field(default_factory=list)
    state: dict[str, float] = field(default_factory=dict)  # a fault rule's own state (a bucket)
    draws: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, prompt_tokens: int, latency_s: float) -> None:
        """One request: answered after ``latency_s``, or failed fast with the fault's error."""
        start = self.clock()
        fault = self.fault(self, start - self.started_at) if self.fault is not None else None
        try:
            self.clock.sleep(PROVIDER_ERROR_LATENCY_S if fault is not None else latency_s)
        finally:
            status = getattr(fault, "status_code", None)
            with self.lock:
                self.requests.append(
                    ModelRequest(CURRENT_TASK.get(), start, self.clock(), fault is None, prompt_tokens, status)
                )
        if fault is not None:
            raise fault

    def random(self) -> float:
        """A seeded draw for the SDK's jitter, a function of the task and how often it drew."""
        task = CURRENT_TASK.get()
        with self.lock:
            n = self.draws.get(task, 0)
            self.draws[task] = n + 1
        return unit_hash(self.seed, self.world, task, "sdk", n)


def _retry_after(exc: ProviderError) -> float | None:
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is not None:
            try:
                return float(raw) * scale
            except ValueError:
                continue
    return None


def sdk_should_retry(exc: ProviderError) -> bool:
    retry_after = _retry_after(exc)
    if retry_after is not None and retry_after > SDK_MAX_RETRY_AFTER_S:
        return False
    return exc.status_code in (408, 409, 429) or exc.status_code >= 500


def sdk_retry_delay(retry_index: int, exc: ProviderError, rnd: float) -> float:
    retry_after = _retry_after(exc)
    if retry_after is not None and math.isfinite(retry_after) and 0 < retry_after <= SDK_MAX_RETRY_AFTER_S:
        return retry_after
    return min(SDK_INITIAL_RETRY_DELAY_S * 2.0**retry_index, SDK_MAX_RETRY_DELAY_S) * (1 - 0.25 * rnd)


def sdk_request(provider: Provider, prompt_tokens: int, latency_s: float, *, max_retries: int) -> None:
    """``provider.request`` behind the client library's own retry loop (see the module)."""
    for retry_index in range(max_retries + 1):
        try:
            provider.request(prompt_tokens, latency_s)
            return
        except ProviderError as exc:
            if retry_index >= max_retries or not sdk_should_retry(exc):
                raise
            provider.clock.sleep(sdk_retry_delay(retry_index, exc, provider.random()))


# -- fault rules --------------------------------------------------------------------------


def key_rate_limit(rpm: float, burst: int) -> ModelFault:
    """The key's request limit as a token bucket (``burst`` at once, ``rpm`` a minute).

    A request finding the bucket empty is answered 429 with ``retry-after`` = whole seconds
    until the next token, and takes no token (rejected requests do not count).
    """
    rate = rpm / 60.0

    def rule(p: Provider, t: float) -> BaseException | None:
        with p.lock:
            tokens = min(float(burst), p.state.get("tokens", float(burst)) + (t - p.state.get("t", 0.0)) * rate)
            p.state["t"] = t
            if tokens >= 1.0:
                p.state["tokens"] = tokens - 1.0
                return None
            p.state["tokens"] = tokens
        return rate_limited(max(1, math.ceil((1.0 - tokens) / rate)), int(rpm))

    return rule


def quota_after(t0: float) -> ModelFault:
    """The key's quota (billing) runs out at ``t0``: every later request is refused."""
    return lambda p, t: quota_exhausted() if t >= t0 else None


def overloaded_burst(start_s: float, end_s: float, p_fail: float, slot_s: float = 1.0) -> ModelFault:
    """During [start_s, end_s) a seeded ``p_fail`` of the 1-second slots answer 529."""

    def rule(p: Provider, t: float) -> BaseException | None:
        if start_s <= t < end_s and unit_hash(p.seed, p.world, "provider", int(t // slot_s)) < p_fail:
            return overloaded()
        return None

    return rule
