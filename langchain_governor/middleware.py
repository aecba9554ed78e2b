"""``GovernorMiddleware``: the governor as a ``langchain.agents.create_agent`` middleware.

Without it a ``ValueError`` raised by any tool aborts a ``create_agent`` run (only
argument-validation errors come back to the model). With it:

* every tool call's *tool* runs governed: the middleware hands the calls below it a
  governed copy of the tool ([`GovernedTool`][langchain_governor.tools.GovernedTool]), so the
  governor retries the tool itself, below every other middleware -- a human approval,
  a guard or a result transformer inside runs once per call, and exceptions raised by
  other middlewares are theirs, passed through unclassified. A non-fatal failure is
  raised as [`GovernedToolError`][langchain_governor.errors.GovernedToolError], which the ToolNode turns
  into ``ToolMessage(status="error")`` holding the governor's JSON and which a
  ``ToolErrorMiddleware``/``ToolRetryMiddleware`` around it can still catch; a
  [`loop_governor.FatalError`][loop_governor.errors.FatalError] propagates and stops the run;
* every model call is a governed model call (``governor.call_model``): one iteration of
  the task's budgets, classified failures, retries with backoff and Retry-After, the
  endpoint's breaker and rate limits, ``FatalError`` for credentials/billing/quota, one
  retry on a compacted prompt after ``context_length_exceeded`` (with a pruner), optional
  fallback models. The provider SDK's own retries are switched off on the model it calls
  (``GovernorConfig(sdk_retries="keep")`` keeps them). It optionally sees a pruned *view*
  of the conversation (``request.override(messages=...)``: graph state and the
  checkpointer keep the full history), and is recorded as one ``model_call`` event with
  usage (incl. prompt-cache reads) and the messages the chat model received (after any
  middleware inside this one edited them).

``create_agent`` adds a tools node to any agent whose middleware defines a tool hook,
and that changes a tool-less agent's graph; so the tool hooks exist only on the variant
``GovernorMiddleware(...)`` builds by default, and ``govern_tool_calls=False`` gives a
chat-only agent (tracing, pruning, step budgets) one without them.

Tools already wrapped with [`langchain_governor.govern_tool`][langchain_governor.tools.govern_tool] are governed by
their wrapper; the middleware only opens the task scope for them (no double retries).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Annotated, Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import BaseMessage, RemoveMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.errors import GraphBubbleUp
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired

import loop_governor as lg
from langchain_governor._capture import ModelStop, PromptCapture, capture_prompt
from langchain_governor._common import (
    STATE_TASK_KEY,
    first_request,
    new_task_id,
    state_value,
    thread_id_of,
)
from langchain_governor._scopes import LiveTasks, RunInfo
from langchain_governor.errors import GovernedFatalError, GovernedToolError, answerable, fatal_stop, model_error
from langchain_governor.models import ModelCopies, describe, prompt_tokens, usage_of_response
from langchain_governor.tools import SURFACING, GovernedTool, govern_tool
from loop_governor.adapter import (
    MessagePruner,
    PassThrough,
    PrunerPool,
    check_pruner,
    emergency_compact,
    not_run_text,
    pending_tool_calls,
    resolve_governor,
    stop_text,
    tool_offer,
)


class GovernorState(AgentState[Any]):
    """Agent state plus the governor's task id for runs that have no ``thread_id``."""

    governor_task_id: NotRequired[Annotated[str, PrivateStateAttr]]


ToolResult = ToolMessage | Command[Any]

# Chat models (by their LangSmith provider name) whose bind_tools passes tool_choice="none"
# through to a provider that honours it: OpenAI's Chat Completions (and Azure's). Others
# get no tool_choice from the governor: Bedrock's Converse API has no "none", and an
# integration may read an unknown string as a tool name.
_FORBIDS_TOOL_CALLS = frozenset({"openai", "azure"})


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


def _sent_to(
    model: Any, handler: Callable[[ModelRequest[Any]], Any], capture: PromptCapture, answered: list[Any]
) -> Callable[[ModelRequest[Any]], Any]:
    """A fallback: the same request, sent to ``model`` through the same handler
    (``answered[0]``: the model the call's event names)."""
    attempt = _model_only(handler, capture)

    def send(request: ModelRequest[Any]) -> Any:
        answered[0] = model
        return attempt(request.override(model=model))

    return send


