"""Child process for the LangChain crash test: create_agent + SqliteSaver + a side effect.

Usage: ``python agent_child.py WORKDIR start|resume [--no-journal] [--crash]``.

The scripted model asks for ``append_line`` twice (one call per turn), then answers.
The tool appends its line to WORKDIR/side_effects.txt (fsynced) -- the side effect that
must happen once. With ``--crash`` the outermost middleware SIGKILLs the process right
after the *second* tool call returned through the journal, before LangGraph saved the
tool node's result: the exact window the journal exists for. ``resume`` continues the
thread with ``agent.invoke(None, config)``. On success WORKDIR/result.json gets the
final answer, the tool results in graph state and the journal replay events.

Imports only what the run needs (LangChain, LangGraph, the adapter, the core, the
LangChain test helpers from ``tests/``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the lg_* helpers

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver
from lg_langchain import ScriptedChatModel, call_tool_until

import loop_governor as lg
from langchain_governor import GovernorMiddleware, ToolCallJournal, ToolJournalMiddleware
from loop_governor.checkpoint import SQLiteCheckpointStore

WORKDIR = Path(sys.argv[1])
MODE = sys.argv[2]
FLAGS = set(sys.argv[3:])
CONFIG: Any = {"configurable": {"thread_id": "thread-1"}}


@tool
def append_line(line: str) -> str:
    """Append a line to the ledger (a side effect that must not happen twice)."""
    with open(WORKDIR / "side_effects.txt", "a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return f"appended {line}"


class CrashAfterSecondCall(AgentMiddleware):
    """Test harness: SIGKILL once the second call's result is back (journaled, unsaved)."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        result = handler(request)
        if request.tool_call["id"] == "call_1":
            os.kill(os.getpid(), signal.SIGKILL)
        return result


events: list[dict[str, Any]] = []
governor = lg.Governor()
governor.subscribe(events.append)
middleware: list[Any] = []
if "--crash" in FLAGS:
    middleware.append(CrashAfterSecondCall())
if "--no-journal" not in FLAGS:
    journal = ToolCallJournal(SQLiteCheckpointStore(WORKDIR / "journal.db"))
    middleware.append(ToolJournalMiddleware(journal, governor=governor))
middleware.append(GovernorMiddleware(governor))

conn = sqlite3.connect(WORKDIR / "graph.db", check_same_thread=False)
# Asks for append_line twice (one call per turn), then answers with the tool results; the
# reply is chosen from the conversation (tool results so far), so it survives the resume.
model = ScriptedChatModel(
    script=call_tool_until(
        "append_line",
        2,
        lambda n: {"line": f"line-{n}"},
        final=lambda results: "finished: " + " | ".join(str(m.content) for m in results),
    )
)
agent = create_agent(model, [append_line], middleware=middleware, checkpointer=SqliteSaver(conn))
payload = {"messages": [("user", "append two lines")]} if MODE == "start" else None
# durability="sync": each step is on disk before the next starts, so the only unsaved
# work at the kill is the crashed tool node itself.
state = agent.invoke(payload, CONFIG, durability="sync")
(WORKDIR / "result.json").write_text(
    json.dumps(
        {
            "final": state["messages"][-1].content,
            "tool_results": [m.content for m in state["messages"] if isinstance(m, ToolMessage)],
            "replayed": [e["call_key"] for e in events if e.get("event") == "tool_call" and e.get("journal")],
        }
    ),
    encoding="utf-8",
)
