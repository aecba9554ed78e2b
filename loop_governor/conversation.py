"""What a stop owes the conversation it ends: an answer to every tool call still waiting.

Providers check a conversation's shape before they read it. OpenAI answers 400 to a
history whose assistant ``tool_calls`` lack a tool message for each ``tool_call_id``;
Anthropic's Messages API ("``tool_use`` ids were found without ``tool_result`` blocks
immediately after") and Bedrock's Converse API do the same, and both also refuse tool
history sent without tool definitions. A run that stops (or is cancelled) between the
model asking for tools and the tools answering leaves exactly that shape behind, and on a
checkpointed thread every later turn then fails. So the adapters answer each pending call
before the run ends -- or, when the run ended without them, before the next one starts --
with the texts made here, from the calls this module finds.

Works on LangChain messages and OpenAI-style dicts alike, through the pruner's codecs
(`loop_governor.context.view`): the core imports no framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loop_governor.context.view import ASSISTANT, TOOL, codec_for
from loop_governor.errors import ErrorFormat, ErrorType, FatalError, GovernedError

__all__ = [
    "PendingCall",
    "links",
    "not_run_text",
    "pending_tool_calls",
    "stop_text",
    "uses_tools",
]


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A tool call of an assistant message that no tool message answers.

    ``after`` is the position (in the list the call was found in) after which its answer
    belongs: the assistant message's own, or that of the last tool message answering it
    (answers go right after their call, before any other message)."""

    id: str
    name: str
    after: int


def links(messages: Sequence[Any]) -> tuple[list[str], list[str | None]]:
    """The tool-call ids the assistant messages issued, and the ids tool results answer
    (None for a result that names no call: a ReAct conversation's)."""
    calls: list[str] = []
    results: list[str | None] = []
    for m in messages:
        codec = codec_for(m)
        role = codec.role(m)
        if role == ASSISTANT:
            calls.extend(c.id for c in codec.tool_calls(m) if c.id is not None)
        elif role == TOOL:
            results.append(codec.tool_call_id(m))
    return calls, results


def pending_tool_calls(messages: Sequence[Any]) -> list[PendingCall]:
    """Every tool call of ``messages`` that no tool message answers, in order.

    A call counts as answered by a tool message with its id anywhere after it (a second
    answer would be refused as well). Calls without an id (a ReAct text conversation has
    none) cannot be answered by id and are not listed."""
    answered = set(links(messages)[1])
    pending: list[PendingCall] = []
    for i, m in enumerate(messages):
        codec = codec_for(m)
        if codec.role(m) != ASSISTANT:
            continue
        calls = [c for c in codec.tool_calls(m) if c.id is not None and c.id not in answered]
        if not calls:
            continue
        after = i
        for j in range(i + 1, len(messages)):  # after the answers the turn already has
            if codec_for(messages[j]).role(messages[j]) != TOOL:
                break
            after = j
        pending.extend(PendingCall(str(c.id), c.name, after) for c in calls)
    return pending


def uses_tools(messages: Sequence[Any]) -> bool:
    """Whether the conversation holds tool history (a tool call or a tool result): then
    Anthropic and Bedrock require the request to define tools."""
    for m in messages:
        codec = codec_for(m)
        role = codec.role(m)
        if role == TOOL or (role == ASSISTANT and codec.tool_calls(m)):
            return True
    return False


def stop_text(stop: FatalError) -> str:
    """The answer to the tool call whose outcome stopped the run: the governor's text for
    the failure the model would have read (``Error: ...`` then ``Fatal: ...``)."""
    return stop.info.to_model_text()


def not_run_text(tool: str | None, reason: str, format: ErrorFormat = "text") -> str:
    """The answer to a tool call that was not run because the run ended first; ``reason``
    says how it ended (a stop's reason, "the run was cancelled", ...), ``format`` is the
    governor's ``error_format``."""
    info = GovernedError(
        error_type=ErrorType.FATAL,
        tool=tool,
        code="not_run",
        message=f"{tool or 'this tool'} was not run: {reason}",
        attempts=0,
        advice="the run ended before this call ran; ask again if it is still needed",
    )
    return info.to_model_text(format)
