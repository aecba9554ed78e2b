"""Governed crewAI tools: the same tool to the model, governed calls underneath.

``govern_tool(tool)`` returns a [`GovernedTool`][crewai_governor.tools.GovernedTool] with the wrapped tool's name,
description, argument schema, result schema and flags, so the prompt (ReAct text) and the
function schema (native calls) are unchanged. Each call goes through
``governor.call`` (retries with backoff, breaker, known-bad calls, budgets). A governed
failure is raised as a [`GovernedToolError`][crewai_governor.failures.GovernedToolError], which crewAI
records as the tool's failure; a fatal one comes back as a
[`GovernedToolFailure`][crewai_governor.failures.GovernedToolFailure] that stops the run -- see
[`crewai_governor.failures`][crewai_governor.failures] for why.

The wrapper is a tool object of its own (``isinstance(agent.tools[0], MyTool)`` is False;
``.inner`` is your tool). Usage limits are counted on your tool: ``max_usage_count`` and
``current_usage_count`` agree between the wrapper and ``.inner``.

Per-task governance (known-bad calls, budgets, the repeated-error guard) needs a governor
task scope: ``with install(g):`` opens one per crew or flow kickoff (a standalone
``Agent.kickoff`` included), or open ``g.task(...)`` yourself around ``kickoff``.
Without one, every call is a task of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from crewai.tools.base_tool import BaseTool, Tool
from crewai.tools.structured_tool import CrewStructuredTool
from crewai.tools.tool_failure import ToolFailure
from crewai.utilities.string_utils import sanitize_tool_name
from pydantic import PrivateAttr

import loop_governor as lg
from crewai_governor.failures import GovernedToolError, ensure_fatal_relay, failure_from_error, raise_governed
from loop_governor.adapter import check_tool_list, not_a_tool, resolve_governor

__all__ = [
    "GovernedStructuredTool",
    "GovernedTool",
    "UngovernedModelWarning",
    "govern_tool",
    "govern_tools",
    "governor_of",
    "is_governed_name",
]

# Sanitized names of the tools each governor wraps: the event listener's last resort when
# a crewAI tool event cannot be traced back to its tool object (see governor_of).
_governed_names: weakref.WeakKeyDictionary[lg.Governor, set[str]] = weakref.WeakKeyDictionary()
_names_lock = threading.Lock()


def is_governed_name(tool_name: str, governor: lg.Governor | None = None) -> bool:
    """Whether a tool of this (sanitized) name was wrapped by [`govern_tool`][crewai_governor.tools.govern_tool], by
    ``governor`` or (``None``) by any governor.

    A name says nothing about one particular tool object: prefer [`governor_of`][crewai_governor.tools.governor_of].
    """
    name = sanitize_tool_name(tool_name)
    with _names_lock:
        if governor is not None:
            return name in _governed_names.get(governor, ())
        return any(name in names for names in _governed_names.values())


def governor_of(tool: Any) -> lg.Governor | None:
    """The governor of a [`GovernedTool`][crewai_governor.tools.GovernedTool] (or of its structured form); else None."""
    if isinstance(tool, GovernedTool):
        return tool.governor
    original = getattr(tool, "_original_tool", None)
    if isinstance(original, GovernedTool):
        return original.governor
    return None


def cache_unless_failure(_args: Any = None, result: Any = None) -> bool:
    """crewAI ``cache_function`` for a tool whose own function allows caching: never cache
    a failure.

    With ``Crew(cache=True)`` crewAI caches every result by (tool, input), including
    ``ToolFailure`` results, so one transient 503 would be replayed for the rest of the
    run without reaching the service again. Module-level so crewAI can serialize it.
    """
    return not isinstance(result, ToolFailure)


# crewAI's ReAct path (ToolUsage) runs a raising tool three times, invoking it twice per
# attempt (with the schema's arguments, then with all of them): five re-runs at most.
_REACT_RERUNS = 5


class GovernedStructuredTool(CrewStructuredTool):
    """The structured form crewAI's ReAct path runs.

    crewAI's ``ainvoke`` runs a sync tool with ``loop.run_in_executor``, which drops
    contextvars: the governor's task scope and crewAI's current task id would vanish
    under ``akickoff``. ``asyncio.to_thread`` copies the context.

    When a governed call failed, crewAI's ReAct loop runs the same call again at once on
    the same thread, up to five times; the governor already retried it, so those re-runs
    get the same [`GovernedToolError`][crewai_governor.failures.GovernedToolError] without a call. Any other call on the
    thread ends that.
    """

    _reruns: threading.local = PrivateAttr(default_factory=threading.local)

    def invoke(self, input: str | dict[str, Any], config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        key = self._rerun_key(input)
        pending = getattr(self._reruns, "pending", None)
        self._reruns.pending = None
        if pending is not None and pending[0] == key and pending[2] > 0:
            self._reruns.pending = (key, pending[1], pending[2] - 1)
            raise raise_governed(pending[1].error) from pending[1].__cause__
        try:
            return super().invoke(input, config, **kwargs)
        except GovernedToolError as exc:
            self._reruns.pending = (key, exc, _REACT_RERUNS)
            raise

    async def ainvoke(self, input: str | dict[str, Any], config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.invoke, input, config, **kwargs)

    def _rerun_key(self, input: str | dict[str, Any]) -> str:
        """The call's arguments as the schema sees them (crewAI's second invocation of
        an attempt passes the unfiltered ones)."""
        if isinstance(input, dict) and self.args_schema is not None:
            fields = self.args_schema.model_fields
            input = {k: v for k, v in input.items() if k in fields}
        return lg.call_key(self.name, (input,), {})


class GovernedTool(BaseTool):
    """A crewAI tool whose calls run through a [`loop_governor.Governor`][loop_governor.governor.Governor].

    The governor and the wrapped tool are private attributes, so the tool's public
    fields (what crewAI renders, validates and serializes) are exactly the wrapped one's.
    """

    _inner: BaseTool = PrivateAttr()
    _governor: lg.Governor = PrivateAttr()

    @property
    def inner(self) -> BaseTool:
        """The wrapped tool."""
        return self._inner

    @property
    def governor(self) -> lg.Governor:
        return self._governor

    # -- usage limits live on the wrapped tool ------------------------------------------
    def _claim_usage(self) -> ToolFailure | None:
        limit = self._inner._claim_usage()
        self.__dict__["current_usage_count"] = self._inner.current_usage_count
        return limit

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "current_usage_count" and getattr(self, "_inner", None) is not None:
            self._inner.current_usage_count = value  # crewAI's ReAct path sets it here

    def reset_usage_count(self) -> None:
        super().reset_usage_count()
        self._inner.reset_usage_count()

    # -- sync: what crewAI calls (native path: tool.run; ReAct path: structured invoke)
    def _run(self, *args: Any, **kwargs: Any) -> Any:
        _say_if_ungoverned(self._governor)
        try:
            return self._governor.call(self.name, self._call_inner, *args, **kwargs)
        except lg.AgentToolError as exc:
            return self._failure(exc)

    def _call_inner(self, *args: Any, **kwargs: Any) -> Any:
        # Same semantics as BaseTool.run minus validation and usage counting, which the
        # wrapper already did: an async tool's coroutine is driven to completion here.
        result = self._inner._run(*args, **kwargs)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)
        return result

    # -- async: for callers that await tool.arun(); crewAI 1.15 itself never does
    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        _say_if_ungoverned(self._governor)
        try:
            if self._inner_is_async():
                return await self._governor.acall(self.name, self._acall_inner, *args, **kwargs)
            return await self._governor.acall(self.name, self._acall_inner_in_thread, *args, **kwargs)
        except lg.AgentToolError as exc:
            return self._failure(exc)

    def _inner_is_async(self) -> bool:
        inner = self._inner
        if isinstance(inner, Tool):
            return inspect.iscoroutinefunction(inner.func)
        return type(inner)._arun is not BaseTool._arun

    async def _acall_inner(self, *args: Any, **kwargs: Any) -> Any:
        return await self._inner._arun(*args, **kwargs)

    async def _acall_inner_in_thread(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call_inner, *args, **kwargs)

    def _failure(self, exc: lg.AgentToolError) -> ToolFailure:
        """A fatal failure is returned for the relay hook to stop the run; any other is
        raised, crewAI's signal for a failed call (see [`crewai_governor.failures`][crewai_governor.failures])."""
        ensure_fatal_relay()
        if isinstance(exc, lg.FatalError):
            return failure_from_error(exc)  # returned: crewAI would swallow it raised
        raise raise_governed(exc) from exc.__cause__

    def format_output_for_agent(self, raw_result: Any) -> str:
        """Delegate success formatting to the wrapped tool (its result schema, overrides)."""
        if isinstance(raw_result, ToolFailure):
            return raw_result.as_agent_message()
        return self._inner.format_output_for_agent(raw_result)

    def to_structured_tool(self) -> CrewStructuredTool:
        self._set_args_schema()
        structured = GovernedStructuredTool(
            name=self.name,
            description=self.description,
            args_schema=self.args_schema,
            result_schema=self.result_schema,
            func=self._run,
            result_as_answer=self.result_as_answer,
            max_usage_count=self.max_usage_count,
            current_usage_count=self.current_usage_count,
            cache_function=self.cache_function,
            tool_failure_policy=self.tool_failure_policy,
        )
        structured._original_tool = self
        return structured


