"""Issue 33, crewAI: stops and withdrawals leave the conversation whole; Build 5 and 7.

A real crewAI crew on its native OpenAI provider (``crewai.LLM(model="openai/...")``) talks
to the local OpenAI-compatible server in its enforcing mode (``history_rules="anthropic"``:
every assistant tool call answered, and tools defined whenever the history holds tool
blocks). The text (ReAct) path is the same provider with function calling switched off.
Sync (``kickoff``), async (``akickoff``) and streaming (``LLM(stream=True)``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import crewai
import lg_crewai
import openai
import pytest
from crewai.hooks.dispatch import InterceptionPoint, register_scoped, scoped_hooks
from crewai.tools import BaseTool
from crewai.tools.tool_failure import ToolExecutionFailedError
from lg_openai_server import OpenAIServer, RecordedRequest, Reply, Slow, ToolCall, insufficient_quota, rate_limit
from lg_testing import HTTPError, VirtualClock, no_asleep, no_sleep

import loop_governor as lg
from crewai_governor import govern_tools, install
from crewai_governor.tools import UngovernedModelWarning

KEY = "sk-test-issue33-crew-0000"
MODES = ("kickoff", "akickoff", "stream")


def llm_for(server: OpenAIServer, mode: str = "kickoff", *, text: bool = False) -> Any:
    """crewAI's native OpenAI LLM; ``text``: without function calling (the ReAct path)."""
    llm = crewai.LLM(model="openai/gpt-4o-mini", base_url=server.url, api_key=KEY, stream=mode == "stream")
    if not text:
        return llm
    cls = type(llm)
    react = type(cls.__name__, (cls,), {"supports_function_calling": lambda self: False})
    return react(model="gpt-4o-mini", base_url=server.url, api_key=KEY, stream=mode == "stream")


def kickoff(crew: Any, gov: lg.Governor, mode: str) -> Any:
    if mode == "akickoff":

        async def run() -> Any:
            async with install(gov):
                return await crew.akickoff()

        return asyncio.run(run())
    with install(gov):
        return crew.kickoff()


def governor(**config: Any) -> tuple[lg.Governor, list[dict[str, Any]]]:
    gov = lg.Governor(lg.GovernorConfig(**config), sleep=no_sleep, asleep=no_asleep)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    return gov, events


def ends(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(e["outcome"], e.get("error_class")) for e in events if e["event"] == "task_end"]


def crew_for(llm: Any, tools: list[Any], gov: lg.Governor, description: str = "Check the job.") -> Any:
    return lg_crewai.make_crew(
        llm,
        govern_tools(tools, gov),
        role="operator",
        goal="get the job done",
        tasks=[(description, "the answer")],
        max_iter=12,
    )


def tool_texts(request: RecordedRequest) -> list[str]:
    return [str(m.get("content")) for m in request.messages if m.get("role") == "tool"]


def native(*calls: tuple[str, dict[str, Any]]) -> Callable[[RecordedRequest], Reply]:
    return lambda r: Reply(tool_calls=tuple(ToolCall(n, a, id=f"c{r.number}_{i}") for i, (n, a) in enumerate(calls)))


def react(name: str, args: dict[str, Any]) -> str:
    return f"Thought: I should use a tool.\nAction: {name}\nAction Input: {json.dumps(args)}"


def final(text: str, request: RecordedRequest) -> str:
    return text if request.tools else f"Thought: I know it.\nFinal Answer: {text}"


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(history_rules="anthropic") as started:
        yield started


def no_rejected_requests(server: OpenAIServer) -> None:
    rejected = [r.outcome for r in server.completions if r.status == 400]
    assert not rejected, rejected


class JobStatus(BaseTool):
    name: str = "job_status"
    description: str = "The status of a build job."

    def _run(self, job_id: str) -> str:
        return json.dumps({"job_id": job_id, "state": "running"})


