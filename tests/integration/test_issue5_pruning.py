"""Issue 5 wiring, end to end: the real ContextPruner behind every adapter plug point.

create_agent + GovernorMiddleware, LangGraph's create_react_agent + make_pre_model_hook,
RunnableWithMessageHistory + GovernedChatMessageHistory, and a real crew with
install(pruner_factory=ContextPruner). In each: the model receives the pruned view (old
big results stubbed, old big tool-call arguments elided, the last 3 results verbatim, no
orphaned call/result), the stored history stays complete, and between two boundary
moves each prompt starts with the previous one byte for byte (the provider's prompt
cache keeps hitting).
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from crewai.tools import BaseTool as CrewBaseTool
from langchain.agents import create_agent
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel

import loop_governor as lg
from crewai_governor import govern_tool, install
from langchain_governor import GovernedChatMessageHistory, GovernorMiddleware, make_pre_model_hook
from loop_governor.context import ContextPruner, PruneReport

SYSTEM = "You are a careful coding agent."
ROUNDS = 14
KEEP = 3  # ContextPruner's default keep_last
STUB = "[old result of "


class RecordingPruner(ContextPruner):
    """The real pruner, remembering what each ``prune`` call decided (boundary moves)."""

    def __init__(self, **kw: Any) -> None:
        self.rebuilds = 0
        super().__init__(**kw)
        self.reports: list[PruneReport] = []

    def _reset(self) -> None:  # the pruner rebuilds its state when history was rewritten
        self.rebuilds += 1
        super()._reset()

    def prune(self, messages: Sequence[Any]) -> list[Any]:
        out = super().prune(messages)
        assert self.last_report is not None
        self.reports.append(self.last_report)
        return out


def file_text(path: str) -> str:
    return f"# {path}\n" + f"def handler_{sum(map(ord, path)) % 97}(event):  # from {path}\n    return event\n" * 120


def file_body(n: int) -> str:
    return f"# generated module {n}\n" + "VALUE = compute(1, 2, 3)  # keep in sync\n" * 90


def coder_script(kit: Any) -> Callable[[list[BaseMessage]], AIMessage]:
    """Reads a big file most rounds, writes a big file every fourth, answers after 14."""

    def script(messages: list[BaseMessage]) -> AIMessage:
        n = len(kit.lc_results(messages))
        if n >= ROUNDS:
            return AIMessage(content="refactoring done")
        if n % 4 == 3:
            return kit.tool_call("write_file", {"path": f"gen/m{n}.py", "body": file_body(n)}, f"call_{n}")
        return kit.tool_call("read_file", {"path": f"src/mod{n}.py"}, f"call_{n}")

    return script


@tool
def read_file(path: str) -> str:
    """Read a source file."""
    return file_text(path)


@tool
def write_file(path: str, body: str) -> str:
    """Write a source file."""
    return f"wrote {len(body)} chars to {path}"


def check_model_saw_pruned_view(
    kit: Any, prompts: list[list[BaseMessage]], reports: list[PruneReport], full: Sequence[BaseMessage]
) -> None:
    """What the issue's must-show says the model receives, checked on every prompt."""
    assert len(prompts) == ROUNDS + 1 == len(reports)  # one prune per model call
    stored = {m.tool_call_id: m for m in kit.lc_results(full)}
    for prompt in prompts:
        kit.assert_lc_pairs_intact(prompt)
        results = kit.lc_results(prompt)
        assert [m.tool_call_id for m in results] == list(stored)[: len(results)]  # nothing dropped
        for m in results[-KEEP:]:
            assert m.content == stored[m.tool_call_id].content  # the last 3 verbatim
        for m in results[:-KEEP]:
            assert m.content == stored[m.tool_call_id].content or str(m.content).startswith(STUB)

    # by the end, old big results are stubs and old big file bodies are elided
    last = prompts[-1]
    results = kit.lc_results(last)
    stubbed = [m for m in results if str(m.content).startswith(STUB)]
    big_old = [m for m in results[:-KEEP] if len(str(stored[m.tool_call_id].content)) > 1000]
    assert len(stubbed) >= len(big_old) - 2  # at most one batch behind
    assert len(stubbed) >= 6
    bodies = [c["args"]["body"] for m in last if isinstance(m, AIMessage) for c in m.tool_calls if "body" in c["args"]]
    assert any(b.startswith("[elided") for b in bodies)
    seen_chars = sum(len(kit.lc_bytes(m)) for m in last)
    full_chars = sum(len(kit.lc_bytes(m)) for m in full)
    assert seen_chars < 0.5 * full_chars

    # cache-friendly: between boundary moves every prompt extends the previous one
    moves = [i for i, r in enumerate(reports) if r.advanced]
    assert 2 <= len(moves) <= len(prompts) // 2
    for i in range(1, len(prompts)):
        before = [kit.lc_bytes(m) for m in prompts[i - 1]]
        now = [kit.lc_bytes(m) for m in prompts[i]]
        if i in moves:
            assert now[:2] == before[:2]  # the system prompt and the task are never touched
        else:
            assert now[: len(before)] == before, f"prompt {i} rewrote the cached prefix without a boundary move"


