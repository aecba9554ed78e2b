"""A small view protocol over chat messages, so one pruner serves every framework.

The pruner never converts messages between formats: converting a LangChain message to a
dict and back loses fields (ids, response metadata, provider-specific content blocks) and
allocates on every turn. Instead each message kind gets a *codec* that reads the few
fields the pruner needs and builds a changed copy of the same kind. LangChain messages are
handled by duck typing (``.type``, ``.content``, ``.tool_calls``, ``.model_copy``), so the
core never imports an agent framework.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

# Role names the pruner reasons about; everything else is "other" and left alone.
SYSTEM, USER, ASSISTANT, TOOL, OTHER = "system", "user", "assistant", "tool", "other"

PIN_KEY = "lg_pinned"
"""Marker that pins a message: a truthy ``additional_kwargs[PIN_KEY]`` on a LangChain
message, or a truthy ``PIN_KEY`` key in a dict message (strip it before sending if your
provider rejects unknown keys; ``ContextPruner(pinned_ids=...)`` avoids the marker)."""

_LC_ROLES = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "human": USER,
    "ai": ASSISTANT,
    "tool": TOOL,
    "function": TOOL,
    "SystemMessageChunk": SYSTEM,
    "HumanMessageChunk": USER,
    "AIMessageChunk": ASSISTANT,
    "ToolMessageChunk": TOOL,
    "FunctionMessageChunk": TOOL,
}
_DICT_ROLES = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "user": USER,
    "human": USER,
    "assistant": ASSISTANT,
    "ai": ASSISTANT,
    "tool": TOOL,
    "function": TOOL,
}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call as the pruner sees it; ``args`` is a dict, or the raw string when the
    provider's JSON did not parse."""

    id: str | None
    name: str
    args: Any


class Codec(Protocol):
    """Reads and rebuilds one kind of message. Implementations must never mutate ``m``."""

    def role(self, m: Any) -> str: ...
    def content(self, m: Any) -> Any: ...
    def tool_calls(self, m: Any) -> list[ToolCall]: ...
    def tool_call_id(self, m: Any) -> str | None: ...
    def name(self, m: Any) -> str | None: ...
    def msg_id(self, m: Any) -> str | None: ...
    def is_error_status(self, m: Any) -> bool: ...
    def is_pinned(self, m: Any) -> bool: ...
    def replace(self, m: Any, *, content: Any = ..., args: Mapping[int, Any] | None = None) -> Any: ...
    def new_user(self, like: Any, text: str) -> Any: ...


def _parse_args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return raw
    return raw


def dump_args(args: Any) -> str:
    """Canonical JSON for arguments (sorted keys): the basis of call keys and digests."""
    if isinstance(args, str):
        return args
    return json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)


class DictCodec:
    """OpenAI-style chat dicts (what CrewAI and LiteLLM pass around)."""

    def role(self, m: Any) -> str:
        return _DICT_ROLES.get(str(m.get("role", "")), OTHER)

    def content(self, m: Any) -> Any:
        return m.get("content")

    def tool_calls(self, m: Any) -> list[ToolCall]:
        calls = m.get("tool_calls") or ()
        out = []
        for c in calls:
            if not isinstance(c, Mapping):
                continue
            fn = c.get("function") or {}
            out.append(ToolCall(c.get("id"), str(fn.get("name", "")), _parse_args(fn.get("arguments"))))
        return out

    def tool_call_id(self, m: Any) -> str | None:
        v = m.get("tool_call_id")
        return str(v) if v is not None else None

    def name(self, m: Any) -> str | None:
        v = m.get("name")
        return str(v) if v is not None else None

    def msg_id(self, m: Any) -> str | None:
        v = m.get("id")
        return str(v) if v is not None else None

    def is_error_status(self, m: Any) -> bool:
        return m.get("status") == "error" or m.get("is_error") is True

    def is_pinned(self, m: Any) -> bool:
        return bool(m.get(PIN_KEY))

    def replace(self, m: Any, *, content: Any = ..., args: Mapping[int, Any] | None = None) -> Any:
        new = dict(m)
        if content is not ...:
            new["content"] = content
        if args:
            calls = list(new.get("tool_calls") or ())
            for i, a in args.items():
                c = dict(calls[i])
                fn = dict(c.get("function") or {})
                fn["arguments"] = a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)
                c["function"] = fn
                calls[i] = c
            new["tool_calls"] = calls
        return new

    def new_user(self, like: Any, text: str) -> Any:
        return {"role": "user", "content": text}


