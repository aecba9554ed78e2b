"""Governed model calls: the same policies as tool calls, keyed on the model endpoint."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lg_testing import HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.usage import Usage


class ProviderError(HTTPError):
    """Shaped like an openai SDK status error: status, code and the JSON body."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.code = code
        self.body = {"message": message, "type": code, "code": code}


QUOTA = ProviderError(429, "insufficient_quota", "You exceeded your current quota, please check your plan.")
RATE = ProviderError(429, "rate_limit_exceeded", "Rate limit reached for requests", {"retry-after": "2"})
AUTH = ProviderError(401, "invalid_api_key", "Incorrect API key provided: sk-abcdefghijklmnopqrstuvwx")
OVERFLOW = ProviderError(
    400, "context_length_exceeded", "This model's maximum context length is 8192 tokens. However, you requested 9000"
)
DOWN = HTTPError(500, "The server had an error while processing your request.")


class Model:
    """A scripted model endpoint: raises the scripted faults in order, then answers."""

    def __init__(self, *faults: BaseException, forever: BaseException | None = None, tokens: int = 100) -> None:
        self.faults = list(faults)
        self.forever = forever
        self.prompts: list[Any] = []
        self.tokens = tokens

    def __call__(self, prompt: Any) -> dict[str, Any]:
        self.prompts.append(prompt)
        if self.faults:
            raise self.faults.pop(0)
        if self.forever is not None:
            raise self.forever
        return {"content": "answer", "usage": {"prompt_tokens": self.tokens, "completion_tokens": 10}}

    async def acall(self, prompt: Any) -> dict[str, Any]:
        return self(prompt)


@pytest.fixture
def events(gov: lg.Governor) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    gov.subscribe(seen.append)
    return seen


def model_calls(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "model_call"]


def test_success_is_one_model_call_event_with_usage(gov: lg.Governor, events: list[dict[str, Any]]) -> None:
    model = Model()
    with gov.task("t"):
        assert gov.call_model("openai:gpt-4o", model, "hi")["content"] == "answer"
    (event,) = model_calls(events)
    assert event["status"] == "ok" and event["attempts"] == 1 and event["model"] == "openai:gpt-4o"
    assert (event["input_tokens"], event["output_tokens"], event["usage_estimated"]) == (100, 10, False)


@pytest.mark.parametrize("fault", [QUOTA, AUTH], ids=["insufficient_quota", "401"])
def test_fatal_reaches_the_provider_once_and_stops_with_partial_results(
    gov: lg.Governor, events: list[dict[str, Any]], fault: Exception
) -> None:
    model = Model(forever=fault)
    with gov.task("t") as task, pytest.raises(lg.FatalError) as stop:
        task.add_result({"page": 1})
        gov.call_model("openai:gpt-4o", model, "hi")
    assert len(model.prompts) == 1
    assert stop.value.partial_results == [{"page": 1}]
    assert "sk-abcdefghijklmnop" not in stop.value.info.to_model_text()
    (event,) = model_calls(events)
    assert (event["status"], event["error_type"], event["attempts"]) == ("error", "fatal", 1)


def test_rate_limit_twice_then_success_honours_retry_after(gov: lg.Governor, clock: VirtualClock) -> None:
    model = Model(RATE, RATE)
    with gov.task("t"):
        assert gov.call_model("openai:gpt-4o", model, "hi")["content"] == "answer"
    assert len(model.prompts) == 3
    assert clock.sleeps == [2.0, 2.0]  # Retry-After beats the shorter backoff


def test_server_error_forever_is_a_typed_error_after_max_attempts(gov: lg.Governor) -> None:
    model = Model(forever=DOWN)
    with gov.task("t"), pytest.raises(lg.TransientError) as err:
        gov.call_model("openai:gpt-4o", model, "hi")
    assert len(model.prompts) == gov.config.retry_max_attempts
    assert err.value.info.attempts == 3 and err.value.info.tool == "openai:gpt-4o"


def test_fallback_model_answers_while_the_primary_is_down(gov: lg.Governor, events: list[dict[str, Any]]) -> None:
    primary, fallback = Model(forever=DOWN), Model()
    with gov.task("t"):
        result = gov.call_model("openai:gpt-4o", primary, "hi", fallbacks=[("anthropic:claude", fallback)])
    assert result["content"] == "answer" and len(primary.prompts) == 3 and fallback.prompts == ["hi"]
    (event,) = model_calls(events)
    assert event["status"] == "ok" and event["model"] == "anthropic:claude"
    assert event["fallback_from"] == "openai:gpt-4o"
    assert [e["from_model"] for e in events if e["event"] == "model_fallback"] == ["openai:gpt-4o"]