class CrmLookup(BaseTool):
    name: str = "crm_lookup"
    description: str = "Look a customer up in the CRM."

    def _run(self, customer: str) -> str:
        raise HTTPError(401, "invalid api key for the CRM")


# ============================================================================ Build 1 and 2


@pytest.mark.parametrize("mode", MODES)
def test_a_stop_ends_the_kickoff_and_the_next_kickoff_is_a_new_task(server: OpenAIServer, mode: str) -> None:
    def script(request: RecordedRequest) -> Reply | str:
        if "Greet" in request.text():
            return "Hello."
        return native(("crm_lookup", {"customer": "acme"}))(request)

    server.set_script(script)
    gov, events = governor()
    with pytest.raises(lg.FatalError) as stop:
        kickoff(crew_for(llm_for(server, mode), [CrmLookup()], gov), gov, mode)
    assert stop.value.info.status == 401
    assert kickoff(crew_for(llm_for(server, mode), [CrmLookup()], gov, "Greet the user."), gov, mode).raw == "Hello."
    assert ends(events) == [("stopped", "FatalError"), ("completed", None)]
    no_rejected_requests(server)


def test_a_cancelled_akickoff_ends_its_task(server: OpenAIServer) -> None:
    server.set_script(lambda r: Slow(1.0, Reply(text="late")) if r.number == 1 else "done")
    gov, events = governor()
    crew = crew_for(llm_for(server, "akickoff"), [JobStatus()], gov)

    async def cancelled() -> None:
        async with install(gov):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(crew.akickoff(), 0.2)

    asyncio.run(cancelled())
    assert ends(events) == [("cancelled", "CancelledError")]


def test_a_kickoff_crewai_itself_ends_is_a_failed_task_not_a_completed_one(server: OpenAIServer) -> None:
    server.set_script(native(("job_status", {"job_id": "J-1"})))
    gov, events = governor()
    # an ungoverned tool: crewAI's own repeated-call check ends the run, not the governor
    crew = lg_crewai.make_crew(
        llm_for(server), [JobStatus()], role="r", goal="g", tasks=[("Poll.", "state")], max_iter=12
    )
    with pytest.raises(ToolExecutionFailedError), install(gov):
        crew.kickoff()
    assert ends(events) == [("failed", "ToolExecutionFailedError")]


# ============================================================================ Build 3 and 4


def car_tools(state: dict[str, Any]) -> list[Any]:
    class StartEngine(BaseTool):
        name: str = "start_engine"
        description: str = "Start the engine."

        def _run(self) -> str:
            state["starts"] += 1
            if not state["brake"]:
                raise ValueError(
                    "Brake pedal must be pressed when starting the engine. Please press the brake pedal first."
                )
            return "Engine started."

    class PressBrake(BaseTool):
        name: str = "press_brake_pedal"
        description: str = "Press the brake pedal."

        def _run(self) -> str:
            state["brake"] = True
            return "Brake pedal pressed."

    return [StartEngine(), PressBrake()]


def stubborn_then_fixes(request: RecordedRequest) -> Reply | str:
    seen = tool_texts(request)
    if any("Engine started" in t for t in seen):
        return "The engine is running."
    if any("start_engine is offered again" in t for t in seen):
        return native(("start_engine", {}))(request)
    if any("start_engine is now withdrawn" in t for t in seen):
        return native(("press_brake_pedal", {}))(request)
    return native(("start_engine", {}))(request)


@pytest.mark.parametrize("mode", MODES)
def test_a_withdrawn_tool_comes_back_after_the_fix_and_the_crew_finishes(server: OpenAIServer, mode: str) -> None:
    server.set_script(stubborn_then_fixes)
    state = {"brake": False, "starts": 0}
    gov, events = governor()
    result = kickoff(crew_for(llm_for(server, mode), car_tools(state), gov, "Start the car."), gov, mode)
    assert result.raw == "The engine is running."
    assert state["starts"] == 2
    assert [(e["tool"], e["reason"]) for e in events if e["event"] == "tool_restored"] == [
        ("start_engine", "world_changed")
    ]
    offered = [[t["function"]["name"] for t in r.tools] for r in server.completions]
    assert offered[0] == offered[-1] == ["start_engine", "press_brake_pedal"]  # left out while withdrawn only
    assert ["press_brake_pedal"] in offered
    no_rejected_requests(server)


