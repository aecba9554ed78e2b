"""Governed LangChain tools: the same tool to the model, a governed call underneath.

``govern_tool(t)`` returns a :class:`GovernedTool`, a ``BaseTool`` that looks exactly
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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from langchain_core.tools import tool as as_tool
from langgraph.errors import GraphBubbleUp
from pydantic import ConfigDict, Field

import loop_governor as lg
from langchain_governor._common import (
    accepts_param,
    carry,
    config_param,
    key_args,
    passthrough,
    resolve_governor,
)
from langchain_governor.errors import GovernedFatalError, fatal_stop

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


class GovernedToolError(ToolException):
    """Carries a non-fatal governed failure out of ``_run`` to ``BaseTool.run``.

    ``BaseTool.run`` turns a ``ToolException`` into ``ToolMessage(status="error")`` when
    the tool was called with a tool-call id (and into a plain string otherwise); the
    content is the governor's model-facing JSON.
    """

    def __init__(self, error: lg.AgentToolError) -> None:
        self.error = error
        super().__init__(error.info.to_model_text())


def _governed_error_text(exc: ToolException) -> str:
    if isinstance(exc, GovernedToolError):
        return exc.error.info.to_model_text()
    raise exc


class GovernedTool(BaseTool):
    """A ``BaseTool`` whose runs go through a :class:`loop_governor.Governor`.

    Non-fatal governed failures come back as content (``ToolMessage(status="error")``
    for tool calls); a fatal one propagates and stops the run, as a
    :class:`~langchain_governor.errors.GovernedFatalError` (a ``loop_governor.FatalError``
    that LangGraph's ``ToolNode(handle_tool_errors=True)`` cannot swallow).
    The inner tool's own ``handle_tool_error`` is bypassed on purpose: the governor's
    structured error replaces free-text error strings.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool = Field(exclude=True)
    governor: lg.Governor = Field(exclude=True)
    handle_tool_error: Any = _governed_error_text

    @classmethod
    def wrap(cls, inner: BaseTool, governor: lg.Governor) -> GovernedTool:
        fields = {name: getattr(inner, name) for name in _COPIED_FIELDS}
        return cls(inner=inner, governor=governor, **fields)

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
        return frozenset(fields)

    def _call_key_value(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """The model-visible arguments only: runtime, state and callbacks are not identity."""
        visible = self._model_fields
        return key_args(args, {k: v for k, v in kwargs.items() if k in visible})

    # -- execution --------------------------------------------------------------------

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        key = self._call_key_value(args, kwargs)
        call_kwargs = _inner_kwargs(self._inner_sync, kwargs, run_manager, config)
        inner_run = self.inner._run

        def attempt(_key: Any) -> Any:
            try:
                return inner_run(*args, **call_kwargs)
            except GraphBubbleUp as exc:
                return carry(exc)

        try:
            return passthrough(self.governor.call(self.name, attempt, key))
        except GovernedFatalError:
            raise  # already the pass-through form (a fatal stop from further in)
        except lg.AgentToolError as exc:
            raise _for_langgraph(exc) from exc

    async def _arun(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        key = self._call_key_value(args, kwargs)
        call_kwargs = _inner_kwargs(self._inner_async, kwargs, run_manager, config)
        inner_arun = self.inner._arun

        async def attempt(_key: Any) -> Any:
            try:
                return await inner_arun(*args, **call_kwargs)
            except GraphBubbleUp as exc:
                return carry(exc)

        try:
            return passthrough(await self.governor.acall(self.name, attempt, key))
        except GovernedFatalError:
            raise  # already the pass-through form (a fatal stop from further in)
        except lg.AgentToolError as exc:
            raise _for_langgraph(exc) from exc


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


def _for_langgraph(exc: lg.AgentToolError) -> Exception:
    """What a governed failure becomes inside LangGraph: a fatal stop it lets through to
    the caller, or a tool error its ToolNode turns into ``ToolMessage(status="error")``."""
    if isinstance(exc, lg.FatalError):
        return fatal_stop(exc)
    return GovernedToolError(exc)


def govern_tool(tool: BaseTool | Callable[..., Any], governor: lg.Governor | None = None) -> GovernedTool:
    """Wrap one tool (a ``BaseTool`` or a plain function with a docstring).

    Wrapping a :class:`GovernedTool` again re-wraps its inner tool, so a tool is never
    governed twice.
    """
    gov = resolve_governor(governor)
    if isinstance(tool, GovernedTool):
        return tool if tool.governor is gov else GovernedTool.wrap(tool.inner, gov)
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)
    return GovernedTool.wrap(base, gov)


def govern_tools(
    tools: Iterable[BaseTool | Callable[..., Any]], governor: lg.Governor | None = None
) -> list[GovernedTool]:
    """Wrap every tool with the same governor (shared breakers, budgets and task state)."""
    gov = resolve_governor(governor)
    return [govern_tool(t, gov) for t in tools]
