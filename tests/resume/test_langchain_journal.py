"""LangChain: the tool-call journal keeps a resumed run from repeating a side effect."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from lg_langchain import ScriptedChatModel, call_tool_until

import loop_governor as lg
from langchain_governor import GovernorMiddleware, ToolCallJournal, ToolJournalMiddleware
from loop_governor.checkpoint import CheckpointCorruptedError, FileCheckpointStore, MemoryCheckpointStore

# -- the crash test: a real process, SIGKILLed, resumed in a fresh one ----------------------


def _crash_and_resume(workdir: Path, rs: SimpleNamespace, *flags: str) -> dict[str, Any]:
    rs.assert_killed(rs.run_child("agent_child.py", workdir, "start", "--crash", *flags))
    assert not (workdir / "result.json").exists()
    rs.assert_ok(rs.run_child("agent_child.py", workdir, "resume", *flags))
    result: dict[str, Any] = json.loads((workdir / "result.json").read_text())
    result["ledger"] = (workdir / "side_effects.txt").read_text().splitlines()
    return result


def test_sigkill_after_side_effect_does_not_repeat_it_on_resume(tmp_path: Path, rs: SimpleNamespace) -> None:
    result = _crash_and_resume(tmp_path, rs)
    assert result["ledger"] == ["line-0", "line-1"]  # each side effect exactly once
    assert result["tool_results"] == ["appended line-0", "appended line-1"]
    assert result["final"] == "finished: appended line-0 | appended line-1"
    assert result["replayed"] == [lg.call_key("append_line", (), {"line": "line-1"})]


def test_same_crash_without_journal_repeats_the_side_effect(tmp_path: Path, rs: SimpleNamespace) -> None:
    # The control: proves the kill lands after the side effect and before LangGraph
    # saved the result, i.e. in the window the journal exists for.
    result = _crash_and_resume(tmp_path, rs, "--no-journal")
    assert result["ledger"] == ["line-0", "line-1", "line-1"]
    assert result["replayed"] == []


# -- in-process behaviour ----------------------------------------------------------------------


def scripted(lines: list[str], ids: list[str]) -> ScriptedChatModel:
    """Calls ``append_line`` once per turn with ``lines[n]`` and id ``ids[n]``, then answers."""
    return ScriptedChatModel(
        script=call_tool_until("append_line", len(lines), lambda n: {"line": lines[n]}, call_id=lambda n: ids[n])
    )


class Crash(RuntimeError):
    pass


class CrashOnceAfter(AgentMiddleware):
    """Fails the run once, right after the given call's result came back (journaled)."""

    def __init__(self, call_id: str) -> None:
        super().__init__()
        self.call_id = call_id
        self.fired = False

    def _check(self, request: Any) -> None:
        if request.tool_call["id"] == self.call_id and not self.fired:
            self.fired = True
            raise Crash("killed after the side effect")

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        result = handler(request)
        self._check(request)
        return result

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        result = await handler(request)
        self._check(request)
        return result


def _agent(ledger: list[str], model: ScriptedChatModel, middleware: list[Any], checkpointer: Any = None) -> Any:
    @tool
    def append_line(line: str) -> str:
        """Append a line (the side effect)."""
        ledger.append(line)
        return f"appended {line}"

    return create_agent(model, [append_line], middleware=middleware, checkpointer=checkpointer or InMemorySaver())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failed_run_resumes_with_journaled_result(tmp_path: Path, mode: str) -> None:
    ledger: list[str] = []
    governor = lg.Governor()
    events: list[dict[str, Any]] = []
    governor.subscribe(events.append)
    journal = ToolCallJournal(FileCheckpointStore(tmp_path))
    middleware = [CrashOnceAfter("c1"), ToolJournalMiddleware(journal, governor=governor), GovernorMiddleware(governor)]
    agent = _agent(ledger, scripted(lines=["a", "b"], ids=["c0", "c1"]), middleware)
    config: Any = {"configurable": {"thread_id": "t"}}

    def run(payload: Any) -> Any:
        if mode == "sync":
            return agent.invoke(payload, config)
        return asyncio.run(agent.ainvoke(payload, config))

    with pytest.raises(Crash):
        run({"messages": [("user", "go")]})
    assert ledger == ["a", "b"]
    state = run(None)
    assert ledger == ["a", "b"]
    assert [m.content for m in state["messages"] if isinstance(m, ToolMessage)] == ["appended a", "appended b"]
    assert state["messages"][-1].content == "done"
    assert [e["tool"] for e in events if e.get("journal")] == ["append_line"]