def test_with_its_only_tool_withdrawn_the_request_keeps_the_tool_defined(server: OpenAIServer) -> None:
    def script(request: RecordedRequest) -> Reply | str:
        if any("now withdrawn" in t for t in tool_texts(request)):
            return "Still running; I stop polling."
        return native(("job_status", {"job_id": "J-1"}))(request)

    server.set_script(script)
    gov, events = governor()
    result = kickoff(crew_for(llm_for(server), [JobStatus()], gov), gov, "kickoff")
    assert result.raw == "Still running; I stop polling."
    assert server.completions[-1].tools == server.completions[0].tools  # the Anthropic-style server would refuse none
    assert ends(events) == [("completed", None)]
    no_rejected_requests(server)


# ============================================================================ Build 5: the text path


def polls_until_told(request: RecordedRequest) -> str:
    text = request.text()
    if "still listed in your instructions" in text:
        return final("The job is still running.", request)
    return react("job_status", {"job_id": "J-1"})


@pytest.mark.parametrize("mode", MODES)
def test_on_the_text_path_the_withdrawn_tool_leaves_the_prompt_and_the_governor_stops_first(
    server: OpenAIServer, mode: str
) -> None:
    server.set_script(lambda r: react("job_status", {"job_id": "J-1"}))
    gov, events = governor()
    with pytest.raises(lg.NoProgressError):  # the governor's ladder, not crewAI's ToolExecutionFailedError
        kickoff(crew_for(llm_for(server, mode, text=True), [JobStatus()], gov), gov, mode)
    first, last = server.completions[0].messages[0]["content"], server.completions[-1].messages[0]["content"]
    description = "Tool Name: job_status"
    assert description in first and "[job_status]" in first
    assert (
        description not in last and "[job_status]" not in last
    )  # after the withdrawal, the prompt lists no job_status
    assert [e["action"] for e in events if e["event"] == "no_progress"] == ["warn", "withdraw"]


def test_where_the_prompt_cannot_be_edited_the_call_is_refused_and_the_run_goes_on(server: OpenAIServer) -> None:
    server.set_script(polls_until_told)
    gov, events = governor()
    crew = crew_for(llm_for(server, text=True), [JobStatus()], gov)
    block = crew.agents[0].tools[0].formatted_description

    def custom_prompt(context: Any) -> None:  # a prompt that lists the tool its own way
        for i, message in enumerate(context.messages):
            content = message.get("content")
            if isinstance(content, str) and block in content:
                context.messages[i] = {**message, "content": content.replace(block, "- job_status: poll a job")}

    with scoped_hooks():
        register_scoped(InterceptionPoint.PRE_MODEL_CALL, custom_prompt)
        result = kickoff(crew, gov, "kickoff")
    assert result.raw == "The job is still running."
    assert ends(events) == [("completed", None)]
    assert "job_status: poll a job" in server.completions[-1].text()


# ============================================================================ Build 7


@pytest.mark.parametrize("mode", ["kickoff", "akickoff"])
def test_a_quota_stop_has_the_providers_error_as_cause_and_is_not_its_retryable_class(
    server: OpenAIServer, mode: str, crewai_retry_waits: list[float]
) -> None:
    server.fail_forever(insufficient_quota())
    gov, _ = governor()
    with pytest.raises(lg.FatalError) as stop:
        kickoff(crew_for(llm_for(server, mode), [JobStatus()], gov), gov, mode)
    assert isinstance(stop.value.__cause__, openai.RateLimitError)
    assert not isinstance(stop.value, openai.RateLimitError)
    assert server.count() == 1 and crewai_retry_waits == []


