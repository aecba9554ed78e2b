"""Token buckets under clock steps and settlements (issue 27, items 2, 3 and 5).

The real-client side of items 2-4 is in tests/providers/test_model_rate_accounting.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lg_testing import VirtualClock

import loop_governor as lg
from loop_governor.ratelimit import take_all


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