def _model_only(handler: Callable[[ModelRequest[Any]], Any], capture: PromptCapture) -> Callable[..., Any]:
    """One governed attempt: the handler, whose failures are the governor's only when the
    chat model itself raised them. Anything else -- a middleware inside this one, the
    structured-output parser after the model answered -- passes through as it is."""

    def attempt(request: ModelRequest[Any]) -> Any:
        try:
            return handler(request)
        except ModelStop as stop:
            raise stop.error from None  # the model's own failure, for the governor to classify
        except Exception as exc:
            if capture.raised_by_model(exc):
                raise
            raise PassThrough(exc) from None

    return attempt


def _amodel_only(
    handler: Callable[[ModelRequest[Any]], Awaitable[Any]], capture: PromptCapture
) -> Callable[..., Awaitable[Any]]:
    async def attempt(request: ModelRequest[Any]) -> Any:
        try:
            return await handler(request)
        except ModelStop as stop:
            raise stop.error from None
        except Exception as exc:
            if capture.raised_by_model(exc):
                raise
            raise PassThrough(exc) from None

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
        govern_tool_calls: govern the agent's tool calls (the default). ``False`` for an
            agent without tools: the middleware then defines no tool hook, and
            ``create_agent`` builds the same graph as without it.
        resume: with a checkpoint store, a thread whose last run did not finish resumes
            from its checkpoint (``None``, the default); one that finished starts over.
            ``True`` resumes a finished thread's checkpoint too, ``False`` never resumes.

    Where it goes in ``middleware=[...]``: first (outermost) is the documented place --
    see the README for how it combines with the built-in middlewares.
    """

    state_schema = GovernorState

    def __new__(cls, *args: Any, govern_tool_calls: bool = True, **kwargs: Any) -> GovernorMiddleware:
        # create_agent decides by the *class* attribute whether a middleware has tool
        # hooks (and then adds a tools node even to a tool-less agent), so the choice is
        # a class: this one, or the subclass below that adds the hooks.
        if cls is GovernorMiddleware and govern_tool_calls:
            cls = _ToolCallGovernor
        return super().__new__(cls)

    @property
    def name(self) -> str:
        """The node name prefix in the agent graph: the same for both variants."""
        return "GovernorMiddleware"

    def __init__(
        self,
        governor: lg.Governor | None = None,
        pruner: MessagePruner | None = None,
        *,
        pruner_factory: Callable[[], MessagePruner] | None = None,
        record_messages: bool = True,
        fallback_models: Sequence[Any] = (),
        govern_tool_calls: bool = True,
        resume: bool | None = None,
    ) -> None:
        super().__init__()
        self.govern_tool_calls = govern_tool_calls
        self.governor = resolve_governor(governor)
        check_pruner(pruner, pruner_factory)
        if resume is not None and not isinstance(resume, bool):
            raise TypeError(f"resume must be True, False or None, not {type(resume).__name__}")
        if isinstance(fallback_models, str) or not isinstance(fallback_models, Sequence):
            raise TypeError(f"fallback_models must be a sequence of chat models, not {type(fallback_models).__name__}")
        self.pruner = pruner
        # A pruner keeps per-conversation state and is not thread-safe: one agent serves
        # many threads (batch, a server), so either one pruner per task (the factory) or
        # the shared one behind a lock (its output depends only on the messages it is
        # given, so sharing stays correct; it just rebuilds when conversations interleave).
        self._pruners = PrunerPool(pruner, pruner_factory)
        self.record_messages = record_messages
        self._copies = ModelCopies(self.governor.config.sdk_retries)
        self._fallbacks = [self._copies(m)[0] for m in fallback_models]
        named = [self._copies(m)[1] for m in fallback_models]
        if len(set(named)) < len(named):  # the agent's own model is checked per call (governor.call_model)
            raise ValueError(f"fallback_models: an endpoint is named twice: {named}")
        self._tasks = LiveTasks(self.governor, resume, on_end=self._pruners.drop)

    # -- task scope ---------------------------------------------------------------------
    #
    # One governor task per agent run, keyed by the LangGraph thread_id (else an id kept
    # in graph state), live from the first node to the run's end, however it ends; see
    # _scopes.LiveTasks. A scope the caller opened around invoke() wins: contextvars
    # reach every node.

    def before_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._start_run(state, runtime)

    async def abefore_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._start_run(state, runtime)

    def after_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._end_task(state, runtime)
        return None

    async def aafter_agent(self, state: GovernorState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._end_task(state, runtime)
        return None

    def _start_run(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        """A new run: its task id (a generated one lives in graph state: the model node and
        the tool node are separate graph nodes, and a resumed run must find it), a task an
        earlier run of the thread left open ended, and the tool calls that run left
        unanswered answered -- or no provider accepts the thread's history again."""
        update: dict[str, Any] = {}
        task_id = self._thread_id(runtime) or state_value(state, STATE_TASK_KEY)
        if not task_id:
            task_id = new_task_id()
            update[STATE_TASK_KEY] = task_id
        if self.governor.current_task() is None:
            name = lambda: self._thread_id(runtime) or first_request(state)  # noqa: E731
            self._tasks.begin(str(task_id), self._run_info(runtime), name)
        answered = self._answer_pending(state_value(state, "messages") or [], str(task_id))
        if answered is not None:
            update["messages"] = answered
        return update or None

    def _answer_pending(self, messages: Sequence[Any], task_id: str) -> list[Any] | None:
        """The thread's messages with an error ToolMessage after each tool call no tool
        message answers (an earlier run ended between the model's request and the tools'
        answers: cancelled, a recursion limit, a crash), or None when there is none."""
        pending = pending_tool_calls(messages)
        if not pending:
            return None
        how = self._tasks.ended_how(task_id)
        reason = f"the run that asked for it ended first ({how})" if how else "the run that asked for it ended first"
        answers: dict[int, list[ToolMessage]] = {}
        fmt = self.governor.config.error_format
        for call in pending:
            answer = ToolMessage(
                content=not_run_text(call.name, reason, fmt), tool_call_id=call.id, name=call.name, status="error"
            )
            answers.setdefault(call.after, []).append(answer)
        repaired: list[Any] = [RemoveMessage(id=REMOVE_ALL_MESSAGES)]
        for i, message in enumerate(messages):
            repaired.append(message)
            repaired.extend(answers.get(i, ()))
        self.governor.emit("pending_calls_answered", count=len(pending), reason=reason)
        return repaired

    def _end_task(self, state: Any, runtime: Any) -> None:
        scope = self.governor.current_task()
        if scope is not None:
            # the caller's own scope: a stop this run deferred is raised here all the same
            if scope.stop is not None:
                raise stop_error(scope.stop)
            return
        task_id = self._task_id(state, runtime)
        live = self._tasks.scope(task_id) if task_id in self._tasks else None
        stop = live.stop if live is not None else None
        if stop is not None:
            # a stop in the tool node answered its calls and ended nothing yet: the
            # run ends here with it (a tool that answers directly leads here)
            raised = stop_error(stop)
            self._tasks.end(task_id, raised)
            raise raised
        self._tasks.end(task_id)

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

    def _run_info(self, runtime: Any) -> RunInfo:
        """The run a node belongs to (see _scopes): its stream writer, step and limit."""
        config = getattr(runtime, "config", None)  # a ToolRuntime's
        if not isinstance(config, dict):
            try:
                config = get_config()
            except RuntimeError:  # not inside a graph run
                config = {}
        step = (config.get("metadata") or {}).get("langgraph_step")
        limit = config.get("recursion_limit")
        return RunInfo(
            getattr(runtime, "stream_writer", None),
            step if isinstance(step, int) else None,
            limit if isinstance(limit, int) else None,
            _checkpoint_of(config),
        )

    @contextlib.contextmanager
    def _scope(self, state: Any, runtime: Any, *, fatal_only: bool = False) -> Iterator[lg.TaskScope | None]:
        if (own := self.governor.current_task()) is not None:
            yield own
            return
        task_id = self._task_id(state, runtime)
        try:
            with self._tasks.attached(
                task_id, self._run_info(runtime), lambda: self._thread_id(runtime) or first_request(state)
            ) as scope:
                yield scope
        except BaseException as exc:
            if isinstance(exc, GraphBubbleUp) and not isinstance(exc, lg.FatalError):
                self._tasks.pause(task_id)
                raise  # an interrupt pauses the run: the task goes on when it resumes
            if fatal_only and isinstance(exc, Exception) and not isinstance(exc, lg.FatalError):
                # A tool-call error may be answered further out (the ToolNode turns a
                # governed failure into a ToolMessage, a ToolErrorMiddleware formats
                # one): only a fatal stop surely ends the run.
                raise
            # The run is aborting (FatalError, a budget, a model error, a cancellation):
            # after_agent will not run, so end the task here. Otherwise the thread stays
            # stuck with a spent budget and runs without a thread_id leak their state. A
            # checkpoint, if any, was saved; a resume reloads it.
            self._tasks.end(task_id, exc)
            raise

    # -- model calls --------------------------------------------------------------------

    def _prepare(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request the model sees: without the tools the governor withdrew, pruned, and
        sent through the governed model copy."""
        scope = self.governor.current_task()
        if scope is not None and scope.withdrawn and request.tools:
            request = self._without_withdrawn(request, scope)
        before = request.messages
        pruned = self._pruners.prune(scope.task_id if scope is not None else None, list(before))
        if pruned is not None:
            emit_pruning(self.governor, before, pruned)
            request = request.override(messages=pruned)
        governed, _ = self._copies(request.model)
        return request if governed is request.model else request.override(model=governed)

    def _without_withdrawn(self, request: ModelRequest[Any], scope: Any) -> ModelRequest[Any]:
        """The request as the ladder offers it once tools are withdrawn
        ([`tool_offer`][loop_governor.policies.ladder.tool_offer]): without the withdrawn tools; with every
        tool withdrawn and tool history in the conversation, the tools stay defined and an
        OpenAI model is told ``tool_choice="none"``."""
        offer = tool_offer(scope, request.tools, request.messages)
        if offer is None:
            return request
        if not offer.forbid:
            return request if len(offer.tools) == len(request.tools) else request.override(tools=offer.tools)
        provider = self._copies(request.model)[1].split(":", 1)[0]
        if request.tool_choice is None and provider in _FORBIDS_TOOL_CALLS:
            return request.override(tool_choice="none")
        return request  # the tools stay offered; a call of one ends the run (the ladder's last step)

    def _model_call(
        self, request: ModelRequest[Any], handler: Callable[..., Any], capture: PromptCapture
    ) -> tuple[str, dict[str, Any]]:
        """The endpoint and the keyword options of ``governor.call_model`` for ``request``."""
        messages, system = request.messages, request.system_message
        _, endpoint = self._copies(request.model)
        answered = [request.model]  # the model that made the last attempt: a fallback's, once used
        options: dict[str, Any] = {
            "usage": usage_of_response,
            # asked per attempt's request: a compacted retry is charged its own size
            "estimated_tokens": lambda sent: prompt_tokens(sent.messages, sent.system_message),
            "compact": self._compact if self._pruners.enabled else None,
            "fallbacks": [(self._copies(m)[1], _sent_to(m, handler, capture, answered)) for m in self._fallbacks],
        }
        if self.governor.emitting:
            options["describe"] = describe(answered, messages, system, self.record_messages, capture)
        return endpoint, options

    def _fatal_for(self, request: ModelRequest[Any]) -> Callable[[BaseException], bool]:
        """Whether a chat model's failure is fatal, as the governor will classify it for
        this request's endpoint (see `langchain_governor._capture`)."""
        rt = self.governor.rt
        endpoint = self._copies(request.model)[1]
        policy = rt.policy("model", endpoint)
        return lambda exc: rt.classify(exc, endpoint, policy).error_type is lg.ErrorType.FATAL

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
        with self._scope(request.state, request.runtime) as scope:
            _raise_deferred(scope)
            request = self._prepare(request)
            with capture_prompt(self.record_messages and self.governor.emitting, self._fatal_for(request)) as capture:
                endpoint, options = self._model_call(request, handler, capture)
                try:
                    return self.governor.call_model(endpoint, _model_only(handler, capture), request, **options)
                except lg.AgentToolError as exc:
                    failure = exc
            raise model_error(failure)  # outside the except block: the chain is the governor's

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[Any]],
    ) -> Any:
        with self._scope(request.state, request.runtime) as scope:
            _raise_deferred(scope)
            request = self._prepare(request)
            with capture_prompt(self.record_messages and self.governor.emitting, self._fatal_for(request)) as capture:
                endpoint, options = self._model_call(request, handler, capture)
                try:
                    return await self.governor.acall_model(endpoint, _amodel_only(handler, capture), request, **options)
                except lg.AgentToolError as exc:
                    failure = exc
            raise model_error(failure)


