"""The governed call as a chain of policies: what an adversarial review found broken once."""

from __future__ import annotations

import asyncio

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.state.breaker import BreakerState


def _rated_breaker_governor(clock: VirtualClock) -> lg.Governor:
    """One tool with a breaker that opens on one failure and a rate limit of one call per
    10 s; a wait longer than 0.5 s is a refusal."""
    config = lg.GovernorConfig(
        breaker_failure_threshold=1,
        breaker_cooldown_s=9,
        retry_base_delay=0.1,
        retry_max_delay=0.5,
        tools={"svc": lg.ToolPolicy(rate_limit_per_s=0.1, rate_burst=1)},
    )
    return lg.Governor(config, clock=clock, sleep=clock.sleep, asleep=clock.asleep, random=lambda: 0.5)


@pytest.mark.parametrize("use_async", [False, True], ids=["call", "acall"])
def test_a_rate_limit_refusal_takes_no_breaker_probe(clock: VirtualClock, use_async: bool) -> None:
    gov = _rated_breaker_governor(clock)

    def call(fn: Backend) -> str:
        if use_async:
            return asyncio.run(gov.acall("svc", fn.acall))
        return gov.call("svc", fn)

    with pytest.raises(lg.TransientError):
        call(Backend(forever=HTTPError(503)))  # opens the breaker, empties the bucket
    clock.advance(9)  # the breaker may probe now; the bucket holds 0.9 of a token
    with pytest.raises(lg.TransientError) as refused:
        call(Backend())
    assert refused.value.info.code == "rate_limited"
    assert gov.store.breaker_get("svc").state is BreakerState.OPEN  # no probe was taken for it
    clock.advance(1.5)  # the bucket is full again: this call is the probe, and it succeeds
    assert call(Backend()) == "ok"
    assert gov.store.breaker_get("svc").state is BreakerState.CLOSED


def test_a_retry_refused_by_the_rate_limit_spends_no_retry_budget(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(
        retry_base_delay=0.1, retry_max_delay=0.5, tools={"svc": lg.ToolPolicy(rate_limit_per_s=1, rate_burst=1)}
    )
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep, random=lambda: 0.5)
    backend = Backend(forever=HTTPError(503))
    with gov.task("t"):
        with pytest.raises(lg.TransientError) as err:
            gov.call("svc", backend)  # the retry would wait ~0.9 s for a token: refused
        assert err.value.info.attempts == 1 and backend.calls == 1
        assert gov.store.budget_used("t") == 0


@pytest.mark.parametrize("use_async", [False, True], ids=["call_model", "acall_model"])
def test_a_fallback_model_keeps_its_own_rate_limit(clock: VirtualClock, use_async: bool) -> None:
    # the primary has no limits; the fallback's key allows one request every 4 s
    config = lg.GovernorConfig(
        models={"b:backup": lg.ModelPolicy(rpm=15, rpm_burst=1)}, retry_max_attempts=1, breaker_failure_threshold=100
    )
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    sent: list[float] = []

    def down(_messages: object) -> str:
        raise ConnectionError("primary down")

    def backup(_messages: object) -> str:
        sent.append(clock())
        return "ok"

    for _ in range(3):
        if use_async:
            asyncio.run(gov.acall_model("a:primary", down, "hi", fallbacks=[("b:backup", backup)]))
        else:
            gov.call_model("a:primary", down, "hi", fallbacks=[("b:backup", backup)])
    assert [round(t - sent[0], 6) for t in sent] == [0.0, 4.0, 8.0]


