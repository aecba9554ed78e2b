"""Issue 24 in the core: stops a user can trust.

The world changes (a state-changing success retires earlier failures), a different
question is progress, sessions the agent renews are not fatal, polls are declared,
parallel calls of one model turn are one decision, and the ladder withdraws a tool
before it ends the run.
"""

from __future__ import annotations

from typing import Any

import pytest
from lg_testing import Backend, Car, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.policies.ladder import offered


def governor(clock: VirtualClock, **tools: lg.ToolPolicy) -> lg.Governor:
    return lg.Governor(lg.GovernorConfig(tools=tools), clock=clock, sleep=clock.sleep)


def events_of(gov: lg.Governor, name: str) -> list[dict[str, Any]]:
    heard: list[dict[str, Any]] = []
    gov.subscribe(lambda e: heard.append(e) if e["event"] == name else None)
    return heard



def test_a_precondition_fixed_by_another_tool_makes_the_retry_run(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    with gov.task("t"):
        with pytest.raises(lg.PermanentError) as failed:
            gov.call("start_engine", car.start_engine)
        # the model reads the tool's words and that fixing the cause, then retrying, is right
        assert "Brake pedal must be pressed" in failed.value.info.message
        assert "fix what the message asks for first" in (failed.value.info.advice or "")
        assert gov.call("press_brake", car.press_brake) == "brake pressed"
        assert gov.call("start_engine", car.start_engine) == "engine running"
    assert car.starts == 2  # the retry reached the engine


def test_a_repeat_with_nothing_done_in_between_is_answered_from_memory(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    with gov.task("t"):
        for _ in range(2):
            with pytest.raises(lg.PermanentError):
                gov.call("start_engine", car.start_engine)
    assert car.starts == 1


def test_a_read_only_success_changes_nothing(clock: VirtualClock) -> None:
    gov, car = governor(clock, get_status=lg.ToolPolicy(read_only=True)), Car()
    with gov.task("t"):
        with pytest.raises(lg.PermanentError):
            gov.call("start_engine", car.start_engine)
        gov.call("get_status", lambda: "parked")  # a lookup: the car is as it was
        with pytest.raises(lg.PermanentError):
            gov.call("start_engine", car.start_engine)
    assert car.starts == 1


def test_a_stateless_tool_keeps_its_failures_whatever_else_succeeds(clock: VirtualClock) -> None:
    gov = governor(clock, fetch=lg.ToolPolicy(stateless=True))
    backend = Backend(forever=HTTPError(404, "no such page"))
    with gov.task("t"):
        with pytest.raises(lg.PermanentError):
            gov.call("fetch", backend, "/gone")
        gov.call("write_file", lambda: "ok")
        with pytest.raises(lg.PermanentError):
            gov.call("fetch", backend, "/gone")
    assert backend.calls == 1


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("User not authenticated. Please log in", "permanent"),
        ("Session expired, please log in again", "permanent"),
        ("You must be logged in to view orders", "permanent"),
        ("Incorrect API key provided: sk-abcdefghijklmnopqrstuvwxyz", "fatal"),
        ("not authenticated: the API key was revoked", "fatal"),
        ("Authentication required.", "fatal"),
    ],
)
def test_a_session_the_agent_renews_is_not_fatal(message: str, kind: str) -> None:
    assert lg.classify(ValueError(message)).error_type == kind


def test_login_then_retry_runs_the_call_again(clock: VirtualClock) -> None:
    gov, session = governor(clock), {"in": False}

    def orders() -> str:
        if not session["in"]:
            raise PermissionError("User not authenticated. Please log in")
        return "#W2378156"

    with gov.task("t"):
        with pytest.raises(lg.PermanentError):
            gov.call("get_orders", orders)
        gov.call("login", lambda: session.update({"in": True}) or "logged in")
        assert gov.call("get_orders", orders) == "#W2378156"


def test_lookups_of_many_entities_are_never_warned(clock: VirtualClock) -> None:
    gov = governor(clock)
    no_progress, cycles = events_of(gov, "no_progress"), events_of(gov, "cycle")
    with gov.task("t"):
        for i in range(12):
            balance = gov.call("get_balance", lambda acct, i=i: f"balance: {100 + i}.00 USD", f"ACC-{1000 + 7 * i}")
            status = gov.call("order_status", lambda order: "Status: delivered", f"#W{i}")
            assert "loop-governor" not in balance + status
    assert no_progress == [] and cycles == []