def check_history_is_full(kit: Any, messages: Sequence[BaseMessage]) -> None:
    results = kit.lc_results(messages)
    assert len(results) == ROUNDS
    for m in results:
        assert not str(m.content).startswith(STUB)
    for m in messages:
        if isinstance(m, AIMessage):
            for call in m.tool_calls:
                if call["name"] == "read_file":
                    assert next(r for r in results if r.tool_call_id == call["id"]).content == file_text(
                        call["args"]["path"]
                    )
                if call["name"] == "write_file":
                    assert call["args"]["body"] == file_body(int(call["id"].removeprefix("call_")))


# -- create_agent + GovernorMiddleware(pruner=ContextPruner()) --------------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_create_agent_model_sees_pruned_view_state_keeps_everything(
    mode: str, kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    pruner = RecordingPruner()
    model = kit.ScriptedChatModel(script=coder_script(kit))
    agent = create_agent(
        model,
        [read_file, write_file],
        system_prompt=SYSTEM,
        middleware=[GovernorMiddleware(governor, pruner=pruner)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": f"refactor-{mode}"}}
    payload = {"messages": [("user", "Refactor the handlers.")]}
    result = agent.invoke(payload, config) if mode == "sync" else asyncio.run(agent.ainvoke(payload, config))

    assert result["messages"][-1].content == "refactoring done"
    assert all(p[0].content == SYSTEM for p in model.prompts)
    check_model_saw_pruned_view(kit, model.prompts, pruner.reports, result["messages"])
    check_history_is_full(kit, result["messages"])
    check_history_is_full(kit, agent.get_state(config).values["messages"])  # the checkpointer too
    pruning = [e for e in events if e["event"] == "pruning"]
    assert len(pruning) == ROUNDS + 1
    assert pruning[-1]["tokens_after"] < 0.5 * pruning[-1]["tokens_before"]


# -- langgraph create_react_agent + make_pre_model_hook ---------------------------------------
def test_pre_model_hook_model_sees_pruned_view_state_keeps_everything(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        pruner = RecordingPruner()
        model = kit.ScriptedChatModel(script=coder_script(kit))
        agent = create_react_agent(
            model,
            [read_file, write_file],
            prompt=SYSTEM,
            pre_model_hook=make_pre_model_hook(pruner, governor),
            checkpointer=InMemorySaver(),
        )
    config = {"configurable": {"thread_id": "react-1"}}
    result = agent.invoke({"messages": [("user", "Refactor the handlers.")]}, config)

    assert result["messages"][-1].content == "refactoring done"
    assert all(p[0].content == SYSTEM for p in model.prompts)
    check_model_saw_pruned_view(kit, model.prompts, pruner.reports, result["messages"])
    check_history_is_full(kit, result["messages"])
    check_history_is_full(kit, agent.get_state(config).values["messages"])
    assert len([e for e in events if e["event"] == "pruning"]) == ROUNDS + 1


# -- RunnableWithMessageHistory + GovernedChatMessageHistory ----------------------------------
def coding_session() -> list[BaseMessage]:
    """A finished tool-using session, as a chat history holds it."""
    messages: list[BaseMessage] = [HumanMessage("Refactor the handlers.")]
    for n in range(ROUNDS):
        path = f"src/mod{n}.py"
        messages.append(
            AIMessage(content="", tool_calls=[{"name": "read_file", "args": {"path": path}, "id": f"call_{n}"}])
        )
        messages.append(ToolMessage(file_text(path), tool_call_id=f"call_{n}", name="read_file"))
    messages.append(AIMessage("refactoring done"))
    return messages


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_chat_history_serves_the_pruned_view_and_stores_everything(kit: Any, governor: lg.Governor) -> None:
    store = InMemoryChatMessageHistory()
    store.add_messages(coding_session())
    pruner = RecordingPruner()
    history = GovernedChatMessageHistory(store, pruner, governor)
    model = kit.ScriptedChatModel(script=lambda messages: AIMessage(content=f"answer {len(messages)}"))
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), MessagesPlaceholder("history"), ("user", "{q}")])
    chain = RunnableWithMessageHistory(
        prompt | model, lambda session_id: history, input_messages_key="q", history_messages_key="history"
    )

    questions = ["Which modules changed?", "Any risky edits?", "Summarise the diff.", "Ready to merge?"]
    for q in questions:
        chain.invoke({"q": q}, {"configurable": {"session_id": "s1"}})

    assert len(model.prompts) == len(questions)
    full = store.messages
    assert len(full) == len(coding_session()) + 2 * len(questions)  # every turn written in full
    check_history_is_full(kit, full[: len(coding_session())])
    stored = {m.tool_call_id: m for m in kit.lc_results(full)}
    for seen in model.prompts:
        kit.assert_lc_pairs_intact(seen)
        results = kit.lc_results(seen)
        assert len(results) == ROUNDS
        assert all(m.content == stored[m.tool_call_id].content for m in results[-KEEP:])
        assert sum(str(m.content).startswith(STUB) for m in results) >= ROUNDS - KEEP - 2
    # later turns only append: each prompt minus its question is a prefix of the next one
    for before, now in zip(model.prompts, model.prompts[1:], strict=False):
        head = [kit.lc_bytes(m) for m in before]
        assert [kit.lc_bytes(m) for m in now][: len(head)] == head


