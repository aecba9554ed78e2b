"""Review of 48cf096 ("Throttles and overloads are waited out"): reproductions.

A plain test is a regression test for a defect fixed on this branch (it fails on
48cf096). A strict xfail is a finding left to the lead (a design question, or a fix
with choices): it fails as long as the behaviour it describes is there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lg_testing import HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.breaker import BreakerState
from loop_governor.stores.memory import MemoryStore

ENDPOINT = "openai:gpt-4o"
KEY = f"model:{ENDPOINT}"


class StillRetrying(BaseException):
    """Escapes the governor (a BaseException is never retried): the call did not end."""


class Throttled:
    """A model endpoint that answers 429 to every request (at most ``limit`` of them)."""

    def __init__(self, headers: dict[str, str] | None = None, limit: int = 1_000) -> None:
        self.headers = headers
        self.limit = limit
        self.requests = 0

    def __call__(self, _prompt: object) -> dict[str, Any]:
        self.requests += 1
        if self.requests > self.limit:
            raise StillRetrying(f"still retrying after {self.limit} requests")
        raise HTTPError(429, "Too Many Requests", self.headers)

    async def acall(self, prompt: object) -> dict[str, Any]:
        return self(prompt)


def _open(store: MemoryStore, gov: lg.Governor) -> None:
    """The fleet's five failures open the endpoint's breaker."""
    policy = gov.model_policy(ENDPOINT).breaker
    for _ in range(5):
        store.breaker_record(KEY, False, False, gov.clock(), policy)


# -- 1. zero-delay throttles: an endless retry loop ---------------------------------------------


@pytest.mark.parametrize(
    ("settings", "headers"),
    [
        ({"retry_base_delay": 0.0}, None),
        ({"retry_base_delay": 0.0, "retry_max_delay": 0.0}, None),
        ({"retry_base_delay": 0.0}, {"retry-after": "0"}),
    ],
    ids=["base_delay=0", "no-backoff", "retry-after-0"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_throttle_with_nothing_to_wait_is_an_attempt(
    clock: VirtualClock, settings: dict[str, float], headers: dict[str, str] | None, mode: str
) -> None:
    """retry_base_delay=0 is valid config (the fleet worker uses it). A throttle then
    plans a 0 s wait: waited_s never grows, so wait_left never runs out, and the throttle
    was not counted as an attempt -- 48cf096 calls the provider again at once, forever."""
    gov = lg.Governor(lg.GovernorConfig(**settings), clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    model = Throttled(headers)
    with pytest.raises(lg.TransientError), gov.task("t"):
        if mode == "sync":
            gov.call_model(ENDPOINT, model, "hi")
        else:
            asyncio.run(gov.acall_model(ENDPOINT, model.acall, "hi"))
    assert model.requests == 3  # retry_max_attempts: nothing was waited out


def test_throttles_that_are_waited_out_still_do_not_spend_attempts(gov: lg.Governor, clock: VirtualClock) -> None:
    """The fix keeps the feature: a throttle with a real wait is a free turn."""
    model = Throttled({"retry-after": "2"})
    with pytest.raises(lg.TransientError), gov.task("t"):
        gov.call_model(ENDPOINT, model, "hi")
    assert model.requests > 3 and sum(clock.sleeps) <= 120.0


# -- 2. a caller behind another's half-open probe sleeps a whole cooldown ------------------------


@pytest.mark.xfail(strict=True, reason="a waiter behind a half-open probe sleeps until the probe goes stale")
def test_a_waiter_behind_a_half_open_probe_goes_in_soon_after_it_closes(clock: VirtualClock) -> None:
    """Another process took the probe 1 s ago; it succeeds 1 s later. Our call is told
    retry_in = probe_at + cooldown - now (59 s) and sleeps all of it in one go."""
    store = MemoryStore()
    gov = lg.Governor(store=store, clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    policy = gov.model_policy(ENDPOINT).breaker
    _open(store, gov)
    clock.advance(60)
    assert store.breaker_admit(KEY, clock, policy)[0].probe  # another process probes
    clock.advance(1)

    def sleep(seconds: float) -> None:
        if store.breaker_get(KEY).state is BreakerState.HALF_OPEN:
            clock.advance(1.0)
            store.breaker_record(KEY, True, True, clock(), policy)  # the probe answers
            seconds -= 1.0
        clock.sleep(seconds)

    gov.rt.sleep = sleep
    start = clock()
    with gov.task("t"):
        gov.call_model(ENDPOINT, lambda _p: {"content": "ok"}, "hi")
    assert clock() - start <= 10.0  # measured on 48cf096: 59 s


# -- 3. a retry admitted as the probe, then refused by the retry budget ---------------------------


@pytest.mark.xfail(strict=True, reason="a retry refused by the retry budget keeps the half-open probe it took")
def test_a_refused_retry_does_not_keep_the_half_open_probe(clock: VirtualClock) -> None:
    """Before 48cf096 a retry was never the probe. Now a waiting retry is admitted as the
    probe by the Breaker and only then refused by RetryBudget (a sibling call of the task
    spent the last unit during the 60 s wait): the breaker stays half-open with no probe
    in flight, and every other caller waits one more cooldown."""
    store = MemoryStore()
    gov = lg.Governor(
        lg.GovernorConfig(task_retry_budget=1), store=store, clock=clock, sleep=clock.sleep, random=lambda: 0.5
    )
    requests = 0

    def model(_prompt: object) -> dict[str, Any]:
        nonlocal requests
        requests += 1
        if requests == 1:
            _open(store, gov)  # the fleet's failures open the breaker meanwhile
            raise HTTPError(500, "server error")
        return {"content": "ok"}

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if seconds > 30:  # the breaker wait: a sibling call of the task takes the last unit
            store.budget_take("t", 1)

    gov.rt.sleep = sleep
    with pytest.raises(lg.TransientError), gov.task("t"):
        gov.call_model(ENDPOINT, model, "hi")
    assert requests == 1
    # no probe is in flight, so the next caller must be admitted as the probe
    assert store.breaker_admit(KEY, clock, gov.model_policy(ENDPOINT).breaker)[0].allowed


# -- 4. max_wall_s is not a bound on the new waits ------------------------------------------------


@pytest.mark.xfail(strict=True, reason="wait_left ignores the task's max_wall_s")
def test_waiting_out_throttles_stays_within_the_task_wall_budget(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_wall_s=30), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    model = Throttled({"retry-after": "5"})
    with gov.task("t") as task, pytest.raises(lg.AgentToolError):
        gov.call_model(ENDPOINT, model, "hi")
    assert clock() - task.started_at <= 30.0  # measured on 48cf096: 117 s in one model call


# -- 5. fallbacks: the primary's throttles are waited out first ------------------------------------


@pytest.mark.xfail(strict=True, reason="design: a throttled primary keeps the call ~120 s before the fallback")
def test_a_throttled_primary_falls_back_promptly(gov: lg.Governor, clock: VirtualClock) -> None:
    """The breaker does not wait when a fallback is left; the throttle and rate-limit
    waits do: 23 requests and 119 s on the primary, then the fallback answers."""
    primary = Throttled({"retry-after": "2"})
    with gov.task("t"):
        gov.call_model(ENDPOINT, primary, "hi", fallbacks=[("anthropic:claude", lambda _p: {"content": "fb"})])
    assert primary.requests <= 3 and clock() - 1_000.0 <= 16.0


@pytest.mark.xfail(strict=True, reason="design: the fallback inherits a spent wait budget")
def test_the_fallback_may_wait_out_a_throttle_of_its_own(gov: lg.Governor) -> None:
    """After the primary used up model_max_wait_s, the fallback's first 429 (Retry-After
    1 s) fails the call, advising to 'configure a fallback model'."""
    answers = iter([HTTPError(429, "Too Many Requests", {"retry-after": "1"}), None])

    def fallback(_prompt: object) -> dict[str, Any]:
        fault = next(answers)
        if fault is not None:
            raise fault
        return {"content": "fb"}

    with gov.task("t"):
        reply = gov.call_model(ENDPOINT, Throttled({"retry-after": "2"}), "hi", fallbacks=[("anthropic:c", fallback)])
    assert reply == {"content": "fb"}


# -- 6. Redis: a later request shortens the TTL that covers a bucket's debt ------------------------


@pytest.mark.redis
def test_a_bucket_debt_outlives_the_ttl_a_later_request_sets(redis_url: str) -> None:
    """A 100k-token prompt on a 6k TPM key (rate 100/s, burst 1000) leaves a 990 s debt
    with a TTL to match; the next (small, refused) request reset the TTL to 60 s on
    48cf096 (its own cost's TTL), so an idle minute forgave the debt that memory and
    SQLite keep."""
    from loop_governor.stores.redis import RedisStore

    store = RedisStore(redis_url, namespace="review-debt")
    memory = MemoryStore()
    for s in (store, memory):
        assert s.rate_acquire_all([("k", 100.0, 1000.0, 100_000.0)], 0.0) == 0.0
        assert s.rate_acquire_all([("k", 100.0, 1000.0, 10.0)], 1.0) == pytest.approx(989.1)
    assert store._redis.pttl(store._rkey("k")) >= 989_000  # 48cf096: 60_000


# -- 7. a throttle resets the breaker's count of consecutive failures ------------------------------


@pytest.mark.xfail(strict=True, reason="design: a throttle counts as a success, so it resets the failure count")
def test_throttles_between_server_errors_do_not_keep_the_breaker_closed(clock: VirtualClock) -> None:
    """An outage whose gateway answers some requests with 429: 4 x 500, a 429, 4 x 500,
    a 429, ... never opens the breaker (threshold 5), because a throttle is recorded as
    ok. Neutral (neither a failure nor a success) would keep the pacing rationale."""
    config = lg.GovernorConfig(retry_max_attempts=1)  # one request per call
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    pattern = [500, 500, 500, 500, 429] * 3
    for status in pattern:
        with pytest.raises(lg.AgentToolError):
            gov.call_model(ENDPOINT, _fails(status), "hi")
        if gov.store.breaker_get(KEY).state is not BreakerState.CLOSED:
            break
    assert gov.store.breaker_get(KEY).state is BreakerState.OPEN


def _fails(status: int) -> Any:
    def call(_prompt: object) -> dict[str, Any]:
        raise HTTPError(status, "Too Many Requests" if status == 429 else "server error")

    return call


# -- 8. classification corners that now cost up to 120 s ------------------------------------------


@pytest.mark.xfail(strict=True, reason="'try again later' in any 503 makes it an overload")
def test_a_plain_503_saying_try_again_later_is_not_an_overload() -> None:
    """Generic 503 pages say 'try again later'; as an overload each model call then
    waits up to 120 s through an outage instead of retry_max_attempts tries."""
    assert not lg.classify(HTTPError(503, "Service Unavailable. Please try again later.")).overloaded


@pytest.mark.xfail(strict=True, reason="OpenAI's 'try again in 7m12s' is not read as a Retry-After")
def test_openai_minutes_retry_hint_is_read() -> None:
    """An RPD limit: with no Retry-After read, the call spends 120 s / 23 requests on a
    limit that lifts in 7 minutes instead of handing back at once."""
    error = HTTPError(429, "Rate limit reached on requests per day (RPD): Limit 200. Please try again in 7m12s.")
    assert lg.classify(error).retry_after == pytest.approx(432.0)
