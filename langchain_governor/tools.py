"""Governed LangChain tools: the same tool to the model, a governed call underneath.

``govern_tool(t)`` returns a [`GovernedTool`][langchain_governor.tools.GovernedTool], a ``BaseTool`` that looks exactly
like ``t`` to a model and to LangChain (same name, description, ``args_schema`` object,
response format, tags, metadata), so it drops into ``create_agent``, ``ToolNode``,
``AgentExecutor`` or ``bind_tools`` unchanged. Underneath, every run goes through
``governor.call``/``acall``: transient failures are retried with backoff, known-bad calls
are not repeated, breakers open, and the model receives one structured error instead of
a traceback.

Why delegate to the inner tool's ``_run``/``_arun`` and not its ``invoke``: ``BaseTool.run``
of the wrapper already validated the arguments against the same schema, injected
runtime arguments and opened the tool's callback run. Invoking the inner tool again
would do all of it twice (about 2x the cost of a plain call, and two tool runs in every
trace); calling its ``_run`` keeps the wrapper within a few percent of the plain tool.

How a non-fatal governed failure comes out depends on who called. Run by a LangGraph
``ToolNode`` (``create_agent``, ``create_react_agent``, a graph of your own) it is raised as a
[`GovernedToolError`][langchain_governor.errors.GovernedToolError], which the ToolNode's error handling
answers (by default with the governor's JSON). Called directly (``invoke`` outside a
ToolNode, a legacy ``AgentExecutor``) it comes back as content: an error ``ToolMessage``
for a tool call, the JSON text otherwise.

A tool cannot see whether a middleware around it handles exceptions, so a governed tool
on its own answers at the ToolNode; under ``GovernorMiddleware`` (or with
``raise_errors=True``) the failure is raised to the middlewares between, and the
middleware turns it into the answerable form on its way out.

One retrier per call: when something around a governed call runs it again for the same
tool call in the same LangGraph task after the governor retried a transient failure to
the end (a retry wrapper re-calling the handler), the governed outcome is replayed
instead of calling the tool again, so retries never multiply. A permanent failure was
tried once; an outer retrier may try it again (inside a task the governor's known-bad
memory answers it without a call).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from pydantic import ConfigDict, Field, PrivateAttr

import loop_governor as lg
from langchain_governor._common import (
    accepts_param,
    config_param,
    graph_task_id,
    handed_back,
    in_tool_node,
    is_control_flow,
    key_args,
    tool_message_from_record,
    tool_message_record,
)
from langchain_governor.errors import GovernedFatalError, GovernedToolError, fatal_stop, tool_error
from loop_governor.adapter import check_tool_list, not_a_tool, resolve_governor

__all__ = ["GovernedTool", "GovernedToolError", "govern_tool", "govern_tools"]

# Fields copied verbatim from the wrapped tool: everything a model, a ToolNode or a
# callback sees of a tool. ``args_schema`` is the same object, not a copy.
_COPIED_FIELDS = (
    "name",
    "description",
    "args_schema",
    "return_direct",
    "verbose",
    "callbacks",
    "tags",
    "metadata",
    "handle_validation_error",
    "response_format",
    "extras",
)

# The tool call id of the run in progress (BaseTool.run knows it; _run is not told).
_TOOL_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("lg_tool_call_id", default=None)

# Set by GovernorMiddleware around the calls below it: it will turn a governed failure
# into the form the ToolNode answers, so the tool raises it for the middlewares between.
SURFACING: contextvars.ContextVar[bool] = contextvars.ContextVar("lg_surfacing_tool_errors", default=False)


@contextlib.contextmanager
def _inner_scope() -> Iterator[bool]:
    """Whether a GovernorMiddleware around this call surfaces its failures; switched off
    for whatever the tool itself runs (a nested agent's tools answer at their own ToolNode)."""
    token = SURFACING.set(False)
    try:
        yield token.old_value is True
    finally:
        SURFACING.reset(token)


class _Outcomes:
    """Governed failures of recent tool calls, by (LangGraph task, tool call id).

    Bounded: an entry only matters while the task that made it may still re-run the
    same call (a retry wrapper around it), which is moments later.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], lg.AgentToolError] = OrderedDict()

    def get(self, key: tuple[str, str] | None) -> lg.AgentToolError | None:
        if key is None:
            return None
        with self._lock:
            return self._items.get(key)

    def replay(self, key: tuple[str, str] | None) -> lg.AgentToolError | None:
        """The outcome to give this call again: a transient failure the governor already
        retried to the end (a permanent one was tried once; see the module doc)."""
        error = self.get(key)
        return error if error is not None and error.info.error_type is lg.ErrorType.TRANSIENT else None

    def put(self, key: tuple[str, str] | None, error: lg.AgentToolError) -> None:
        if key is None:
            return
        with self._lock:
            self._items[key] = error
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class GovernedTool(BaseTool):
    """A ``BaseTool`` whose runs go through a [`loop_governor.Governor`][loop_governor.governor.Governor].

    Non-fatal governed failures are raised as
    [`GovernedToolError`][langchain_governor.errors.GovernedToolError] inside a LangGraph run and come
    back as content otherwise (``ToolMessage(status="error")`` for tool calls); a fatal one
    propagates and stops the run, as a
    [`GovernedFatalError`][langchain_governor.errors.GovernedFatalError] (a ``loop_governor.FatalError``
    that LangGraph's ``ToolNode(handle_tool_errors=True)`` cannot swallow).
    The inner tool's own ``handle_tool_error`` is bypassed on purpose: the governor's
    structured error replaces free-text error strings.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool = Field(exclude=True)
    governor: lg.Governor = Field(exclude=True)
    raise_errors: bool = Field(default=False, exclude=True)
    """Raise non-fatal governed failures to the middlewares around the call (a
    ``ToolErrorMiddleware`` or ``ToolRetryMiddleware`` sees them) instead of answering the
    model at the ToolNode; one that nothing handles then ends the run, as the tool's own
    exception would. ``GovernorMiddleware`` does this for every call it wraps."""
    _outcomes: _Outcomes = PrivateAttr(default_factory=_Outcomes)

    @classmethod
    def wrap(cls, inner: BaseTool, governor: lg.Governor, *, raise_errors: bool = False) -> GovernedTool:
        fields = {name: getattr(inner, name) for name in _COPIED_FIELDS}
        return cls(inner=inner, governor=governor, raise_errors=raise_errors, **fields)

    # -- what LangChain introspects -------------------------------------------------

    @functools.cached_property
    def _injected_args_keys(self) -> frozenset[str]:
        # Injected arguments (ToolRuntime, InjectedToolCallId, ...) are declared by the
        # inner tool's function; the wrapper must inject and hide exactly the same ones.
        return self.inner._injected_args_keys

    @property
    def func(self) -> Callable[..., Any] | None:
        """The inner function, for LangGraph's injected-argument discovery (read only)."""
        return getattr(self.inner, "func", None)

    @property
    def coroutine(self) -> Callable[..., Any] | None:
        return getattr(self.inner, "coroutine", None)

    @functools.cached_property
    def _inner_sync(self) -> tuple[bool, str | None]:
        return accepts_param(self.inner._run, "run_manager"), config_param(self.inner._run)

    @functools.cached_property
    def _inner_async(self) -> tuple[bool, str | None]:
        return accepts_param(self.inner._arun, "run_manager"), config_param(self.inner._arun)

    @functools.cached_property
    def _model_fields(self) -> frozenset[str]:
        schema = self.tool_call_schema
        if isinstance(schema, dict):
            return frozenset(schema.get("properties", {}))
        # pydantic v2 schema, else a v1 one
        fields = getattr(schema, "model_fields", None) or getattr(schema, "__fields__", {})
        # an injected argument (ToolRuntime, state, ...) can still be a schema field
        # hidden from the JSON schema only: it is the runtime's, not the call's identity
        return frozenset(fields) - self._injected_args_keys

    def _call_key_value(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The model-visible arguments only: runtime, state and callbacks are not identity."""
        visible = self._model_fields
        return key_args(args, {k: v for k, v in kwargs.items() if k in visible})

    # -- entry points: who called decides how a failure comes out ----------------------

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        tool_call_id = kwargs.get("tool_call_id")
        token = _TOOL_CALL_ID.set(tool_call_id)
        try:
            return super().run(tool_input, *args, **kwargs)
        except GovernedToolError as exc:
            return self._answer_or_raise(exc, kwargs.get("config"), tool_call_id)
        finally:
            _TOOL_CALL_ID.reset(token)

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        tool_call_id = kwargs.get("tool_call_id")
        token = _TOOL_CALL_ID.set(tool_call_id)
        try:
            return await super().arun(tool_input, *args, **kwargs)
        except GovernedToolError as exc:
            return self._answer_or_raise(exc, kwargs.get("config"), tool_call_id)
        finally:
            _TOOL_CALL_ID.reset(token)

    def _answer_or_raise(self, exc: GovernedToolError, config: Any, tool_call_id: str | None) -> Any:
        """Re-raise to a LangGraph ToolNode; elsewhere the JSON is the tool's answer."""
        if in_tool_node(config):
            raise exc
        if tool_call_id is None:
            return exc.message
        return ToolMessage(content=exc.message, tool_call_id=tool_call_id, name=self.name, status="error")

    # -- execution --------------------------------------------------------------------

    @staticmethod
    def _outcome_key(config: RunnableConfig) -> tuple[str, str] | None:
        task, call_id = graph_task_id(config), _TOOL_CALL_ID.get()
        if task is None or call_id is None:
            return None
        return (task, call_id)

    def _replayed(self, outcome_key: tuple[str, str] | None, surfaced: bool) -> None:
        error = self._outcomes.replay(outcome_key)
        if error is not None:
            self.governor.emit_tool_error(self.name, error.info, call_key=None, replayed=True)
            raise tool_error(error, answerable=not surfaced) from error.__cause__

    def _raise_failure(self, exc: lg.AgentToolError, outcome_key: tuple[str, str] | None, surfaced: bool) -> NoReturn:
        if isinstance(exc, GovernedFatalError):
            raise exc  # already the pass-through form (a fatal stop from further in)
        if isinstance(exc, lg.FatalError):
            raise fatal_stop(exc) from exc
        cause = exc.__cause__
        if cause is None and (earlier := self._outcomes.get(outcome_key)) is not None:
            # the known-bad memory answered this call again: it is still the same tool
            # exception to the middlewares around it (a retry wrapper keyed on its class)
            cause = earlier.__cause__
        else:
            self._outcomes.put(outcome_key, exc)
        raise tool_error(exc, answerable=not surfaced, cause=cause) from cause

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        with _inner_scope() as surfaced:
            return self._governed_run(args, kwargs, config, run_manager, surfaced or self.raise_errors)

    def _governed_run(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], config: RunnableConfig, run_manager: Any, surfaced: bool
    ) -> Any:
        key = self._call_key_value(args, kwargs)
        outcome_key = self._outcome_key(config)
        self._replayed(outcome_key, surfaced)
        call_kwargs = _inner_kwargs(self._inner_sync, kwargs, run_manager, config)
        inner_run = self.inner._run

        def attempt(_key: Any) -> Any:
            try:
                return tool_message_record(inner_run(*args, **call_kwargs))
            except Exception as exc:
                if is_control_flow(exc):
                    raise handed_back(exc) from None
                raise

        try:
            value = self.governor.call(self.name, attempt, key)
        except lg.AgentToolError as exc:
            self._raise_failure(exc, outcome_key, surfaced)
        return tool_message_from_record(value, _TOOL_CALL_ID.get())

    async def _arun(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        with _inner_scope() as surfaced:
            return await self._agoverned_run(args, kwargs, config, run_manager, surfaced or self.raise_errors)

    async def _agoverned_run(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], config: RunnableConfig, run_manager: Any, surfaced: bool
    ) -> Any:
        key = self._call_key_value(args, kwargs)
        outcome_key = self._outcome_key(config)
        self._replayed(outcome_key, surfaced)
        call_kwargs = _inner_kwargs(self._inner_async, kwargs, run_manager, config)
        inner_arun = self.inner._arun

        async def attempt(_key: Any) -> Any:
            try:
                return tool_message_record(await inner_arun(*args, **call_kwargs))
            except Exception as exc:
                if is_control_flow(exc):
                    raise handed_back(exc) from None
                raise

        try:
            value = await self.governor.acall(self.name, attempt, key)
        except lg.AgentToolError as exc:
            self._raise_failure(exc, outcome_key, surfaced)
        return tool_message_from_record(value, _TOOL_CALL_ID.get())


def _inner_kwargs(
    spec: tuple[bool, str | None], kwargs: dict[str, Any], run_manager: Any, config: RunnableConfig
) -> dict[str, Any]:
    """The keyword arguments the inner ``_run``/``_arun`` takes: its own, plus the run
    manager and config when (and under the name) its signature asks for them."""
    wants_manager, config_name = spec
    call_kwargs = dict(kwargs)
    if wants_manager:
        call_kwargs["run_manager"] = run_manager
    if config_name:
        call_kwargs[config_name] = config
    return call_kwargs


def govern_tool(
    tool: BaseTool | Callable[..., Any], governor: lg.Governor | None = None, *, raise_errors: bool = False
) -> GovernedTool:
    """Wrap one tool so every call of it is governed (the same name, description and schema).

    Wrapping a governed tool again re-wraps its inner tool, so a tool is never governed twice.

    Args:
        tool: a LangChain ``BaseTool``, or a plain function with a docstring (it becomes one
            as ``@tool`` makes it); anything else is a TypeError naming ``tool``.
        governor: the governor; ``None`` uses the process-wide default one.
        raise_errors: raise non-fatal governed failures to the middlewares around the call
            (a ``ToolErrorMiddleware`` or ``ToolRetryMiddleware`` sees them) instead of
            answering the model at the ToolNode; ``GovernorMiddleware`` does this for
            every call it wraps.
    """
    gov = resolve_governor(governor)
    if isinstance(tool, GovernedTool):
        if tool.governor is gov and tool.raise_errors == raise_errors:
            return tool
        return GovernedTool.wrap(tool.inner, gov, raise_errors=raise_errors)
    return GovernedTool.wrap(_as_base_tool(tool, "tool"), gov, raise_errors=raise_errors)


_ACCEPTED = "a LangChain BaseTool or a function with a docstring"


def _as_base_tool(tool: object, parameter: str) -> BaseTool:
    """``tool`` as a BaseTool (a function becomes one, as ``@tool`` makes it), or a
    TypeError naming ``parameter``: LangChain's ``tool("search")`` would return a decorator
    and the failure would surface only at the agent's first step."""
    if isinstance(tool, BaseTool):
        return tool
    if isinstance(tool, type) or not callable(tool) or not hasattr(tool, "__name__"):
        raise not_a_tool(tool, _ACCEPTED, parameter)
    try:
        return as_tool(tool)
    except (TypeError, ValueError) as exc:  # no docstring, an unsupported signature
        raise TypeError(f"{parameter}: {tool.__name__} cannot become a LangChain tool: {exc}") from exc


def govern_tools(
    tools: Iterable[BaseTool | Callable[..., Any]], governor: lg.Governor | None = None, *, raise_errors: bool = False
) -> list[GovernedTool]:
    """Wrap every tool with the same governor (shared breakers, budgets and task state).

    ``tools`` is a list (or any iterable) of tools: a single tool is refused with a
    TypeError (use [`govern_tool`][langchain_governor.tools.govern_tool] for one)."""
    listed = check_tool_list(tools, lambda t: isinstance(t, BaseTool), "govern_tools")
    gov = resolve_governor(governor)
    # every one checked before any is wrapped, a misfit named by its position
    checked = [_as_base_tool(tool, f"tools[{i}]") for i, tool in enumerate(listed)]
    return [govern_tool(t, gov, raise_errors=raise_errors) for t in checked]