def test_a_rate_limit_is_retried_by_the_governor_alone(server: OpenAIServer, crewai_retry_waits: list[float]) -> None:
    server.fail_forever(rate_limit(retry_after=1))
    clock = VirtualClock()
    gov = lg.Governor(sleep=clock.sleep, asleep=clock.asleep, clock=clock)
    calls: list[dict[str, Any]] = []
    gov.subscribe(lambda e: calls.append(e) if e["event"] == "model_call" else None)
    with pytest.raises(lg.TransientError):
        kickoff(crew_for(llm_for(server), [JobStatus()], gov), gov, "kickoff")
    # every request the provider saw is one of the governor's attempts: crewAI's own LLM
    # retry (3 attempts, Retry-After unread) and its agent's task retries add none
    assert server.count() == sum(c["attempts"] for c in calls) and len(calls) == 1
    assert crewai_retry_waits == [] and clock.sleeps and all(s >= 1 for s in clock.sleeps)


def test_governed_tools_without_install_say_so_once(server: OpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    server.set_script(lambda r: "done" if tool_texts(r) else native(("job_status", {"job_id": "J-1"}))(r))
    gov, _ = governor()
    caplog.set_level(logging.WARNING, logger="loop_governor")
    with pytest.warns(UngovernedModelWarning, match="model calls are not"):
        crew_for(llm_for(server), [JobStatus()], gov).kickoff()
    other, _ = governor()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UngovernedModelWarning)
        crew_for(llm_for(server), [JobStatus()], gov).kickoff()  # once per governor
        kickoff(crew_for(llm_for(server), [JobStatus()], other), other, "kickoff")  # never under install()
    assert sum("outside `with install(governor):`" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("text", [False, True], ids=["native", "text"])
def test_the_governors_loop_stop_comes_before_crewais_repeated_call_check(server: OpenAIServer, text: bool) -> None:
    server.set_script(
        lambda r: react("job_status", {"job_id": "J-1"}) if text else native(("job_status", {"job_id": "J-1"}))(r)
    )
    gov, events = governor()
    try:
        kickoff(crew_for(llm_for(server, text=text), [JobStatus()], gov), gov, "kickoff")
    except ToolExecutionFailedError:
        pytest.fail("crewAI's own repeated-call check ended the run before the governor")
    except lg.NoProgressError as stop:
        assert stop.info.code in ("no_progress", "cycle")
        assert stop.partial_results  # what the task got done comes back with the stop
    else:
        pytest.fail("the loop was not stopped")
    assert ends(events) == [("stopped", "NoProgressError")]


def test_every_model_of_the_kickoff_is_governed_and_given_back(server: OpenAIServer) -> None:
    """The agent's function_calling_llm too (crewAI parses text tool calls with it): an
    ungoverned one would retry on its own, crewAI's retries on top of the SDK's."""
    from crewai_governor.llm import is_governed_llm

    seen: list[tuple[bool, bool]] = []

    class Probe(BaseTool):
        name: str = "probe"
        description: str = "Report whether the agent's models are governed."

        def _run(self) -> str:
            agent = crew.agents[0]
            seen.append((is_governed_llm(agent.llm), is_governed_llm(agent.function_calling_llm)))
            return "probed"

    server.set_script(lambda r: "done" if tool_texts(r) else native(("probe", {}))(r))
    gov, _ = governor()
    crew = crew_for(llm_for(server), [Probe()], gov)
    parser = llm_for(server)
    crew.agents[0].function_calling_llm = parser
    assert kickoff(crew, gov, "kickoff").raw == "done"
    assert seen == [(True, True)]
    assert crew.agents[0].function_calling_llm is parser and not is_governed_llm(crew.agents[0].llm)