def test_a_declared_poll_repeats_freely_within_its_bounds(clock: VirtualClock) -> None:
    gov = governor(clock, job_status=lg.ToolPolicy(poll=True, max_calls=10, max_wall_s=300))
    with gov.task("t") as scope:
        seen = []
        for _ in range(10):
            seen.append(gov.call("job_status", lambda job: "running", "J-1"))
            clock.advance(5)
        assert seen[:7] == ["running"] * 7 and seen[8:] == ["running"] * 2  # never a loop
        assert "at most 2 more polls" in seen[7]  # warned once, at 80 % of the bound
        assert scope.withdrawn == {}
        with pytest.raises(lg.PermanentError) as over:  # at the bound: refused and withdrawn
            gov.call("job_status", lambda job: "running", "J-1")
        assert over.value.info.code == "poll_max_calls" and "job_status" in scope.withdrawn
        assert not isinstance(over.value, lg.FatalError)
        with pytest.raises(lg.NoProgressError) as stop:  # polled anyway: the stop
            gov.call("job_status", lambda job: "running", "J-1")
    assert "reached its bound" in stop.value.info.message


def test_a_poll_is_bounded_by_wall_time_too_and_suits_an_hour_long_job(clock: VirtualClock) -> None:
    gov = governor(clock, job_status=lg.ToolPolicy(poll=True))
    with gov.task("t"):
        for minute in range(59):  # a 20-minute job is far inside; an hour's polls once a minute fit
            text = gov.call("job_status", lambda job, attempt: "running", job="J-7", attempt=minute)
            assert text == "running" or "remain before job_status is withdrawn" in text
            clock.advance(60)
        clock.advance(120)  # past the default bound of 3600 s from the job's first poll
        with pytest.raises(lg.PermanentError) as over:
            gov.call("job_status", lambda job, attempt: "running", job="J-7", attempt=99)
    assert over.value.info.code == "poll_max_wall_s"


def test_an_undeclared_poll_is_stopped_and_the_stop_names_the_option(clock: VirtualClock) -> None:
    gov = governor(clock)
    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for _ in range(20):
            gov.call("job_status", lambda: "state: running, 0 of 12 steps done")
    assert "ToolPolicy(poll=True)" in stop.value.info.message


def test_parallel_calls_of_one_turn_are_one_decision(clock: VirtualClock) -> None:
    gov = governor(clock)
    backend = Backend(forever=HTTPError(404, "no such order"))
    with gov.task("t") as scope:
        gov.count_step("model")  # one model turn asked for 6 identical lookups
        for _ in range(6):
            with pytest.raises(lg.PermanentError) as err:
                gov.call("get_order", backend, "#W1")
            assert not isinstance(err.value, lg.FatalError)
        assert scope.withdrawn == {}  # the model was never told between them
        for _ in range(2):  # the next turns repeat it after being told: the ladder climbs
            gov.count_step("model")
            with pytest.raises(lg.PermanentError):
                gov.call("get_order", backend, "#W1")
        assert "get_order" in scope.withdrawn
        gov.count_step("model")
        with pytest.raises(lg.NoProgressError):
            gov.call("get_order", backend, "#W1")
    assert backend.calls == 1


def test_the_ladder_withdraws_before_it_stops(clock: VirtualClock) -> None:
    gov = governor(clock, search=lg.ToolPolicy(read_only=True))  # a lookup fixes nothing
    withdrawn = events_of(gov, "tool_withdrawn")
    backend = Backend(forever=HTTPError(404, "document 42 not found"))
    advice = []
    with gov.task("t") as scope:
        scope.add_result("summary so far")
        for _ in range(3):  # told, answered from memory, withdrawn
            with pytest.raises(lg.PermanentError) as err:
                gov.call("fetch_doc", backend, 42)
            advice.append(err.value.info.advice or "")
        assert gov.call("search", lambda q: "3 hits", "x") == "3 hits"  # other tools still work
        assert "fetch_doc" in scope.withdrawn  # a read-only lookup changes nothing it depends on
        # an adapter asks what is left before the next model call
        assert offered(scope, ["fetch_doc", "search"]) == [False, True]
        with pytest.raises(lg.NoProgressError) as persisted:
            gov.call("fetch_doc", backend, 43)  # the model calls it anyway: the run ends
    assert "2 more identical calls failing the same way withdraw fetch_doc" in advice[0]
    assert "the next identical call failing the same way withdraws fetch_doc" in advice[1]
    assert "fetch_doc is now withdrawn" in advice[2] and "Calling it again ends the task" in advice[2]
    assert [(e["tool"], e["code"]) for e in withdrawn] == [("fetch_doc", "repeated_failure")]
    assert persisted.value.partial_results[:1] == ["summary so far"]
    assert backend.calls == 1


def test_each_fix_lets_the_retry_run_and_a_success_ends_the_count(clock: VirtualClock) -> None:
    gov, car = governor(clock), Car()
    with gov.task("t") as scope:
        for _ in range(2):  # between the tries only a note: it says something, it fixes nothing
            with pytest.raises(lg.PermanentError):
                gov.call("start_engine", car.start_engine)
            gov.call("log_note", lambda note: "noted", note="tried to start the engine")
        assert car.starts == 2  # each retry after a state-changing success ran for real
        gov.call("press_brake", car.press_brake)
        assert gov.call("start_engine", car.start_engine) == "engine running"
        car.brake = False  # later in the task the precondition fails again: news, told afresh
        for _ in range(2):
            with pytest.raises(lg.PermanentError) as again:
                gov.call("start_engine", car.start_engine)
            gov.call("log_note", lambda note: "noted", note="tried to start the engine")
        advice = again.value.info.advice or ""
        # a note is no fix: the second failure alike counts
        assert "the next identical call failing the same way withdraws start_engine" in advice
        assert scope.withdrawn == {}


