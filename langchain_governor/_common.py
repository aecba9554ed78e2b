"""Small helpers shared by the LangChain adapter modules.

Kept here so the tool wrapper, the middleware and the callback handler agree on the
one thing that must not drift between them: how a LangChain call is named for the
governor (default governor, task id, call-key arguments) and how a model call is
described in an event.
"""

from __future__ import annotations

import inspect
import json
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_openai_messages
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp, is_invalid_resume

import loop_governor as lg
from loop_governor.adapter import PassThrough

STATE_TASK_KEY = "governor_task_id"
"""Graph-state key where the middleware keeps a generated task id (runs without a thread_id)."""


def is_control_flow(exc: BaseException) -> bool:
    """LangGraph control flow, never a tool failure: an interrupt or parent command
    (``GraphBubbleUp``), or a resume value an ``interrupt()`` rejected, which LangGraph
    re-raises so the interrupt stays open to be answered again."""
    return isinstance(exc, GraphBubbleUp) or is_invalid_resume(exc)


def handed_back(exc: Exception) -> PassThrough:
    """A LangGraph control-flow exception handed back through the governor as it came
    ([`PassThrough`][loop_governor.adapter.PassThrough]): never the call's failure, nor its
    success (an interrupt answered no question of the tool's: a half-open breaker's
    probe is handed back, the task's world does not move on). A governed tool's fatal stop
    (also a ``GraphBubbleUp``) is re-raised instead, so the governor records it as the
    fatal failure it is."""
    if isinstance(exc, lg.FatalError):
        raise exc
    return PassThrough(exc)


def thread_id_of(config: Mapping[str, Any] | None) -> str | None:
    """The LangGraph ``thread_id`` of a runnable config, if the run has one."""
    if not config:
        return None
    configurable = config.get("configurable") or {}
    value = configurable.get("thread_id")
    return None if value is None else str(value)


# LangGraph's config keys for the runtime (which every ToolNode requires, in a graph or
# invoked on its own) and for the task (one node execution) a call runs in. Its constants
# module is internal, so the literals are used; a rename would make governed tools answer
# with error content instead of raising to the ToolNode, and never replay an outcome.
_GRAPH_RUNTIME_KEY = "__pregel_runtime"
_GRAPH_TASK_KEY = "__pregel_task_id"


def in_tool_node(config: Mapping[str, Any] | None) -> bool:
    """Whether a LangGraph ToolNode runs this call (it answers tool errors itself)."""
    return bool(config) and _GRAPH_RUNTIME_KEY in ((config or {}).get("configurable") or {})


def graph_task_id(config: Mapping[str, Any] | None) -> str | None:
    """The id of the LangGraph task (one node execution) a call runs in, if any."""
    if not config:
        return None
    value = (config.get("configurable") or {}).get(_GRAPH_TASK_KEY)
    return None if value is None else str(value)


def state_value(state: Any, key: str) -> Any:
    """Read ``key`` from agent state, which LangGraph passes as a dict or an object."""
    if isinstance(state, Mapping):
        return state.get(key)
    return getattr(state, key, None)


def first_request(state: Any) -> str | None:
    """The text of the run's first user message: a run without a ``thread_id`` is named
    by what it was asked ("Summarise the docs"), not by a generated id."""
    for message in state_value(state, "messages") or ():
        if getattr(message, "type", None) != "human":
            continue
        content = getattr(message, "content", "")
        if isinstance(content, list):  # content blocks: their text parts
            content = " ".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
        text = str(content).strip()
        return text or None
    return None


def new_task_id() -> str:
    return uuid.uuid4().hex


def key_args(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The single positional value handed to ``governor.call`` to derive the call key.

    Passing the tool's arguments as one value (not as ``**kwargs``) means a tool argument
    named like a parameter of ``Governor.call`` can never clash with it.
    """
    if args:
        return [*args, dict(kwargs)] if kwargs else list(args)
    return dict(kwargs)


def accepts_param(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def config_param(fn: Callable[..., Any]) -> str | None:
    """Name of the parameter of ``fn`` annotated ``RunnableConfig`` (BaseTool.run passes it).

    langchain-core does this in a private helper; re-done here (a few lines of
    ``typing``) so a private rename upstream cannot break the wrapper.
    """
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    for name, annotation in hints.items():
        if annotation is RunnableConfig:
            return name
    return None


def model_name(model: Any) -> str | None:
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    llm_type = getattr(model, "_llm_type", None)
    return llm_type if isinstance(llm_type, str) else None


def usage_fields(message: BaseMessage | None) -> dict[str, Any]:
    """Token usage of a model reply, with prompt-cache reads and writes split out."""
    usage = getattr(message, "usage_metadata", None) or {}
    details = usage.get("input_token_details") or {}
    metadata = getattr(message, "response_metadata", None) or {}
    return {
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
        "cache_read_tokens": details.get("cache_read"),
        "cache_creation_tokens": details.get("cache_creation"),
        "finish_reason": metadata.get("finish_reason") or metadata.get("stop_reason"),
    }


def openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The prompt as OpenAI-style dicts: the trace format every backend understands."""
    converted = convert_to_openai_messages(list(messages))
    return converted if isinstance(converted, list) else [converted]


def last_ai_message(messages: Sequence[BaseMessage]) -> AIMessage | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return message
    return None


_RECORD_MARK = "lc_tool_message"


def tool_message_record(message: Any) -> Any:
    """A ToolMessage a tool returned, as JSON the governor can checkpoint (every field
    but the tool call id, which belongs to the call that restores it); anything else,
    or a message with a non-JSON part, is returned unchanged."""
    if not isinstance(message, ToolMessage):
        return message
    record = {
        _RECORD_MARK: True,
        "content": message.content,
        "artifact": message.artifact,
        "name": message.name,
        "status": message.status,
        "id": message.id,
        "additional_kwargs": message.additional_kwargs,
        "response_metadata": message.response_metadata,
    }
    try:
        json.dumps(record, allow_nan=False)
    except (TypeError, ValueError):
        return message
    return record


def tool_message_from_record(value: Any, tool_call_id: str | None) -> Any:
    """The ToolMessage of [`tool_message_record`][langchain_governor._common.tool_message_record] again, answering
    ``tool_call_id``."""
    if not (isinstance(value, dict) and value.get(_RECORD_MARK)):
        return value
    fields = {k: v for k, v in value.items() if k != _RECORD_MARK and v is not None}
    return ToolMessage(tool_call_id=tool_call_id or "", **fields)
