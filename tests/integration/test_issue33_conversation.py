"""Issue 33, LangChain: stops and withdrawals leave the conversation whole.

A real ``ChatOpenAI`` in ``create_agent`` + ``GovernorMiddleware`` talks to the local
OpenAI-compatible server in its enforcing mode (``history_rules``): an assistant message
whose ``tool_calls`` lack a tool message for each id is a 400 (OpenAI's rule, Anthropic's and
Bedrock's too), and in the Anthropic mode so is tool history sent without ``tools``. Every
test runs sync, async and streaming where the path differs.

* Build 1: every stop in the tool node (a revoked key, ``ToolPolicy(max_calls=...)``, a
  withdrawn tool called anyway, a poll's bound) answers each pending call of the turn with
  an error ToolMessage saying why, with and without a checkpointer; the next user message on
  the thread starts a new task and is answered.
* Build 2: every way a run ends ends its task, ``task_end`` saying how: completed, stopped,
  failed, cancelled (``asyncio.wait_for``, ``KeyboardInterrupt``, a stream left unread),
  LangGraph's ``GraphRecursionError``; no task scope outlives its run.
* Build 3: a tool withdrawn for repeating is offered again after another tool's
  state-changing success (the docs' start_engine / press_brake), and the model is told.
* Build 4: a withdrawal never produces a request a provider rejects: with every tool
  withdrawn the tools stay defined (the prompt cache's first block unchanged) and an OpenAI
  model is told ``tool_choice="none"``.
* Build 8: a fatal model stop is never an instance of the provider's retryable class.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolCallLimitMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from lg_openai_server import OpenAIServer, RecordedRequest, Reply, ToolCall, insufficient_quota, rate_limit
from lg_testing import HTTPError, governed, no_asleep, no_sleep

import loop_governor as lg
from langchain_governor import GovernorMiddleware

KEY = "sk-test-issue33-0000"
MODES = ("invoke", "ainvoke", "stream", "astream")


def chat(server: OpenAIServer, mode: str = "invoke", **kwargs: Any) -> ChatOpenAI:
    """A real ChatOpenAI; streaming in the stream modes; an async run gets its own HTTP
    client (langchain-openai caches one per base URL, bound to the first event loop)."""
    if mode.startswith("a"):
        kwargs.setdefault("http_async_client", httpx.AsyncClient())
    return ChatOpenAI(model="gpt-4o-mini", base_url=server.url, api_key=KEY, streaming="stream" in mode, **kwargs)


def run(agent: Any, mode: str, text: str, config: dict[str, Any] | None = None) -> list[Any]:
    """One user turn in ``mode``; the messages the run left (the stream's last values)."""
    payload = {"messages": [("user", text)]}
    if mode == "invoke":
        return list(agent.invoke(payload, config)["messages"])
    if mode == "ainvoke":
        return list(asyncio.run(agent.ainvoke(payload, config))["messages"])
    if mode == "stream":
        values = [chunk for chunk in agent.stream(payload, config, stream_mode="values")]
        return list(values[-1]["messages"])

    async def astream() -> list[Any]:
        values = [chunk async for chunk in agent.astream(payload, config, stream_mode="values")]
        return list(values[-1]["messages"])

    return asyncio.run(astream())


def governor(**config: Any) -> tuple[lg.Governor, list[dict[str, Any]]]:
    gov = lg.Governor(lg.GovernorConfig(**config), sleep=no_sleep, asleep=no_asleep)
    events: list[dict[str, Any]] = []
    gov.subscribe(events.append)
    return gov, events


def ends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "task_end"]


def settled(middleware: GovernorMiddleware) -> int:
    """How many tasks are live once runs freed by a garbage collection were swept (the
    sweeper thread does that soon after the collection; ``len`` does it at once)."""
    gc.collect()
    return len(middleware._tasks)


def thanks_or(turn: Callable[[RecordedRequest], Reply | str]) -> Callable[[RecordedRequest], Reply | str]:
    """A script: ``turn(request)``, but a user's "thanks" gets a text answer."""

    def reply(request: RecordedRequest) -> Reply | str:
        last = request.messages[-1]
        if last.get("role") == "user" and "thanks" in str(last.get("content")):
            return "You are welcome."
        return turn(request)

    return reply


