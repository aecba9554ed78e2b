"""``GovernorCapability`` governs a pydantic-ai agent's tool calls and model requests.

Offline: pydantic-ai's own ``FunctionModel`` (a scripted model that sees what the agent sent)
and ``TestModel``; virtual time. Every behaviour runs through ``run_sync`` and ``run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from lg_testing import HTTPError, VirtualClock
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import loop_governor as lg
from pydantic_ai_governor import GovernorCapability

MODES = ["run_sync", "run"]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def events() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def governor(clock: VirtualClock, events: list[dict[str, Any]]) -> lg.Governor:
    gov = lg.Governor(clock=clock, sleep=clock.sleep, asleep=clock.asleep)
    gov.subscribe(events.append)
    return gov


def run(agent: Agent[Any, Any], mode: str, prompt: str = "go") -> Any:
    if mode == "run_sync":
        return agent.run_sync(prompt)
    return asyncio.run(agent.run(prompt))


def answers(messages: list[ModelMessage]) -> list[Any]:
    """What the model was told of its tool calls, in order."""
    return [p for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart | RetryPromptPart)]


def calling(*calls: tuple[str, dict[str, Any]], final: str = "done") -> Callable[..., ModelResponse]:
    """A model that makes ``calls`` one a turn, then answers ``final``; it records each
    turn's offered tools on ``.offered``."""
    offered: list[list[str]] = []

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.append([t.name for t in info.function_tools])
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn < len(calls):
            name, args = calls[turn]
            return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{turn}")])
        return ModelResponse(parts=[TextPart(final)])

    script.offered = offered  # type: ignore[attr-defined]
    return script


@pytest.mark.parametrize("mode", MODES)
def test_a_transient_tool_failure_is_retried_and_the_model_reads_only_the_answer(
    mode: str, governor: lg.Governor, clock: VirtualClock
) -> None:
    tries: list[str] = []

    def weather(city: str) -> str:
        """The weather in a city."""
        tries.append(city)
        if len(tries) < 3:
            raise HTTPError(503, "service unavailable")
        return f"sunny in {city}"

    agent = Agent(
        FunctionModel(calling(("weather", {"city": "Paris"}))),
        tools=[weather],
        capabilities=[GovernorCapability(governor)],
    )
    result = run(agent, mode)

    assert tries == ["Paris"] * 3
    assert [p.content for p in answers(result.all_messages())] == ["sunny in Paris"]
    assert len(clock.sleeps) == 2  # backed off on virtual time


@pytest.mark.parametrize("mode", MODES)
def test_a_permanent_failure_is_a_failed_tool_result_and_not_made_again_in_the_run(
    mode: str, governor: lg.Governor
) -> None:
    tries: list[str] = []

    def lookup(order_id: str) -> str:
        """Look an order up."""
        tries.append(order_id)
        raise HTTPError(404, f"no order {order_id}")

    model = FunctionModel(calling(("lookup", {"order_id": "A-404"}), ("lookup", {"order_id": "A-404"})))
    agent = Agent(model, tools=[lookup], capabilities=[GovernorCapability(governor)])
    result = run(agent, mode)

    assert tries == ["A-404"]  # the second identical call is answered from memory
    told = answers(result.all_messages())
    assert [p.outcome for p in told] == ["failed", "failed"]  # pydantic-ai's ToolFailed: no retry budget spent
    assert "no order A-404" in str(told[0].content) and "Permanent failure" in str(told[0].content)
    assert result.output == "done"  # the run goes on: the model read the failure


