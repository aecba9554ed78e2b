"""install(): pruning in before_llm_call, scoping, thread safety, the response event."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from crewai.hooks.dispatch import InterceptionPoint, get_hooks

import loop_governor as lg
from crewai_governor import GovernorHooks, govern_tool, install

ANSWER = "summarised five searches"


class KeepLastExchanges:
    """Stand-in for ContextPruner: drop all but the last ``keep`` tool exchanges.

    An exchange is an assistant message with tool calls plus the tool results answering
    them; both go together. Every output is recorded so the test can compare it with
    what the model received.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.outputs: list[list[dict[str, Any]]] = []

    def prune(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        exchanges = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("tool_calls")]
        drop: set[int] = set()
        for i in exchanges[: max(0, len(exchanges) - self.keep)]:
            ids = {c["id"] for c in messages[i]["tool_calls"]}
            drop.add(i)
            drop |= {j for j, m in enumerate(messages) if m.get("role") == "tool" and m.get("tool_call_id") in ids}
        out = [m for j, m in enumerate(messages) if j not in drop]
        self.outputs.append([dict(m) for m in out])
        return out


class DropAssistantsOnly:
    """A broken pruner: removes tool calls but keeps their results (orphans them)."""

    def prune(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [m for m in messages if not (m.get("role") == "assistant" and m.get("tool_calls"))]


class TrimOldObservations:
    """ReAct stand-in: older assistant turns keep their first line only."""

    def __init__(self, keep: int = 1) -> None:
        self.keep = keep
        self.outputs: list[list[dict[str, Any]]] = []

    def prune(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        old = set(turns[: max(0, len(turns) - self.keep)])
        out = [
            {**m, "content": str(m["content"]).split("\n", 1)[0] + "\n[observation pruned]"} if i in old else m
            for i, m in enumerate(messages)
        ]
        self.outputs.append([dict(m) for m in out])
        return out


def five_searches(kit: Any) -> list[Any]:
    return [kit.ToolStep("search_docs", {"query": f"q{i}"}) for i in range(5)] + [kit.Final(ANSWER)]


def assert_pairs_intact(messages: list[dict[str, Any]]) -> None:
    issued: list[str] = []
    for m in messages:
        if m.get("role") == "assistant":
            issued.extend(c["id"] for c in m.get("tool_calls") or [])
        if m.get("role") == "tool":
            assert m["tool_call_id"] in issued, f"orphaned tool result {m['tool_call_id']}"
    answered = {m["tool_call_id"] for m in messages if m.get("role") == "tool"}
    assert set(issued) <= answered, f"tool calls without results: {set(issued) - answered}"


def test_llm_receives_the_pruned_list_with_pairs_intact(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    backend = kit.Backend()
    llm = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
    pruner = KeepLastExchanges(keep=2)
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(backend), governor)])

    with install(governor, pruner=pruner):
        out = crew.kickoff()

    assert out.raw == ANSWER
    assert backend.count == 5  # pruning changed what the model saw, not what it did
    assert len(llm.received) == 6
    assert llm.received == pruner.outputs  # the model got exactly the pruner's output
    last = llm.received[-1]
    assert [m["tool_call_id"] for m in last if m.get("role") == "tool"] == ["call_3", "call_4"]
    assert last[0]["role"] == "system" and last[1]["role"] == "user"
    for received in llm.received:
        assert_pairs_intact(received)
    pruning = [e for e in events if e["event"] == "pruning"]
    assert pruning, "pruning fired but emitted no event"
    assert all(e["messages_after"] < e["messages_before"] for e in pruning)
    assert all(e["tokens_after"] < e["tokens_before"] for e in pruning)


def test_pruning_on_react_text(kit: Any, governor: lg.Governor) -> None:
    llm = kit.ScriptedLLM(model="scripted", native=False, script=five_searches(kit))
    pruner = TrimOldObservations(keep=1)
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(kit.Backend()), governor)])

    with install(governor, pruner=pruner):
        assert crew.kickoff().raw == ANSWER

    assert llm.received == pruner.outputs
    shown = kit.all_text(llm)
    assert "[observation pruned]" in shown
    # only the newest assistant turn still carries its observation
    last_assistants = [m["content"] for m in llm.received[-1] if m.get("role") == "assistant"]
    assert sum("Observation:" in c for c in last_assistants) == 1


