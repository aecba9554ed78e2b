"""Governed crewAI LLMs: every model call -- tool-call replies included -- is a governed call.

``govern_llm(llm, governor)`` returns a copy of ``llm`` whose ``call``/``acall`` run
through ``governor.call_model``: the task's budgets are charged per call (its usage
counted before the next call, from the provider's own report), failures are classified,
transient ones retried with the governor's backoff (and Retry-After), the endpoint has
a breaker and shared rate limits, ``context_length_exceeded`` gets one retry on a
compacted prompt, fallback LLMs answer while the model is down, and every call is one
``model_call`` event. ``install()`` does this for every agent of a kickoff.

The copy is an instance of a subclass of the LLM's own class (``isinstance`` holds, its
fields, stop words and events are the original's), with the provider SDK's own retries
switched off (``max_retries=0``; ``GovernorConfig(sdk_retries="keep")`` keeps them), so a
fatal 429 reaches the provider once. crewAI's own rate-limit retry around ``call`` sees
the governor's outcome only as a clean stop
([`crewai_governor.failures.model_stop`][crewai_governor.failures.model_stop]), which its agent retry loop lets through:
the run ends with the typed error.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from crewai.hooks.dispatch import HookAborted
from crewai.llms.base_llm import BaseLLM, LLMCallBlockedError
from crewai.types.usage_metrics import UsageMetrics
from pydantic import PrivateAttr

import loop_governor as lg
from crewai_governor.failures import context_overflow, model_stop
from loop_governor.adapter import (
    PassThrough,
    Usage,
    approx_tokens,
    emergency_compact,
    is_context_overflow,
    resolve_governor,
    tool_offer,
)

__all__ = ["endpoint_of", "govern_llm", "governor_of_llm", "is_governed_llm"]

# The usage reports of the model call in flight (crewAI tracks usage on the LLM object,
# cumulatively and shared by every agent using it; this sees exactly one call's).
_CALL_USAGE: ContextVar[list[dict[str, Any]] | None] = ContextVar("loop_governor_crewai_usage", default=None)


def endpoint_of(llm: Any) -> str:
    """``provider:model`` (``openai:gpt-4o-mini``), as the breaker and rate limits key it."""
    model = str(getattr(llm, "model", "") or type(llm).__name__)
    provider = getattr(llm, "provider", None)
    if isinstance(provider, str) and provider and not model.startswith(f"{provider}/"):
        return f"{provider}:{model}"
    return model.replace("/", ":", 1)


def _usage_of(reports: list[dict[str, Any]]) -> Usage | None:
    if not reports:
        return None
    total = UsageMetrics()
    for report in reports:
        metrics = UsageMetrics.from_provider_dict(report)
        if metrics is not None:
            total.add_usage_metrics(metrics)
    return Usage(total.prompt_tokens, total.completion_tokens, total.cached_prompt_tokens, total.cache_creation_tokens)


class _Governed:
    """The methods the governed subclass of an LLM class adds (mixed in first). Its state
    (``_lg_governor``, ``_lg_fallbacks``, ``_lg_compact``) is pydantic private attributes
    of the subclass (see [`_governed_class`][crewai_governor.llm._governed_class])."""

    _lg_governor: Any
    _lg_fallbacks: tuple[Any, ...]
    _lg_compact: bool

    def _track_token_usage_internal(self, usage_data: dict[str, Any]) -> None:
        super()._track_token_usage_internal(usage_data)  # type: ignore[misc]
        sink = _CALL_USAGE.get()
        if sink is not None:
            sink.append(dict(usage_data))

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs = _offered(self._lg_governor, messages, kwargs)
        spec = _spec(self, messages, args, kwargs, asynchronous=False)
        try:
            return self._lg_governor.call_model(spec.endpoint, spec.attempt, messages, **spec.options)
        except lg.AgentToolError as exc:
            failure = exc
        raise _outcome(failure)  # outside the except block: no implicit chain to a 429

    async def acall(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs = _offered(self._lg_governor, messages, kwargs)
        spec = _spec(self, messages, args, kwargs, asynchronous=True)
        try:
            return await self._lg_governor.acall_model(spec.endpoint, spec.attempt, messages, **spec.options)
        except lg.AgentToolError as exc:
            failure = exc
        raise _outcome(failure)


def _offered(governor: lg.Governor, messages: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's keyword arguments as the ladder offers the tools once some are
    withdrawn ([`tool_offer`][loop_governor.policies.ladder.tool_offer]): without the withdrawn schemas;
    with every tool withdrawn and tool history in the conversation they stay (crewAI sends
    ``tool_choice="auto"`` itself, so a call of a withdrawn tool then ends the run)."""
    tools = kwargs.get("tools")
    scope = governor.current_task() if tools else None
    if scope is None or not scope.withdrawn or not isinstance(tools, list):
        return kwargs
    offer = tool_offer(scope, tools, messages if isinstance(messages, list) else ())
    if offer is None or len(offer.tools) == len(tools):
        return kwargs
    return {**kwargs, "tools": offer.tools or None}  # an empty tool list is a 400 at some providers


