"""Issue 16 in the core: every soft signal escalates to a hard stop; cycles; call budgets."""

from __future__ import annotations

from typing import Any

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg


def stubborn(gov: lg.Governor, tool: str, fn: Any, *args_per_round: Any, rounds: int = 50) -> list[Any]:
    """Call ``tool`` round after round, ignoring whatever the governor answers."""
    seen: list[Any] = []
    for i in range(rounds):
        args = args_per_round[i % len(args_per_round)] if args_per_round else ()
        try:
            if isinstance(args, dict):
                seen.append(gov.call(tool, fn, **args))
            else:
                seen.append(gov.call(tool, fn, *args))
        except lg.FatalError:
            raise
        except lg.AgentToolError as err:
            seen.append(err)
    return seen


GUARD_EVENTS = frozenset({"cycle", "no_progress", "escalation", "tool_withdrawn", "loop_detected"})


def quiet(gov: lg.Governor) -> list[dict[str, Any]]:
    """The loop-guard events of ``gov`` from now on (a healthy run has none: not a warning,
    not a withdrawal, not a stop)."""
    heard: list[dict[str, Any]] = []
    gov.subscribe(lambda e: heard.append(e) if e["event"] in GUARD_EVENTS else None)
    return heard


def test_a_known_bad_call_repeated_after_the_warning_ends_the_task(gov: lg.Governor) -> None:
    backend = Backend(forever=HTTPError(404, "no such booking ABC123"))
    with gov.task("t") as scope, pytest.raises(lg.NoProgressError) as stop:
        scope.add_result("booking list")
        stubborn(gov, "get_booking", backend, ("ABC123",))
    assert backend.calls == 1
    assert stop.value.info.code == "repeated_failure" and stop.value.partial_results == ["booking list"]


def test_near_identical_failing_calls_end_the_task_after_the_loop_warning(gov: lg.Governor) -> None:
    calls = []

    def book(flight: str, amount: int) -> str:
        calls.append(amount)
        raise HTTPError(409, f"payment of {amount} does not add up for flight {flight}")

    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        stubborn(gov, "book", book, *[{"flight": "UA100", "amount": 100 + i} for i in range(50)])
    # the same booking with another amount each time, failing the same way: 3 failures ->
    # LoopDetectedError (told); 2 more withdraw the tool, the next call ends the task unrun
    assert len(calls) == 5 and stop.value.info.code == "repeated_failure"


def test_calls_about_other_entities_failing_alike_are_no_loop(gov: lg.Governor) -> None:
    calls = []

    def book(flight: str) -> str:
        calls.append(flight)
        raise HTTPError(409, f"flight {flight} is full")

    with gov.task("t"):
        stubborn(gov, "book", book, *[(f"UA{100 + i}",) for i in range(50)])
    assert len(calls) == 50  # fifty flights are fifty questions, whatever they answer


def test_the_first_warning_says_plainly_what_a_repeat_does(gov: lg.Governor) -> None:
    with gov.task("t"):
        with pytest.raises(lg.PermanentError) as first:
            gov.call("get_booking", Backend(forever=HTTPError(404)), "X")
        with pytest.raises(lg.PermanentError) as second:
            gov.call("get_booking", Backend(), "X")
    assert first.value.info.advice.endswith("failing the same way withdraw get_booking from your tools")
    assert "2 more identical calls" in first.value.info.advice
    assert second.value.info.advice.endswith("failing the same way withdraws get_booking from your tools")
    assert "the next identical call" in second.value.info.advice


def test_calls_to_an_open_breaker_after_the_refusal_withdraw_the_tool_and_never_end_the_task(
    gov: lg.Governor, clock: VirtualClock
) -> None:
    down = Backend(forever=HTTPError(503))
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    with gov.task("t"):
        seen = stubborn(gov, "search", down, *[(f"q{i}",) for i in range(50)])
    # a service that is down is withdrawn until it may be back; calls meanwhile are refused
    assert [e["code"] for e in events if e["event"] == "tool_withdrawn"] == ["repeated_refusal"]
    assert all(isinstance(x, lg.TransientError) for x in seen[-40:])
    assert "will be offered again" in (seen[-1].info.advice or "")
    assert down.calls <= gov.config.breaker_failure_threshold  # refused, not called, after it opened