def calls(*names_args: tuple[str, dict[str, Any]]) -> Callable[[RecordedRequest], Reply]:
    """Every turn asks for these calls (ids unique per request)."""
    return lambda r: Reply(
        tool_calls=tuple(ToolCall(n, a, id=f"c{r.number}_{i}") for i, (n, a) in enumerate(names_args))
    )


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(history_rules="anthropic") as started:
        yield started


def assert_answered(messages: list[Any]) -> list[ToolMessage]:
    """Every tool call of the conversation has its ToolMessage; the answers."""
    asked = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    answers = [m for m in messages if isinstance(m, ToolMessage)]
    assert sorted(asked) == sorted(m.tool_call_id for m in answers)
    return answers


def no_rejected_requests(server: OpenAIServer) -> None:
    rejected = [r.outcome for r in server.completions if r.status == 400]
    assert not rejected, rejected


# ============================================================================ Build 1


@tool
def crm_lookup(customer: str) -> str:
    """Look a customer up in the CRM."""
    raise HTTPError(401, "invalid api key for the CRM")


@tool
def send_sms(text: str) -> str:
    """Send a text message."""
    return "queued"


@tool
def job_status(job_id: str) -> str:
    """The status of a build job."""
    return json.dumps({"job_id": job_id, "state": "running"})


