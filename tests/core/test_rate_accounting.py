"""Token buckets under clock steps and settlements (issue 27, items 2, 3 and 5).

The real-client side of items 2-4 is in tests/providers/test_model_rate_accounting.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lg_testing import VirtualClock

import loop_governor as lg
from loop_governor.state.bucket import take_all


def answer(_prompt: object) -> dict[str, object]:
    return {"content": "ok", "usage": {"prompt_tokens": 10, "completion_tokens": 0}}


@pytest.mark.parametrize("step_back", [1.0, 600.0, 86_400.0])
def test_a_wall_clock_step_back_does_not_freeze_the_buckets(step_back: float) -> None:
    clock = VirtualClock()
    gov = lg.Governor(
        lg.GovernorConfig(models={"openai": lg.ModelPolicy(rpm=60, rpm_burst=1)}), clock=clock, sleep=clock.sleep
    )
    gov.call_model("openai:gpt-4o", answer, "hi")
    clock.now -= step_back  # NTP, a VM resumed, an operator: the wall clock jumps back
    start = clock()
    for _ in range(3):
        gov.call_model("openai:gpt-4o", answer, "hi")  # was: 120 s of waiting, then rate_limited
    assert clock() - start == pytest.approx(3.0)  # one request a second, as configured


STATE = st.tuples(st.floats(-1e6, 1e3, allow_nan=False), st.floats(0, 1e6, allow_nan=False))


@given(
    state=st.one_of(st.none(), STATE),
    now=st.floats(0, 1e6, allow_nan=False),
    rate=st.floats(0.01, 1e4, allow_nan=False),
    burst=st.floats(1, 1e3, allow_nan=False),
    cost=st.floats(-1e6, 1e6, allow_nan=False),
)
def test_a_bucket_never_waits_on_a_refund_nor_overfills_nor_freezes(
    state: tuple[float, float] | None, now: float, rate: float, burst: float, cost: float
) -> None:
    if state is not None:
        state = (min(state[0], burst), state[1])
    (after,), wait = take_all([state], [("k", rate, burst, cost)], now)
    tokens, stamp = after
    assert stamp == now  # elapsed time is clamped, and the refill restarts from now
    assert tokens <= burst + 1e-9
    if cost <= 0:
        assert wait == 0.0  # a refund (a prompt refused unprocessed) is always given back
    if wait > 0:
        assert wait <= (min(cost, burst) - tokens) / rate + 1e-9
        _, again = take_all([after], [("k", rate, burst, cost)], now + wait)
        assert again == 0.0 or again < 1e-6 * wait  # the wait it was told is enough


def test_a_model_call_refused_unprocessed_is_refunded_and_one_that_ran_is_settled() -> None:
    clock = VirtualClock()
    gov = lg.Governor(
        lg.GovernorConfig(models={"openai": lg.ModelPolicy(tpm=6000, tpm_burst=1000)}), clock=clock, sleep=clock.sleep
    )

    class TooLong(Exception):
        status_code = 400
        code = "context_length_exceeded"

    def refuse(_prompt: object) -> object:
        raise TooLong("maximum context length is 8192 tokens")

    with pytest.raises(lg.PermanentError):
        gov.call_model("openai:gpt-4o", refuse, "big", estimated_tokens=50_000)
    start = clock()
    gov.call_model("openai:gpt-4o", answer, "hi", estimated_tokens=900)  # no 490 s debt to wait out
    assert clock() == start
    # ... and the 900-token estimate was settled to the 10 tokens used: the bucket is full
    gov.call_model("openai:gpt-4o", answer, "hi", estimated_tokens=990)
    assert clock() == start


# -- item 8: rate-limit waits are served in order ----------------------------------------------


def _simulate(arrivals: list[float], rate: float) -> list[int]:
    """Calls arriving at ``arrivals`` (virtual seconds), each polling the rate limit again
    after the wait it is told; returns the order in which they were admitted."""
    import heapq

    from loop_governor.call import TOOL, Call
    from loop_governor.policies.ratelimit import RateLimit

    clock = VirtualClock(0.0)
    config = lg.GovernorConfig(tools={"api": lg.ToolPolicy(rate_limit_per_s=rate, rate_burst=1, max_wait_s=1e9)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    limit = RateLimit(gov.rt)
    calls = [Call(TOOL, "api", gov.rt.policy(TOOL, "api"), None, print, (), {}) for _ in arrivals]
    polls = [(t, n, n) for n, t in enumerate(arrivals)]  # (time, tie-break, call)
    heapq.heapify(polls)
    admitted: list[int] = []
    seq = len(arrivals)
    while polls:
        at, _, n = heapq.heappop(polls)
        clock.now = at
        wait = limit.before_attempt(calls[n])
        if wait <= 0:
            admitted.append(n)
        else:
            seq += 1
            heapq.heappush(polls, (at + wait, seq, n))
    return admitted


@given(
    st.lists(st.floats(0, 20, allow_nan=False), min_size=2, max_size=30).map(sorted),
    st.sampled_from([0.5, 1.0, 4.0]),
)
def test_rate_limit_waits_are_served_in_arrival_order(arrivals: list[float], rate: float) -> None:
    # issue 27: a newcomer polling just after a refill took the token the first waiter
    # had waited for (12 threads x 8 calls: a fair wait of 0.6 s, a longest of 2.3 s)
    assert _simulate(arrivals, rate) == list(range(len(arrivals)))


def test_an_answer_without_usage_is_charged_its_estimated_size() -> None:
    # issue 27: a stream without usage charged only the prompt estimate to the token limit
    clock = VirtualClock()
    gov = lg.Governor(
        lg.GovernorConfig(models={"openai": lg.ModelPolicy(tpm=6000, tpm_burst=1000)}), clock=clock, sleep=clock.sleep
    )
    events: list[dict[str, object]] = []
    gov.subscribe(events.append)
    start = clock()
    for _ in range(4):
        gov.call_model("openai:gpt-4o", lambda _p: "x" * 20_000, "hi", estimated_tokens=10)  # ~5000-token answers
    assert [e["output_tokens"] for e in events if e["event"] == "usage_estimated"] == [5000] * 4
    # the first two answers were paid for before the fourth call went (the third's is the
    # debt it leaves): ~10k tokens at 100/s, less one burst -- not 0 s
    assert clock() - start >= (2 * 5010 - 1000) / 100 - 1e-6
