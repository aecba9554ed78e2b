"""The LangChain arms: every task runs through a real ``langchain.agents.create_agent``.

Only the bench command imports this module (LangChain is an optional extra; ``import
loop_governor`` never loads it).

* ``baseline`` -- bare ``create_agent``. It aborts the run on any tool exception, so the
  agent gets the one-line fix users commonly add: a ``wrap_tool_call`` middleware that
  returns ``str(exc)`` as an error ``ToolMessage``.
* ``builtins`` -- what LangChain 1.5 ships: ``ToolRetryMiddleware`` at its documented
  defaults (2 retries of every exception, 1 s initial delay, x2, max 60 s, ±25 % jitter)
  with ``on_failure="error"`` placed inside ``ToolErrorMiddleware`` (the composition its
  docstring recommends) that returns ``"<ExcType>: <message>"``, and
  ``ToolCallLimitMiddleware(run_limit=40, exit_behavior="end")``: 40 calls fit the
  longest plan (30 items) with room for retries; "end" stops a runaway loop instead of
  feeding it more error messages. For the model call, ``ModelRetryMiddleware`` at its
  defaults (2 retries of retryable model errors, 1 s, x2, ±25 %, ``on_failure="continue"``:
  the run ends with an AI message stating the error).
* ``governed`` -- ``GovernorMiddleware`` plus ``govern_tools`` (the wrapped tools'
  results are plain strings, so the governor can checkpoint them and a restarted task
  resumes); the middleware governs every model call.

The model ([`PolicyChatModel`][loop_governor.bench.lc_runner.PolicyChatModel]) is a request to the world's provider
behind the simulated SDK retry loop (``max_retries=2``, as a ChatOpenAI user has it); it raises the
provider's errors as langchain-openai does, as classes that are both the provider error
and LangChain's ``ModelRateLimitError`` / ``ModelAPIError`` (``is_retryable``). The
governed arm calls the adapter's copy of it, with ``max_retries=0``.

Virtual time: ``ToolRetryMiddleware`` and ``ModelRetryMiddleware`` sleep with
``time.sleep`` from their own modules and draw jitter from the global ``random`` module
in ``langchain.agents.middleware._retry``; they take no sleep or random argument. For the
length of a world, ``world()`` swaps those module attributes (``tool_retry.time``,
``model_retry.time`` and ``_retry.random``) for the world's virtual clock and a seeded
``random.Random`` (``unittest.mock.patch.object``), and restores them.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ModelRetryMiddleware,
    ToolCallLimitMiddleware,
    ToolErrorMiddleware,
    ToolRetryMiddleware,
)
from langchain.agents.middleware import _retry as lc_retry
from langchain.agents.middleware import model_retry as lc_model_retry
from langchain.agents.middleware import tool_retry as lc_tool_retry
from langchain_core.exceptions import ModelAPIError, ModelRateLimitError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool

from langchain_governor import GovernorMiddleware, govern_tools
from loop_governor.bench.harness import World
from loop_governor.bench.policy import Answer, decide, model_latency
from loop_governor.bench.prompts import SYSTEM_PROMPT, task_prompt
from loop_governor.bench.provider import (
    COMPLETION_TOKENS,
    SDK_MAX_RETRIES,
    InternalServerError,
    ProviderError,
    RateLimitError,
    sdk_request,
)
from loop_governor.bench.real_model import Meter, RealModel, chat_openai, http_client
from loop_governor.bench.world import TaskSpec
from loop_governor.context.tokens import approx_tokens

TOOL_CALL_RUN_LIMIT = 40


class LCRateLimitError(RateLimitError, ModelRateLimitError):
    """A 429 as langchain-openai raises it: the provider's error and LangChain's type."""


class LCInternalServerError(InternalServerError, ModelAPIError):
    """A 5xx as langchain-openai raises it."""


def _as_langchain(exc: ProviderError) -> ProviderError:
    cls: type[ProviderError] | None = None
    if isinstance(exc, RateLimitError):
        cls = LCRateLimitError
    elif isinstance(exc, InternalServerError):
        cls = LCInternalServerError
    if cls is None:
        return exc
    twin = cls.__new__(cls, *exc.args)
    twin.__dict__.update(exc.__dict__)
    twin.args = exc.args
    return twin


class PolicyChatModel(BaseChatModel):
    """A LangChain chat model whose replies come from [`loop_governor.bench.policy`][loop_governor.bench.policy]."""

    spec: Any
    world: Any
    model_name: str = "bench-model"
    max_retries: int = SDK_MAX_RETRIES
    offered: tuple[str, ...] | None = None  # the tools of the request (None: not bound)

    @property
    def _llm_type(self) -> str:
        return "loop-governor-bench-policy"

    def bind_tools(self, tools: Any, **kwargs: Any) -> PolicyChatModel:
        names = tuple(t.get("name", "") if isinstance(t, dict) else getattr(t, "name", "") for t in tools or ())
        return self.model_copy(update={"offered": names})

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        spec: TaskSpec = self.spec
        world: World = self.world
        turn = sum(1 for m in messages if isinstance(m, AIMessage))
        tokens = sum(approx_tokens(m) for m in messages)
        latency = model_latency(world.seed, spec.task_id, turn, len(messages))
        try:
            sdk_request(world.provider, tokens, latency, max_retries=self.max_retries)
        except ProviderError as exc:
            raise _as_langchain(exc) from None
        results = [m.text for m in messages if isinstance(m, ToolMessage)]
        move = decide(spec, results, world.behaviour, world.seed, offered=self.offered)
        usage: Any = {
            "input_tokens": tokens,
            "output_tokens": COMPLETION_TOKENS,
            "total_tokens": tokens + COMPLETION_TOKENS,
        }
        if isinstance(move, Answer):
            reply = AIMessage(content=move.text, usage_metadata=usage)
        else:
            call = {"name": move.tool, "args": move.kwargs, "id": f"call_{turn}", "type": "tool_call"}
            reply = AIMessage(content="", tool_calls=[call], usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=reply)])


def make_tools(spec: TaskSpec, world: World) -> list[BaseTool]:
    """One LangChain tool per service the plan uses, each a request to the downstream."""
    tools: list[BaseTool] = []
    for name, schema in spec.tool_schemas().items():
        tools.append(
            StructuredTool.from_function(
                func=lambda _n=name, **kw: world.downstream.call(_n, kw),
                name=name,
                description=spec.tool_description(name),
                args_schema=schema,
            )
        )
    return tools


class ErrorsAsText(AgentMiddleware[Any, Any, Any]):
    """The common user fix for create_agent's abort-on-exception: the error as text."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        try:
            return handler(request)
        except Exception as exc:
            call = request.tool_call
            return ToolMessage(content=f"Error: {exc}", tool_call_id=call["id"], name=call["name"], status="error")