def test_parallel_tool_calls_of_one_task_never_crash_the_no_progress_guard(
    gov: lg.Governor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph runs the tool calls of one turn in parallel threads: two trivial results
    ("0" again after "0") both ended the tool's streak, and the second ``del`` raised
    KeyError out of a call whose tool had succeeded. The barrier forces that interleaving."""
    import threading

    from loop_governor.policies import progress

    real = progress.is_trivial
    both_read = threading.Barrier(2, timeout=5)

    def trivial_after_both_read(text: str, limit: int) -> bool:
        both_read.wait()
        return real(text, limit)

    outcomes: list[object] = []

    def call(scope: lg.TaskScope, n: int) -> None:
        with gov.attach(scope):
            try:
                outcomes.append(gov.call("exit_code", lambda _n: "0", n))
            except Exception as exc:  # the defect: a KeyError out of a successful call
                outcomes.append(exc)

    with gov.task("parallel") as scope:
        gov.call("exit_code", lambda _n: "0", 0)
        monkeypatch.setattr(progress, "is_trivial", trivial_after_both_read)
        threads = [threading.Thread(target=call, args=(scope, n)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert outcomes == ["0", "0"]


def test_refusals_of_separate_outages_do_not_add_up_to_a_stop(clock: VirtualClock) -> None:
    """The model makes one call per outage (refused: circuit open), waits, and the tool
    works again: it never repeated a refusal it was told about, so the run goes on."""
    config = lg.GovernorConfig(
        breaker_failure_threshold=2, breaker_cooldown_s=30, retry_max_attempts=1, repeated_error_threshold=100
    )
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    backend = Backend()
    with gov.task("long"):
        for outage in range(4):
            backend.forever = HTTPError(503)
            for _ in range(2):
                with pytest.raises(lg.TransientError):
                    gov.call("api", backend, outage)
            with pytest.raises(lg.CircuitOpenError):
                gov.call("api", backend, outage)  # told: "unavailable; 2 more calls end the task"
            backend.forever = None
            clock.advance(31)
            assert gov.call("api", backend, outage) == "ok"  # recovered
            clock.advance(100)


def test_refusals_while_still_unavailable_withdraw_the_tool_until_it_may_be_back(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(breaker_failure_threshold=1, breaker_cooldown_s=30, retry_max_attempts=1)
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    with gov.task("stubborn"):
        with pytest.raises(lg.TransientError):
            gov.call("api", Backend(forever=HTTPError(503)))
        with pytest.raises(lg.CircuitOpenError):
            gov.call("api", Backend())
        gov.call("other", Backend())  # a success of another tool proves nothing about this one
        with pytest.raises(lg.CircuitOpenError):
            gov.call("api", Backend())
        with pytest.raises(lg.AgentToolError) as withdrawn:  # the ladder: withdrawn while unavailable
            gov.call("api", Backend())
        assert "api is now withdrawn" in (withdrawn.value.info.advice or "")
        with pytest.raises(lg.TransientError) as refused:  # refused meanwhile, never a stop
            gov.call("api", Backend())
        assert refused.value.info.code == "withdrawn"
        clock.advance(31)  # the breaker may let a probe through: the tool is offered again
        assert gov.call("api", Backend()) == "ok"
        assert "api" not in gov.current_task().withdrawn  # type: ignore[union-attr]


class _ContextTooLong(Exception):
    code = "context_length_exceeded"
    status_code = 400


@pytest.mark.parametrize("use_async", [False, True], ids=["call_model", "acall_model"])
def test_a_failing_compactor_leaves_the_context_error_standing(gov: lg.Governor, use_async: bool) -> None:
    events: list[dict[str, object]] = []
    gov.subscribe(events.append)
    sent: list[object] = []

    def model(messages: object) -> str:
        sent.append(messages)
        raise _ContextTooLong("This model's maximum context length is 100 tokens")

    def compact(_messages: object) -> object:
        raise RuntimeError("summarizer backend down")

    with gov.task("t"), pytest.raises(lg.PermanentError) as err:
        if use_async:
            asyncio.run(gov.acall_model("openai:m", model, ["a"] * 10, compact=compact))
        else:
            gov.call_model("openai:m", model, ["a"] * 10, compact=compact)
    assert err.value.info.code == "context_length_exceeded" and len(sent) == 1
    (failed,) = [e for e in events if e["event"] == "model_call"]
    assert failed["status"] == "error"
    (broken,) = [e for e in events if e["event"] == "compaction_failed"]
    assert "RuntimeError" in str(broken["error"])


def test_a_flaky_service_that_keeps_recovering_does_not_end_a_long_run(gov: lg.Governor, clock: VirtualClock) -> None:
    """Two 503s every 20 calls, the service fine in between: each burst is a new
    outage, not the model ignoring advice (its calls succeed again in between)."""
    calls = [0]

    def flaky(q: int) -> str:
        calls[0] += 1
        if calls[0] % 20 in (1, 2):
            raise HTTPError(503)
        return f"answer {q}"

    outcomes = []
    with gov.task("long-running"):
        for q in range(200):
            try:
                outcomes.append(gov.call("search", flaky, q))
            except lg.FatalError:
                raise
            except lg.AgentToolError as err:
                outcomes.append(type(err).__name__)
            clock.advance(60)
    # every burst reaches the model as the service's failure, never as a loop: the service's
    # successes in between start the count over
    assert len(outcomes) == 200 and outcomes.count("TransientError") > 2
    assert "LoopDetectedError" not in outcomes


def test_a_service_down_for_good_is_withdrawn_and_no_longer_called(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(503))
    with gov.task("down") as scope:
        for q in range(20):
            with pytest.raises(lg.TransientError):
                gov.call("search", backend, q)
        assert "search" in scope.withdrawn  # the model is no longer offered it
    assert backend.calls <= 8  # a down service is not hammered: retries, then the breaker