@pytest.mark.parametrize("mode", MODES)
def test_a_fatal_failure_ends_the_run_with_its_partial_results(mode: str, governor: lg.Governor) -> None:
    def search(query: str) -> str:
        """Search."""
        return f"results for {query}"

    def charge(amount: int) -> str:
        """Charge a card."""
        raise HTTPError(401, "invalid api key")

    model = FunctionModel(calling(("search", {"query": "refunds"}), ("charge", {"amount": 5})))
    agent = Agent(model, tools=[search, charge], capabilities=[GovernorCapability(governor)])
    with pytest.raises(lg.FatalError) as stopped:
        run(agent, mode)

    assert str(stopped.value).startswith("loop-governor stopped the run: ")
    assert isinstance(stopped.value.__cause__, HTTPError)
    assert {"tool": "search", "result": "results for refunds"} in stopped.value.partial_results


@pytest.mark.parametrize("mode", MODES)
def test_an_open_breaker_refuses_the_call_without_making_it(mode: str, governor: lg.Governor) -> None:
    tries: list[str] = []

    def lookup(order_id: str) -> str:
        """Look an order up."""
        tries.append(order_id)
        return "found"

    policy = governor.rt.policy("tool", "lookup").breaker
    for _ in range(policy.failure_threshold):
        governor.store.breaker_record("lookup", False, False, governor.rt.clock(), policy)
    agent = Agent(
        FunctionModel(calling(("lookup", {"order_id": "A-1"}))),
        tools=[lookup],
        capabilities=[GovernorCapability(governor)],
    )
    result = run(agent, mode)

    assert tries == []
    assert "unavailable" in str(answers(result.all_messages())[0].content)


@pytest.mark.parametrize("mode", MODES)
def test_a_repeated_failure_withdraws_the_tool_from_the_models_tools(mode: str, governor: lg.Governor) -> None:
    def deploy(service: str) -> str:
        """Deploy a service."""
        raise HTTPError(400, "manifest invalid: replicas must be positive")

    def status(service: str) -> str:
        """A service's status."""
        return "running"

    script = calling(*[("deploy", {"service": "api"})] * 6)
    agent = Agent(FunctionModel(script), tools=[deploy, status], capabilities=[GovernorCapability(governor)])
    with pytest.raises(lg.NoProgressError) as stopped:
        run(agent, mode)  # the model keeps calling deploy: told, answered from memory, withdrawn, then stopped

    offered = script.offered  # type: ignore[attr-defined]
    assert offered[0] == ["deploy", "status"]
    assert offered[-1] == ["status"]  # withdrawn through pydantic-ai's tool preparation
    assert "deploy" in str(stopped.value)


@pytest.mark.parametrize("mode", MODES)
def test_pydantic_ais_own_control_flow_passes_through_unjudged(mode: str, governor: lg.Governor) -> None:
    asked: list[int] = []

    def pick(n: int) -> str:
        """Pick a number."""
        asked.append(n)
        if n < 0:
            raise ModelRetry("n must be positive")
        return f"picked {n}"

    model = FunctionModel(calling(("pick", {"n": -1}), ("pick", {"n": 2})))
    agent = Agent(model, tools=[pick], capabilities=[GovernorCapability(governor)])
    result = run(agent, mode)

    told = answers(result.all_messages())
    assert told[0].outcome == "retried" and told[0].content == "n must be positive"  # pydantic-ai's, as it was
    assert told[1].content == "picked 2"
    assert asked == [-1, 2]  # not retried by the governor
    assert governor.store.breaker_get("pick").failures == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_throttled_model_request_is_retried(mode: str, governor: lg.Governor, clock: VirtualClock) -> None:
    requests: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(len(messages))
        if len(requests) < 3:
            raise ModelHTTPError(429, "function", body={"error": {"message": "slow down"}})
        return ModelResponse(parts=[TextPart("hello")])

    agent = Agent(FunctionModel(model), capabilities=[GovernorCapability(governor)])
    assert run(agent, mode).output == "hello"
    assert len(requests) == 3 and clock.sleeps


@pytest.mark.parametrize("mode", MODES)
def test_an_exhausted_quota_ends_the_run_at_once(mode: str, governor: lg.Governor) -> None:
    requests: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(len(messages))
        body = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
        raise ModelHTTPError(429, "function", body=body)

    agent = Agent(FunctionModel(model), capabilities=[GovernorCapability(governor)])
    with pytest.raises(lg.FatalError):
        run(agent, mode)
    assert len(requests) == 1