# -- a real crew: install(g, pruner_factory=ContextPruner) ------------------------------------
class QueryArgs(BaseModel):
    query: str


def search_text(query: str) -> str:
    return f"results for {query}:\n" + f"A paragraph of documentation about {query}. " * 180


class SearchDocs(CrewBaseTool):
    name: str = "search_docs"
    description: str = "Search the documentation."
    args_schema: type[BaseModel] = QueryArgs

    def _run(self, query: str) -> str:
        return search_text(query)


def test_crew_llm_receives_pruned_list_with_pairs_and_cache_breakpoints(
    kit: Any, governor: lg.Governor, events: list[dict[str, Any]]
) -> None:
    pruners: list[RecordingPruner] = []

    def factory() -> RecordingPruner:
        pruners.append(RecordingPruner())
        return pruners[-1]

    def script(messages: list[dict[str, Any]], turn: int) -> Any:
        return kit.Final("summary of 12 searches") if turn >= 12 else kit.ToolStep("search_docs", {"query": f"q{turn}"})

    llm = kit.ScriptedLLM(model="scripted", script=script)
    crew = kit.make_crew(llm, [govern_tool(SearchDocs(), governor)])
    with install(governor, pruner_factory=factory):
        out = crew.kickoff()

    assert out.raw == "summary of 12 searches"
    assert len(pruners) == 1  # one conversation, one stateful pruner
    # crewAI keeps the pruned list as its history; the hook hands the pruner its originals
    # back, so it only ever ingests new messages (O(new) a turn) and never rebuilds.
    assert pruners[0].rebuilds == 1  # the constructor's initial reset only
    reports = pruners[0].reports
    received = llm.received
    assert len(received) == 13 == len(reports)
    for messages in received:
        kit.assert_dict_pairs_intact(messages)
        # crewAI marks the stable head for provider caching: the marks survive pruning
        assert messages[0]["role"] == "system" and messages[0].get("cache_breakpoint") is True
        assert messages[1]["role"] == "user" and messages[1].get("cache_breakpoint") is True
        results = [m for m in messages if m.get("role") == "tool"]
        full = {m["tool_call_id"]: search_text(f"q{m['tool_call_id'].removeprefix('call_')}") for m in results}
        for m in results[-KEEP:]:
            assert m["content"] == full[m["tool_call_id"]]  # the last 3 verbatim
        for m in results[:-KEEP]:
            assert str(m["content"]).startswith(STUB) or m["content"] == full[m["tool_call_id"]]
    last_results = [m for m in received[-1] if m.get("role") == "tool"]
    assert len(last_results) == 12
    assert sum(str(m["content"]).startswith(STUB) for m in last_results) >= 12 - KEEP - 2

    moves = [i for i, r in enumerate(reports) if r.advanced]
    assert 2 <= len(moves) <= len(received) // 2
    for i in range(1, len(received)):
        before = [json.dumps(m, sort_keys=True) for m in received[i - 1]]
        now = [json.dumps(m, sort_keys=True) for m in received[i]]
        if i not in moves:
            assert now[: len(before)] == before, f"call {i} rewrote the cached prefix without a boundary move"
    pruning = [e for e in events if e["event"] == "pruning"]
    assert pruning and all(e["tokens_after"] < e["tokens_before"] for e in pruning)
