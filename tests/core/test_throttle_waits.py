"""Waiting out throttles, overloads and open breakers on a model call -- and its bounds.

A model call waits its turn rather than spending attempts (a 429 is pacing, not a
failure), but never forever: each turn waits at least 0.1 s (doubling to 2 s), the wait is
capped by ``max_wait`` and the task's ``max_wall_s``, a fallback is taken promptly and
gets a wait of its own, and a caller behind another's half-open probe goes in soon after
the probe closes the breaker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lg_testing import HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.retry import backoff_delay, turn_floor
from loop_governor.state.breaker import BreakerState
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
        self.message = "Too Many Requests"

    def __call__(self, _prompt: object) -> dict[str, Any]:
        self.requests += 1
        if self.requests > self.limit:
            raise StillRetrying(f"still retrying after {self.limit} requests")
        raise HTTPError(429, self.message, self.headers)

    async def acall(self, prompt: object) -> dict[str, Any]:
        return self(prompt)


def _open(store: MemoryStore, gov: lg.Governor) -> None:
    """The fleet's five failures open the endpoint's breaker."""
    policy = gov.model_policy(ENDPOINT).breaker
    for _ in range(5):
        store.breaker_record(KEY, False, False, gov.clock(), policy)


# -- throttles with (next to) nothing to wait: no flood of requests --------------------------


@pytest.mark.parametrize(
    ("settings", "headers", "message"),
    [
        ({"retry_base_delay": 0.0}, None, "Too Many Requests"),
        ({"retry_base_delay": 0.0, "retry_max_delay": 0.0}, None, "Too Many Requests"),
        ({"retry_base_delay": 0.0}, {"retry-after": "0"}, "Too Many Requests"),
        ({"retry_base_delay": 0.0}, {"retry-after-ms": "1"}, "Too Many Requests"),
        (
            {"retry_base_delay": 0.0},
            None,
            "Rate limit reached for gpt-4o on tokens per min (TPM). Please try again in 6ms.",
        ),
    ],
    ids=["base_delay=0", "no-backoff", "retry-after-0", "retry-after-ms-1", "try-again-in-6ms"],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_throttle_with_next_to_nothing_to_wait_backs_off_anyway(
    clock: VirtualClock, settings: dict[str, float], headers: dict[str, str] | None, message: str, mode: str
) -> None:
    """retry_base_delay=0 is valid config (the fleet worker uses it). A throttle then
    plans a wait of 0 s, or of the few ms the provider asks for ("try again in 6ms",
    OpenAI's TPM text): as a free turn each would cost next to nothing of the 120 s wait,
    and one call would send tens of thousands of requests to the throttling endpoint. A
    turn waits at least 0.1 s, doubling to 2 s: a few dozen requests, then hand back."""
    gov = lg.Governor(lg.GovernorConfig(**settings), clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    model = Throttled(headers, limit=100)
    model.message = message
    with pytest.raises(lg.TransientError), gov.task("t"):
        if mode == "sync":
            gov.call_model(ENDPOINT, model, "hi")
        else:
            asyncio.run(gov.acall_model(ENDPOINT, model.acall, "hi"))
    assert 3 < model.requests <= 70
    assert min(clock.sleeps) >= 0.1 and sum(clock.sleeps) <= 120.0


@given(retry=st.integers(0, 40), earlier=st.integers(0, 40), rnd=st.floats(0.0, 1.0, exclude_max=True))
def test_the_turn_floor_is_below_the_default_backoff_at_every_step(retry: int, earlier: int, rnd: float) -> None:
    """The floor only lifts waits of a no-backoff configuration: with the default settings
    (0.8 s doubling, jitter down to half, 8 s cap) every backoff is above it, so the
    defaults' waits are as before. A call has waited out at most one throttle per retry."""
    policy = lg.Governor().model_policy(ENDPOINT)
    throttles = min(earlier, retry)
    assert turn_floor(throttles) < backoff_delay(retry, policy, rnd)


def test_throttles_that_are_waited_out_still_do_not_spend_attempts(gov: lg.Governor, clock: VirtualClock) -> None:
    """A throttle with a real wait is a free turn: more requests than attempts, within the wait."""
    model = Throttled({"retry-after": "2"})
    with pytest.raises(lg.TransientError), gov.task("t"):
        gov.call_model(ENDPOINT, model, "hi")
    assert model.requests > 3 and sum(clock.sleeps) <= 120.0


# -- behind another caller's half-open probe ---------------------------------------------------


def test_a_waiter_behind_a_half_open_probe_goes_in_soon_after_it_closes(clock: VirtualClock) -> None:
    """Another process took the probe 1 s ago; it succeeds 1 s later. The breaker tells
    our call the probe goes stale in 59 s; sleeping all of it in one go would keep the
    agent's step waiting long after the endpoint is back."""
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
    assert clock() - start <= 10.0


def test_polling_behind_a_silent_probe_is_one_event_and_ends_when_the_probe_goes_stale(clock: VirtualClock) -> None:
    """Another process took the probe and died. Our call asks every second (one
    ``breaker_wait`` event for the whole wait, not one per poll: a trace of 60 identical
    events says nothing more) and goes in as the new probe once the old one is stale."""
    store = MemoryStore()
    gov = lg.Governor(store=store, clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    seen: list[dict[str, Any]] = []
    gov.subscribe(seen.append)
    policy = gov.model_policy(ENDPOINT).breaker
    _open(store, gov)
    clock.advance(60)
    assert store.breaker_admit(KEY, clock, policy)[0].probe  # the process that then died
    start = clock()
    with gov.task("t"):
        assert gov.call_model(ENDPOINT, lambda _p: {"content": "ok"}, "hi") == {"content": "ok"}
    assert clock() - start == pytest.approx(60.0)  # the probe went stale after one cooldown
    assert len(clock.sleeps) == 60
    waits = [e for e in seen if e["event"] == "breaker_wait"]
    assert [(e["delay_s"], e["state"]) for e in waits] == [(1.0, "half_open")]
    assert store.breaker_get(KEY).state is BreakerState.CLOSED


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_wait_for_an_open_breaker_in_one_call_is_one_event(clock: VirtualClock, mode: str) -> None:
    """The call waits out the cooldown, its probe fails (the breaker opens again), and it
    waits out the new cooldown: two waits, two ``breaker_wait`` events (the flag that keeps
    polls quiet is reset when the call is let in), and the second probe's answer is returned."""
    store = MemoryStore()
    gov = lg.Governor(store=store, clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=lambda: 0.5)
    seen: list[dict[str, Any]] = []
    gov.subscribe(seen.append)
    _open(store, gov)
    clock.advance(30)
    answers: list[BaseException | None] = [HTTPError(503, "Service Unavailable"), None]

    def model(_prompt: object) -> dict[str, Any]:
        fault = answers.pop(0)
        if fault is not None:
            raise fault
        return {"content": "ok"}

    async def amodel(prompt: object) -> dict[str, Any]:
        return model(prompt)

    with gov.task("t"):
        if mode == "sync":
            assert gov.call_model(ENDPOINT, model, "hi") == {"content": "ok"}
        else:
            assert asyncio.run(gov.acall_model(ENDPOINT, amodel, "hi")) == {"content": "ok"}
    waits = [(round(e["delay_s"], 6), e["state"]) for e in seen if e["event"] == "breaker_wait"]
    assert waits == [(30.0, "open"), (59.4, "open")]  # the second after the probe's 0.6 s backoff
    assert not answers and store.breaker_get(KEY).state is BreakerState.CLOSED


# -- a waiting retry and the task's retry budget -----------------------------------------------


def test_a_refused_retry_does_not_keep_the_half_open_probe(clock: VirtualClock) -> None:
    """A waiting retry may go in as the half-open probe. If the retry budget is gone by
    then (a sibling call of the task spent the last unit during the 60 s wait), the retry
    must be refused before it takes the probe: a probe taken and never sent leaves the
    breaker half-open with nothing in flight, and every other caller waits one more
    cooldown."""
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


class ContextTooLong(Exception):
    status_code = 400
    code = "context_length_exceeded"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_compaction_with_nothing_to_cut_does_not_take_the_half_open_probe(clock: VirtualClock, mode: str) -> None:
    """The retry after context_length_exceeded may meet an open breaker (the fleet's
    failures). When the compactor has nothing left to cut, the call ends with the context
    error at once -- not after waiting out the cooldown and taking the probe it never
    sends, which left the breaker half-open with nothing in flight for one more cooldown."""
    store = MemoryStore()
    gov = lg.Governor(store=store, clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=lambda: 0.5)
    requests = 0

    def model(_prompt: object) -> dict[str, Any]:
        nonlocal requests
        requests += 1
        _open(store, gov)  # the fleet's failures open the breaker meanwhile
        raise ContextTooLong("This model's maximum context length is 128000 tokens")

    async def amodel(prompt: object) -> dict[str, Any]:
        return model(prompt)

    with pytest.raises(lg.PermanentError), gov.task("t"):
        if mode == "sync":
            gov.call_model(ENDPOINT, model, "hi", compact=lambda _p: None)
        else:
            asyncio.run(gov.acall_model(ENDPOINT, amodel, "hi", compact=lambda _p: None))
    assert requests == 1 and clock() == 1_000.0  # no cooldown waited for a request never sent
    clock.advance(60)
    assert store.breaker_admit(KEY, clock, gov.model_policy(ENDPOINT).breaker)[0].probe


# -- the task's wall budget bounds the waits -----------------------------------------------------


def test_waiting_out_throttles_stays_within_the_task_wall_budget(clock: VirtualClock) -> None:
    """model_max_wait_s (120 s) is per call; a task's max_wall_s=30 caps it too."""
    gov = lg.Governor(lg.GovernorConfig(max_wall_s=30), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    model = Throttled({"retry-after": "5"})
    with gov.task("t") as task, pytest.raises(lg.AgentToolError):
        gov.call_model(ENDPOINT, model, "hi")
    assert clock() - task.started_at <= 30.0


# -- fallbacks: taken promptly, each with a wait of its own ---------------------------------------


def test_a_throttled_primary_falls_back_promptly(gov: lg.Governor, clock: VirtualClock) -> None:
    """While a fallback is left a throttle is an attempt, as for a tool: three requests
    on the primary, then the fallback answers (waiting 120 s on the primary would be
    what the fallback was configured to avoid)."""
    primary = Throttled({"retry-after": "2"})
    with gov.task("t"):
        gov.call_model(ENDPOINT, primary, "hi", fallbacks=[("anthropic:claude", lambda _p: {"content": "fb"})])
    assert primary.requests <= 3 and clock() - 1_000.0 <= 16.0


def test_the_fallback_may_wait_out_a_throttle_of_its_own(gov: lg.Governor) -> None:
    """The primary's attempts are spent; the fallback's first 429 (Retry-After 1 s) is
    waited out on the fallback's own wait limit, and its answer comes back."""
    answers = iter([HTTPError(429, "Too Many Requests", {"retry-after": "1"}), None])

    def fallback(_prompt: object) -> dict[str, Any]:
        fault = next(answers)
        if fault is not None:
            raise fault
        return {"content": "fb"}

    with gov.task("t"):
        reply = gov.call_model(ENDPOINT, Throttled({"retry-after": "2"}), "hi", fallbacks=[("anthropic:c", fallback)])
    assert reply == {"content": "fb"}


# -- a throttle is neutral for the breaker -------------------------------------------------------


def test_throttles_between_server_errors_do_not_keep_the_breaker_closed(clock: VirtualClock) -> None:
    """An outage whose gateway answers some requests with 429: 4 x 500, a 429, 4 x 500,
    ... must open the breaker (threshold 5). Counted as a success, each 429 would reset
    the count of consecutive failures and keep the breaker closed through the outage."""
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


# -- classification corners that would cost up to 120 s each -------------------------------------


def test_a_plain_503_saying_try_again_later_is_not_an_overload() -> None:
    """Generic 503 pages say 'try again later'; as an overload each model call then
    waits up to 120 s through an outage instead of retry_max_attempts tries."""
    assert not lg.classify(HTTPError(503, "Service Unavailable. Please try again later.")).overloaded


def test_openai_minutes_retry_hint_is_read() -> None:
    """An RPD limit: unread, the call would spend 120 s / 23 requests on a limit that
    lifts in 7 minutes instead of handing back at once."""
    error = HTTPError(429, "Rate limit reached on requests per day (RPD): Limit 200. Please try again in 7m12s.")
    assert lg.classify(error).retry_after == pytest.approx(432.0)


@pytest.mark.parametrize(
    ("hint", "seconds"),
    [
        ("20s", 20.0),
        ("120ms", 0.12),
        ("2 minutes", 120.0),
        ("1h2m", 3720.0),
        ("1.5 seconds", 1.5),
        ("1 hour and 30 minutes", 5400.0),
        ("1 min 30 sec", 90.0),
        ("10 s, 5 m tokens left", 10.0),
        ("1 hr", 3600.0),
        ("a moment", None),
        ("5 months", None),
    ],
)
def test_retry_hints_in_every_unit_are_read(hint: str, seconds: float | None) -> None:
    error = HTTPError(429, f"Rate limit reached. Please try again in {hint}. Visit our docs.")
    assert lg.classify(error).retry_after == (None if seconds is None else pytest.approx(seconds))


def test_a_throttled_probe_closes_the_breaker(clock: VirtualClock) -> None:
    """The throttle that is neutral for a closed breaker is the probe's answer for a
    half-open one: the endpoint is up and pacing, so the breaker closes."""
    store = MemoryStore()
    gov = lg.Governor(lg.GovernorConfig(retry_max_attempts=1), store=store, clock=clock, sleep=clock.sleep)
    _open(store, gov)
    clock.advance(60)
    with pytest.raises(lg.AgentToolError), gov.task("t"):
        gov.call_model(ENDPOINT, _fails(429), "hi")
    assert store.breaker_get(KEY).state is BreakerState.CLOSED


class OvershootingClock(VirtualClock):
    """Sleeps take half as long again as asked (a busy host, a coarse timer)."""

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds * 1.5)


@given(st.floats(2.0, 10.0), st.sampled_from(["sync", "async"]))
def test_the_wait_limit_counts_the_time_waits_really_took(limit: float, mode: str) -> None:
    # issue 27: max_wait counted planned sleeps, so a call refused "after 3 s" had waited 4.
    clock = OvershootingClock()
    gov = lg.Governor(lg.GovernorConfig(model_max_wait_s=limit), clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    endpoint = Throttled({"retry-after": "0.2"})
    with pytest.raises(lg.TransientError):
        if mode == "sync":
            gov.call_model(ENDPOINT, endpoint, "hi")
        else:
            asyncio.run(gov.acall_model(ENDPOINT, endpoint, "hi"))
    # every wait was begun only if it fitted in what the earlier waits had really left
    waited = 0.0
    for took in clock.sleeps:
        assert waited + took / 1.5 <= limit + 1e-9, (clock.sleeps, limit)
        waited += took
    assert clock.sleeps  # it did wait (not a vacuous pass)