def test_a_call_retried_after_the_model_fixed_its_cause_runs_again(gov: lg.Governor) -> None:
    files: dict[str, str] = {}

    def read_file(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    def write_file(path: str, text: str) -> str:
        files[path] = text
        return f"wrote {len(text)} bytes"

    with gov.task("fix-then-retry"):
        with pytest.raises(lg.PermanentError):
            gov.call("read_file", read_file, "config.yaml")
        gov.call("write_file", write_file, "config.yaml", "debug: true\n")  # the model fixed it
        assert gov.call("read_file", read_file, "config.yaml") == "debug: true\n"


def test_a_batch_of_lookups_with_the_same_answer_is_not_a_loop(gov: lg.Governor) -> None:
    def order_status(order_id: str) -> str:
        return "Status: delivered (signed for at the front desk)"

    with gov.task("batch"):
        for order_id in ("A-17", "B-22", "C-9", "D-41", "E-3", "F-8"):
            gov.call("order_status", order_status, order_id)


def test_with_checkpoints_a_live_run_polls_for_real_and_a_resume_retires_old_failures(
    clock: VirtualClock, tmp_path: Any
) -> None:
    config = lg.GovernorConfig(checkpoint_url=f"file://{tmp_path}", tools={"job_status": lg.ToolPolicy(poll=True)})
    states = iter(["running", "running", "done"])
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    with gov.task("t", resume=True):
        polled = [gov.call("job_status", lambda job: next(states), "J-1") for _ in range(3)]
        car = Car()
        with pytest.raises(lg.PermanentError):
            gov.call("start_engine", car.start_engine)
    assert polled == ["running", "running", "done"]  # not answered from the checkpoint
    again = lg.Governor(config, clock=clock, sleep=clock.sleep)
    with again.task("t", resume=True):  # the task did not finish: resumed, its failure comes back
        with pytest.raises(lg.PermanentError):
            again.call("start_engine", car.start_engine)  # nothing changed since: from memory
        again.call("press_brake", car.press_brake)
        assert again.call("start_engine", car.start_engine) == "engine running"
    assert car.starts == 2


def test_a_poll_is_bounded_per_job_not_per_task(clock: VirtualClock) -> None:
    gov = governor(clock, job_status=lg.ToolPolicy(poll=True, max_calls=5))
    with gov.task("t"):
        for job in ("J-1", "J-2", "J-3"):  # 15 polls in the task, 5 per job
            for _ in range(5):
                assert gov.call("job_status", lambda job_id: "running", job_id=job).startswith("running")
            clock.advance(1500)  # 4,500 s in all: each job's own 3,600 s is what bounds it
        with pytest.raises(lg.PermanentError) as over:
            gov.call("job_status", lambda job_id: "running", job_id="J-3")
    assert over.value.info.code == "poll_max_calls" and over.value.info.tool == "job_status"


def test_a_model_endpoint_saying_not_authenticated_is_fatal(clock: VirtualClock) -> None:
    gov = governor(clock)

    def model(_prompt: str) -> str:
        raise HTTPError(401, "Not authenticated")  # FastAPI's default body, behind many proxies

    with pytest.raises(lg.FatalError):
        gov.call_model("proxy:gpt", model, "hi")
    with pytest.raises(lg.PermanentError):  # the same words from a tool: the agent can log in
        gov.call("get_orders", model, "hi")


def test_a_tool_withdrawn_for_an_outage_comes_back_when_it_may_be_up(clock: VirtualClock) -> None:
    config = lg.GovernorConfig(breaker_failure_threshold=1, breaker_cooldown_s=30, retry_max_attempts=1)
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    down = {"yes": True}

    def search(q: str) -> str:
        if down["yes"]:
            raise HTTPError(503, "service unavailable")
        return "3 hits"

    with gov.task("t") as scope:
        with pytest.raises(lg.TransientError):
            gov.call("search", search, "q")
        for _ in range(3):  # refused while open: told, then withdrawn for the cooldown
            with pytest.raises(lg.AgentToolError) as refused:
                gov.call("search", search, "q")
        assert "search" in scope.withdrawn and "for the next 30s" in (refused.value.info.advice or "")
        down["yes"] = False
        clock.advance(31)  # the service is back: so is the tool, not a stop
        assert offered(scope, ["search"]) == [True]
        assert gov.call("search", search, "q") == "3 hits"