def _open_model_breaker(gov: lg.Governor, primary: Model) -> None:
    """Two tasks' 3 failures each open the endpoint's breaker (threshold 5)."""
    no_wait = lg.Governor(
        gov.config.model_copy(update={"model_max_wait_s": 0.0}), store=gov.store, clock=gov.clock, sleep=gov.sleep
    )
    for task in ("a", "b"):
        with no_wait.task(task), pytest.raises(lg.TransientError):
            no_wait.call_model("openai:gpt-4o", primary, "hi")
    assert gov.store.breaker_get("model:openai:gpt-4o").state is lg.governor.BreakerState.OPEN
    assert gov.store.breaker_get("openai:gpt-4o").state is lg.governor.BreakerState.CLOSED  # no clash with tools


def test_open_breaker_skips_the_model_and_goes_to_the_fallback(gov: lg.Governor, clock: VirtualClock) -> None:
    primary = Model(forever=DOWN)
    _open_model_breaker(gov, primary)
    calls, fallback, now = len(primary.prompts), Model(), clock()
    with gov.task("c"):
        gov.call_model("openai:gpt-4o", primary, "hi", fallbacks=[("openai:gpt-4o-mini", fallback)])
    assert len(primary.prompts) == calls and len(fallback.prompts) == 1 and clock() == now  # at once


def test_open_breaker_with_no_fallback_waits_for_the_cooldown_and_probes(
    gov: lg.Governor, clock: VirtualClock, events: list[dict[str, Any]]
) -> None:
    """With nowhere else to go, failing at once would end the agent's step: the call waits
    out the cooldown (within model_max_wait_s) and goes in as the probe."""
    primary = Model(forever=DOWN)
    _open_model_breaker(gov, primary)
    primary.forever, calls, start = None, len(primary.prompts), clock()
    with gov.task("c"):
        assert gov.call_model("openai:gpt-4o", primary, "hi")["content"] == "answer"
    assert len(primary.prompts) == calls + 1 and clock() - start == pytest.approx(60.0)  # the cooldown
    assert gov.store.breaker_get("model:openai:gpt-4o").state is lg.governor.BreakerState.CLOSED
    assert [e["delay_s"] for e in events if e["event"] == "breaker_wait"] == [pytest.approx(60.0)]


