"""How a LangChain chat model call is handed to the governor.

* the endpoint the breaker and rate limits key on: ``provider:model`` from the model's
  LangSmith parameters (``openai:gpt-4o-mini``);
* the model the governor calls: with ``sdk_retries="off"`` (the default) a copy whose
  provider SDK does not retry on its own (``max_retries=0``; the openai and anthropic
  clients rebuilt with it), so a fatal 429 reaches the provider once and each transient
  retry is one visible, governed attempt; a streaming ChatOpenAI also gets
  ``stream_usage=True``, so usage (and the token budgets) survive streaming. Copies are
  made once per model object and reused;
* what to record: usage, the prompt that was sent, the finish reason.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.utils import count_tokens_approximately

from langchain_governor._common import last_ai_message, model_name, openai_messages
from loop_governor.adapter import Usage, usage_of

_CLIENTS = (("root_client", "client"), ("root_async_client", "async_client"))


def endpoint_of(model: Any) -> str:
    """``provider:model`` for a chat model (falls back to the model's name alone)."""
    name = model_name(model) or type(model).__name__
    provider = None
    params = getattr(model, "_get_ls_params", None)
    if callable(params):
        try:
            provider = params().get("ls_provider")
        except Exception:
            provider = None
    return f"{provider}:{name}" if provider else name


def _rebuilt_clients(model: Any) -> dict[str, Any]:
    """openai/anthropic SDK clients of ``model`` rebuilt with ``max_retries=0``."""
    update: dict[str, Any] = {}
    for root_attr, leaf_attr in _CLIENTS:  # ChatOpenAI / AzureChatOpenAI
        root = getattr(model, root_attr, None)
        with_options = getattr(root, "with_options", None)
        if callable(with_options):
            rebuilt = with_options(max_retries=0)
            update[root_attr] = rebuilt
            chat = getattr(rebuilt, "chat", None)
            if chat is not None and getattr(model, leaf_attr, None) is not None:
                update[leaf_attr] = chat.completions
    return update


def governed_copy(model: Any, *, sdk_retries: str) -> Any:
    """The model the governor calls: SDK retries off, streaming usage on (see module)."""
    update: dict[str, Any] = {}
    fields = getattr(type(model), "model_fields", {})
    if sdk_retries == "off" and "max_retries" in fields and model.max_retries != 0:  # None: the SDK's default, 2
        update["max_retries"] = 0
        update.update(_rebuilt_clients(model))
    if getattr(model, "streaming", False) and getattr(model, "stream_usage", True) is False:
        update["stream_usage"] = True
    if getattr(model, "stream_usage", True) is None and "openai" in type(model).__module__:
        update["stream_usage"] = True  # langchain-openai leaves it off for custom base URLs
    copier = getattr(model, "model_copy", None)
    if not update or not callable(copier):
        return model
    copy = copier(update=update)
    for cached in ("_client", "_async_client"):  # ChatAnthropic builds its clients lazily
        copy.__dict__.pop(cached, None)
    return copy


class ModelCopies:
    """One governed copy (and its endpoint) per model object: computed once, reused for
    every call (thread-safe; dropped with the original)."""

    def __init__(self, sdk_retries: str) -> None:
        self._sdk_retries = sdk_retries
        # id(model) -> (weak ref to it, its copy or None when the model is its own, endpoint).
        # Only a model's entry holds its copy (the copy lives as long as the model); the
        # copy's own entry and a model needing no copy hold nothing, so both can go.
        self._copies: dict[int, tuple[weakref.ref[Any], Any, str]] = {}
        self._lock = threading.Lock()

    def __call__(self, model: Any) -> tuple[Any, str]:
        """``(the governed copy, its endpoint)`` for ``model`` (or for a copy it made)."""
        key = id(model)
        entry = self._copies.get(key)
        if entry is not None and entry[0]() is model:
            return (model if entry[1] is None else entry[1]), entry[2]
        copy = governed_copy(model, sdk_retries=self._sdk_retries)
        endpoint = endpoint_of(model)
        try:
            refs = [(id(model), weakref.ref(model, functools.partial(self._forget, id(model))), copy)]
            if copy is not model:  # a request already carrying the copy maps to it too
                refs.append((id(copy), weakref.ref(copy, functools.partial(self._forget, id(copy))), None))
        except TypeError:
            return copy, endpoint  # not weak-referenceable: copy each time rather than leak
        with self._lock:
            for ref_key, ref, held in refs:
                self._copies[ref_key] = (ref, None if held is model else held, endpoint)
        return copy, endpoint

    def _forget(self, key: int, _ref: Any) -> None:
        self._copies.pop(key, None)


def usage_of_response(result: Any) -> Usage | None:
    """The usage of a model-call handler's result (a ModelResponse or an AIMessage), read
    directly: the generic reader's duck typing costs microseconds on pydantic messages."""
    messages = getattr(result, "result", None)
    message = messages[-1] if isinstance(messages, list) and messages else result
    if not isinstance(message, AIMessage):
        inner = getattr(result, "model_response", None)
        return usage_of_response(inner) if inner is not None else usage_of(result)
    meta = message.usage_metadata
    if not meta:
        return None
    details = meta.get("input_token_details") or {}
    return Usage(
        int(meta.get("input_tokens") or 0),
        int(meta.get("output_tokens") or 0),
        int(details.get("cache_read") or 0),
        int(details.get("cache_creation") or 0),
    )


def prompt_tokens(messages: Sequence[BaseMessage], system: BaseMessage | None) -> int:
    """LangChain's own estimate (within ~6% of providers' counts on real runs)."""
    return count_tokens_approximately([system, *messages] if system is not None else list(messages))


def describe(
    answered: list[Any], messages: Sequence[BaseMessage], system: BaseMessage | None, record: bool, capture: Any = None
) -> Any:
    """The ``model_call`` event fields the core cannot know (the name of the model that
    answered, ``answered[0]``: a fallback's once one was used; finish reason; the prompt:
    as the chat model received it when ``capture`` caught it -- middlewares inside the
    governor may have edited it -- else as the governor handed it on)."""

    def fields(result: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model_name(answered[0])}
        reply = last_ai_message(response_messages(result)) if result is not None else None
        metadata = getattr(reply, "response_metadata", None) or {}
        out["finish_reason"] = metadata.get("finish_reason") or metadata.get("stop_reason")
        if record:
            sent = getattr(capture, "sent", None)
            if sent is None:  # no chat-model run reported its prompt (a stubbed handler, a failure)
                sent = [system, *messages] if system is not None else list(messages)
            out["messages"] = openai_messages(sent)
        return out

    return fields


def response_messages(result: Any) -> list[BaseMessage]:
    """The messages of whatever a model-call handler returned (all shapes LangChain allows)."""
    from langchain.agents.middleware import ModelResponse
    from langchain_core.messages import AIMessage

    if isinstance(result, AIMessage):
        return [result]
    inner = getattr(result, "model_response", None)
    if isinstance(inner, ModelResponse):
        result = inner
    if isinstance(result, ModelResponse):
        return list(result.result)
    return []