class UngovernedModelWarning(UserWarning):
    """A governed crewAI tool ran without ``install()``: the crew's model calls are not
    governed (no retries, budgets, breaker or stop of the governor's; crewAI's own
    retries and the SDK's instead)."""


_told: weakref.WeakSet[lg.Governor] = weakref.WeakSet()


def _say_if_ungoverned(governor: lg.Governor) -> None:
    """Once per governor: a governed tool running outside ``install()`` says, as a
    warning and a ``loop_governor`` log line, that the model calls are not governed."""
    if governor in _told:
        return
    from crewai_governor.hooks import installed  # (hooks builds on this module)

    if installed(governor):
        return
    _told.add(governor)
    text = (
        "a governed crewAI tool ran outside `with install(governor):` -- its tool calls are "
        "governed, but the crew's model calls are not (no retries with backoff, budgets, "
        "breaker or stop on an exhausted quota); wrap the kickoff in `with install(governor):`"
    )
    warnings.warn(text, UngovernedModelWarning, stacklevel=3)
    logging.getLogger("loop_governor").warning(text)


def _cache_function_for(inner: BaseTool) -> Callable[..., bool]:
    inner_cache = inner.cache_function
    if getattr(inner_cache, "__name__", "") == "_default_cache_function":
        # crewAI caches only where the crew opted in (Crew(cache=True)): that choice is the
        # user's, so successes stay cacheable (the governor sees only the calls crewAI runs)
        return cache_unless_failure

    def cache_unless_failure_then_inner(args: Any = None, result: Any = None) -> bool:
        return cache_unless_failure(args, result) and bool(inner_cache(args, result))

    return cache_unless_failure_then_inner