def _error_text(exc: Exception, request: Any) -> str:
    return f"{type(exc).__name__}: {exc}"


class LangChainRunner:
    name = "langchain"

    @contextlib.contextmanager
    def world(self, arm: str, world: World) -> Iterator[None]:
        if arm != "builtins":
            yield
            return
        rng = random.Random(world.rng.random())
        with (
            mock.patch.object(lc_tool_retry, "time", SimpleNamespace(sleep=world.clock.sleep)),
            mock.patch.object(lc_model_retry, "time", SimpleNamespace(sleep=world.clock.sleep)),
            mock.patch.object(lc_retry, "random", rng),
        ):
            yield

    def run(self, arm: str, spec: TaskSpec, world: World, attempt: int) -> str:
        if isinstance(world.behaviour, RealModel):
            # a real model through langchain-openai, metered and capped (see real_model)
            meter = Meter(world.behaviour.settings, world, spec.task_id)
            try:
                with http_client(meter) as client:
                    model = chat_openai(world.behaviour.settings, client)
                    return self._run(arm, spec, world, model, SYSTEM_PROMPT, task_prompt(spec))
            finally:
                meter.close()
        return self._run(arm, spec, world, PolicyChatModel(spec=spec, world=world), spec.goal, spec.goal)

    def _run(self, arm: str, spec: TaskSpec, world: World, model: Any, system: str, prompt: str) -> str:
        tools = make_tools(spec, world)
        middleware: list[Any]
        if arm == "baseline":
            middleware = [ErrorsAsText()]
        elif arm == "builtins":
            middleware = [
                ToolCallLimitMiddleware(run_limit=TOOL_CALL_RUN_LIMIT, exit_behavior="end"),
                ToolErrorMiddleware(_error_text),
                ToolRetryMiddleware(on_failure="error"),
                ModelRetryMiddleware(),
            ]
        else:
            governor = world.governor
            assert governor is not None
            tools = list(govern_tools(tools, governor))
            middleware = [GovernorMiddleware(governor, record_messages=False)]
        agent = create_agent(model, tools, system_prompt=system, middleware=middleware)
        inputs: Any = {"messages": [{"role": "user", "content": prompt}]}
        config: Any = {"recursion_limit": 10_000}
        if arm == "governed":
            assert world.governor is not None
            with world.governor.task(spec.task_id):
                state = agent.invoke(inputs, config)
        else:
            state = agent.invoke(inputs, config)
        last = state["messages"][-1]
        return last.text if isinstance(last, AIMessage) else str(last.content)
