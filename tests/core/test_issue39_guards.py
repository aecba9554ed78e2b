"""Issue 39: loop guards the loops this project began with cannot escape, without stopping
healthy work (plain ``g.call``; the same patterns through create_agent and a crew are in
``tests/integration/test_issue24_trusted_stops.py``).

Loops: a failing call with anything succeeding in between, a critic never satisfied by
revised drafts, the same booking with revised amounts, a poll that never ends, and any loop
at all under the default model-call ceiling. Healthy: a coding agent whose error changes
after each fix, a check re-run after real work, a 20 s outage, lookups over ids with
separators.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.config import MAX_MODEL_CALLS


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def governor(clock: VirtualClock, **config: Any) -> lg.Governor:
    return lg.Governor(lg.GovernorConfig(**config), clock=clock, sleep=clock.sleep, random=lambda: 0.5)


def missing_doc(name: str) -> str:
    raise HTTPError(404, f"no document named {name}")


@pytest.mark.parametrize(
    "between",
    [
        ("think", lambda i: {"thought": f"maybe it is there now ({i})"}, ""),
        ("log_note", lambda i: {"note": f"attempt {i} failed"}, "Note saved."),
        ("search_kb", lambda i: {"query": f"refunds 2019 ({i})"}, "3 results"),
        ("get_flight", lambda i: {"flight_number": f"HAT{100 + i}", "date": "2024-05-13"}, '{"seats": 0}'),
    ],
    ids=["think", "log_note", "search", "a lookup by id"],
)
def test_a_failing_call_with_anything_succeeding_in_between_is_stopped(clock: VirtualClock, between: Any) -> None:
    tool, args_of, answer = between
    gov = governor(clock)
    backend = Backend(forever=HTTPError(404, "no document named refunds-2019.pdf"))
    turns = 0
    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for i in range(100):  # 200 turns if nothing stops it
            turns += 1
            try:
                gov.call("fetch_doc", backend, "refunds-2019.pdf")
            except lg.FatalError:
                raise
            except lg.AgentToolError:
                pass
            turns += 1
            gov.call(tool, lambda **kw: answer, **args_of(i))
    # the retries ran for real after each success (it may have been a fix), and each failed
    # the same way: told, counted, withdrawn at the 3rd, the 4th call is the stop
    assert backend.calls == 3 and turns == 7
    assert stop.value.info.code == "repeated_failure"


@pytest.mark.parametrize("tool", ["think", "log_note", "search_kb"])
def test_a_failure_returned_as_text_with_a_think_between_is_stopped(clock: VirtualClock, tool: str) -> None:
    """A tool that returns its error instead of raising it (many LangChain tools do): the same
    answer to the same call, a ``think`` between. The ``think`` says something and changes
    nothing, so it does not hand the withdrawn tool back."""
    gov = governor(clock)
    calls = 0

    def fetch_doc(name: str) -> str:
        nonlocal calls
        calls += 1
        return f"Error: HTTP 404: no document named {name}"

    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for i in range(100):
            gov.call(tool, lambda **kw: "", thought=f"maybe it is there now ({i})")
            gov.call("fetch_doc", fetch_doc, "refunds-2019.pdf")
    assert calls == 4 and stop.value.info.code == "no_progress"


def test_the_critic_loop_with_revised_drafts_is_stopped(clock: VirtualClock) -> None:
    gov = governor(clock)
    reviews: list[str] = []

    def critic(draft: str) -> str:
        reviews.append(draft)
        return f"Score {4 + len(reviews) % 3}/10. Not good enough: the tone is off. Revise."

    notes = []
    with gov.task("t"), pytest.raises(lg.NoProgressError) as stop:
        for i in range(250):
            notes.append(gov.call("critic", critic, draft=f"v{i}"))
    assert reviews == ["v0", "v1", "v2", "v3"]  # told at the 3rd verdict, withdrawn at the 4th
    assert "returned the same result 3 times" in notes[2] and "now withdrawn" in notes[3]
    assert stop.value.info.code == "no_progress"


def test_a_critic_whose_verdict_changes_or_that_approves_is_left_alone(clock: VirtualClock) -> None:
    gov = governor(clock)
    verdicts = iter(["Not good enough: the tone is off.", "Better, but cite the policy.", "Cite it properly.", "OK."])
    with gov.task("t"):
        seen = [gov.call("critic", lambda draft: next(verdicts), draft=f"v{i}") for i in range(4)]
    assert seen[-1] == "OK."


def test_the_same_booking_with_revised_amounts_is_stopped(clock: VirtualClock) -> None:
    gov = governor(clock)
    sent = []

    def book(user_id: str, flight_number: str, amount: int) -> str:
        sent.append(amount)
        raise ValueError(f"Payment amount does not add up, total price is 572, but paid {amount}")

    with gov.task("t"), pytest.raises(lg.NoProgressError):
        for i in range(50):
            try:
                gov.call("book_reservation", book, user_id="mia_li_3668", flight_number="HAT136", amount=100 + 7 * i)
            except lg.FatalError:
                raise
            except lg.AgentToolError:
                pass
            gov.call("calculate", lambda expression: "472", expression=f"572 - {100 + 7 * i}")
    # the same booking (user and flight) revised: 3 failures alike -> told; 2 more -> withdrawn
    assert len(sent) == 5


def test_a_coding_agent_whose_error_changes_after_each_fix_is_never_stopped(clock: VirtualClock) -> None:
    gov = governor(clock)
    missing = ["numpy", "scipy", "pandas", "pyyaml", "requests", "attrs", "rich", "typer"]
    installed: list[str] = []

    def run_script(command: str) -> str:
        left = [m for m in missing if m not in installed]
        if left:
            raise RuntimeError(f"ModuleNotFoundError: No module named '{left[0]}'")
        return "all good"

    with gov.task("t"):
        for module in missing:
            with pytest.raises(lg.PermanentError):
                gov.call("bash", run_script, command="python reproduce.py")
            gov.call("bash", lambda command: "Successfully installed", command=f"pip install {module}")
            installed.append(module)
        assert gov.call("bash", run_script, command="python reproduce.py") == "all good"


def test_a_check_re_run_after_real_work_is_no_repeat(clock: VirtualClock) -> None:
    """A linter re-run after each round of edits failing the same way (a successful coding run
    of the corpus did it 5 times): more than 3 other calls in between, no repeat."""
    gov = governor(clock)
    with gov.task("t") as scope:
        for round_ in range(6):
            with pytest.raises(lg.PermanentError) as lint:
                gov.call("bash", Backend(forever=RuntimeError("L:1 | P:20 | PRS | Found unparsable section")), "lint")
            assert not isinstance(lint.value, lg.LoopDetectedError)
            for edit in range(4):
                gov.call("bash", lambda cmd: "", f"sed -i 's/a{round_}/b{edit}/' src/parser.py")
        assert scope.withdrawn == {}


def test_ids_with_separators_dates_and_skus_are_entities_not_walking_positions(clock: VirtualClock) -> None:
    gov = governor(clock)
    with gov.task("t") as scope:
        for i in range(1, 201):
            assert gov.call("get_invoice", lambda invoice_id: '{"status": "paid"}', f"INV-2024-{i:04d}")
        for day in range(1, 29):
            gov.call("get_report", lambda date: "No incidents.", f"2024-03-{day:02d}")
        gov.count_step("model")  # ten lookups in one model turn
        for i in range(10):
            gov.call("check_stock", lambda sku: "in stock", f"SKU-{5531 + i}")
        for i in range(10):  # ten deleted orders: ten 404s, about ten different things
            with pytest.raises(lg.PermanentError) as err:
                gov.call("get_order", Backend(forever=HTTPError(404, "order not found")), f"#W{4000000 + i}")
            assert not isinstance(err.value, lg.LoopDetectedError)
        assert scope.withdrawn == {}


def test_a_20s_outage_never_ends_the_run_and_the_tool_comes_back(clock: VirtualClock) -> None:
    gov = governor(clock)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    up_at = clock.now + 20

    def search(query: str) -> str:
        if clock.now < up_at:
            raise HTTPError(503, "upstream unavailable")
        return "3 results"

    answers: list[str | None] = []
    started = clock.now
    with gov.task("t"):
        while clock.now - started < 300:  # the model asks every 4 s until it gets an answer
            try:
                answers.append(gov.call("search_kb", search, "refund policy"))
                break
            except lg.AgentToolError as err:
                assert not isinstance(err, lg.FatalError)  # never a stop: the service recovers
                answers.append(err.info.code)
            clock.advance(4)
        assert answers[-1] == "3 results"  # offered again once it may be back, and answered
        assert clock.now - started <= 80  # the breaker's 60 s cool-down, not the rest of the task
        assert "withdrawn" in answers  # meanwhile the model was told it is unavailable
    assert [e["event"] for e in events].count("tool_restored") == 1


def test_the_default_model_call_ceiling_bounds_any_loop_with_partial_results(clock: VirtualClock) -> None:
    gov = governor(clock)
    assert gov.config.max_model_calls == MAX_MODEL_CALLS == 500
    with gov.task("t") as scope, pytest.raises(lg.BudgetExhaustedError) as spent:
        scope.add_result("the first section")
        for i in range(10_000):  # a model that asks for something new every turn, forever
            gov.call_model("openai:m", lambda prompt: "next", f"turn {i}")
            gov.call("get_weather", lambda city: "sunny", f"city {i}")
    assert spent.value.info.code == "max_model_calls" and scope.model_calls == 500
    assert spent.value.partial_results[0] == "the first section"
    off = governor(clock, max_model_calls=None)
    with off.task("t"):
        for i in range(600):
            off.call_model("openai:m", lambda prompt: "next", f"turn {i}")


def test_a_poll_whose_arguments_vary_is_one_job(clock: VirtualClock) -> None:
    gov = governor(clock, tools={"get_job_status": lg.ToolPolicy(poll=True, max_calls=10)})
    with gov.task("t"), pytest.raises(lg.PermanentError) as over:
        for attempt in range(400):
            gov.call(
                "get_job_status",
                lambda **kw: "running",
                job_id="J-1",
                attempt=attempt,
                at=f"2024-05-01T12:{attempt % 60:02d}",
            )
            clock.advance(10)
    assert over.value.info.code == "poll_max_calls"


def test_the_model_reads_plain_text_by_default_and_json_when_configured(clock: VirtualClock) -> None:
    for fmt, head in (
        ("text", "Error: HTTPError: no document named a.pdf\nPermanent failure: "),
        ("json", '{"error":'),
    ):
        gov = governor(clock, error_format=fmt)
        with gov.task("t"), pytest.raises(lg.PermanentError) as err:
            gov.call("fetch_doc", missing_doc, "a.pdf")
        assert err.value.info.to_model_text().startswith(head)


def test_async_twin_stops_the_think_loop_too(clock: VirtualClock) -> None:
    gov = governor(clock)

    async def run() -> int:
        async def fetch(name: str) -> str:
            raise HTTPError(404, f"no document named {name}")

        calls = 0
        async with gov.task("t"):
            for i in range(100):
                calls += 1
                try:
                    await gov.acall("fetch_doc", fetch, "refunds-2019.pdf")
                except lg.FatalError:
                    return calls
                except lg.AgentToolError:
                    pass
                await gov.acall("think", lambda thought: "", thought=f"again {i}")
        return calls

    assert asyncio.run(run()) == 4


def test_a_shell_agent_editing_between_identical_failing_runs_is_iterating(clock: VirtualClock) -> None:
    """Run the test, edit, the same failure, edit again, then the fix works: everyday coding
    work through one shell tool. An ``echo`` between the runs is no edit: that is a loop."""
    gov = governor(clock)
    state = {"fixed": False}

    def bash(command: str) -> str:
        if command.startswith("pytest"):
            if not state["fixed"]:
                raise RuntimeError("FAILED tests/test_core.py::test_load - AssertionError\n1 failed in 0.41s")
            return "1 passed"
        if "attempt 5" in command:
            state["fixed"] = True
        return ""

    with gov.task("edits") as scope:
        for attempt in range(6):
            try:
                gov.call("bash", bash, command="pytest -q tests/test_core.py")
            except lg.FatalError:
                raise
            except lg.AgentToolError:
                pass
            gov.call("bash", bash, command=f"sed -i 's/x/y{attempt}/' src/core.py  # attempt {attempt}")
        assert gov.call("bash", bash, command="pytest -q tests/test_core.py") == "1 passed"
        assert scope.withdrawn == {}
    state["fixed"] = False
    with gov.task("echoes"), pytest.raises(lg.NoProgressError):
        for attempt in range(20):
            try:
                gov.call("bash", bash, command="pytest -q tests/test_core.py")
            except lg.FatalError:
                raise
            except lg.AgentToolError:
                pass
            gov.call("bash", bash, command=f"echo 'retrying {attempt}'")


@pytest.mark.parametrize(
    ("tool", "kwargs", "fixes"),
    [
        ("search_replace", {"path": "app/config.py", "search": "DEBUG = False", "replace": "DEBUG = True"}, True),
        ("find_and_replace", {"file": "settings.toml", "old": "port = 80", "new": "port = 8080"}, True),
        ("get_or_create_user", {"email": "mia@example.com"}, True),
        ("run_python", {"code": "open('config.json', 'w').write('{}')"}, True),
        ("edit_file", {"path": "app/config.py", "old": "a", "new": "b"}, True),
        ("think", {"thought": "let me try again"}, False),
        ("search_kb", {"query": "refunds 2019"}, False),
        ("get_order", {"order_id": "A-1042"}, False),
    ],
)
def test_what_counts_as_a_fix_reads_the_whole_tool_name(tool: str, kwargs: dict[str, Any], fixes: bool) -> None:
    """A tool named for reading that writes after all (``search_replace``) may have fixed
    something, as may code to run; a think, a search or a lookup did not."""
    from loop_governor.call import TOOL, Call
    from loop_governor.policies.fixes import did_something

    assert did_something(Call(TOOL, tool, None, None, lambda: None, (), kwargs)) is fixes