def _outcome(failure: lg.AgentToolError) -> lg.AgentToolError:
    """What crewAI sees of a failed governed model call: a context overflow goes to its
    own context-window handling, anything else stops the run."""
    if failure.info.error_type is lg.ErrorType.PERMANENT and is_context_overflow(failure.info):
        return context_overflow(failure)
    return model_stop(failure)


class _Spec:
    __slots__ = ("attempt", "endpoint", "options")

    def __init__(self, endpoint: str, attempt: Callable[..., Any], options: dict[str, Any]) -> None:
        self.endpoint = endpoint
        self.attempt = attempt
        self.options = options


def _parent_call(llm: Any, asynchronous: bool) -> Callable[..., Any]:
    """The LLM class's own ``call``/``acall``, without the rate-limit retry crewAI wraps
    around every LLM class's call method: the governor owns the retries."""
    base: Any = type(llm).__mro__[2]  # [governed subclass, _Governed, the original class, ...]
    method = base.acall if asynchronous else base.call
    if getattr(method, "_crewai_rate_limit_wrapped", False):
        method = getattr(method, "__wrapped__", method)
    return functools.partial(method, llm)


class _Reports(list):  # type: ignore[type-arg]
    """The usage reports of the attempt in flight, and the LLM that made it (the model's
    or a fallback's: one list per governed call, so the answer's own usage is read)."""

    llm: Any = None


def _attempt(
    llm: Any, args: tuple[Any, ...], kwargs: dict[str, Any], asynchronous: bool, sink: _Reports
) -> Callable[..., Any]:
    """One attempt of ``llm``'s own call; its usage reports land in ``sink``."""
    parent = _parent_call(llm, asynchronous)

    def run(messages: Any) -> Any:
        sink.clear()
        sink.llm = llm
        token = _CALL_USAGE.set(sink)
        try:
            return parent(messages, *args, **kwargs)
        except (HookAborted, LLMCallBlockedError) as exc:
            # a crewAI hook's deny: the user's decision, not the endpoint failing; handed
            # back as it came, never classified, retried or counted by its breaker
            raise PassThrough(exc) from None
        finally:
            _CALL_USAGE.reset(token)

    async def arun(messages: Any) -> Any:
        sink.clear()
        sink.llm = llm
        token = _CALL_USAGE.set(sink)
        try:
            return await parent(messages, *args, **kwargs)
        except (HookAborted, LLMCallBlockedError) as exc:
            # a crewAI hook's deny: the user's decision, not the endpoint failing; handed
            # back as it came, never classified, retried or counted by its breaker
            raise PassThrough(exc) from None
        finally:
            _CALL_USAGE.reset(token)

    return arun if asynchronous else run


def _spec(llm: Any, messages: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, asynchronous: bool) -> _Spec:
    reports = _Reports()
    attempt = _attempt(llm, args, kwargs, asynchronous, reports)
    fallbacks = [(endpoint_of(f), _attempt(f, args, kwargs, asynchronous, reports)) for f in llm._lg_fallbacks]
    options: dict[str, Any] = {
        "usage": lambda _result: _usage_of(reports),
        "estimated_tokens": _prompt_tokens,  # asked per attempt's messages (a compacted retry: its own)
        "compact": _compact if llm._lg_compact else None,
        "fallbacks": fallbacks,
        "describe": lambda _result: {"model": getattr(reports.llm or llm, "model", None)},
    }
    return _Spec(endpoint_of(llm), attempt, options)


