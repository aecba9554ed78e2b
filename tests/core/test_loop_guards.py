"""Loop guards: no-progress detection, token/cost/time budgets, rate limits."""

from __future__ import annotations

import pytest
from lg_testing import Backend, VirtualClock

import loop_governor as lg
from loop_governor.policies.progress import ProgressGuard

VERDICT = "The draft still lacks citations for claims 2 and 5; revise and resubmit."


def test_never_satisfied_critic_is_warned_withdrawn_then_stopped(gov: lg.Governor) -> None:
    calls = []

    def critic(draft: str) -> str:
        calls.append(draft)
        return VERDICT

    seen = []
    with gov.task("t") as scope:
        scope.add_result("draft 0")
        with pytest.raises(lg.NoProgressError) as err:
            for _ in range(100):  # a model that would go on forever, resubmitting the same draft
                seen.append(gov.call("critic", critic, "draft 1"))
    # warned at the 3rd identical verdict; the 4th withdraws the critic; calling it anyway ends the task
    assert len(calls) == 4 and len(seen) == 4
    assert seen[:2] == [VERDICT, VERDICT]
    assert "verdict has not changed" in seen[2] and "final answer" in seen[2]
    assert "the next identical verdict withdraws critic from your tools" in seen[2]
    assert "critic is now withdrawn" in seen[3] and "Calling it again ends the task" in seen[3]
    assert scope.withdrawn.keys() == {"critic"}
    assert isinstance(err.value, lg.FatalError) and not isinstance(err.value, lg.PermanentError)
    assert err.value.code == "no_progress" and "ToolPolicy(poll=True)" in err.value.info.message
    # what add_result recorded first, then the task's successful tool results (redacted text)
    assert err.value.partial_results[0] == "draft 0"
    assert [r["tool"] for r in err.value.partial_results[1:]] == ["critic"] * 4
    assert err.value.partial_results[1]["result"] == VERDICT


def test_a_verdict_that_changes_only_a_number_or_time_is_no_progress(gov: lg.Governor) -> None:
    verdicts = iter(f"score {6 + i % 3}/10 at 12:0{i}:0{i}: the conclusion is still weak" for i in range(100))
    ran = []
    with gov.task("t"), pytest.raises(lg.NoProgressError) as err:
        for _ in range(100):
            gov.call("critic", lambda draft: ran.append(draft) or next(verdicts), "the same draft")
    assert err.value.info.code == "no_progress" and len(ran) == 4


def test_a_new_question_with_an_answer_alike_but_for_numbers_is_progress(gov: lg.Governor) -> None:
    cities = ["Paris", "London", "Berlin", "Madrid", "Rome", "Oslo", "Vienna", "Prague", "Lisbon", "Dublin"]
    with gov.task("t"):
        for i, city in enumerate(cities):
            answer = gov.call("get_weather", lambda c, i=i: f"Sunny, {10 + i} C, wind {i} km/h", city)
            assert "loop-governor" not in answer  # not even warned: five cities are five answers
        for i in range(10):  # the critic gets a new draft each round: a different question each time
            verdict = gov.call("critic", lambda d, i=i: f"score {i}/10: the conclusion is weak", f"draft {i}")
            assert "loop-governor" not in verdict


def test_changing_verdicts_and_trivial_results_are_progress(gov: lg.Governor) -> None:
    with gov.task("t"):
        words = "citations tone structure length examples sources figures spelling grammar intro".split()
        for i in range(10):
            gov.call("critic", lambda d: f"the {words[d]} needs work", i)  # a new verdict every time
        for i in range(10):
            assert gov.call("sed", lambda f: "0", f"file{i}.py") == "0"  # edits: a bare exit code, trivial
            assert gov.call("noop", lambda f: "", f"file{i}.py") == ""


def test_identical_call_with_identical_result_repeated(gov: lg.Governor) -> None:
    backend = Backend()
    with gov.task("t"), pytest.raises(lg.NoProgressError) as err:
        for _ in range(10):
            gov.call("ls", backend, "/tmp")
    # warned at the 3rd, withdrawn at the 4th, the next ends the task
    assert backend.calls == 4 and err.value.info.code in {"no_progress", "cycle"}


