"""`GovernorCapability`: the governor in a pydantic-ai agent, through its capability hooks.

pydantic-ai's extension point is the capability (``Agent(..., capabilities=[...])``). This one
plugs in at four of its hooks, each for what it is made for:

* ``wrap_run`` -- one governor task per agent run (known-bad calls, the retry budget, the
  loop guards and the model-call ceiling are per task), ended however the run ends: a
  result, an exception, a cancellation. A run inside an open task (``with governor.task():``
  around ``agent.run_sync``, an agent called from another agent's tool) runs in that task.
* ``wrap_tool_execute`` -- each tool call is a governed call; its handler runs the tool, and
  may run again (pydantic-ai allows it), so the governor's retries are real attempts. A
  non-fatal governed failure becomes pydantic-ai's ``ToolFailed``: the model reads the
  governor's text as a failed tool result, and the tool's own retry budget (``ModelRetry``)
  is not spent. pydantic-ai's control flow from a tool (``ModelRetry``, ``ToolFailed``,
  deferral and approval, ``SkipToolExecution``) is handed back as it came.
* ``get_wrapper_model`` -- each model request attempt goes through ``acall_model``, keyed on
  the endpoint (``"<system>:<model name>"``): classification, retries, a breaker per endpoint,
  usage for the token and cost budgets. ``wrap_model_request`` may call its handler only once,
  so a retry cannot live there; the wrapper model's ``request`` may be called again.
* ``prepare_tools`` -- the ladder's tool withdrawal: a withdrawn tool is left out of the
  model's tool definitions (pydantic-ai then refuses a call of it as well).

A fatal failure (credentials, quota, a loop the ladder ended, a spent budget) raises
``lg.FatalError`` out of ``agent.run`` / ``run_sync``, with the task's partial results.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    ModelRetry,
    SkipToolExecution,
    ToolFailed,
    ToolFailedError,
    ToolRetryError,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model, ModelRequestContext, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition

import loop_governor as lg
from loop_governor.adapter import PassThrough, Usage, readable_name, resolve_governor, tool_offer

__all__ = ["GovernorCapability"]

# pydantic-ai's own control flow out of a tool: never the tool's failure, nor its success
_CONTROL_FLOW = (
    ModelRetry,
    ToolRetryError,
    ToolFailed,
    ToolFailedError,
    CallDeferred,
    ApprovalRequired,
    SkipToolExecution,
)


@dataclasses.dataclass
class GovernorCapability(AbstractCapability[Any]):
    """Govern a pydantic-ai agent's tool calls and model requests.

    Args:
        governor: the governor; ``None`` uses the process-wide default one (shared breakers).
        endpoint: the breaker and rate-limit key of the agent's model requests; default
            ``"<system>:<model name>"`` of the model serving each request.
    """

    governor: lg.Governor | None = None
    endpoint: str | None = None

    def __post_init__(self) -> None:
        self.governor = resolve_governor(self.governor)
        if self.endpoint is not None and (not isinstance(self.endpoint, str) or not self.endpoint):
            raise TypeError(f"endpoint must be a non-empty string or None, not {self.endpoint!r}")

    @property
    def _governor(self) -> lg.Governor:
        assert self.governor is not None  # resolved at construction
        return self.governor

    # -- the run: one governor task ------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        governor = self._governor
        open_task = governor.current_task()
        if open_task is not None and open_task.rt is governor.rt:
            return await handler()  # the caller's task (or an outer agent's) spans this run
        # (an open task of another governor -- an agent run from an agent governed by another
        # -- is not this governor's: its budgets and report are its own)
        name = readable_name(ctx.prompt) if isinstance(ctx.prompt, str) and ctx.prompt.strip() else None
        async with governor.task(ctx.run_id or uuid.uuid4().hex, name=name):
            return await handler()

    # -- tool calls ----------------------------------------------------------------------

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        async def attempt(_key: Any) -> Any:
            try:
                return await handler(args)
            except _CONTROL_FLOW as exc:
                raise PassThrough(exc) from None  # pydantic-ai's own decision: back as it came

        try:
            # the tool call id goes on the call's events (and tells a re-run of one call from a new call)
            with self._governor.call_context(tool_call_id=call.tool_call_id):
                return await self._governor.acall(tool_def.name, attempt, _call_key(call, args))
        except lg.FatalError:
            raise  # ends the run, with the task's partial results
        except lg.AgentToolError as failure:
            # a failed tool result the model reads; the tool's retry budget is not spent
            raise ToolFailed(failure.info.to_model_text()) from failure

    async def prepare_tools(self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]) -> list[ToolDefinition]:
        scope = self._governor.current_task()
        if scope is None or not scope.withdrawn:
            return tool_defs
        offer = tool_offer(scope, tool_defs, _tool_history(ctx.messages))
        return tool_defs if offer is None else offer.tools

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: ModelRequestContext, response: ModelResponse
    ) -> ModelResponse:
        """A call of a tool the request did not offer because it is withdrawn is the
        governor's to judge (the ladder's last step ends the run), not only pydantic-ai's
        "unknown tool" retry prompt."""
        scope = self._governor.current_task()
        if scope is None or not scope.withdrawn:
            return response
        offered = {t.name for t in request_context.model_request_parameters.function_tools}
        for part in response.parts:
            if isinstance(part, ToolCallPart) and part.tool_name in scope.withdrawn and part.tool_name not in offered:
                try:
                    await self._governor.acall(part.tool_name, _not_offered, _call_key(part, None))
                except lg.FatalError:
                    raise
                except (lg.AgentToolError, _NotOffered):
                    pass  # refused, not a stop: pydantic-ai tells the model the tool is not there
        return response

    # -- model requests ------------------------------------------------------------------

    def get_wrapper_model(self, model: Model) -> Model | None:
        return GovernedModel(model, self._governor, self.endpoint)


class GovernedModel(WrapperModel):
    """A model whose requests are governed calls (``acall_model``): each attempt is the
    wrapped model's own ``request``. A failure the governor does not end the run with
    reaches pydantic-ai as the provider's own exception (its ``ModelFallback`` and
    ``on_model_request_error`` see what they would without the governor), once the
    governor's retries are spent; a refusal (an open breaker) as the governor's error."""

    def __init__(self, wrapped: Model, governor: lg.Governor, endpoint: str | None = None) -> None:
        super().__init__(wrapped)
        self._lg_governor = governor
        self._lg_endpoint = endpoint

    @property
    def lg_endpoint(self) -> str:
        return self._lg_endpoint or f"{self.wrapped.system}:{self.wrapped.model_name}"

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        try:
            response: ModelResponse = await self._lg_governor.acall_model(
                self.lg_endpoint,
                self.wrapped.request,
                messages,
                model_settings,
                model_request_parameters,
                usage=_usage,
                describe=lambda _response: {"model": self.wrapped.model_name},
            )
        except lg.FatalError:
            raise
        except lg.AgentToolError as failure:
            cause = failure.__cause__
            if isinstance(cause, Exception):
                raise cause from None  # the provider's own error, after the governor's retries
            raise
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # A stream reaches the caller as it arrives: it cannot be retried once it has begun,
        # so it is counted against the task's budgets (the model-call ceiling holds), not retried.
        self._lg_governor.count_step("model")
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as response_stream:
            yield response_stream


class _NotOffered(Exception):
    """The governor let a call of a tool the request did not offer through (its
    withdrawal lapsed meanwhile): nothing ran, so no verdict."""


async def _not_offered(_key: Any) -> Any:
    raise PassThrough(_NotOffered())


def _usage(response: Any) -> Usage | None:
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    return Usage(
        int(getattr(usage, "input_tokens", 0) or 0),
        int(getattr(usage, "output_tokens", 0) or 0),
        int(getattr(usage, "cache_read_tokens", 0) or 0),
        int(getattr(usage, "cache_write_tokens", 0) or 0),
    )


def _call_key(call: ToolCallPart, args: Any) -> Any:
    """The call's identity for the governor: the arguments the model sent (validated ones
    may hold objects no key can be made of)."""
    try:
        return call.args_as_dict()
    except Exception:  # arguments pydantic-ai repaired or could not parse: the validated ones
        return args


def _tool_history(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    """Whether the conversation holds tool history, in the shape the ladder reads (it
    imports no framework): one OpenAI-style tool message if it does."""
    for message in messages:
        for part in getattr(message, "parts", ()):
            if isinstance(part, ToolCallPart | ToolReturnPart):
                return [{"role": "tool", "tool_call_id": part.tool_call_id, "content": ""}]
    return []