def test_pruner_output_that_orphans_a_tool_result_is_not_sent(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    llm = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
    crew = kit.make_crew(llm, [govern_tool(kit.SearchTool(kit.Backend()), governor)])

    with install(governor, pruner=DropAssistantsOnly()):
        assert crew.kickoff().raw == ANSWER

    for received in llm.received:
        assert_pairs_intact(received)
    assert sum(1 for m in llm.received[-1] if m.get("role") == "tool") == 5
    assert any(e["event"] == "pruning_rejected" for e in events)


def test_scoped_install_applies_to_one_run_only(kit: Any, governor: lg.Governor) -> None:
    pruner = KeepLastExchanges(keep=1)
    inside = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
    with install(governor, pruner=pruner):
        kit.make_crew(inside, [kit.SearchTool(kit.Backend())]).kickoff()
    calls_inside = len(pruner.outputs)

    outside = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
    kit.make_crew(outside, [kit.SearchTool(kit.Backend())]).kickoff()

    assert sum(1 for m in inside.received[-1] if m.get("role") == "tool") == 1
    assert sum(1 for m in outside.received[-1] if m.get("role") == "tool") == 5
    assert len(pruner.outputs) == calls_inside == 6


def test_global_install_until_uninstalled(kit: Any, governor: lg.Governor) -> None:
    pruner = KeepLastExchanges(keep=1)
    installation = install(governor, pruner=pruner, scoped=False)
    try:
        hooks = installation.hooks
        assert hooks.before_llm_call in get_hooks(InterceptionPoint.PRE_MODEL_CALL)
        first = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
        kit.make_crew(first, [kit.SearchTool(kit.Backend())]).kickoff()
    finally:
        installation.uninstall()
    assert hooks.before_llm_call not in get_hooks(InterceptionPoint.PRE_MODEL_CALL)
    assert hooks.after_tool_call not in get_hooks(InterceptionPoint.POST_TOOL_CALL)

    second = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
    kit.make_crew(second, [kit.SearchTool(kit.Backend())]).kickoff()

    assert sum(1 for m in first.received[-1] if m.get("role") == "tool") == 1
    assert sum(1 for m in second.received[-1] if m.get("role") == "tool") == 5


def test_two_crews_in_threads_keep_their_own_scoped_hooks(kit: Any, make_governor: Any) -> None:
    results: dict[str, Any] = {}

    def run(label: str, keep: int) -> None:
        gov = make_governor()
        pruner = KeepLastExchanges(keep=keep)
        llm = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
        with install(gov, pruner=pruner):
            kit.make_crew(llm, [govern_tool(kit.SearchTool(kit.Backend()), gov)]).kickoff()
        results[label] = (llm, pruner)

    threads = [threading.Thread(target=run, args=(label, keep)) for label, keep in (("a", 1), ("b", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for label, keep in (("a", 1), ("b", 3)):
        llm, pruner = results[label]
        assert llm.received == pruner.outputs
        assert sum(1 for m in llm.received[-1] if m.get("role") == "tool") == keep


def test_pruner_factory_gives_each_executor_its_own_pruner(kit: Any, governor: lg.Governor) -> None:
    from crewai import Agent, Crew, Task

    made: list[KeepLastExchanges] = []

    def factory() -> KeepLastExchanges:
        made.append(KeepLastExchanges(keep=1))
        return made[-1]

    tasks, llms = [], []
    for name in ("alpha", "beta"):
        llm = kit.ScriptedLLM(model="scripted", native=True, script=five_searches(kit))
        agent = Agent(
            role=f"{name} researcher",
            goal="answer",
            backstory="careful",
            llm=llm,
            tools=[kit.SearchTool(kit.Backend())],
            max_iter=12,
        )
        tasks.append(Task(description=f"Task {name}.", expected_output="answer", agent=agent))
        llms.append(llm)

    with install(governor, pruner_factory=factory):
        Crew(agents=[t.agent for t in tasks], tasks=tasks).kickoff()

    assert len(made) == 2
    for pruner, name in zip(made, ("alpha", "beta"), strict=True):
        seen = {str(m["content"]) for out in pruner.outputs for m in out if m.get("role") == "user"}
        task_prompts = [text for text in seen if "Current Task" in text]
        assert task_prompts and all(f"Task {name}." in text for text in task_prompts)
    for llm, pruner in zip(llms, made, strict=True):
        assert llm.received == pruner.outputs


class _Executor:
    pass


class _Context:
    def __init__(self, messages: list[dict[str, Any]], executor: Any) -> None:
        self.messages = messages
        self.executor = executor


class OneCallerAtATime(KeepLastExchanges):
    """Fails if two threads are inside prune() at once (a stateful pruner is not reentrant)."""

    def __init__(self) -> None:
        super().__init__(keep=1)
        self.inside = 0
        self.overlaps = 0
        self.guard = threading.Lock()

    def prune(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with self.guard:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1
        time.sleep(0.002)  # widen the window a race would need; the result does not depend on it
        try:
            return super().prune(messages)
        finally:
            with self.guard:
                self.inside -= 1


def _conversation(n: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for i in range(n):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "t", "arguments": "{}"}}],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"r{i}"})
    return msgs


def test_hooks_are_thread_safe_with_a_shared_pruner(governor: lg.Governor) -> None:
    pruner = OneCallerAtATime()
    hooks = GovernorHooks(governor, pruner=pruner)
    contexts = [_Context(_conversation(4), _Executor()) for _ in range(8)]
    barrier = threading.Barrier(len(contexts))

    def run(ctx: _Context) -> None:
        barrier.wait()
        hooks.before_llm_call(ctx)

    threads = [threading.Thread(target=run, args=(c,)) for c in contexts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert pruner.overlaps == 0
    for ctx in contexts:
        assert [m.get("tool_call_id") for m in ctx.messages if m["role"] == "tool"] == ["c3"]


def test_pruner_factory_is_per_executor_under_threads(governor: lg.Governor) -> None:
    made: list[KeepLastExchanges] = []
    lock = threading.Lock()

    def factory() -> KeepLastExchanges:
        with lock:
            made.append(KeepLastExchanges(keep=2))
            return made[-1]

    hooks = GovernorHooks(governor, pruner_factory=factory)
    executors = [_Executor() for _ in range(4)]
    contexts = [_Context(_conversation(3 + i % 2), executors[i % 4]) for i in range(16)]
    threads = [threading.Thread(target=hooks.before_llm_call, args=(c,)) for c in contexts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert len(made) == 4
    assert sum(len(p.outputs) for p in made) == 16


def test_after_llm_call_emits_the_final_response(kit: Any, governor: lg.Governor, events: list[dict[str, Any]]) -> None:
    llm = kit.ScriptedLLM(
        model="scripted",
        native=True,
        script=[kit.ToolStep("search_docs", {"query": "x"}), kit.Final("the answer is 42")],
    )
    with install(governor):
        kit.make_crew(llm, [govern_tool(kit.SearchTool(kit.Backend()), governor)]).kickoff()

    responses = [e for e in events if e["event"] == "response"]
    assert [e["text"] for e in responses] == ["the answer is 42"]
    assert responses[0]["agent_role"] == "researcher"
    # the crew ran inside one governor task opened by the hooks
    starts = [e for e in events if e["event"] == "task_start"]
    assert len(starts) == 1 and starts[0]["task_id"].startswith("crewai-crew-")
    assert responses[0]["task_id"] == starts[0]["task_id"]


@pytest.mark.parametrize("mode", ["kickoff", "kickoff_async"])
def test_standalone_agent_kickoff_runs_in_a_governor_task(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]], native: bool, mode: str
) -> None:
    # crewAI starts a standalone Agent.kickoff with crew=None, flow=<AgentExecutor>
    from crewai import Agent

    backend = kit.Backend(status=404)
    # the same two failing calls twice (alternating dodges crewAI's same-input guard)
    steps = [kit.ToolStep("search_docs", {"query": "x"}), kit.ToolStep("search_docs", {"query": "y"})] * 2
    llm = kit.ScriptedLLM(model="scripted", native=native, script=[*steps, kit.Final("done")])
    agent = Agent(
        role="r", goal="g", backstory="b", llm=llm, tools=[govern_tool(kit.SearchTool(backend), governor)], max_iter=10
    )
    with install(governor):
        if mode == "kickoff":
            agent.kickoff("find")
        else:
            asyncio.run(agent.kickoff_async("find"))

    assert backend.count == 2  # the repeats were answered from the task's known-bad memory
    starts = [e for e in events if e["event"] == "task_start"]
    assert len(starts) == 1 and starts[0]["task_id"].startswith("crewai-flow-")
    assert [e["task_id"] for e in events if e["event"] == "task_end"] == [starts[0]["task_id"]]
    assert {e["task_id"] for e in events if e["event"] == "tool_call"} == {starts[0]["task_id"]}
    assert governor.current_task() is None


class CountingPruner:
    def __init__(self) -> None:
        self.calls = 0

    def prune(self, messages: list[Any]) -> list[Any]:
        self.calls += 1
        return list(messages)


def test_global_hooks_copied_into_executors_stop_after_uninstall(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]], native: bool
) -> None:
    # crewAI copies the global LLM hooks into every executor it builds: kicking the same
    # crew off again after uninstall() reuses an executor that still holds them.
    pruner = CountingPruner()
    llm = kit.ScriptedLLM(
        model="scripted", native=native, script=[kit.ToolStep("search_docs", {"query": "a"}), kit.Final("done")]
    )
    crew = kit.make_crew(llm, [kit.SearchTool(kit.Backend())])
    with install(governor, pruner=pruner, scoped=False) as installation:
        crew.kickoff()
    calls_inside, events_inside = pruner.calls, len(events)
    assert calls_inside == 2

    crew.kickoff()

    assert pruner.calls == calls_inside
    assert events[events_inside:] == []
    assert not installation.hooks.active


def test_scoped_installation_can_be_entered_again(kit: Any, governor: lg.Governor) -> None:
    pruner = CountingPruner()
    installation = install(governor, pruner=pruner)
    for _ in range(2):
        with installation:
            llm = kit.ScriptedLLM(model="scripted", native=True, script=[kit.Final("done")])
            kit.make_crew(llm, []).kickoff()
    assert pruner.calls == 2
