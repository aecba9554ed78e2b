"""The governed call: what a user relies on when a tool fails."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg


def test_success_returns_value_and_calls_once(gov: lg.Governor) -> None:
    backend = Backend()
    assert gov.call("search", backend, "q") == "ok"
    assert backend.calls == 1


def test_transient_twice_then_ok_retries_with_seed_backoff(gov: lg.Governor, clock: VirtualClock) -> None:
    backend = Backend(HTTPError(503), HTTPError(503))
    with gov.task("t"):
        assert gov.call("search", backend) == "ok"
    assert backend.calls == 3
    # min(8, 0.8 * 2**n) * (0.5 + 0.5 * 0.5) with random() = 0.5
    assert clock.sleeps == pytest.approx([0.6, 1.2])


def test_transient_forever_gives_one_structured_outcome(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(503, "service unavailable"))
    with gov.task("t"), pytest.raises(lg.TransientError) as err:
        gov.call("search", backend)
    assert backend.calls == 3
    body = json.loads(err.value.info.to_model_text("json"))["error"]
    assert body["type"] == "transient"
    assert body["attempts"] == 3
    assert body["outcome"] == "retries exhausted: 3 attempts"
    assert "retryable" not in body  # not "transient" beside "retryable": false
    assert "search" in body["advice"]


def test_permanent_is_not_retried_and_becomes_known_bad(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(404, "document 42 not found"))
    with gov.task("t"):
        with pytest.raises(lg.PermanentError) as first:
            gov.call("fetch_doc", backend, doc=42)
        with pytest.raises(lg.PermanentError) as second:
            gov.call("fetch_doc", backend, doc=42)
        assert backend.calls == 1  # the identical call did not run again
        # the same outcome; only the advice counts down to the stop (issue 16)
        assert first.value.info.model_copy(update={"advice": None}) == second.value.info.model_copy(
            update={"advice": None}
        )
        first_advice, second_advice = first.value.info.advice or "", second.value.info.advice or ""
        assert "2 more identical calls failing the same way withdraw fetch_doc" in first_advice
        assert "the next identical call failing the same way withdraws fetch_doc" in second_advice
        with pytest.raises(lg.PermanentError):
            gov.call("fetch_doc", backend, doc=43)  # other arguments do run
        assert backend.calls == 2


def test_known_bad_is_per_task(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(404))
    for task in ("a", "b"):
        with gov.task(task), pytest.raises(lg.PermanentError):
            gov.call("fetch_doc", backend, 1)
    assert backend.calls == 2


def test_fatal_raises_fatal_error_without_retry(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(401, "invalid api key sk-abcdefghijklmnopqrstuv"))
    with pytest.raises(lg.FatalError) as err:
        gov.call("search", backend)
    assert backend.calls == 1
    assert "sk-abcdefghijklmnop" not in err.value.info.to_model_text()


def test_quota_429_is_fatal_not_retried(gov: lg.Governor) -> None:
    exc = HTTPError(429, "You exceeded your current quota, please check your plan and billing details.")
    backend = Backend(forever=exc)
    with pytest.raises(lg.FatalError):
        gov.call("llm_tool", backend)
    assert backend.calls == 1


def test_task_retry_budget_is_shared_by_all_tools(gov: lg.Governor) -> None:
    backends = {tool: Backend(forever=HTTPError(503)) for tool in "abcd"}
    with gov.task("t"):
        for tool, backend in backends.items():
            with pytest.raises(lg.TransientError):
                gov.call(tool, backend)
    # budget 6 retries: a, b and c use 2 each; d gets its first attempt only.
    assert [b.calls for b in backends.values()] == [3, 3, 3, 1]
    fresh = Backend(forever=HTTPError(503))
    with gov.task("another"), pytest.raises(lg.TransientError):
        gov.call("e", fresh)
    assert fresh.calls == 3  # a new task has its own budget


def test_budget_exhaustion_stops_retries_and_says_so(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(task_retry_budget=1), clock=clock, sleep=clock.sleep, random=lambda: 0.0)
    backend = Backend(forever=HTTPError(503))
    with gov.task("t"):
        with pytest.raises(lg.TransientError):
            gov.call("a", backend)
        assert backend.calls == 2
        with pytest.raises(lg.TransientError) as err:
            gov.call("b", backend)
    assert backend.calls == 3
    assert "budget" in (err.value.info.advice or "")


def test_breaker_opens_after_threshold_and_refuses_without_calling(gov: lg.Governor, clock: VirtualClock) -> None:
    backend = Backend(forever=HTTPError(503))
    with gov.task("t"):
        for _ in range(2):
            with pytest.raises(lg.TransientError):
                gov.call("search", backend)
    assert backend.calls == 5  # 3 + 2: the 5th failure opened the breaker mid-retry
    with gov.task("t2"), pytest.raises(lg.CircuitOpenError) as err:
        gov.call("search", backend)
    assert backend.calls == 5
    assert err.value.info.retry_after == pytest.approx(60.0, abs=1.0)
    assert gov.breaker_state("search") is lg.governor.BreakerState.OPEN


def test_breaker_half_open_probe_success_closes(gov: lg.Governor, clock: VirtualClock) -> None:
    failing = Backend(forever=HTTPError(503))
    with gov.task("t"):
        for _ in range(2):
            with pytest.raises(lg.TransientError):
                gov.call("search", failing)
    clock.advance(61)
    healthy = Backend()
    assert gov.call("search", healthy) == "ok"
    assert gov.store.breaker_get("search").state.value == "closed"


def test_breaker_half_open_probe_failure_reopens(gov: lg.Governor, clock: VirtualClock) -> None:
    failing = Backend(forever=HTTPError(503))
    with gov.task("t"):
        for _ in range(2):
            with pytest.raises(lg.TransientError):
                gov.call("search", failing)
    clock.advance(61)
    before = failing.calls
    with pytest.raises(lg.TransientError):
        gov.call("search", failing)
    assert failing.calls == before + 1  # the probe only; no retries through a re-opened breaker
    with pytest.raises(lg.CircuitOpenError):
        gov.call("search", failing)


def test_tool_failing_forever_called_ten_times_reaches_backend_at_most_eight(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(503))
    outcomes = []
    with gov.task("t"):
        for _ in range(10):
            with pytest.raises(lg.AgentToolError) as err:
                gov.call("search", backend)
            outcomes.append(type(err.value).__name__)
    assert backend.calls <= 8
    assert "CircuitOpenError" in outcomes or "LoopDetectedError" in outcomes


def test_repeated_error_signature_triggers_loop_detected(gov: lg.Governor) -> None:
    def parse(text: str) -> None:
        raise ValueError(f"cannot parse record 'row-{len(text)}' at line {len(text) * 7}")

    with gov.task("t"):
        errors = []
        for text in ("a", "bb", "ccc"):  # the text revised, the error the same but for its numbers
            with pytest.raises(lg.PermanentError) as err:
                gov.call("parse", parse, text=text)
            errors.append(err.value)
    assert not isinstance(errors[0], lg.LoopDetectedError)
    assert not isinstance(errors[1], lg.LoopDetectedError)
    assert isinstance(errors[2], lg.LoopDetectedError)
    assert errors[2].info.count == 3
    assert "do not repeat it unchanged" in (errors[2].info.advice or "")


def test_model_insisting_on_known_bad_call_is_told_to_stop(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(404))
    with gov.task("t"):
        raised = []
        for _ in range(3):  # told, answered from memory, withdrawn
            with pytest.raises(lg.PermanentError) as err:
                gov.call("fetch_doc", backend, 7)
            raised.append(err.value)
        assert "fetch_doc is now withdrawn" in (raised[-1].info.advice or "")
        # calling the withdrawn tool ends the run: a FatalError, never a PermanentError
        with pytest.raises(lg.NoProgressError) as stop:
            gov.call("fetch_doc", backend, 7)
    assert backend.calls == 1
    assert isinstance(stop.value, lg.FatalError) and not isinstance(stop.value, lg.PermanentError)
    assert stop.value.code == "repeated_failure"
    assert str(stop.value).startswith("loop-governor stopped the run: fetch_doc (repeated_failure): ")


def test_retry_after_is_honoured_up_to_the_cap(gov: lg.Governor, clock: VirtualClock) -> None:
    backend = Backend(HTTPError(429, "slow down", {"Retry-After": "5"}))
    assert gov.call("search", backend) == "ok"
    assert clock.sleeps == [5.0]
    long_wait = Backend(forever=HTTPError(429, "slow down", {"Retry-After": "120"}))
    with pytest.raises(lg.TransientError) as err:
        gov.call("other", long_wait)
    assert long_wait.calls == 1  # asked to wait past the cap: hand back at once
    assert err.value.info.retry_after == 120


def test_tool_policy_never_retries_side_effect_tools(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(tools={"send_email": lg.ToolPolicy(retry=False)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    backend = Backend(forever=TimeoutError("smtp timed out"))
    with pytest.raises(lg.TransientError):
        gov.call("send_email", backend)
    assert backend.calls == 1


def test_unknown_errors_follow_config(clock: VirtualClock) -> None:
    class Weird(Exception):
        pass

    gov = lg.Governor(clock=clock, sleep=clock.sleep)
    backend = Backend(forever=Weird("???"))
    with pytest.raises(lg.PermanentError):
        gov.call("t", backend)
    assert backend.calls == 1
    gov2 = lg.Governor(lg.GovernorConfig(unknown_error="transient"), clock=clock, sleep=clock.sleep)
    backend2 = Backend(forever=Weird("???"))
    with pytest.raises(lg.TransientError):
        gov2.call("t", backend2)
    assert backend2.calls == 3


def test_user_rules_win_over_builtin_heuristics(clock: VirtualClock) -> None:
    gov = lg.Governor(clock=clock, sleep=clock.sleep, rules=[lg.Rule("transient", status=404)])
    backend = Backend(HTTPError(404))  # eventually consistent store: 404 means "not yet"
    assert gov.call("read", backend) == "ok"
    assert backend.calls == 2


def test_max_steps_caps_tool_calls_and_keeps_partial_results(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_steps=4), clock=clock, sleep=clock.sleep)
    backend = Backend()
    with gov.task("t") as scope:
        with pytest.raises(lg.BudgetExhaustedError) as err:
            for i in range(10):
                scope.add_result(gov.call("step", backend, i))
    assert backend.calls == 4
    # add_result's values first, then the task's successful tool results
    assert err.value.partial_results == ["ok"] * 4 + [{"tool": "step", "result": "ok"}] * 4
    assert isinstance(err.value, lg.FatalError)


def test_events_report_final_outcome_and_retries(gov: lg.Governor) -> None:
    events: list[dict] = []
    gov.subscribe(events.append)
    with gov.task("t"):
        gov.call("search", Backend(HTTPError(503)))
    kinds = [e["event"] for e in events]
    assert kinds == ["task_start", "retry", "tool_call", "task_end"]
    call = events[2]
    assert call["status"] == "ok" and call["attempts"] == 2 and call["task_id"] == "t"


def test_failing_subscriber_never_breaks_the_call(gov: lg.Governor) -> None:
    def broken(_: dict) -> None:
        raise RuntimeError("sink down")

    gov.subscribe(broken)
    assert gov.call("search", Backend()) == "ok"
    assert gov.sink_failures >= 1


def test_async_twin_makes_the_same_decisions(gov: lg.Governor, clock: VirtualClock) -> None:
    async def main() -> None:
        ok = Backend(HTTPError(503), HTTPError(503))
        async with gov.task("t"):
            assert await gov.acall("search", ok.acall) == "ok"
            assert ok.calls == 3
            bad = Backend(forever=HTTPError(404))
            for _ in range(2):
                with pytest.raises(lg.PermanentError):
                    await gov.acall("doc", bad.acall, 1)
            assert bad.calls == 1
            with pytest.raises(lg.FatalError):
                await gov.acall("auth", Backend(forever=HTTPError(401)).acall)

    asyncio.run(main())
    assert clock.sleeps == pytest.approx([0.6, 1.2])


def test_task_scope_follows_asyncio_tasks(gov: lg.Governor) -> None:
    async def worker(name: str) -> str | None:
        async with gov.task(name):
            await asyncio.sleep(0)
            scope = gov.current_task()
            return scope.task_id if scope else None

    async def main() -> list[str | None]:
        return list(await asyncio.gather(worker("a"), worker("b")))

    assert asyncio.run(main()) == ["a", "b"]
    assert gov.current_task() is None


def test_64_threads_at_cooldown_expiry_admit_exactly_one_probe() -> None:
    clock = VirtualClock()
    gov = lg.Governor(clock=clock, sleep=lambda s: None)
    gov.store.breaker_force("svc", "open", clock())
    clock.advance(60.5)
    barrier = threading.Barrier(64)
    calls = []
    release = threading.Event()
    results: list[str] = []
    lock = threading.Lock()

    def slow_probe() -> str:
        calls.append(1)
        release.wait(5)
        return "ok"

    def worker() -> None:
        barrier.wait()
        try:
            gov.call("svc", slow_probe)
            outcome = "probe"
        except lg.CircuitOpenError:
            outcome = "refused"
        with lock:
            results.append(outcome)
        if outcome == "refused" and len(results) == 63:
            release.set()

    threads = [threading.Thread(target=worker) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1
    assert sorted(results).count("probe") == 1
    assert gov.store.breaker_get("svc").state.value == "closed"
