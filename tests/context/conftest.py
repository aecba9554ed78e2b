"""Builders for small conversations in both message kinds (OpenAI dicts and LangChain)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage


class Dicts:
    """OpenAI-style dict messages (what CrewAI passes)."""

    kind = "dict"

    @staticmethod
    def system(text: str) -> Any:
        return {"role": "system", "content": text}

    @staticmethod
    def user(text: Any, **extra: Any) -> Any:
        return {"role": "user", "content": text, **extra}

    @staticmethod
    def ai(text: str = "", calls: list[tuple[str | None, str, dict[str, Any]]] = ()) -> Any:  # type: ignore[assignment]
        m: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            m["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for cid, name, args in calls
            ]
        return m

    @staticmethod
    def tool(call_id: str | None, content: Any, name: str = "bash", error: bool = False) -> Any:
        m: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
        if error:
            m["content"] = '{"error":{"type":"permanent","message":"' + str(content) + '"}}'
        return m

    @staticmethod
    def text(m: Any) -> Any:
        return m["content"]

    @staticmethod
    def args(m: Any, i: int = 0) -> dict[str, Any]:
        return json.loads(m["tool_calls"][i]["function"]["arguments"])


class LangChain:
    kind = "langchain"

    @staticmethod
    def system(text: str) -> Any:
        return SystemMessage(content=text)

    @staticmethod
    def user(text: Any, **extra: Any) -> Any:
        return HumanMessage(content=text, **extra)

    @staticmethod
    def ai(text: str = "", calls: list[tuple[str | None, str, dict[str, Any]]] = ()) -> Any:  # type: ignore[assignment]
        return AIMessage(
            content=text,
            tool_calls=[{"id": cid, "name": name, "args": args, "type": "tool_call"} for cid, name, args in calls],
        )

    @staticmethod
    def tool(call_id: str | None, content: Any, name: str = "bash", error: bool = False) -> Any:
        return ToolMessage(
            content=content, tool_call_id=call_id or "", name=name, status="error" if error else "success"
        )

    @staticmethod
    def text(m: Any) -> Any:
        return m.content

    @staticmethod
    def args(m: Any, i: int = 0) -> dict[str, Any]:
        return dict(m.tool_calls[i]["args"])


@pytest.fixture(params=[Dicts, LangChain], ids=["dict", "langchain"])
def kind(request: pytest.FixtureRequest) -> Any:
    return request.param


def requests_of(messages: list[Any]) -> list[int]:
    """Indices before which the model was called (one per assistant message) plus the end."""
    ends = [i for i, m in enumerate(messages) if _is_ai(m)]
    return [*ends, len(messages)]


def _is_ai(m: Any) -> bool:
    return (m.get("role") if isinstance(m, dict) else m.type) in ("assistant", "ai")


def agent_run(kind: Any, steps: int, result_chars: int = 3000, arg_chars: int = 10) -> list[Any]:
    """system, task, then ``steps`` x (assistant call, tool result) with distinct payloads."""
    msgs = [kind.system("You are a coding agent."), kind.user("Fix the bug in parser.py")]
    for s in range(steps):
        body = f"step {s} " + ("é" * (arg_chars - 8) if arg_chars > 8 else "")
        msgs.append(kind.ai(f"thinking {s}", [(f"c{s}", "bash", {"command": f"cat f{s}.py", "body": body})]))
        msgs.append(kind.tool(f"c{s}", f"out{s} " + "line of output\n" * (result_chars // 15)))
    return msgs


for _cls in (Dicts, LangChain):
    _cls.requests_of = staticmethod(requests_of)  # type: ignore[attr-defined]
    _cls.run = classmethod(lambda cls, *a, **k: agent_run(cls, *a, **k))  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def kinds() -> tuple[Any, Any]:
    """Both builders (session-scoped so hypothesis tests can use them)."""
    return Dicts, LangChain