def _prompt_tokens(messages: Any) -> int:
    if isinstance(messages, str):
        return max(1, len(messages) // 4)
    return sum(approx_tokens(m) for m in messages)


def _compact(messages: Any) -> Any:
    if isinstance(messages, str):
        return None
    return emergency_compact(list(messages), keep_last=1)


_classes: dict[type[Any], type[Any]] = {}
_classes_lock = threading.Lock()


def _governed_class(cls: type[Any]) -> type[Any]:
    with _classes_lock:
        governed = _classes.get(cls)
        if governed is None:
            namespace = {
                "__module__": cls.__module__,
                "__annotations__": {"_lg_governor": Any, "_lg_fallbacks": Any, "_lg_compact": Any},
                "_lg_governor": PrivateAttr(default=None),
                "_lg_fallbacks": PrivateAttr(default=()),
                "_lg_compact": PrivateAttr(default=False),
            }
            governed = type(cls.__name__, (_Governed, cls), namespace)
            _classes[cls] = governed
        return governed


def _without_sdk_retries(llm: Any) -> dict[str, Any]:
    if "max_retries" in type(llm).model_fields and llm.max_retries != 0:  # None: the SDK's default
        return {"max_retries": 0}
    return {}


def is_governed_llm(llm: Any) -> bool:
    return isinstance(llm, _Governed)


def governor_of_llm(llm: Any) -> lg.Governor | None:
    return llm._lg_governor if isinstance(llm, _Governed) else None


_copies: dict[tuple[int, int], tuple[weakref.ref[Any], Any]] = {}
_copies_lock = threading.Lock()


def _forget(key: tuple[int, int], _ref: Any) -> None:
    _copies.pop(key, None)


def govern_llm(
    llm: BaseLLM,
    governor: lg.Governor | None = None,
    *,
    fallbacks: Sequence[BaseLLM] = (),
    compact: bool = False,
) -> BaseLLM:
    """A governed copy of ``llm`` (see the module docstring); the same object again for the
    same (llm, governor). ``compact=True``: one retry on an emergency-compacted prompt
    after ``context_length_exceeded`` (``install(pruner=...)`` turns it on)."""
    gov = resolve_governor(governor)
    if isinstance(llm, _Governed):
        if llm._lg_governor is gov:
            return llm
        raise ValueError("this LLM is already governed by another governor")
    if not isinstance(llm, BaseLLM):
        raise TypeError(f"govern_llm expects a crewAI BaseLLM, got {type(llm).__name__}")
    names = [endpoint_of(llm), *(endpoint_of(f) for f in fallbacks)]
    for i, name in enumerate(names[1:], 1):
        if name in names[:i]:
            # the same endpoint again: the same failing requests, under the same breaker
            raise ValueError(f"fallbacks: {name!r} is the model's own endpoint or named twice")
    key = (id(llm), id(gov))
    entry = _copies.get(key)
    if entry is not None and entry[0]() is llm and entry[1]._lg_compact == compact:
        return entry[1]  # type: ignore[no-any-return]
    update = _without_sdk_retries(llm) if gov.config.sdk_retries == "off" else {}
    copy: Any = llm.model_copy(update=update)
    object.__setattr__(copy, "__class__", _governed_class(type(llm)))
    private = copy.__pydantic_private__
    if update:
        for client in ("_client", "_async_client"):  # rebuilt on first use, with max_retries=0
            if client in private:
                private[client] = None
    private["_lg_governor"] = gov
    private["_lg_fallbacks"] = tuple(govern_llm(f, gov) for f in fallbacks)
    private["_lg_compact"] = compact
    try:
        ref = weakref.ref(llm, functools.partial(_forget, key))
    except TypeError:
        return copy  # type: ignore[no-any-return]
    with _copies_lock:
        _copies[key] = (ref, copy)
    return copy  # type: ignore[no-any-return]