@pytest.mark.parametrize("mode", MODES)
def test_every_run_is_one_task_ended_however_the_run_ends(
    mode: str, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    def charge(amount: int) -> str:
        """Charge a card."""
        raise HTTPError(401, "invalid api key")

    ok = Agent(TestModel(), capabilities=[GovernorCapability(governor)])
    stopped = Agent(
        FunctionModel(calling(("charge", {"amount": 1}))), tools=[charge], capabilities=[GovernorCapability(governor)]
    )
    run(ok, mode, "Summarise the docs")
    with pytest.raises(lg.FatalError):
        run(stopped, mode)

    ends = [e for e in events if e["event"] == "task_end"]
    assert [e["outcome"] for e in ends] == ["completed", "stopped"]
    assert [e["event"] for e in events].count("task_start") == 2
    assert next(e for e in events if e["event"] == "task_start")["name"] == "Summarise the docs"
    assert ends[0]["model_calls"] == 1


def test_a_cancelled_run_ends_its_task(governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    started = asyncio.Event()

    async def wait_for_human() -> str:
        """Wait for a human."""
        started.set()
        await asyncio.sleep(3600)
        return "never"

    agent = Agent(
        FunctionModel(calling(("wait_for_human", {}))),
        tools=[wait_for_human],
        capabilities=[GovernorCapability(governor)],
    )

    async def main() -> None:
        run = asyncio.create_task(agent.run("go"))
        await started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(main())
    assert [e["outcome"] for e in events if e["event"] == "task_end"] == ["cancelled"]


def test_a_run_inside_an_open_task_runs_in_it(governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    agent = Agent(TestModel(), capabilities=[GovernorCapability(governor)])
    with governor.task("ticket-7"):
        agent.run_sync("one")
        agent.run_sync("two")
    assert [e["task_id"] for e in events if e["event"] == "task_end"] == ["ticket-7"]


def test_a_run_inside_another_governors_task_gets_a_task_of_its_own(
    governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    other = lg.Governor()
    theirs: list[dict[str, Any]] = []
    other.subscribe(theirs.append)
    agent = Agent(TestModel(), capabilities=[GovernorCapability(governor)])
    with other.task("outer"):
        agent.run_sync("one")
    assert [e["event"] for e in events if e["event"] in ("task_start", "task_end")] == ["task_start", "task_end"]
    assert not any(e["event"] == "model_call" for e in theirs)  # counted in this governor's task only


def test_test_models_every_tool_is_governed(governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    def search(query: str) -> str:
        """Search."""
        return f"results for {query}"

    agent = Agent(TestModel(), tools=[search], capabilities=[GovernorCapability(governor)])
    agent.run_sync("go")
    assert [e["tool"] for e in events if e["event"] == "tool_call"] == ["search"]
    assert any(e["event"] == "model_call" for e in events)


def test_a_config_where_the_governor_goes_fails_at_construction() -> None:
    with pytest.raises(TypeError, match=r"governor must be a loop_governor.Governor.*governor=lg.Governor\(config\)"):
        GovernorCapability(lg.GovernorConfig())  # type: ignore[arg-type]


def test_a_streamed_run_counts_its_model_requests_and_governs_its_tools(
    governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    def search(query: str) -> str:
        """Search."""
        return f"results for {query}"

    agent = Agent(TestModel(), tools=[search], capabilities=[GovernorCapability(governor)])

    async def main() -> None:
        async with agent.run_stream("go") as streamed:
            await streamed.get_output()

    asyncio.run(main())
    assert [e["tool"] for e in events if e["event"] == "tool_call"] == ["search"]
    assert [e["model_calls"] for e in events if e["event"] == "task_end"] == [2]  # the model-call ceiling holds
