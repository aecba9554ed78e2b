"""A withdrawal's lifecycle in the core (issue 33): it lifts when the world changes, what a
request offers meanwhile never breaks the provider's rules, and a stopped task runs nothing
more. The conversation helpers the adapters answer pending tool calls with."""

from __future__ import annotations

from typing import Any

import pytest
from lg_testing import Car, VirtualClock

import loop_governor as lg
from loop_governor.conversation import not_run_text, pending_tool_calls, stop_text, uses_tools
from loop_governor.errors import read_model_text
from loop_governor.policies.ladder import keep_listed, tool_offer


def governor(clock: VirtualClock, **tools: lg.ToolPolicy) -> lg.Governor:
    return lg.Governor(lg.GovernorConfig(tools=tools), clock=clock, sleep=clock.sleep)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()



def withdraw_start_engine(gov: lg.Governor, car: Car) -> None:
    """The model repeats the failing start until the ladder withdraws it (one turn each)."""
    for _ in range(3):
        gov.count_step("model")
        with pytest.raises(lg.PermanentError):
            gov.call("start_engine", car.start_engine)


def test_a_state_changing_success_of_another_tool_offers_the_withdrawn_tool_again(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    restored: list[dict[str, Any]] = []
    gov.subscribe(lambda e: restored.append(e) if e["event"] == "tool_restored" else None)
    with gov.task("t") as scope:
        withdraw_start_engine(gov, car)
        assert "start_engine" in scope.withdrawn
        gov.count_step("model")
        note = gov.call("press_brake", car.press_brake)
        assert "start_engine" not in scope.withdrawn
        gov.count_step("model")
        assert gov.call("start_engine", car.start_engine) == "engine running"  # runs: no stop
    # the model is told, in the result of the tool that changed the world
    assert note.startswith("brake pressed") and "start_engine is offered again: press_brake" in note
    assert [(e["tool"], e["reason"], e["by"]) for e in restored] == [("start_engine", "world_changed", "press_brake")]


def test_a_read_only_success_or_a_parallel_call_of_the_same_turn_lifts_nothing(clock: VirtualClock) -> None:
    gov, car = governor(clock, get_status=lg.ToolPolicy(read_only=True)), Car()
    with gov.task("t") as scope:
        withdraw_start_engine(gov, car)
        note = gov.call("get_status", lambda: "engine off")  # same turn, and read-only besides
        gov.count_step("model")
        assert gov.call("get_status", lambda: "engine off") == "engine off"
        assert "start_engine" in scope.withdrawn
        gov.call("press_brake", car.press_brake)  # the same turn as the last lookup: a later one than the withdrawal
        assert "start_engine" not in scope.withdrawn
    assert note == "engine off"


def test_a_withdrawal_in_the_turn_of_the_fix_is_not_lifted_by_that_fix(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    with gov.task("t") as scope:
        for _ in range(2):
            gov.count_step("model")
            with pytest.raises(lg.PermanentError):
                gov.call("start_engine", car.start_engine)
        gov.count_step("model")  # one turn: the last repeat (withdrawn) and the brake, in parallel
        with pytest.raises(lg.PermanentError):
            gov.call("start_engine", car.start_engine)
        gov.call("press_brake", car.press_brake)
        assert "start_engine" in scope.withdrawn  # the model chose no fix after being told
        gov.count_step("model")
        gov.call("press_brake", car.press_brake)
        assert "start_engine" not in scope.withdrawn


TOOLS = [{"type": "function", "function": {"name": "start_engine"}}, {"type": "function", "function": {"name": "honk"}}]
HISTORY = [
    {"role": "user", "content": "start the car"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "start_engine"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "Error: ..."},
]


def test_a_withdrawn_tool_is_left_out_but_tool_history_never_goes_without_tools(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    with gov.task("t") as scope:
        assert tool_offer(scope, TOOLS, HISTORY) is None  # nothing withdrawn: as it is
        withdraw_start_engine(gov, car)
        offer = tool_offer(scope, TOOLS, HISTORY)
        assert offer is not None and offer.tools == TOOLS[1:] and not offer.forbid
        scope.withdrawn["honk"] = ("no_progress", None, None, True)
        offer = tool_offer(scope, TOOLS, HISTORY)  # every tool withdrawn: the array stays, calls forbidden
        assert offer is not None and offer.tools == TOOLS and offer.forbid
        offer = tool_offer(scope, TOOLS, HISTORY[:1])  # no tool history: none is a valid request
        assert offer is not None and offer.tools == [] and not offer.forbid


def test_a_tool_left_listed_in_the_prompt_is_refused_never_a_stop(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    with gov.task("t") as scope:
        withdraw_start_engine(gov, car)
        keep_listed(scope, ["start_engine"])
        for _ in range(3):
            gov.count_step("model")
            with pytest.raises(lg.PermanentError) as refused:
                gov.call("start_engine", car.start_engine)
            assert not isinstance(refused.value, lg.FatalError)
        assert "still listed in your instructions" in refused.value.info.message
    assert car.starts == 1


def test_a_stopped_task_runs_no_further_tool_call(clock: VirtualClock) -> None:
    gov = governor(clock, send=lg.ToolPolicy(max_calls=1))
    ran: list[str] = []
    stops: list[dict[str, Any]] = []
    gov.subscribe(lambda e: stops.append(e) if e["event"] == "run_stopped" else None)
    with gov.task("t"):
        gov.call("send", ran.append, "a")
        with pytest.raises(lg.BudgetExhaustedError):
            gov.call("send", ran.append, "b")
        with pytest.raises(lg.BudgetExhaustedError):  # a parallel call of that turn: the same stop
            gov.call("lookup", ran.append, "c")
    assert ran == ["a"] and len(stops) == 1


def test_pending_tool_calls_are_the_unanswered_ones_after_their_turns_answers() -> None:
    messages = [
        *HISTORY,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c2", "function": {"name": "honk"}}, {"id": "c3", "function": {"name": "honk"}}],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "honked"},
        {"role": "user", "content": "and now?"},
    ]
    pending = pending_tool_calls(messages)
    assert [(p.id, p.name, p.after) for p in pending] == [("c3", "honk", 4)]
    assert pending_tool_calls(HISTORY) == []
    assert uses_tools(HISTORY) and not uses_tools(HISTORY[:1])


def test_the_answers_read_as_fatal_failures_saying_why() -> None:
    stop = lg.FatalError(lg.GovernedError(error_type="fatal", tool="crm", code="401", message="invalid api key"))
    assert read_model_text(stop_text(stop)) == {"message": "invalid api key", "type": "fatal"}
    text = not_run_text("honk", "the run was cancelled")
    fields = read_model_text(text)
    assert (
        fields is not None
        and fields["type"] == "fatal"
        and fields["message"] == "honk was not run: the run was cancelled"
    )
    assert read_model_text(not_run_text("honk", "x", "json"))["code"] == "not_run"  # type: ignore[index]