def test_reused_call_id_in_a_later_turn_runs_again() -> None:
    # Some providers number tool-call ids per message: "call_0" again, same arguments,
    # is a new call in a new turn and must not be answered from the journal.
    ledger: list[str] = []
    journal = ToolCallJournal(MemoryCheckpointStore())
    agent = _agent(ledger, scripted(lines=["a", "a"], ids=["call_0", "call_0"]), [ToolJournalMiddleware(journal)])
    agent.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "t"}})
    assert ledger == ["a", "a"]


def test_threads_do_not_share_journal_entries() -> None:
    ledger: list[str] = []
    store = MemoryCheckpointStore()
    agent = _agent(ledger, scripted(lines=["a"], ids=["c0"]), [ToolJournalMiddleware(ToolCallJournal(store))])
    for thread in ("t1", "t2"):
        agent.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": thread}})
    assert ledger == ["a", "a"]
    assert ToolCallJournal(store).threads() == ["t1", "t2"]


def test_run_without_thread_id_is_not_journaled() -> None:
    ledger: list[str] = []
    store = MemoryCheckpointStore()
    model = scripted(lines=["a"], ids=["c0"])

    @tool
    def append_line(line: str) -> str:
        """Append a line."""
        ledger.append(line)
        return "ok"

    agent = create_agent(model, [append_line], middleware=[ToolJournalMiddleware(store)])
    agent.invoke({"messages": [("user", "go")]})
    assert ledger == ["a"]
    assert store.list() == []


def test_concurrent_writers_of_one_thread_keep_both_entries(tmp_path: Path) -> None:
    first = ToolCallJournal(FileCheckpointStore(tmp_path))
    second = ToolCallJournal(FileCheckpointStore(tmp_path))
    assert second.get("t", "k2", "f2") is None  # second now holds a stale copy
    assert first.put("t", "k1", "f1", {"v": 1})
    assert second.put("t", "k2", "f2", {"v": 2})  # conflict -> reload, merge, save
    fresh = ToolCallJournal(FileCheckpointStore(tmp_path))
    assert fresh.get("t", "k1", "f1") == {"v": 1}
    assert fresh.get("t", "k2", "f2") == {"v": 2}
    assert fresh.get("t", "k1", "other-call") is None


def test_corrupt_journal_raises_instead_of_starting_over(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    journal = ToolCallJournal(store)
    journal.put("t", "k", "f", {"v": 1})
    path = store.path_for(journal.task_id("t"))
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(CheckpointCorruptedError):
        ToolCallJournal(FileCheckpointStore(tmp_path)).get("t", "k", "f")


def test_non_json_result_is_not_journaled_but_nothing_fails() -> None:
    journal = ToolCallJournal(MemoryCheckpointStore())
    assert journal.put("t", "k", "f", {"artifact": object()}) is False
    assert journal.get("t", "k", "f") is None


@pytest.mark.parametrize("tool_name", ["send_email", "reset-password", "refresh_token", "rotate-secret"])
def test_tools_named_like_secrets_are_replayed_too(tmp_path: Path, tool_name: str) -> None:
    # the journal's entries pass through checkpoint redaction: a tool name that looks
    # like a secret key must not turn its fingerprint into "[REDACTED]" (no replay)
    journal = ToolCallJournal(f"sqlite:///{tmp_path / 'j.db'}")
    fingerprint = lg.call_key(tool_name, (), {"user": "bob"})
    doc = {"type": "tool", "data": {"content": "done", "tool_call_id": "c"}}
    journal.put("thread-1", f"ai-1/{tool_name}", fingerprint, doc)
    reopened = ToolCallJournal(f"sqlite:///{tmp_path / 'j.db'}")
    assert reopened.get("thread-1", f"ai-1/{tool_name}", fingerprint) == doc
