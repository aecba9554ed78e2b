"""A small view protocol over chat messages, so one pruner serves every framework.

The pruner never converts messages between formats: converting a LangChain message to a
dict and back loses fields (ids, response metadata, provider-specific content blocks) and
allocates on every turn. Instead each message kind gets a *codec* that reads the few
fields the pruner needs and builds a changed copy of the same kind. LangChain messages are
handled by duck typing (``.type``, ``.content``, ``.tool_calls``, ``.model_copy``), so the
core never imports an agent framework.

Messages come from models, frameworks and checkpoints the pruner does not control, so the
codecs read defensively: a field of an unexpected type (``tool_calls: 5``, a string as
``function``, a list as an id) reads as absent, and a message of no known kind (``None``,
a bare string) gets the [`OPAQUE_CODEC`][loop_governor.context.view.OPAQUE_CODEC]: role "other", nothing to prune,
passed through as it is.
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
    provider's JSON did not parse. ``index`` is its position in the message's own list
    (entries of an unknown shape are skipped, so positions may have gaps)."""

    id: str | None
    name: str
    args: Any
    index: int = 0


def _as_id(value: Any) -> str | None:
    """An id as a string; anything but a string or an integer is no usable id."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def safe_text(value: Any, limit: int = 10_000) -> str:
    """``str(value)`` that never raises (deep nesting, a broken ``__str__``) and stays short."""
    try:
        text = str(value)
    except Exception:  # RecursionError, or whatever a foreign __str__ raises
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit]


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
        except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
            return raw
    return raw


def dump_args(args: Any) -> str:
    """Canonical JSON for arguments (sorted keys): the basis of call keys and digests.

    Arguments JSON cannot sort (mixed key types) or encode (too deep, circular) still get
    a text, the same one for the same value."""
    if isinstance(args, str):
        return args
    try:
        return json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return json.dumps(args, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return safe_text(args)


def _calls(raw: Any, read: Any) -> list[ToolCall]:
    """The well-formed entries of a ``tool_calls`` value; ``read(entry)`` gives (name, args)
    or None for an entry of an unknown shape."""
    if not isinstance(raw, (list, tuple)):
        return []
    out = []
    for index, c in enumerate(raw):
        if not isinstance(c, Mapping):
            continue
        parts = read(c)
        if parts is not None:
            out.append(ToolCall(_as_id(c.get("id")), parts[0], parts[1], index))
    return out


def _name_of(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else safe_text(value, 200)


class DictCodec:
    """OpenAI-style chat dicts (what CrewAI and LiteLLM pass around)."""

    def role(self, m: Any) -> str:
        role = m.get("role", "")
        return _DICT_ROLES.get(role, OTHER) if isinstance(role, str) else OTHER

    def content(self, m: Any) -> Any:
        return m.get("content")

    def tool_calls(self, m: Any) -> list[ToolCall]:
        def read(c: Mapping[str, Any]) -> tuple[str, Any] | None:
            fn = c.get("function")
            if fn is None:
                fn = {}
            if not isinstance(fn, Mapping):
                return None  # "function": "str" -- not a call the pruner can read
            return _name_of(fn.get("name")), _parse_args(fn.get("arguments"))

        return _calls(m.get("tool_calls"), read)

    def tool_call_id(self, m: Any) -> str | None:
        return _as_id(m.get("tool_call_id"))

    def name(self, m: Any) -> str | None:
        v = m.get("name")
        return None if v is None else _name_of(v)

    def msg_id(self, m: Any) -> str | None:
        return _as_id(m.get("id"))

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
        if not isinstance(t, str):
            return OTHER
        if t == "chat":
            role = getattr(m, "role", "")
            return _DICT_ROLES.get(role, OTHER) if isinstance(role, str) else OTHER
        return _LC_ROLES.get(t, OTHER)

    def content(self, m: Any) -> Any:
        return m.content

    def tool_calls(self, m: Any) -> list[ToolCall]:
        return _calls(getattr(m, "tool_calls", None), lambda c: (_name_of(c.get("name")), c.get("args", {})))

    def tool_call_id(self, m: Any) -> str | None:
        return _as_id(getattr(m, "tool_call_id", None))

    def name(self, m: Any) -> str | None:
        v = getattr(m, "name", None)
        return None if v is None else _name_of(v)

    def msg_id(self, m: Any) -> str | None:
        return _as_id(getattr(m, "id", None))

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


class OpaqueCodec:
    """A message of no known kind (``None``, a bare string, a foreign object): role "other",
    no content or calls the pruner would touch; ``replace`` hands it back unchanged."""

    def role(self, m: Any) -> str:
        return OTHER

    def content(self, m: Any) -> Any:
        return None

    def tool_calls(self, m: Any) -> list[ToolCall]:
        return []

    def tool_call_id(self, m: Any) -> str | None:
        return None

    def name(self, m: Any) -> str | None:
        return None

    def msg_id(self, m: Any) -> str | None:
        return None

    def is_error_status(self, m: Any) -> bool:
        return False

    def is_pinned(self, m: Any) -> bool:
        return False

    def replace(self, m: Any, *, content: Any = ..., args: Mapping[int, Any] | None = None) -> Any:
        return m

    def new_user(self, like: Any, text: str) -> Any:
        return {"role": "user", "content": text}


DICT_CODEC = DictCodec()
LANGCHAIN_CODEC = LangChainCodec()
OPAQUE_CODEC = OpaqueCodec()


def codec_for(m: Any) -> Codec:
    """Pick the codec for one message: dicts are OpenAI-style, anything with a ``type`` and
    ``content`` is treated as a LangChain message, anything else is opaque."""
    if isinstance(m, Mapping):
        return DICT_CODEC
    try:
        if hasattr(m, "content") and hasattr(m, "type"):
            return LANGCHAIN_CODEC
    except Exception:  # a property that raises on access
        pass
    return OPAQUE_CODEC


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
    return safe_text(content)