def test_guard_is_per_task(gov: lg.Governor) -> None:
    for task in ("a", "b", "c"):
        with gov.task(task):
            for i in range(2):
                assert gov.call("critic", lambda d: VERDICT, i) == VERDICT


def test_progress_guard_annotates_message_like_results() -> None:
    class Msg:
        def __init__(self, content: str) -> None:
            self.content = content

        def model_copy(self, update: dict) -> Msg:
            return Msg(update["content"])

    guard = ProgressGuard()
    verdicts = [guard.observe("critic", VERDICT) for _ in range(5)]  # the same question, or none given
    assert [v.action for v in verdicts] == ["ok", "ok", "warn", "repeat", "stop"]
    from loop_governor.policies.ladder import annotate

    original = Msg("x")
    assert annotate(original, "note").content == "x\n\nnote" and original.content == "x"
    assert annotate({"content": "y"}, "n") == {"content": "y\n\nn"}
    assert annotate(42, "n") == 42


def test_token_budget_stops_the_next_step(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_tokens=1000), clock=clock, sleep=clock.sleep)
    with gov.task("t") as scope:
        gov.count_step("model")
        gov.record_usage("m", input_tokens=900, output_tokens=150)
        scope.add_result("partial")
        with pytest.raises(lg.BudgetExhaustedError) as err:
            gov.count_step("model")
    assert err.value.info.code == "max_tokens" and err.value.partial_results == ["partial"]


def test_cost_budget_uses_the_price_table_with_cache_discount(clock: VirtualClock) -> None:
    prices = {"gpt-x": lg.ModelPrice(input=2.0, output=8.0, cache_read=0.5)}
    gov = lg.Governor(lg.GovernorConfig(max_cost=0.01, prices=prices), clock=clock)
    with gov.task("t") as scope:
        gov.record_usage("gpt-x", input_tokens=4000, output_tokens=0, cache_read_tokens=4000)
        assert scope.cost == pytest.approx(4000 * 0.5 / 1e6)
        gov.count_step()
        gov.record_usage("gpt-x", input_tokens=2000, output_tokens=1000)
        with pytest.raises(lg.BudgetExhaustedError, match="max_cost"):
            gov.call("tool", Backend())
    with pytest.raises(ValueError, match="price table"):
        lg.GovernorConfig(max_cost=1.0)


def test_wall_clock_budget(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_wall_s=30), clock=clock, sleep=clock.sleep)
    with gov.task("t"):
        gov.call("tool", Backend())
        clock.advance(31)
        with pytest.raises(lg.BudgetExhaustedError, match="max_wall_s"):
            gov.call("tool", Backend())


def test_shared_rate_limit_paces_calls_on_virtual_time(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(rate_limit_per_s=2.0, rate_burst=1), clock=clock, sleep=clock.sleep)
    backend = Backend()
    start = clock()
    for _ in range(5):
        gov.call("api", backend)
    assert backend.calls == 5
    assert clock() - start == pytest.approx(2.0)  # 1 at once, then one every 0.5 s


def test_rate_limit_wait_past_the_cap_is_a_transient_outcome(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(tools={"slow_api": lg.ToolPolicy(rate_limit_per_s=0.01, rate_burst=1)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    gov.call("slow_api", Backend())
    with pytest.raises(lg.TransientError) as err:
        gov.call("slow_api", Backend())
    assert err.value.info.code == "rate_limited" and err.value.info.retry_after == 100


class _NoRepr:
    """An argument whose repr raises (a half-initialized client, a detached record)."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_an_argument_without_a_repr_does_not_lose_the_tool_result(gov: lg.Governor) -> None:
    """The no-progress guard reads the numbers an argument carries from its repr. A repr
    that raises escaped the governor after the tool had run: its result (and any side
    effect's outcome) was lost to the agent for a guard's bookkeeping."""
    with gov.task("t"):
        results = [
            gov.call("search", lambda page, f: f"the result list has {page} entries of 40", page=page, f=_NoRepr())
            for page in range(1, 3)
        ]
    assert results[1] == "the result list has 2 entries of 40"