def test_open_breaker_past_the_wait_limit_is_circuit_open(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(model_max_wait_s=30), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    primary = Model(forever=DOWN)
    _open_model_breaker(gov, primary)
    calls, start = len(primary.prompts), clock()
    with gov.task("c"), pytest.raises(lg.CircuitOpenError):
        gov.call_model("openai:gpt-4o", primary, "hi")
    assert len(primary.prompts) == calls and clock() == start


# -- throttles (429): a turn to wait for, not a failure ------------------------------------------


def test_throttles_are_waited_out_without_spending_attempts_or_the_budget(
    gov: lg.Governor, clock: VirtualClock
) -> None:
    """Five 429s in a row with Retry-After 2 s: more than max_attempts (3), less than the
    wait limit. The call waits its turns and answers; the task's retry budget is intact."""
    model = Model(*[RATE] * 5)
    with gov.task("t") as task:
        assert gov.call_model("openai:gpt-4o", model, "hi")["content"] == "answer"
        assert gov.store.budget_used(task.task_id) == 0
    assert len(model.prompts) == 6 and sum(clock.sleeps) >= 10.0


def test_throttles_never_open_the_breaker(gov: lg.Governor) -> None:
    for task in range(4):
        with gov.task(f"t{task}"):
            gov.call_model("openai:gpt-4o", Model(RATE, RATE, RATE), "hi")
    assert gov.store.breaker_get("model:openai:gpt-4o").state is lg.governor.BreakerState.CLOSED
    for _ in range(6):  # a tool's throttles neither: the service answered
        with pytest.raises(lg.TransientError):
            gov.call("search", Model(RATE, RATE, RATE), "q")
    assert gov.store.breaker_get("search").state is lg.governor.BreakerState.CLOSED


def test_throttles_end_at_the_wait_limit(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(model_max_wait_s=10), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    model = Model(forever=RATE)
    with gov.task("t"), pytest.raises(lg.TransientError) as err:
        gov.call_model("openai:gpt-4o", model, "hi")
    assert sum(clock.sleeps) <= 10.0 and len(model.prompts) == 1 + len(clock.sleeps)
    assert "longer than the call may wait" in err.value.info.advice


def test_a_retry_after_beyond_the_wait_limit_hands_back_at_once(gov: lg.Governor, clock: VirtualClock) -> None:
    slow = ProviderError(429, "rate_limit_exceeded", "Rate limit reached", {"retry-after": "600"})
    model = Model(forever=slow)
    with gov.task("t"), pytest.raises(lg.TransientError) as err:
        gov.call_model("openai:gpt-4o", model, "hi")
    assert len(model.prompts) == 1 and clock.sleeps == []
    assert "pause of 600s" in err.value.info.advice


def test_a_tool_throttle_keeps_the_tool_retry_rules(gov: lg.Governor, clock: VirtualClock) -> None:
    """Tools do not wait by default (the model may do something else meanwhile): a
    throttle is a transient attempt like any other, unless ToolPolicy(max_wait_s=...)."""
    tool = Model(forever=RATE)
    with pytest.raises(lg.TransientError):
        gov.call("search", tool, "q")
    assert len(tool.prompts) == 3
    waiting = lg.Governor(
        lg.GovernorConfig(tools={"search": lg.ToolPolicy(max_wait_s=20)}), clock=clock, sleep=clock.sleep
    )
    tool = Model(*[RATE] * 5)
    assert waiting.call("search", tool, "q")["content"] == "answer" and len(tool.prompts) == 6
    side_effect = lg.Governor(
        lg.GovernorConfig(tools={"send": lg.ToolPolicy(retry=False, max_wait_s=20)}), clock=clock, sleep=clock.sleep
    )
    tool = Model(RATE)
    with pytest.raises(lg.TransientError):
        side_effect.call("send", tool, "q")  # retry=False: never repeated, whatever max_wait_s says
    assert len(tool.prompts) == 1


def test_an_overload_burst_is_waited_out_and_opens_the_breaker_meanwhile(gov: lg.Governor, clock: VirtualClock) -> None:
    """Five 529s in a row: a fault the breaker counts (it opens, sparing the provider),
    and one that waiting ends: the call waits out the cooldown, probes and answers."""
    overloaded = ProviderError(529, "overloaded_error", "Overloaded")
    model = Model(*[overloaded] * 5)
    with gov.task("t") as task:
        assert gov.call_model("anthropic:claude", model, "hi")["content"] == "answer"
        assert gov.store.budget_used(task.task_id) == 0
    assert len(model.prompts) == 6 and clock() >= 60.0
    assert gov.store.breaker_get("model:anthropic:claude").state is lg.governor.BreakerState.CLOSED


@pytest.mark.parametrize(
    ("error", "throttled", "overloaded"),
    [
        (RATE, True, False),
        (ProviderError(400, "ThrottlingException", "Rate exceeded"), True, False),
        (HTTPError(429, "Too Many Requests"), True, False),
        (ProviderError(529, "overloaded_error", "Overloaded"), False, True),
        (HTTPError(503, "The engine is currently overloaded, please try again later"), False, True),
        (QUOTA, False, False),  # fatal: no wait lifts it
        (DOWN, False, False),  # a 500 is a fault, retried max_attempts times
        (HTTPError(503, "service unavailable"), False, False),
    ],
)
def test_throttles_and_overloads_are_told_apart(error: Exception, throttled: bool, overloaded: bool) -> None:
    info = lg.classify(error)
    assert (info.throttled, info.overloaded) == (throttled, overloaded)


def test_a_model_call_over_its_token_limit_waits_its_turn(clock: VirtualClock) -> None:
    """200k TPM allows a 33k-token prompt every ~10 s (the default token burst): the
    later calls wait their turn instead of failing the run."""
    gov = lg.Governor(
        lg.GovernorConfig(models={"openai": lg.ModelPolicy(rpm=500, tpm=200_000)}), clock=clock, sleep=clock.sleep
    )
    sent: list[float] = []
    with gov.task("agent"):
        for _ in range(3):
            gov.call_model("openai:gpt-4o", _sent_at(clock, sent), "m", estimated_tokens=33_000)
    assert len(sent) == 3 and sent[1] - sent[0] == pytest.approx(9.9, abs=0.2)


def test_prompts_above_the_token_burst_stay_within_the_token_limit(clock: VirtualClock) -> None:
    gov = lg.Governor(
        lg.GovernorConfig(models={"openai": lg.ModelPolicy(rpm=500, tpm=200_000)}), clock=clock, sleep=clock.sleep
    )
    sent: list[float] = []
    for _ in range(4):
        gov.call_model("openai:gpt-4o", _sent_at(clock, sent), "m", estimated_tokens=60_000)
    minutes = (sent[-1] - sent[0]) / 60
    # each is charged all the tokens it used (its usage: the 60k estimate is settled to 33.1k)
    assert 33_100 * (len(sent) - 1) / minutes <= 200_000 * 1.01


def _sent_at(clock: VirtualClock, sent: list[float]) -> Any:
    def call(_messages: object) -> dict[str, object]:
        sent.append(clock())
        clock.advance(1.0)
        return {"usage": {"prompt_tokens": 33_000, "completion_tokens": 100}}

    return call


def test_context_length_exceeded_retries_once_on_the_compacted_prompt(gov: lg.Governor) -> None:
    model = Model(OVERFLOW)
    with gov.task("t"):
        result = gov.call_model("openai:gpt-4o", model, ["a" * 100, "b" * 100, "c"], compact=lambda p: p[-1:])
    assert result["content"] == "answer"
    assert model.prompts == [["a" * 100, "b" * 100, "c"], ["c"]]


def test_context_length_exceeded_without_compaction_is_permanent(gov: lg.Governor) -> None:
    model = Model(forever=OVERFLOW)
    with gov.task("t"), pytest.raises(lg.PermanentError) as err:
        gov.call_model("openai:gpt-4o", model, "long")
    assert len(model.prompts) == 1 and err.value.info.code == "context_length_exceeded"
    with gov.task("u"), pytest.raises(lg.PermanentError):  # compacting once more does not help
        gov.call_model("openai:gpt-4o", model, "long", compact=lambda p: p[:1])
    assert model.prompts[1:] == ["long", "l"]


def test_the_retry_budget_is_shared_with_tool_calls(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(task_retry_budget=2), clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    tool = Model(DOWN, DOWN)
    model = Model(forever=DOWN)
    with gov.task("t"):
        gov.call("search", tool, "q")  # two retries spent by the tool
        with pytest.raises(lg.TransientError) as err:
            gov.call_model("openai:gpt-4o", model, "hi")
    assert len(model.prompts) == 1 and "retry budget" in (err.value.info.advice or "")


def test_token_budget_stops_the_next_model_call(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_tokens=250), clock=clock, sleep=clock.sleep)
    model = Model(tokens=100)
    with gov.task("t"), pytest.raises(lg.BudgetExhaustedError) as spent:
        for _ in range(10):
            gov.call_model("openai:gpt-4o", model, "hi")
    assert len(model.prompts) == 3 and spent.value.info.code == "max_tokens"  # 110 + 110 + 110 >= 250


def test_missing_usage_is_estimated_and_still_budgeted(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_tokens=1000), clock=clock, sleep=clock.sleep)
    seen: list[dict[str, Any]] = []
    gov.subscribe(seen.append)
    calls = []

    def silent(prompt: str) -> str:  # a stream without usage: nothing to read
        calls.append(prompt)
        return "answer"

    with gov.task("t"), pytest.raises(lg.BudgetExhaustedError):
        for _ in range(10):
            gov.call_model("openai:gpt-4o", silent, "hi", estimated_tokens=lambda: 400)
    assert len(calls) == 3
    assert [e["input_tokens"] for e in seen if e["event"] == "usage_estimated"] == [400, 400, 400]
    answered = [e for e in model_calls(seen) if e["status"] == "ok"]
    assert len(answered) == 3 and all(e["usage_estimated"] for e in answered)


def test_custom_usage_reader_wins(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_tokens=50), clock=clock, sleep=clock.sleep)
    with gov.task("t"), pytest.raises(lg.BudgetExhaustedError):
        for _ in range(3):
            gov.call_model("m", lambda p: p, "hi", usage=lambda _r: Usage(60, 0))
    assert gov.config.max_tokens == 50


