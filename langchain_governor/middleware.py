"""``GovernorMiddleware``: the governor as a ``langchain.agents.create_agent`` middleware.

Without it a ``ValueError`` raised by any tool aborts a ``create_agent`` run (only
argument-validation errors come back to the model). With it:

* every tool call goes through ``governor.call``/``acall`` (the ToolNode handler is
  called again per attempt), and a non-fatal failure becomes a
  ``ToolMessage(status="error")`` holding the governor's structured JSON; a
  :class:`loop_governor.FatalError` propagates and stops the run;
* every model call is a governed model call (``governor.call_model``): one iteration of
  the task's budgets, classified failures, retries with backoff and Retry-After, the
  endpoint's breaker and rate limits, ``FatalError`` for credentials/billing/quota, one
  retry on a compacted prompt after ``context_length_exceeded`` (with a pruner), optional
  fallback models. The provider SDK's own retries are switched off on the model it calls
  (``GovernorConfig(sdk_retries="keep")`` keeps them). It optionally sees a pruned *view*
  of the conversation (``request.override(messages=...)``: graph state and the
  checkpointer keep the full history), and is recorded as one ``model_call`` event with
  usage (incl. prompt-cache reads) and the messages the model saw.

Tools already wrapped with :func:`langchain_governor.govern_tool` are governed by
their wrapper; the middleware only opens the task scope for them (no double retries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Annotated, Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired

import loop_governor as lg
from langchain_governor._common import (
    STATE_TASK_KEY,
    carry,
    key_args,
    new_task_id,
    passthrough,
    resolve_governor,
    state_value,
    thread_id_of,
)
from langchain_governor._pruning import MessagePruner, PrunerPool
from langchain_governor._scopes import LiveTasks
from langchain_governor.errors import fatal_stop
from langchain_governor.models import ModelCopies, describe, prompt_tokens, usage_of_response
from langchain_governor.tools import GovernedTool
from loop_governor.context.compact import emergency_compact


class GovernorState(AgentState[Any]):
    """Agent state plus the governor's task id for runs that have no ``thread_id``."""

    governor_task_id: NotRequired[Annotated[str, PrivateStateAttr]]


ToolResult = ToolMessage | Command[Any]