@contextlib.contextmanager
def _surfacing() -> Iterator[None]:
    """Governed failures climb through the middlewares inside this one as exceptions and
    leave it in the form the ToolNode answers the model with (unless something further
    out handles them first)."""
    token = SURFACING.set(True)
    try:
        yield
    except GovernedToolError as exc:
        if exc.answerable:
            raise
        raise answerable(exc) from exc.__cause__
    finally:
        SURFACING.reset(token)


class _GovernedTools:
    """One governed copy per tool object (a ToolNode reuses its tools on every call).

    Bounded, since middleware may hand out new tool objects per request.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._by_id: OrderedDict[int, tuple[BaseTool, GovernedTool]] = OrderedDict()

    def get(self, tool: BaseTool, governor: lg.Governor) -> GovernedTool:
        with self._lock:
            entry = self._by_id.get(id(tool))
            if entry is not None and entry[0] is tool:
                self._by_id.move_to_end(id(tool))
                return entry[1]
        governed = govern_tool(tool, governor)
        with self._lock:
            self._by_id[id(tool)] = (tool, governed)  # the pair keeps the id valid
            while len(self._by_id) > self._size:
                self._by_id.popitem(last=False)
        return governed


class _ToolCallGovernor(GovernorMiddleware):
    """``GovernorMiddleware`` with tool hooks (what ``GovernorMiddleware(...)`` builds
    unless ``govern_tool_calls=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._governed_tools = _GovernedTools()

    def _governed_request(self, request: ToolCallRequest) -> ToolCallRequest:
        """The request with its tool swapped for a governed copy (unknown tools are left
        to ToolNode's own answer; a GovernedTool governs itself)."""
        tool = request.tool
        if tool is None or isinstance(tool, GovernedTool):
            return request
        return request.override(tool=self._governed_tools.get(tool, self.governor))

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        with (
            self._scope(request.state, request.runtime, fatal_only=True) as scope,
            self.governor.call_context(tool_call_id=request.tool_call.get("id")),
        ):
            if scope is not None and scope.stop is not None:
                return self._not_run(request, scope.stop)
            try:
                with _surfacing():
                    return handler(self._governed_request(request))
            except lg.FatalError as stop:
                return self._stopped(request, scope, stop)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        with (
            self._scope(request.state, request.runtime, fatal_only=True) as scope,
            self.governor.call_context(tool_call_id=request.tool_call.get("id")),
        ):
            if scope is not None and scope.stop is not None:
                return self._not_run(request, scope.stop)
            try:
                with _surfacing():
                    return await handler(self._governed_request(request))
            except lg.FatalError as stop:
                return self._stopped(request, scope, stop)

    # A stop in the tool node is not raised there: LangGraph would save the model's tool
    # calls without their answers, and every later request of the thread would be refused
    # (OpenAI: "An assistant message with 'tool_calls' must be followed by tool messages
    # responding to each 'tool_call_id'"). The call that stopped is answered with the stop,
    # the turn's other calls with "not run", the answers are saved with the tool node, and
    # the run ends at its next node (the model call, or after_agent) with the stop.

    def _stopped(self, request: ToolCallRequest, scope: lg.TaskScope | None, stop: lg.FatalError) -> ToolMessage:
        if scope is None:
            raise stop  # no task: nothing to defer to
        if scope.stop is None:
            scope.stop = stop  # a fatal error the governor's own chain did not see
        call = request.tool_call
        return ToolMessage(
            content=stop_text(stop), tool_call_id=call.get("id") or "", name=call.get("name"), status="error"
        )

    def _not_run(self, request: ToolCallRequest, stop: lg.FatalError) -> ToolMessage:
        call = request.tool_call
        reason = f"the run was stopped ({stop.reason})"
        return ToolMessage(
            content=not_run_text(call.get("name"), reason, self.governor.config.error_format),
            tool_call_id=call.get("id") or "",
            name=call.get("name"),
            status="error",
        )


def _checkpoint_of(config: Any) -> tuple[Any, dict[str, Any]] | None:
    """The run's checkpointer and the config of its latest checkpoint (the graph's
    namespace: a node's own ends in ``|<node>:<task id>``), for a run with a thread."""
    configurable = config.get("configurable") or {}
    saver = configurable.get(CONFIG_KEY_CHECKPOINTER)
    thread = configurable.get("thread_id")
    if saver is None or thread is None:
        return None
    namespace = str(configurable.get("checkpoint_ns") or "")
    graph_ns = namespace.rsplit("|", 1)[0] if "|" in namespace else ""
    return saver, {"configurable": {"thread_id": thread, "checkpoint_ns": graph_ns}}


def stop_error(stop: lg.FatalError) -> lg.FatalError:
    """A task's stop as the run raises it: LangGraph's pass-through form of its class
    (`fatal_stop`), its cause the governor's error."""
    if isinstance(stop, GovernedFatalError):
        return stop
    raised = fatal_stop(stop)
    raised.__cause__ = stop
    return raised


def _raise_deferred(scope: lg.TaskScope | None) -> None:
    """Before a model call: a stop the tool node answered ends the run now."""
    if scope is not None and scope.stop is not None:
        raise stop_error(scope.stop)