STOPS: dict[str, tuple[Callable[[RecordedRequest], Reply], dict[str, Any], str]] = {
    # a tool backend's revoked key, asked twice in one turn
    "revoked_key": (calls(("crm_lookup", {"customer": "acme"}), ("crm_lookup", {"customer": "globex"})), {}, "401"),
    # a per-tool limit, with a second call in the turn that crosses it
    "max_calls": (
        lambda r: Reply(
            tool_calls=(ToolCall("send_sms", {"text": f"m{r.number}"}, id=f"c{r.number}"),)
            + ((ToolCall("job_status", {"job_id": "J-9"}, id=f"c{r.number}b"),) if r.number >= 3 else ())
        ),
        {"tools": {"send_sms": lg.ToolPolicy(max_calls=2)}},
        "max_calls",
    ),
    # the same call, the same answer: warned, withdrawn, then called anyway
    "withdrawn": (calls(("job_status", {"job_id": "J-1"})), {}, "no_progress"),
    # a declared poll past its bound
    "poll_bound": (
        calls(("job_status", {"job_id": "J-1"})),
        {"tools": {"job_status": lg.ToolPolicy(poll=True, max_calls=3)}},
        "poll_max_calls",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("stop", STOPS)
def test_a_stop_in_the_tool_node_answers_every_pending_call_and_the_thread_goes_on(
    server: OpenAIServer, stop: str, mode: str
) -> None:
    script, config, code = STOPS[stop]
    server.set_script(thanks_or(script))
    gov, events = governor(**config)
    agent = create_agent(
        chat(server, mode),
        [crm_lookup, send_sms, job_status],
        middleware=[GovernorMiddleware(gov)],
        checkpointer=InMemorySaver(),
    )
    thread = {"configurable": {"thread_id": f"{stop}-{mode}"}}
    with pytest.raises(lg.FatalError) as stopped:
        run(agent, mode, "look into it", thread)
    assert code in (stopped.value.info.code, str(stopped.value.info.status))
    messages = agent.get_state(thread).values["messages"]
    assert_answered(messages)
    turn = next(m for m in reversed(messages) if isinstance(m, AIMessage) and m.tool_calls)
    answers = [
        m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id in {c["id"] for c in turn.tool_calls}
    ]
    # the stop's own call says why (a call of the turn that ran before the stop keeps its result)
    assert any(m.status == "error" and governed(m.content)["type"] == "fatal" for m in answers)
    assert [e["outcome"] for e in ends(events)] == ["stopped"]
    # the next user message is a new task, and the provider accepts the thread
    reply = run(agent, mode, "thanks", thread)
    assert reply[-1].content == "You are welcome."
    assert [e["event"] for e in events].count("task_start") == 2
    assert [e["outcome"] for e in ends(events)] == ["stopped", "completed"]
    no_rejected_requests(server)


@pytest.mark.parametrize("mode", MODES)
def test_without_a_checkpointer_the_stop_is_raised_after_the_answers_are_written(
    server: OpenAIServer, mode: str
) -> None:
    server.set_script(STOPS["revoked_key"][0])
    gov, events = governor()
    agent = create_agent(chat(server, mode), [crm_lookup], middleware=[GovernorMiddleware(gov)])
    updates: list[Any] = []

    async def astream() -> None:
        async for chunk in agent.astream({"messages": [("user", "look")]}, stream_mode="updates"):
            updates.append(chunk)

    with pytest.raises(lg.FatalError):
        if mode.startswith("a"):
            asyncio.run(astream())
        else:
            updates.extend(agent.stream({"messages": [("user", "look")]}, stream_mode="updates"))
    answered = [m for u in updates for m in (u.get("tools") or {}).get("messages", ())]
    assert sorted(m.tool_call_id for m in answered) == ["c1_0", "c1_1"]
    assert all(m.status == "error" for m in answered)
    assert "invalid api key" in " ".join(m.content for m in answered)
    assert [e["outcome"] for e in ends(events)] == ["stopped"]


def test_the_stop_is_the_stopping_calls_answer_and_the_other_calls_are_not_run(server: OpenAIServer) -> None:
    sent: list[str] = []

    @tool
    def notify(to: str) -> str:
        """Notify someone."""
        sent.append(to)
        return "notified"

    # one turn: the stopping call first, then a call of another tool (sequential tool node)
    server.set_script(thanks_or(calls(("crm_lookup", {"customer": "acme"}), ("notify", {"to": "ops"}))))
    gov, _ = governor()
    agent = create_agent(
        chat(server), [crm_lookup, notify], middleware=[GovernorMiddleware(gov)], checkpointer=InMemorySaver()
    )
    thread = {"configurable": {"thread_id": "t"}}
    with pytest.raises(lg.FatalError):
        agent.invoke({"messages": [("user", "go")]}, thread)
    answers = {m.name: m for m in assert_answered(agent.get_state(thread).values["messages"])}
    assert governed(answers["crm_lookup"].content)["message"].endswith("invalid api key for the CRM")
    if not sent:  # the tool node may run the turn's calls in parallel: then it ran
        assert "notify was not run: the run was stopped" in answers["notify"].content


# ============================================================================ Build 2


def slow_tool_agent(
    server: OpenAIServer, gov: lg.Governor, started: asyncio.Event | None = None, **kwargs: Any
) -> tuple[Any, GovernorMiddleware]:
    @tool
    async def build(target: str) -> str:
        """Run a slow build."""
        if started is not None:
            started.set()
        await asyncio.sleep(30)
        return "built"

    server.set_script(thanks_or(calls(("build", {"target": "all"}))))
    middleware = GovernorMiddleware(gov)
    return create_agent(chat(server, "ainvoke"), [build], middleware=[middleware], **kwargs), middleware


def test_thirty_cancelled_runs_leave_no_task_behind(server: OpenAIServer) -> None:
    gov, events = governor()
    agent, middleware = slow_tool_agent(server, gov)

    async def thirty() -> None:
        for _ in range(30):  # cancelled wherever the timeout falls: in the model call or the tool
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(agent.ainvoke({"messages": [("user", "build it")]}), 0.1)

    asyncio.run(thirty())
    # a run the timeout cancels before its first model request (a loaded machine) never opened a task
    started = [e for e in events if e["event"] == "task_start"]
    assert 0 < len(started) <= 30
    assert [e["outcome"] for e in ends(events)] == ["cancelled"] * len(started)
    assert len(middleware._tasks) == 0


def test_a_cancelled_turn_leaves_the_thread_usable_and_the_next_turn_a_new_task(server: OpenAIServer) -> None:
    gov, events = governor()

    async def turns() -> Any:
        started = asyncio.Event()
        agent, _ = slow_tool_agent(server, gov, started, checkpointer=InMemorySaver())
        turn = asyncio.ensure_future(agent.ainvoke({"messages": [("user", "build it")]}, thread))
        await started.wait()
        turn.cancel()  # the user presses stop while the build runs
        with pytest.raises(asyncio.CancelledError):
            await turn
        return agent, await agent.ainvoke({"messages": [("user", "thanks")]}, thread)

    thread = {"configurable": {"thread_id": "stop-button"}}
    _, reply = asyncio.run(turns())

    assert reply["messages"][-1].content == "You are welcome."
    (answer,) = assert_answered(reply["messages"])
    assert answer.status == "error" and "build was not run" in answer.content and "cancelled" in answer.content
    assert [e["outcome"] for e in ends(events)] == ["cancelled", "completed"]
    no_rejected_requests(server)


def test_a_keyboard_interrupt_in_a_tool_ends_the_task_as_cancelled(server: OpenAIServer) -> None:
    @tool
    def deploy(env: str) -> str:
        """Deploy."""
        raise KeyboardInterrupt

    server.set_script(thanks_or(calls(("deploy", {"env": "prod"}))))
    gov, events = governor()
    middleware = GovernorMiddleware(gov)
    agent = create_agent(chat(server), [deploy], middleware=[middleware], checkpointer=InMemorySaver())
    thread = {"configurable": {"thread_id": "ctrl-c"}}
    with pytest.raises(KeyboardInterrupt):
        agent.invoke({"messages": [("user", "deploy")]}, thread)
    assert [(e["outcome"], e["error_class"]) for e in ends(events)] == [("cancelled", "KeyboardInterrupt")]
    assert agent.invoke({"messages": [("user", "thanks")]}, thread)["messages"][-1].content == "You are welcome."
    no_rejected_requests(server)


@pytest.mark.parametrize("limit", [5, 6], ids=["tools-last", "model-last"])
@pytest.mark.parametrize("threaded", [False, True], ids=["no-thread", "thread"])
def test_graph_recursion_error_ends_the_task(server: OpenAIServer, limit: int, threaded: bool) -> None:
    server.set_script(
        thanks_or(lambda r: Reply(tool_calls=(ToolCall("job_status", {"job_id": f"J-{r.number}"}, id=f"c{r.number}"),)))
    )
    gov, events = governor()
    middleware = GovernorMiddleware(gov)
    agent = create_agent(
        chat(server), [job_status], middleware=[middleware], checkpointer=InMemorySaver() if threaded else None
    )
    config: dict[str, Any] = {"recursion_limit": limit}
    if threaded:
        config["configurable"] = {"thread_id": f"limit-{limit}"}
    try:
        agent.invoke({"messages": [("user", "poll")]}, config)
    except GraphRecursionError:
        pass
    else:
        pytest.fail("the run was expected to hit the recursion limit")
    assert settled(middleware) == 0
    (end,) = ends(events)
    assert (end["outcome"], end["error_class"]) == ("failed", "GraphRecursionError")
    if threaded:  # a model step at the limit left its tool call unanswered: answered now
        assert agent.invoke({"messages": [("user", "thanks")]}, config)["messages"][-1].content == "You are welcome."
        no_rejected_requests(server)


@pytest.mark.parametrize("threaded", [False, True], ids=["no-thread", "thread"])
def test_an_exception_in_another_middlewares_node_ends_the_task(server: OpenAIServer, threaded: bool) -> None:
    server.set_script(thanks_or(calls(("job_status", {"job_id": "J-1"}))))
    gov, events = governor()
    middleware = GovernorMiddleware(gov)
    limit = ToolCallLimitMiddleware(run_limit=1, exit_behavior="error")
    agent = create_agent(
        chat(server), [job_status], middleware=[middleware, limit], checkpointer=InMemorySaver() if threaded else None
    )
    config = {"configurable": {"thread_id": "limit"}} if threaded else None
    with pytest.raises(Exception, match="limit"):
        agent.invoke({"messages": [("user", "poll")]}, config)
    assert settled(middleware) == 0
    (end,) = ends(events)
    # with a thread, its checkpoint says what failed; without, only that the run ended
    expected = ("failed", "ToolCallLimitExceededError") if threaded else ("abandoned", "RunAbandoned")
    assert (end["outcome"], end["error_class"]) == expected
    if threaded:  # its after_model raised with the model's tool call unanswered: answered now
        assert agent.invoke({"messages": [("user", "thanks")]}, config)["messages"][-1].content == "You are welcome."
        no_rejected_requests(server)


def test_a_stream_its_consumer_stops_reading_ends_its_task(server: OpenAIServer) -> None:
    server.set_script(thanks_or(calls(("job_status", {"job_id": "J-1"}))))
    gov, events = governor()
    middleware = GovernorMiddleware(gov)
    agent = create_agent(chat(server, "stream"), [job_status], middleware=[middleware])
    stream = agent.stream({"messages": [("user", "poll")]}, stream_mode="updates")
    next(stream)
    next(stream)
    stream.close()  # the user navigated away
    del stream
    assert settled(middleware) == 0
    assert [e["outcome"] for e in ends(events)] == ["abandoned"]


def test_a_run_paused_at_an_interrupt_keeps_its_task_until_it_is_resumed(server: OpenAIServer) -> None:
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.types import Command

    server.set_script(
        thanks_or(lambda r: "Sent." if r.messages[-1].get("role") == "tool" else calls(("send_sms", {"text": "hi"}))(r))
    )
    gov, events = governor()
    middleware = GovernorMiddleware(gov)
    agent = create_agent(
        chat(server),
        [send_sms],
        middleware=[middleware, HumanInTheLoopMiddleware({"send_sms": True})],
        checkpointer=InMemorySaver(),
    )
    thread = {"configurable": {"thread_id": "hitl"}}
    paused = agent.invoke({"messages": [("user", "text mum")]}, thread)
    assert "__interrupt__" in paused
    assert settled(middleware) == 1 and ends(events) == []  # waiting for the human
    done = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), thread)
    assert done["messages"][-1].content == "Sent."
    assert [e["outcome"] for e in ends(events)] == ["completed"]
    assert [e["event"] for e in events].count("task_start") == 1