def emit_pruning(governor: lg.Governor, before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> None:
    """Record what a pruner did to one prompt (approximate token counts, no tokenizer)."""
    if not governor.emitting:
        return  # counting tokens is the expensive part: only when someone listens
    governor.emit(
        "pruning",
        tokens_before=count_tokens_approximately(before),
        tokens_after=count_tokens_approximately(after),
        messages_before=len(before),
        messages_after=len(after),
    )


class _ControlFlow(BaseException):
    """A LangGraph interrupt (or parent command) raised inside the model call, carried
    through the governor as control flow: a BaseException, so the governor neither
    classifies it nor retries it nor counts it against the endpoint's breaker (as with
    cancellation). :meth:`GovernorMiddleware.wrap_model_call` raises the original again."""

    def __init__(self, exc: GraphBubbleUp) -> None:
        super().__init__()
        self.exc = exc


def _bubbling(handler: Callable[[ModelRequest[Any]], Any]) -> Callable[[ModelRequest[Any]], Any]:
    def attempt(request: ModelRequest[Any]) -> Any:
        try:
            return handler(request)
        except GraphBubbleUp as exc:
            if isinstance(exc, lg.FatalError):
                raise  # a governed stop keeps its verdict
            raise _ControlFlow(exc) from None

    return attempt


def _abubbling(
    handler: Callable[[ModelRequest[Any]], Awaitable[Any]],
) -> Callable[[ModelRequest[Any]], Awaitable[Any]]:
    async def attempt(request: ModelRequest[Any]) -> Any:
        try:
            return await handler(request)
        except GraphBubbleUp as exc:
            if isinstance(exc, lg.FatalError):
                raise
            raise _ControlFlow(exc) from None

    return attempt


def _sent_to(
    model: Any, handler: Callable[[ModelRequest[Any]], Any], answered: list[Any]
) -> Callable[[ModelRequest[Any]], Any]:
    """A fallback: the same request, sent to ``model`` through the same handler
    (``answered[0]``: the model the call's event names)."""

    def send(request: ModelRequest[Any]) -> Any:
        answered[0] = model
        return handler(request.override(model=model))

    return send


_RECORD_MARK = "lc_tool_message"


def _to_record(result: Any) -> Any:
    """A plain text ToolMessage as JSON, so the governor can checkpoint it and resume
    without re-running the tool; anything else (artifacts, Commands) passes unchanged."""
    if isinstance(result, ToolMessage) and isinstance(result.content, str) and result.artifact is None:
        return {_RECORD_MARK: True, "content": result.content, "name": result.name, "status": result.status}
    return result


def _from_record(value: Any, request: ToolCallRequest) -> Any:
    """The ToolMessage again, answering *this* request's tool call id."""
    if isinstance(value, dict) and value.get(_RECORD_MARK):
        return ToolMessage(
            content=value.get("content", ""),
            tool_call_id=request.tool_call["id"],
            name=value.get("name") or request.tool_call["name"],
            status=value.get("status") or "success",
        )
    return value


def _shield(handler: Callable[[ToolCallRequest], ToolResult], request: ToolCallRequest) -> Callable[[Any], Any]:
    """One attempt of the ToolNode handler; LangGraph control flow is carried through."""

    def attempt(_key: Any) -> Any:
        try:
            return _to_record(handler(request))
        except GraphBubbleUp as exc:
            return carry(exc)

    return attempt


def _ashield(
    handler: Callable[[ToolCallRequest], Awaitable[ToolResult]], request: ToolCallRequest
) -> Callable[[Any], Awaitable[Any]]:
    async def attempt(_key: Any) -> Any:
        try:
            return _to_record(await handler(request))
        except GraphBubbleUp as exc:
            return carry(exc)

    return attempt


class GovernorMiddleware(AgentMiddleware[GovernorState, Any, Any]):
    """Govern tool calls and model steps of a ``create_agent`` agent.

    Args:
        governor: the governor to use; ``None`` means the process-wide default.
        pruner: optional object with ``prune(messages) -> messages`` returning a pruned
            copy; the model sees its output, the graph state keeps the full history.
        record_messages: include the prompt (as OpenAI-style dicts) in ``model_call``
            events; turn off for very long contexts if the trace size matters.
        fallback_models: chat models tried in order while the agent's model is down
            (its breaker open, its transient retries spent); each is governed on its own
            endpoint (breaker, rate limits) and gets the same request.
    """

    state_schema = GovernorState

    def __init__(
        self,
        governor: lg.Governor | None = None,
        pruner: MessagePruner | None = None,
        *,
        pruner_factory: Callable[[], MessagePruner] | None = None,
        record_messages: bool = True,
        fallback_models: Sequence[Any] = (),
    ) -> None:
        super().__init__()
        self.governor = resolve_governor(governor)
        if pruner is not None and pruner_factory is not None:
            raise ValueError("pass pruner or pruner_factory, not both")
        self.pruner = pruner
        # A pruner keeps per-conversation state and is not thread-safe: one agent serves
        # many threads (batch, a server), so either one pruner per task (the factory) or
        # the shared one behind a lock (its output depends only on the messages it is
        # given, so sharing stays correct; it just rebuilds when conversations interleave).
        self._pruners = PrunerPool(pruner, pruner_factory)
        self.record_messages = record_messages
        self._copies = ModelCopies(self.governor.config.sdk_retries)
        self._fallbacks = [self._copies(m)[0] for m in fallback_models]
        self._tasks = LiveTasks(self.governor)

    # -- task scope ---------------------------------------------------------------------
    #
    # One governor task per agent run, keyed by the LangGraph thread_id (else an id kept
    # in graph state), live from the first node to after_agent; see _scopes.LiveTasks.
    # A scope the caller opened around invoke() wins: contextvars reach every node.

    def before_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._assign_task_id(state, runtime)

    async def abefore_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._assign_task_id(state, runtime)

    def after_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._end_task(state, runtime)
        return None

    async def aafter_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._end_task(state, runtime)
        return None

    def _assign_task_id(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        # The model node and the tool node are separate graph nodes: a generated id has
        # to live in graph state so both (and a resumed run) find the same task.
        if self._thread_id(runtime) is not None or state_value(state, STATE_TASK_KEY):
            return None
        return {STATE_TASK_KEY: new_task_id()}

    def _end_task(self, state: Any, runtime: Any) -> None:
        if self.governor.current_task() is None:
            task_id = self._task_id(state, runtime)
            self._tasks.end(task_id)
            self._pruners.drop(task_id)

    @staticmethod
    def _thread_id(runtime: Any) -> str | None:
        info = getattr(runtime, "execution_info", None)
        thread = getattr(info, "thread_id", None)
        if thread is not None:
            return str(thread)
        return thread_id_of(getattr(runtime, "config", None))

    def _task_id(self, state: Any, runtime: Any) -> str:
        task_id = self._thread_id(runtime) or state_value(state, STATE_TASK_KEY)
        return str(task_id) if task_id else "langgraph-run"

    @contextlib.contextmanager
    def _scope(self, state: Any, runtime: Any) -> Iterator[None]:
        if self.governor.current_task() is not None:
            yield
            return
        task_id = self._task_id(state, runtime)
        try:
            with self._tasks.attached(task_id):
                yield
        except Exception as exc:
            if isinstance(exc, GraphBubbleUp) and not isinstance(exc, lg.FatalError):
                raise  # an interrupt pauses the run: the task goes on when it resumes
            # The run is aborting (FatalError, a budget, a model error): after_agent will
            # not run, so end the task here. Otherwise the thread stays stuck with a spent
            # budget and runs without a thread_id leak their state. A checkpoint, if any,
            # was saved; a resume reloads it.
            self._tasks.end(task_id)
            self._pruners.drop(task_id)
            raise

    # -- model calls --------------------------------------------------------------------

    def _prepare(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request the model sees: pruned, and sent through the governed model copy."""
        scope = self.governor.current_task()
        before = request.messages
        pruned = self._pruners.prune(scope.task_id if scope is not None else None, list(before))
        if pruned is not None:
            emit_pruning(self.governor, before, pruned)
            request = request.override(messages=pruned)
        governed, _ = self._copies(request.model)
        return request if governed is request.model else request.override(model=governed)

    def _model_call(self, request: ModelRequest[Any], handler: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
        """The endpoint and the keyword options of ``governor.call_model`` for ``request``."""
        messages, system = request.messages, request.system_message
        _, endpoint = self._copies(request.model)
        answered = [request.model]  # the model that made the last attempt: a fallback's, once used
        options: dict[str, Any] = {
            "usage": usage_of_response,
            "estimated_tokens": lambda: prompt_tokens(messages, system),
            "compact": self._compact if self._pruners.enabled else None,
            "fallbacks": [(self._copies(m)[1], _sent_to(m, handler, answered)) for m in self._fallbacks],
        }
        if self.governor.emitting:
            options["describe"] = describe(answered, messages, system, self.record_messages)
        return endpoint, options

    @staticmethod
    def _compact(request: ModelRequest[Any]) -> ModelRequest[Any] | None:
        """After ``context_length_exceeded``: the same request, compacted as hard as is safe."""
        compacted = emergency_compact(request.messages, keep_last=1)
        return None if compacted is None else request.override(messages=compacted)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Any],
    ) -> Any:
        with self._scope(request.state, request.runtime):
            request = self._prepare(request)
            handler = _bubbling(handler)
            endpoint, options = self._model_call(request, handler)
            try:
                return self.governor.call_model(endpoint, handler, request, **options)
            except _ControlFlow as flow:
                raise flow.exc from None

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[Any]],
    ) -> Any:
        with self._scope(request.state, request.runtime):
            request = self._prepare(request)
            handler = _abubbling(handler)
            endpoint, options = self._model_call(request, handler)
            try:
                return await self.governor.acall_model(endpoint, handler, request, **options)
            except _ControlFlow as flow:
                raise flow.exc from None

    # -- tool calls ---------------------------------------------------------------------

    @staticmethod
    def _needs_governing(request: ToolCallRequest) -> bool:
        # Unknown tools are left to ToolNode (it answers with its own error message);
        # wrapped tools already go through the governor.
        return request.tool is not None and not isinstance(request.tool, GovernedTool)

    @staticmethod
    def _error_message(request: ToolCallRequest, exc: lg.AgentToolError) -> ToolMessage:
        call = request.tool_call
        return ToolMessage(
            content=exc.info.to_model_text(),
            tool_call_id=call["id"],
            name=call["name"],
            status="error",
        )

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        with self._scope(request.state, request.runtime):
            if not self._needs_governing(request):
                # a GovernedTool governs itself; its events still get the tool call id
                with self.governor.call_context(tool_call_id=request.tool_call.get("id")):
                    return handler(request)
            call = request.tool_call
            try:
                with self.governor.call_context(tool_call_id=call.get("id")):
                    result: ToolResult = _from_record(
                        passthrough(
                            self.governor.call(call["name"], _shield(handler, request), key_args((), call["args"]))
                        ),
                        request,
                    )
            except lg.FatalError as exc:
                # as a GraphBubbleUp too: a ToolNode(handle_tool_errors=True) must not turn it into text
                raise fatal_stop(exc) from exc
            except lg.AgentToolError as exc:
                return self._error_message(request, exc)
            return result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        with self._scope(request.state, request.runtime):
            if not self._needs_governing(request):
                with self.governor.call_context(tool_call_id=request.tool_call.get("id")):
                    return await handler(request)
            call = request.tool_call
            try:
                with self.governor.call_context(tool_call_id=call.get("id")):
                    result: ToolResult = _from_record(
                        passthrough(
                            await self.governor.acall(
                                call["name"], _ashield(handler, request), key_args((), call["args"])
                            )
                        ),
                        request,
                    )
            except lg.FatalError as exc:
                # as a GraphBubbleUp too: a ToolNode(handle_tool_errors=True) must not turn it into text
                raise fatal_stop(exc) from exc
            except lg.AgentToolError as exc:
                return self._error_message(request, exc)
            return result
