"""Governed model calls with real provider clients over real HTTP (issue 15).

Real ChatOpenAI in ``create_agent`` + ``GovernorMiddleware``, and a real crewAI crew on
its native OpenAI provider with ``govern_tools`` + ``install()``, against the local
OpenAI-compatible server (``lg_openai_server``). What reaches the server is counted
there. The governor sleeps on a virtual clock, so backoff and Retry-After cost no time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from lg_openai_server import (
    FAST_RETRY,
    OpenAIServer,
    Reply,
    context_length_exceeded,
    insufficient_quota,
    invalid_api_key,
    rate_limit,
    server_error,
    tool_reply,
)
from lg_testing import VirtualClock

import loop_governor as lg
from langchain_governor import GovernorMiddleware
from loop_governor.context import ContextPruner
from loop_governor.trace import load_trace

KEY = "sk-test-governed-0000abcd"
MODEL = "gpt-4o-mini"
FALLBACK = "gpt-4o"
FATAL = {"insufficient_quota": insufficient_quota, "401": invalid_api_key}


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def make_governor(tmp_path: Path, clock: VirtualClock) -> Iterator[Callable[..., lg.Governor]]:
    made: list[lg.Governor] = []

    def make(**config: Any) -> lg.Governor:
        config.setdefault("trace_path", str(tmp_path / "trace.jsonl"))
        gov = lg.Governor(lg.GovernorConfig(**config), clock=clock, sleep=clock.sleep, asleep=clock.asleep)
        made.append(gov)
        return gov

    yield make
    for gov in made:
        if gov.lens is not None:
            gov.lens.close()


def added(partial_results: list[Any]) -> list[Any]:
    """What ``add_result`` recorded (partial results also hold the tool results after it)."""
    return [r for r in partial_results if "tool" not in r]


def tool_results(partial_results: list[Any]) -> list[str]:
    """The tools whose successful results the partial results hand back."""
    return [r["tool"] for r in partial_results if "tool" in r]


def failed_model_calls(gov: lg.Governor) -> list[dict[str, Any]]:
    gov.lens.flush()
    trace = load_trace(gov.config.trace_path)
    return [c for c in trace.model_calls if c.get("status") == "error"]


# ================================================================== LangChain: create_agent


def chat(server: OpenAIServer, model: str = MODEL, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=server.url, api_key=KEY, **kwargs)


def fetch_tool(gov: lg.Governor) -> Any:
    @tool
    def fetch_page(page: int) -> str:
        """Fetch one page of rows."""
        scope = gov.current_task()
        assert scope is not None
        scope.add_result({"page": page})
        return f"page {page}: " + "row " * 200

    return fetch_page


def pages(n: int) -> list[Reply | str]:
    """A script: fetch pages 0..n-1, one per turn, then answer."""
    return [*(tool_reply("fetch_page", {"page": i}) for i in range(n)), "done"]


def agent_for(server: OpenAIServer, gov: lg.Governor, model: Any = None, **middleware: Any) -> Any:
    return create_agent(model or chat(server), [fetch_tool(gov)], middleware=[GovernorMiddleware(gov, **middleware)])


def run(agent: Any, thread: str = "t1") -> Any:
    return agent.invoke({"messages": [("user", "collect the pages")]}, {"configurable": {"thread_id": thread}})


@pytest.mark.parametrize("fault", FATAL.values(), ids=FATAL.keys())
def test_langchain_fatal_reaches_the_provider_once_and_stops_with_partial_results(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor], fault: Callable[[], Any]
) -> None:
    gov = make_governor()
    openai_server.set_script(pages(5))
    openai_server.fail_at(2, fault=fault())  # the 2nd request: after one page was fetched
    openai_server.add_rule(lambda r: fault() if r.number > 2 else None)
    with pytest.raises(lg.FatalError) as stop:
        run(agent_for(openai_server, gov))
    assert openai_server.count() == 2  # one success, then the fatal error exactly once
    assert added(stop.value.partial_results) == [{"page": 0}]
    assert tool_results(stop.value.partial_results) == ["fetch_page"]
    (failed,) = failed_model_calls(gov)
    assert failed["error_type"] == "fatal" and failed["attempts"] == 1


def test_langchain_rate_limit_twice_then_success_completes(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor], clock: VirtualClock
) -> None:
    gov = make_governor()
    openai_server.set_script(pages(1))
    openai_server.fail_next(rate_limit(retry_after=3), times=2)
    state = run(agent_for(openai_server, gov))
    assert state["messages"][-1].content == "done"
    assert openai_server.count() == 4  # 2 x 429, then the tool call, then the answer
    assert clock.sleeps[:2] == [3.0, 3.0]  # Retry-After honoured, on the governor's clock


def test_langchain_server_error_forever_is_a_typed_error_after_max_attempts(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    gov = make_governor()
    openai_server.fail_forever(server_error())
    with pytest.raises(lg.TransientError) as err:
        run(agent_for(openai_server, gov))
    assert openai_server.count() == gov.config.retry_max_attempts
    assert err.value.info.status == 500


def test_langchain_fallback_model_answers_while_the_primary_is_down(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    gov = make_governor()
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    openai_server.set_script(pages(1))
    openai_server.add_rule(lambda r: server_error() if r.model == MODEL else None)
    state = run(agent_for(openai_server, gov, fallback_models=[chat(openai_server, FALLBACK)]))
    assert state["messages"][-1].content == "done"
    models = [r.model for r in openai_server.completions]
    assert models[:4] == [MODEL, MODEL, MODEL, FALLBACK]
    answered = [e for e in events if e["event"] == "model_call" and e["status"] == "ok"]
    assert answered and all(e["endpoint"] == f"openai:{FALLBACK}" for e in answered)
    assert [e["model"] for e in answered] == [FALLBACK] * len(answered)  # not the model that was down


def test_langchain_context_length_exceeded_once_retries_a_shorter_request(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    gov = make_governor()
    openai_server.set_script(pages(4))
    openai_server.fail_at(4, fault=context_length_exceeded(2000))
    state = run(agent_for(openai_server, gov, pruner_factory=ContextPruner))
    assert state["messages"][-1].content == "done"
    refused, retried = openai_server.completions[3], openai_server.completions[4]
    assert refused.status == 400 and retried.status == 200
    assert retried.content_chars < refused.content_chars / 2
    assert retried.message_count == refused.message_count  # no orphaned tool call or result


def test_langchain_context_length_exceeded_without_a_pruner_is_permanent(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    gov = make_governor()
    openai_server.fail_forever(context_length_exceeded(2000))
    with pytest.raises(lg.PermanentError):
        run(agent_for(openai_server, gov))
    assert openai_server.count() == 1


@pytest.mark.parametrize("streaming", [False, True], ids=["invoke", "streaming"])
def test_langchain_token_budget_fires_with_and_without_streaming(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor], streaming: bool
) -> None:
    gov = make_governor(max_tokens=1200)
    openai_server.set_script(pages(20))
    with pytest.raises(lg.BudgetExhaustedError) as spent:
        run(agent_for(openai_server, gov, model=chat(openai_server, streaming=streaming)))
    assert spent.value.info.code == "max_tokens"
    served = openai_server.completions
    used = sum(r.prompt_tokens or 0 for r in served)
    assert used >= 1200 and used - (served[-1].prompt_tokens or 0) < 1200  # stopped the call after crossing
    if streaming:
        assert all(r.include_usage for r in served)  # the governed copy asked for usage


# ====================================================================== crewAI: a real crew


def crew_for(server: OpenAIServer, gov: lg.Governor, *, model: str = MODEL, max_iter: int = 30) -> Any:
    import crewai
    from crewai.tools import BaseTool
    from lg_crewai import make_crew
    from pydantic import BaseModel

    from crewai_governor import govern_tools

    class PageArgs(BaseModel):
        page: int

    class FetchPage(BaseTool):
        name: str = "fetch_page"
        description: str = "Fetch one page of rows."
        args_schema: type[BaseModel] = PageArgs

        def _run(self, page: int) -> str:
            scope = gov.current_task()
            assert scope is not None
            scope.add_result({"page": page})
            return f"page {page}: " + "row " * 200

    llm = crewai.LLM(model=f"openai/{model}", base_url=server.url, api_key=KEY)
    tools = govern_tools([FetchPage()], gov)
    return make_crew(
        llm, tools, role="collector", goal="collect pages", tasks=[("Collect the pages.", "done")], max_iter=max_iter
    )


@pytest.mark.parametrize("fault", FATAL.values(), ids=FATAL.keys())
def test_crewai_fatal_reaches_the_provider_once_and_stops_with_partial_results(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor], fault: Callable[[], Any]
) -> None:
    from crewai_governor import install

    gov = make_governor()
    openai_server.set_script(pages(5))
    openai_server.add_rule(lambda r: fault() if r.number >= 2 else None)
    with pytest.raises(lg.FatalError) as stop, install(gov):
        crew_for(openai_server, gov).kickoff()
    assert openai_server.count() == 2  # crewAI's own LLM retry, its agent retries and the SDK's: none
    assert added(stop.value.partial_results) == [{"page": 0}]
    assert tool_results(stop.value.partial_results) == ["fetch_page"]
    (failed,) = failed_model_calls(gov)
    assert failed["error_type"] == "fatal" and failed["attempts"] == 1


def test_crewai_rate_limit_twice_then_success_completes(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor], clock: VirtualClock
) -> None:
    from crewai_governor import install

    gov = make_governor()
    openai_server.set_script(pages(1))
    openai_server.fail_next(rate_limit(retry_after=3), times=2)
    with install(gov):
        result = crew_for(openai_server, gov).kickoff()
    assert result.raw == "done"
    assert openai_server.count() == 4
    assert clock.sleeps[:2] == [3.0, 3.0]


def test_crewai_server_error_forever_is_a_typed_error_after_max_attempts(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    from crewai_governor import install

    gov = make_governor()
    openai_server.fail_forever(server_error())
    with pytest.raises(lg.TransientError) as err, install(gov):
        crew_for(openai_server, gov).kickoff()
    assert openai_server.count() == gov.config.retry_max_attempts
    assert err.value.info.status == 500


def test_crewai_token_budget_stops_within_one_request_of_crossing(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    from crewai_governor import install

    gov = make_governor(max_tokens=5000)
    openai_server.set_script(pages(40))
    with pytest.raises(lg.BudgetExhaustedError) as spent, install(gov):
        crew_for(openai_server, gov).kickoff()
    assert spent.value.info.code == "max_tokens"
    served = openai_server.completions
    totals = [sum((r.prompt_tokens or 0) + 1 for r in served[: i + 1]) for i in range(len(served))]
    crossed = next(i for i, t in enumerate(totals) if t >= 5000)
    assert len(served) == crossed + 1  # the request that crossed was the last one sent
    # ... and the tool call its reply asked for was refused too: budgets gate every call
    assert added(spent.value.partial_results) == [{"page": p} for p in range(len(served) - 1)]


def test_crewai_context_length_exceeded_once_retries_a_shorter_request(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    from crewai_governor import install

    gov = make_governor()
    openai_server.set_script(pages(4))
    openai_server.fail_at(4, fault=context_length_exceeded(2000))
    with install(gov, pruner_factory=ContextPruner):
        result = crew_for(openai_server, gov).kickoff()
    assert result.raw == "done"
    refused, retried = openai_server.completions[3], openai_server.completions[4]
    assert refused.status == 400 and retried.status == 200
    assert retried.content_chars < refused.content_chars / 2


def test_crewai_own_context_window_handling_still_runs_without_a_governor_pruner(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    """crewAI's default ``respect_context_window=True`` summarizes the history after a
    context overflow and goes on; the governed LLM (no ``install(pruner=...)``, so nothing
    for the governor to compact) must hand it the overflow, not stop the run."""
    from crewai_governor import install

    gov = make_governor()
    openai_server.set_script(pages(4))
    openai_server.fail_at(4, fault=context_length_exceeded(2000))
    crew = crew_for(openai_server, gov)
    assert crew.agents[0].respect_context_window
    with install(gov):
        result = crew.kickoff()
    assert result.raw == "done"
    statuses = [r.status for r in openai_server.completions]
    assert statuses[:4] == [200, 200, 200, 400] and statuses.count(400) == 1  # reached once, not retried


def test_crewai_fallback_llm_answers_while_the_primary_is_down(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    import crewai

    from crewai_governor import install

    gov = make_governor()
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    openai_server.set_script(pages(1))
    openai_server.add_rule(lambda r: server_error() if r.model == MODEL else None)
    fallback = crewai.LLM(model=f"openai/{FALLBACK}", base_url=openai_server.url, api_key=KEY)
    with gov.task("t") as scope, install(gov, fallback_llms=[fallback]):
        result = crew_for(openai_server, gov).kickoff()
        tokens = scope.tokens
    assert result.raw == "done"
    assert [r.model for r in openai_server.completions][:4] == [MODEL, MODEL, MODEL, FALLBACK]
    # the answers are the fallback's: its model name, its own usage report (not an estimate)
    answered = [e for e in events if e["event"] == "model_call" and e["status"] == "ok"]
    served = [r for r in openai_server.completions if r.status == 200]
    assert [e["model"] for e in answered] == [FALLBACK] * len(served)
    assert not any(e["usage_estimated"] for e in answered)
    assert [e["input_tokens"] for e in answered] == [r.prompt_tokens for r in served]
    assert tokens == sum(e["input_tokens"] + e["output_tokens"] for e in answered)


def test_crewai_a_hook_that_denies_the_model_call_is_not_a_model_failure(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    """A before_llm_call hook that aborts (crewAI runs the hooks inside the provider's
    call when no executor dispatched them: a direct call, a summary, a structured-output
    conversion) is the user's decision, not the endpoint failing: the deny reaches the
    caller as crewAI raised it, and nothing is counted against the model."""
    import crewai
    from crewai.hooks.dispatch import HookAborted, InterceptionPoint, register, unregister

    from crewai_governor.llm import govern_llm

    gov = make_governor()
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)

    def deny(_context: Any) -> None:
        raise HookAborted("blocked by the data-loss policy", source="dlp")

    llm = govern_llm(crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY), gov)
    register(InterceptionPoint.PRE_MODEL_CALL, deny)
    try:
        with gov.task("t"):
            for _ in range(4):
                with pytest.raises(HookAborted) as denied:
                    llm.call("hi")
                assert type(denied.value) is HookAborted and denied.value.source == "dlp"
    finally:
        unregister(InterceptionPoint.PRE_MODEL_CALL, deny)
    assert openai_server.count() == 0
    assert not [e for e in events if e["event"] in ("model_call", "loop_detected")]


# ======================================================== a fleet sharing one provider key


@pytest.mark.redis
def test_a_fleet_on_one_key_stays_within_its_shared_request_limit(
    openai_server: OpenAIServer, redis_server: str
) -> None:
    """4 processes, one key limited to 10 requests/s (burst 2), through a real redis-server:
    the server never sees more than 10/s + the burst, and no request is refused."""
    import subprocess
    import sys
    import uuid

    worker = Path(__file__).with_name("model_fleet_worker.py")
    ns, n, calls = f"lg-fleet-{uuid.uuid4().hex[:8]}", 4, 8
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), json.dumps(plan)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for plan in (
            {
                "id": i,
                "n": n,
                "ns": ns,
                "redis": redis_server,
                "server": openai_server.url,
                "calls": calls,
                "rpm": 600,
                "burst": 2,
            }
            for i in range(n)
        )
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    served = openai_server.completions
    assert len(served) == n * calls and all(r.status == 200 for r in served)
    # The shared bucket's promise, at the moment each process let a request go ...
    admitted = sorted(t for r in reports for t in r["admitted"])
    assert max(sum(1 for u in admitted if t <= u < t + 1.0) for t in admitted) <= 10 + 2
    # ... and at the server, where scheduling jitter on a loaded 2-core machine can move an
    # arrival by a fraction of a second into the next window (allow one request for it).
    assert openai_server.max_in_window(1.0) <= 10 + 2 + 1
    assert admitted[-1] - admitted[0] >= (n * calls - 2) / 10 - 0.05  # paced, not bursted
    assert sum(r["waits"] for r in reports) > 0 and all(r["fallbacks"] == 0 for r in reports)


def test_sdk_retries_keep_multiplies_requests_per_governed_attempt(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    """``sdk_retries="keep"``: each governed attempt may be 1 + max_retries requests."""
    gov = make_governor(sdk_retries="keep")
    openai_server.fail_forever(insufficient_quota().with_headers(FAST_RETRY))
    with pytest.raises(lg.FatalError):
        run(agent_for(openai_server, gov))
    assert openai_server.count() == 3  # the SDK's own 2 retries of a fatal error


def test_an_ungoverned_crewai_llm_failure_is_one_model_call_event(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    """crewAI emits two LLMCallFailedEvents for one failed call: the listener reports one."""
    import crewai
    from crewai.events import crewai_event_bus

    from crewai_governor import GovernorEventListener

    gov = make_governor(trace_path=None)
    seen: list[dict[str, Any]] = []
    gov.subscribe(seen.append)
    openai_server.fail_forever(invalid_api_key())
    llm = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)
    with crewai_event_bus.scoped_handlers(), GovernorEventListener(gov) as listener:
        with pytest.raises(openai.AuthenticationError):
            llm.call("hi")
        listener.flush()
    failed = [e for e in seen if e["event"] == "model_call"]
    assert len(failed) == 1 and failed[0]["status"] == "error"


def test_crewai_akickoff_fatal_reaches_the_provider_once(
    openai_server: OpenAIServer, make_governor: Callable[..., lg.Governor]
) -> None:
    import asyncio

    from crewai_governor import install

    gov = make_governor()
    openai_server.set_script(pages(5))
    openai_server.add_rule(lambda r: insufficient_quota() if r.number >= 2 else None)

    async def main() -> None:
        async with install(gov):
            await crew_for(openai_server, gov).akickoff()

    with pytest.raises(lg.FatalError) as stop:
        asyncio.run(main())
    assert openai_server.count() == 2
    assert added(stop.value.partial_results) == [{"page": 0}]
    assert tool_results(stop.value.partial_results) == ["fetch_page"]