# ============================================================================ Build 3 and 4


class Car:
    def __init__(self) -> None:
        self.brake = False
        self.starts = 0


def car_tools(car: Car) -> list[Any]:
    @tool
    def start_engine() -> str:
        """Start the engine."""
        car.starts += 1
        if not car.brake:
            raise ValueError(
                "Brake pedal must be pressed when starting the engine. Please press the brake pedal first."
            )
        return "Engine started."

    @tool
    def press_brake_pedal() -> str:
        """Press the brake pedal."""
        car.brake = True
        return "Brake pedal pressed."

    return [start_engine, press_brake_pedal]


def stubborn_then_fixes(request: RecordedRequest) -> Reply | str:
    """Starts the engine until it is withdrawn, then presses the brake, then starts again
    once start_engine is offered again; answers when the engine runs."""
    tool_texts = [str(m.get("content")) for m in request.messages if m.get("role") == "tool"]
    if any("Engine started" in t for t in tool_texts):
        return "The engine is running."
    if any("start_engine is offered again" in t for t in tool_texts):
        return calls(("start_engine", {}))(request)
    if any("start_engine is now withdrawn" in t for t in tool_texts):
        return calls(("press_brake_pedal", {}))(request)
    return calls(("start_engine", {}))(request)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rules", ["openai", "anthropic"])