_ACCEPTED = "a crewAI BaseTool (a plain function becomes one with crewai.tools.tool)"


def govern_tool(tool: BaseTool, governor: lg.Governor | None = None) -> GovernedTool:
    """Wrap one crewAI tool (a ``BaseTool`` subclass instance or an ``@tool`` function).

    ``governor=None`` uses the process-wide default governor. Wrapping a tool that is
    already governed by the same governor returns it unchanged; by another governor,
    re-wraps the original tool.
    """
    gov = resolve_governor(governor)
    if isinstance(tool, GovernedTool):
        if tool.governor is gov:
            return tool
        tool = tool.inner
    if not isinstance(tool, BaseTool):
        raise not_a_tool(tool, _ACCEPTED)
    with warnings.catch_warnings():
        # A closure cache_function can't be checkpointed by crewAI; the wrapped tool's
        # own one is kept, so the wrapper adds no new restriction.
        warnings.simplefilter("ignore", UserWarning)
        governed = GovernedTool(
            name=tool.name,
            description=tool.description,
            env_vars=list(tool.env_vars),
            args_schema=tool.args_schema,
            result_schema=tool.result_schema,
            description_updated=tool.description_updated,
            cache_function=_cache_function_for(tool),
            result_as_answer=tool.result_as_answer,
            max_usage_count=tool.max_usage_count,
            tool_failure_policy=tool.tool_failure_policy,
            current_usage_count=tool.current_usage_count,
        )
    governed._inner = tool
    governed._governor = gov
    with _names_lock:
        _governed_names.setdefault(gov, set()).add(sanitize_tool_name(tool.name))
    ensure_fatal_relay()
    return governed


def govern_tools(tools: Iterable[BaseTool], governor: lg.Governor | None = None) -> list[GovernedTool]:
    """[`govern_tool`][crewai_governor.tools.govern_tool] for each tool, all sharing one governor (a single tool is
    refused with a TypeError: pass ``[tool]`` or use [`govern_tool`][crewai_governor.tools.govern_tool])."""
    listed = check_tool_list(tools, lambda t: isinstance(t, BaseTool), "govern_tools")
    gov = resolve_governor(governor)
    for i, tool in enumerate(listed):  # every one checked before any is wrapped
        if not isinstance(tool, BaseTool):
            raise not_a_tool(tool, _ACCEPTED, f"tools[{i}]")
    return [govern_tool(t, gov) for t in listed]  # type: ignore[arg-type]