class LangChainCodec:
    """LangChain ``BaseMessage`` objects, by duck typing (no langchain import)."""

    def role(self, m: Any) -> str:
        t = getattr(m, "type", "")
        if t == "chat":
            return _DICT_ROLES.get(str(getattr(m, "role", "")), OTHER)
        return _LC_ROLES.get(t, OTHER)

    def content(self, m: Any) -> Any:
        return m.content

    def tool_calls(self, m: Any) -> list[ToolCall]:
        calls = getattr(m, "tool_calls", None) or ()
        return [ToolCall(c.get("id"), str(c.get("name", "")), c.get("args", {})) for c in calls]

    def tool_call_id(self, m: Any) -> str | None:
        v = getattr(m, "tool_call_id", None)
        return str(v) if v is not None else None

    def name(self, m: Any) -> str | None:
        v = getattr(m, "name", None)
        return str(v) if v is not None else None

    def msg_id(self, m: Any) -> str | None:
        v = getattr(m, "id", None)
        return str(v) if v is not None else None

    def is_error_status(self, m: Any) -> bool:
        return getattr(m, "status", None) == "error"

    def is_pinned(self, m: Any) -> bool:
        kw = getattr(m, "additional_kwargs", None) or {}
        return bool(kw.get(PIN_KEY))

    def replace(self, m: Any, *, content: Any = ..., args: Mapping[int, Any] | None = None) -> Any:
        update: dict[str, Any] = {}
        if content is not ...:
            update["content"] = content
        if args:
            calls = [dict(c) for c in m.tool_calls]
            by_id: dict[str, Any] = {}
            for i, a in args.items():
                calls[i]["args"] = a if isinstance(a, dict) else {"__raw__": a}
                if calls[i].get("id") is not None:
                    by_id[str(calls[i]["id"])] = calls[i]["args"]
            update["tool_calls"] = calls
            # Providers serialise from different places: OpenAI's converter may read the raw
            # ``additional_kwargs["tool_calls"]``, Anthropic's the ``tool_use`` content blocks.
            # Keep all three consistent so the trimmed arguments are what the model sees.
            kw = getattr(m, "additional_kwargs", None) or {}
            if isinstance(kw.get("tool_calls"), list) and by_id:
                raw_calls = []
                for rc in kw["tool_calls"]:
                    if isinstance(rc, Mapping) and str(rc.get("id")) in by_id:
                        rc = dict(rc)
                        fn = dict(rc.get("function") or {})
                        fn["arguments"] = json.dumps(by_id[str(rc["id"])], ensure_ascii=False)
                        rc["function"] = fn
                    raw_calls.append(rc)
                update["additional_kwargs"] = {**kw, "tool_calls": raw_calls}
            blocks = update.get("content", m.content)
            if isinstance(blocks, list) and by_id:
                new_blocks = []
                for b in blocks:
                    if isinstance(b, Mapping) and b.get("type") == "tool_use" and str(b.get("id")) in by_id:
                        b = {**b, "input": by_id[str(b["id"])]}
                    new_blocks.append(b)
                update["content"] = new_blocks
        return m.model_copy(update=update)

    def new_user(self, like: Any, text: str) -> Any:
        # ``like`` is a human message of the conversation: its class builds a new one
        # without this module importing langchain.
        return type(like)(content=text)


DICT_CODEC = DictCodec()
LANGCHAIN_CODEC = LangChainCodec()


def codec_for(m: Any) -> Codec:
    """Pick the codec for one message: dicts are OpenAI-style, anything with a ``type`` and
    ``content`` is treated as a LangChain message."""
    if isinstance(m, Mapping):
        return DICT_CODEC
    if hasattr(m, "content") and hasattr(m, "type"):
        return LANGCHAIN_CODEC
    raise TypeError(f"unsupported message type: {type(m).__name__}")


def text_of(content: Any) -> str:
    """The text a model reads in ``content`` (text blocks joined; other blocks skipped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for b in content:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, Mapping) and isinstance(b.get("text"), str):
                parts.append(b["text"])
        return "\n".join(parts)
    return str(content)