def test_request_and_token_rate_limits_pace_model_calls_on_virtual_time(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(models={"openai": lg.ModelPolicy(rpm=120, rpm_burst=1, tpm=6000, tpm_burst=500)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    model = Model()
    start = clock()
    for _ in range(3):  # 2 requests/s: 1 at once, then every 0.5 s
        gov.call_model("openai:gpt-4o", model, "hi")
    assert clock() - start == pytest.approx(1.0)
    start = clock()
    model = Model(tokens=390)  # 390 prompt + 10 completion tokens: the estimate is right
    for _ in range(2):  # 100 tokens/s, 400-token calls: the second waits (400 - 100) / 100 s
        gov.call_model("openai:gpt-4o-mini", model, "hi", estimated_tokens=400)
    assert clock() - start == pytest.approx(3.0, abs=0.6)


def test_async_twin_makes_the_same_decisions(gov: lg.Governor, clock: VirtualClock) -> None:
    model = Model(RATE, OVERFLOW)

    async def run() -> Any:
        async def compact(prompt: list[str]) -> list[str]:
            return prompt[-1:]

        async with gov.task("t"):
            return await gov.acall_model("openai:gpt-4o", model.acall, ["x", "y"], compact=compact)

    assert asyncio.run(run())["content"] == "answer"
    assert model.prompts == [["x", "y"], ["x", "y"], ["y"]]
    assert [s for s in clock.sleeps if s] == [2.0]  # the rate limit backed off; the compaction did not


# -- issue 17: each attempt is classified on its own; cancellation propagates ----------------


def test_a_permanent_failure_on_a_retry_is_permanent(gov: lg.Governor) -> None:
    tool = Model(HTTPError(503), FileNotFoundError("no such file: report.txt"))
    with gov.task("t"):
        with pytest.raises(lg.PermanentError) as err:
            gov.call("read", tool, "report.txt")
        assert len(tool.prompts) == 2
        assert "report.txt" in err.value.info.message and err.value.info.status is None
        with pytest.raises(lg.PermanentError):
            gov.call("read", tool, "report.txt")  # known-bad now: not called again
        assert len(tool.prompts) == 2


def test_credentials_expiring_during_a_retry_are_fatal(gov: lg.Governor) -> None:
    class NoCredentialsError(Exception):  # botocore's name for it
        pass

    tool = Model(HTTPError(503), NoCredentialsError("Unable to locate credentials"))
    with gov.task("t"), pytest.raises(lg.FatalError):
        gov.call("s3_get", tool, "bucket/key")
    assert len(tool.prompts) == 2


def test_cancellation_during_a_retry_propagates_at_once(gov: lg.Governor) -> None:
    real = lg.Governor()  # real asyncio sleeps: wait_for must win
    calls = []

    async def flaky() -> str:
        calls.append(1)
        await asyncio.sleep(0.05)
        raise HTTPError(503)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(real.acall("search", flaky), 0.2)
        assert loop.time() - started < 0.6

    asyncio.run(main())
    assert len(calls) <= 2
    assert real.store.breaker_get("search").failures <= 1  # the cancelled attempt is not a failure


def test_a_cancelled_task_is_cancelled_not_finished(gov: lg.Governor) -> None:
    async def hangs() -> str:
        await asyncio.Event().wait()
        return "never"

    async def main() -> None:
        task = asyncio.create_task(gov.acall("search", hangs))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())
    assert gov.store.breaker_get("search").failures == 0


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(1)], ids=["KeyboardInterrupt", "SystemExit"])
def test_interpreter_exits_propagate_from_a_retry_and_are_not_failures(gov: lg.Governor, exc: BaseException) -> None:
    tool = Model(HTTPError(503), exc)
    with gov.task("t"), pytest.raises(type(exc)):
        gov.call("search", tool, "q")
    assert len(tool.prompts) == 2
    assert gov.store.breaker_get("search").failures == 1  # the 503 only


def test_cancellation_is_never_classified_as_retryable() -> None:
    for exc in (asyncio.CancelledError(), KeyboardInterrupt(), SystemExit(0), GeneratorExit()):
        info = lg.classify(exc)
        assert info.error_type == "fatal" and info.retryable is False and info.code == "cancelled"


def test_a_broken_compactor_is_not_mistaken_for_the_model_failing(gov: lg.Governor) -> None:
    def broken_compactor(_prompt: Any) -> Any:
        raise RuntimeError("compactor bug")

    model = Model(OVERFLOW)
    with gov.task("t"), pytest.raises(lg.PermanentError) as err:
        gov.call_model("m", model, "p", compact=broken_compactor)
    assert "maximum context length" in err.value.info.message  # the provider's error, not the compactor's
    assert len(model.prompts) == 1