def test_calls_over_a_shared_rate_limit_after_the_refusal_are_refused_until_it_lifts(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(tools={"slow_api": lg.ToolPolicy(rate_limit_per_s=0.01, rate_burst=1)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    backend = Backend()
    with gov.task("t"):
        seen = stubborn(gov, "slow_api", backend, *[(i,) for i in range(50)])
        assert backend.calls == 1 and "slow_api" in gov.current_task().withdrawn  # type: ignore[union-attr]
        clock.advance(200.0)  # the bucket refills and the withdrawal lapses: offered again
        assert gov.call("slow_api", backend, 99) == "ok"
    assert all(isinstance(x, lg.TransientError) for x in seen[1:])


@pytest.mark.parametrize("tool", ["slow_api", "api:slow"])  # MCP-style names hold a colon
def test_a_success_of_the_tool_ends_its_refusals_count(clock: VirtualClock, tool: str) -> None:
    """Refused by the rate limit (told), then the tool answers: the limit lifted, and a
    later refusal is news for the model, told afresh, not the next repeat of the old one."""
    config = lg.GovernorConfig(tools={tool: lg.ToolPolicy(rate_limit_per_s=0.01, rate_burst=1)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    backend = Backend()
    outcomes: list[str] = []
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    with gov.task("t"):
        for i in range(7):
            if i == 2:
                clock.advance(100.0)  # the bucket refills: the next call goes through
            try:
                gov.call(tool, backend, i)
                outcomes.append("ok")
            except lg.AgentToolError as err:
                outcomes.append("withdrawn" if err.info.code == "withdrawn" else "refused")
    # told at the 4th call, withdrawn at the 6th, refused (never a stop) at the 7th
    assert outcomes == ["ok", "refused", "ok", "refused", "refused", "refused", "withdrawn"]
    assert [e["event"] for e in events].count("tool_withdrawn") == 1
    assert backend.calls == 2


def test_per_tool_escalation_override(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(tools={"lookup": lg.ToolPolicy(escalation_repeats=4)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    attempts = {}
    for tool in ("lookup", "other"):
        attempts[tool] = 0
        with gov.task(tool), pytest.raises(lg.NoProgressError):
            for _ in range(50):
                attempts[tool] += 1
                try:
                    gov.call(tool, Backend(forever=HTTPError(404)), "k")
                except lg.FatalError:
                    raise
                except lg.AgentToolError:
                    pass
    assert attempts == {"lookup": 1 + 4 + 1, "other": 1 + 2 + 1}  # told, N more withdraw it, the next ends it


@pytest.mark.parametrize(
    ("name", "calls", "expected"),
    [
        ("A-B", [("search", "q"), ("open", "u")], 6),
        ("A-B-C", [("search", "q"), ("open", "u"), ("summarize", "s")], 8),
        ("A-B-C-D", [("search", "q"), ("open", "u"), ("summarize", "s"), ("save", "f")], 10),
        ("within one tool", [("bash", "pytest -x"), ("bash", "git diff")], 6),
    ],
)
def test_cycles_with_unchanged_results_end_the_task(
    gov: lg.Governor, name: str, calls: list[tuple[str, str]], expected: int
) -> None:
    made = []
    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for i in range(100):
            tool, arg = calls[i % len(calls)]
            made.append(tool)
            gov.call(tool, lambda a: f"the same output for {a.split()[0]}", arg)
    # warned when the cycle first repeated in full, its tools withdrawn the step after, the
    # next call of one ends the task
    assert len(made) == expected and stop.value.info.code == "cycle"


def test_a_cycle_whose_results_change_is_progress(gov: lg.Governor) -> None:
    counter = iter(range(1000))
    heard = quiet(gov)
    with gov.task("t"):
        for i in range(40):  # the same two calls, each time with new results: polling that moves
            gov.call("status" if i % 2 else "fetch", lambda a: f"new rows: {'x' * next(counter)}", "job-7")
    assert heard == []  # not warned, not withdrawn, not stopped


def test_walking_a_pager_that_keeps_returning_nothing_is_no_progress(gov: lg.Governor) -> None:
    pages = []
    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for page in range(100):
            pages.append(page)
            gov.call("list_orders", lambda **kw: "[]", customer="c1", page=page, limit=50)
    assert len(pages) == 5 and stop.value.info.code == "cycle"


def test_walking_a_pager_through_real_results_is_progress(gov: lg.Governor) -> None:
    heard = quiet(gov)
    with gov.task("t"):
        for page in range(30):
            gov.call("list_orders", lambda **kw: f"[order-{kw['page'] * 2}, order-{kw['page'] * 2 + 1}]", page=page)
    assert heard == []  # not warned, not withdrawn, not stopped


def test_a_batch_whose_results_echo_the_item_is_progress(gov: lg.Governor) -> None:
    heard = quiet(gov)
    with gov.task("t"):
        for item in range(30):  # results differ only in a number, the number the call asked for
            gov.call("process", lambda n: f"item {n}: processed and stored in the archive", item)
    assert heard == []  # not warned, not withdrawn, not stopped


def test_a_failing_call_inside_a_cycle_counts_too(gov: lg.Governor) -> None:
    def flaky(q: str) -> str:
        raise HTTPError(400, "query too broad")

    with gov.task("t"), pytest.raises(lg.NoProgressError):
        for i in range(50):
            try:
                if i % 2:
                    gov.call("refine", lambda q: "try narrower terms", "x")
                else:
                    gov.call("search", flaky, f"broad {i}")
            except lg.AgentToolError as err:
                if isinstance(err, lg.FatalError):
                    raise


def test_cycle_detection_can_be_switched_off(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(cycle_detection=False), clock=clock, sleep=clock.sleep)
    heard = quiet(gov)
    with gov.task("t"):
        for i in range(20):
            gov.call("search" if i % 2 else "open", lambda a: "same", "x")
    assert heard == []  # not warned, not withdrawn, not stopped


# -- iteration and call budgets ---------------------------------------------------------------


def test_max_tool_calls_and_per_tool_max_calls_are_hard_stops(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(max_tool_calls=5, tools={"send_email": lg.ToolPolicy(max_calls=2)})
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    with gov.task("t"), pytest.raises(lg.BudgetExhaustedError) as spent:
        for i in range(10):
            gov.call("send_email", lambda to: "sent", f"user{i}@example.com")
    assert spent.value.info.code == "max_calls"
    with gov.task("u"), pytest.raises(lg.BudgetExhaustedError) as spent:
        for i in range(10):
            gov.call("search", lambda q: f"result {q}", f"q{i}")
    assert spent.value.info.code == "max_tool_calls" and spent.value.info.message.endswith("(used 5)")


def test_max_model_calls_is_a_hard_stop(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_model_calls=3), clock=clock, sleep=clock.sleep)
    answered = []
    with gov.task("t"), pytest.raises(lg.BudgetExhaustedError) as spent:
        for i in range(10):
            answered.append(gov.call_model("m", lambda p: "ok", i))
    assert len(answered) == 3 and spent.value.info.code == "max_model_calls"


def test_max_steps_counts_iterations_not_calls(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(max_steps=2), clock=clock, sleep=clock.sleep)
    with gov.task("t") as scope, pytest.raises(lg.BudgetExhaustedError):
        for turn in range(10):
            gov.call_model("m", lambda p: "calls two tools", turn)  # one decision ...
            gov.call("search", lambda q: f"r{q}", turn)  # ... and the tool calls it asked for
            gov.call("open", lambda q: f"p{q}", turn)
    assert scope.model_calls == 2 and scope.tool_calls == 4 and scope.steps == 2


# -- tools with state (a shell): a success with other arguments starts over ---------------------


def test_a_success_of_the_same_tool_retires_its_known_bad_calls(gov: lg.Governor) -> None:
    """A coding agent re-runs its reproduction script after an edit: it may pass now."""
    state = {"fixed": False}

    def bash(command: str) -> str:
        if command == "python reproduce.py" and not state["fixed"]:
            raise HTTPError(400, "AssertionError: expected 3, got 2")
        if command.startswith("sed -i"):
            state["fixed"] = True
        return "ok"

    with gov.task("t"):
        with pytest.raises(lg.PermanentError):
            gov.call("bash", bash, "python reproduce.py")
        assert gov.call("bash", bash, "sed -i 's/2/3/' calc.py") == "ok"
        assert gov.call("bash", bash, "python reproduce.py") == "ok"  # ran again, and passes now


def test_a_stateless_tool_keeps_its_known_bad_calls(clock: VirtualClock) -> None:
    gov = lg.Governor(lg.GovernorConfig(tools={"fetch": lg.ToolPolicy(stateless=True)}), clock=clock, sleep=clock.sleep)
    backend = Backend(HTTPError(404, "gone"))
    with gov.task("t"):
        with pytest.raises(lg.PermanentError):
            gov.call("fetch", backend, "/gone")
        gov.call("fetch", lambda url: "page", "/other")
        with pytest.raises(lg.PermanentError):
            gov.call("fetch", backend, "/gone")
    assert backend.calls == 1


def test_failures_alike_from_different_commands_are_not_one_loop(gov: lg.Governor) -> None:
    """A shell's commands fail with one signature ("Traceback ...", an empty output): that
    is not the model repeating itself; the same command but for a number is."""

    def bash(command: str) -> str:
        raise HTTPError(400, "Traceback (most recent call last):\n  File x\nValueError: bad")

    with gov.task("t"):
        for command in ("python a.py", "python -m pytest b", "python c.py --fast", "python d.py", "pytest e"):
            with pytest.raises(lg.AgentToolError) as err:
                gov.call("bash", bash, command)
            assert not isinstance(err.value, lg.FatalError)


def test_a_line_range_walking_through_a_file_with_the_same_answer_is_no_progress(gov: lg.Governor) -> None:
    commands = []
    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for start in range(400, 2000, 50):
            commands.append(start)
            gov.call("bash", lambda c: "", f"sed -n '{start},{start + 49}p' models.py")
    assert len(commands) == 5 and stop.value.info.code == "cycle"


def test_a_batch_over_numbered_items_is_progress(gov: lg.Governor) -> None:
    heard = quiet(gov)
    with gov.task("t"):
        for i in range(30):
            assert gov.call("send_email", lambda to: "sent", f"user{i}@example.com") == "sent"
            gov.call("bash", lambda c: "", f"sed -i 's/a/b/' src/module{i}.py")
    assert heard == []  # not warned, not withdrawn, not stopped
