"""LangChain test helpers shared by the test folders and the crash-test child process.

A scripted chat model with a working ``bind_tools`` and the scripts it plays. No pytest
here: ``agent_child.py`` imports this module too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

Script = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose reply is a function of the conversation it is shown.

    Choosing replies from the conversation (not from a call counter) keeps it correct
    across retries and resumes. ``prompts`` records every prompt exactly as received.
    ``bind_tools`` works (returns the model), unlike LangChain's built-in fakes. When
    ``usage`` is set, every reply carries it as ``usage_metadata`` (and finish reason
    "stop"), the way provider integrations report it; otherwise replies go out as the
    script made them.
    """

    script: Any
    prompts: list[list[BaseMessage]] = Field(default_factory=list)
    tool_names: list[list[str]] = Field(default_factory=list)  # the tools offered, per bind (model request)
    usage: dict[str, Any] | None = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        names = [t.get("name", "") if isinstance(t, dict) else getattr(t, "name", "") for t in tools or ()]
        self.tool_names.append([str(n) for n in names])
        return self

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        self.prompts.append(list(messages))
        reply = self.script(list(messages))
        if self.usage is not None:
            reply = reply.model_copy(
                update={"usage_metadata": dict(self.usage), "response_metadata": {"finish_reason": "stop"}}
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return self._reply(messages)


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """An assistant message asking for one tool call."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def tool_messages(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def call_tool_until(
    name: str,
    times: int,
    args: Callable[[int], dict[str, Any]],
    final: str | Callable[[list[ToolMessage]], str] = "done",
    call_id: Callable[[int], str] = lambda n: f"call_{n}",
) -> Script:
    """Script: call ``name`` (one call per turn, the n-th with ``args(n)`` and id
    ``call_id(n)``) until ``times`` results came back, then answer ``final`` (a text, or a
    function of the tool results)."""

    def script(messages: list[BaseMessage]) -> AIMessage:
        results = tool_messages(messages)
        seen = len(results)
        if seen >= times:
            return AIMessage(content=final if isinstance(final, str) else final(results))
        return tool_call(name, args(seen), call_id(seen))

    return script