def test_a_withdrawn_tool_comes_back_after_the_fix_and_the_task_finishes(mode: str, rules: str) -> None:
    car = Car()
    gov, events = governor()
    with OpenAIServer(stubborn_then_fixes, history_rules=rules) as server:
        agent = create_agent(chat(server, mode), car_tools(car), middleware=[GovernorMiddleware(gov)])
        messages = run(agent, mode, "start the car")
        offered = [[t["function"]["name"] for t in r.tools] for r in server.completions]
        no_rejected_requests(server)
    assert messages[-1].content == "The engine is running."
    assert car.starts == 2  # the first start, then the one after the fix (the repeats: from memory)
    restored = [e for e in events if e["event"] == "tool_restored"]
    assert [(e["tool"], e["reason"], e["by"]) for e in restored] == [
        ("start_engine", "world_changed", "press_brake_pedal")
    ]
    # left out of the request while withdrawn, offered again after the fix
    assert offered[0] == ["start_engine", "press_brake_pedal"] and offered[-1] == offered[0]
    assert ["press_brake_pedal"] in offered


@pytest.mark.parametrize("mode", MODES)
def test_with_every_tool_withdrawn_the_tools_stay_defined_and_tool_calls_are_forbidden(
    server: OpenAIServer, mode: str
) -> None:
    def script(request: RecordedRequest) -> Reply | str:
        if request.body.get("tool_choice") == "none":
            return "The job is still running; I will stop polling."
        return calls(("job_status", {"job_id": "J-1"}))(request)

    server.set_script(script)
    gov, events = governor()
    agent = create_agent(chat(server, mode), [job_status], middleware=[GovernorMiddleware(gov)])
    messages = run(agent, mode, "is the build done?")
    assert messages[-1].content.startswith("The job is still running")
    last = server.completions[-1]
    assert last.tools == server.completions[0].tools and last.body["tool_choice"] == "none"
    assert [e["outcome"] for e in ends(events)] == ["completed"]
    no_rejected_requests(server)


# ============================================================================ Build 8


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_quota_stop_is_never_the_providers_retryable_class(server: OpenAIServer, mode: str) -> None:
    server.fail_forever(insufficient_quota())
    gov, _ = governor()
    agent = create_agent(chat(server, mode), [job_status], middleware=[GovernorMiddleware(gov)])
    retried = 0
    for _ in range(3):  # an application's own retry loop
        try:
            run(agent, mode, "hi")
        except openai.RateLimitError:
            retried += 1
        except lg.FatalError as stop:
            assert isinstance(stop.__cause__, openai.RateLimitError)  # the provider's error is the cause
            break
    assert retried == 0 and server.count() == 1


def test_a_rate_limit_the_governor_gave_up_on_is_still_the_providers_class(server: OpenAIServer) -> None:
    server.fail_forever(rate_limit(retry_after=0.001))
    gov, _ = governor()
    agent = create_agent(chat(server), [job_status], middleware=[GovernorMiddleware(gov)])
    with pytest.raises(openai.RateLimitError) as raised:  # not a stop: the caller may retry later
        agent.invoke({"messages": [("user", "hi")]})
    assert isinstance(raised.value, lg.TransientError)


# ============================================================================ the server's rules


def test_the_server_enforces_each_providers_history_rules() -> None:
    asked = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    answered = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    for rules in ("openai", "anthropic", "bedrock"):
        with OpenAIServer(history_rules=rules) as server:
            client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
            user = {"role": "user", "content": "hi"}
            with pytest.raises(openai.BadRequestError) as unanswered:
                client.chat.completions.create(model="m", messages=[user, asked, user], tools=tools)
            with pytest.raises(openai.BadRequestError):
                client.chat.completions.create(model="m", messages=[user, answered], tools=tools)
            client.chat.completions.create(model="m", messages=[user, asked, answered, user], tools=tools)
            if rules == "openai":
                assert "must be followed by tool messages responding to each 'tool_call_id'" in str(unanswered.value)
                client.chat.completions.create(model="m", messages=[user, asked, answered, user])  # no tools: fine
            else:
                with pytest.raises(openai.BadRequestError) as no_tools:
                    client.chat.completions.create(model="m", messages=[user, asked, answered, user])
                assert ("must define tools" if rules == "anthropic" else "toolConfig field must be defined") in str(
                    no_tools.value
                )
            assert [r.outcome for r in server.completions].count("history_rejected") == (2 if rules == "openai" else 3)
