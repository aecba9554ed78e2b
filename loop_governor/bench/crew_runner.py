"""The crewAI arms: every task runs through a real ``crewai.Crew`` kickoff.

Only the bench command imports this module; it sets crewAI's offline switches before
crewAI is imported (no telemetry, no tracing, no network, no key).

* ``baseline`` -- a plain crew: tools raise, crewAI shows "Error executing tool: ..." to
  the model. ``max_iter=60`` (crewAI's default 25 is below the 30-item batch plan; every
  arm gets an iteration budget that fits its plans), ``max_retry_limit`` at its default
  (2). crewAI's REPEATED_CALL guard (abort on the 5th identical call+result) is always on.
* ``builtins`` -- crewAI's own failure signalling: tools *return* a ``ToolFailure``
  (message, HTTP status as ``code``, ``retryable`` for 429/5xx) as crewAI 1.15 documents,
  under the default ``ToolFailurePolicy.WARN`` (recorded, run continues); REPEATED_CALL;
  ``max_iter=40`` as the iteration budget (the analogue of LangChain's tool-call limit);
  ``max_retry_limit=2`` (default).
* ``governed`` -- ``crewai_governor.govern_tools`` + ``install(governor, task_id=...)``,
  ``max_iter=60`` like the baseline.

The model is a native function-calling ``BaseLLM`` whose moves come from
[`loop_governor.bench.policy`][loop_governor.bench.policy]: each call is a request to the world's provider behind
the simulated SDK retry loop (``max_retries=2``, as crewAI's native OpenAI LLM has it),
with its latency slept on the world's virtual clock. Around every LLM class's ``call``
crewAI wraps its own rate-limit retry (3 attempts, 1 s / 2 s or ``retry-after``, ±20 %),
and an agent whose LLM call fails is re-executed up to ``max_retry_limit`` (2) times:
that is crewAI's built-in model retry, in the baseline and builtins arms alike (it cannot
be switched off). The governed arm's LLM is the adapter's copy: SDK retries off, crewAI's
wrapper bypassed, the governor retrying. crewAI's retry sleeps with ``time.sleep`` and
draws jitter from the global ``random`` module, bound as default arguments: ``world()``
swaps the two module functions for ones that sleep on the virtual clock and draw from a
seeded generator.
"""

from __future__ import annotations

import os

for _name, _value in (
    ("OTEL_SDK_DISABLED", "true"),
    ("CREWAI_DISABLE_TELEMETRY", "true"),
    ("CREWAI_DISABLE_TRACKING", "true"),
    ("CREWAI_TRACING_ENABLED", "false"),
):
    os.environ[_name] = _value

import contextlib  # noqa: E402 - the environment above must be set before crewai loads
import contextvars  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402
from unittest import mock  # noqa: E402

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms import base_llm as crew_base_llm  # noqa: E402
from crewai.llms import retry as crew_retry  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import BaseTool  # noqa: E402
from crewai.tools.tool_failure import ToolFailure, ToolFailureReason  # noqa: E402
from pydantic import BaseModel, PrivateAttr  # noqa: E402

from crewai_governor import govern_tools, install  # noqa: E402
from loop_governor.bench.determinism import unit_hash  # noqa: E402
from loop_governor.bench.harness import World  # noqa: E402
from loop_governor.bench.policy import Answer, decide, model_latency  # noqa: E402
from loop_governor.bench.prompts import SYSTEM_PROMPT, task_prompt  # noqa: E402
from loop_governor.bench.provider import COMPLETION_TOKENS, SDK_MAX_RETRIES, sdk_request  # noqa: E402
from loop_governor.bench.real_model import Meter, RealModel, crewai_llm  # noqa: E402
from loop_governor.bench.world import ServiceError, TaskSpec  # noqa: E402
from loop_governor.context.tokens import approx_tokens  # noqa: E402

# BaseLLM warns on every call of a model without a native token counter.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)

MAX_ITER = {"baseline": 60, "builtins": 40, "governed": 60}


class PolicyLLM(BaseLLM):
    """A crewAI LLM with native tool calls whose moves come from the benchmark policy."""

    max_retries: int = SDK_MAX_RETRIES
    _spec: Any = PrivateAttr(default=None)
    _world: Any = PrivateAttr(default=None)

    def bind(self, spec: TaskSpec, world: World) -> PolicyLLM:
        self._spec = spec
        self._world = world
        return self

    def supports_function_calling(self) -> bool:
        return True

    def supports_stop_words(self) -> bool:
        return False

    def call(
        self,
        messages: str | list[Any],
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any | None = None,
        from_agent: Any | None = None,
        response_model: type[BaseModel] | None = None,
    ) -> Any:
        spec: TaskSpec = self._spec
        world: World = self._world
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        tokens = sum(approx_tokens(m) for m in messages)
        latency = model_latency(world.seed, spec.task_id, turn, len(messages))
        sdk_request(world.provider, tokens, latency, max_retries=self.max_retries)
        self._track_token_usage_internal(
            {
                "prompt_tokens": tokens,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": tokens + COMPLETION_TOKENS,
            }
        )
        results = [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]
        offered = [str((t.get("function") or t).get("name", "")) for t in tools or () if isinstance(t, dict)]
        move = decide(spec, results, world.behaviour, world.seed, tools_offered=bool(tools), offered=offered)
        if isinstance(move, Answer):
            return move.text
        return [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": move.tool, "arguments": json.dumps(move.kwargs, sort_keys=True)},
            }
        ]

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(*args, **kwargs)


class ServiceTool(BaseTool):
    """A crewAI tool that sends one request to a simulated downstream service."""

    _world: Any = PrivateAttr(default=None)
    _as_failure: bool = PrivateAttr(default=False)

    def _run(self, **kwargs: Any) -> Any:
        world: World = self._world
        try:
            return world.downstream.call(self.name, kwargs)
        except ServiceError as exc:
            if not self._as_failure:
                raise
            return ToolFailure(
                message=str(exc),
                reason=ToolFailureReason.TOOL_REPORTED,
                code=str(exc.status_code),
                retryable=exc.status_code == 429 or exc.status_code >= 500,
            )


def make_tools(spec: TaskSpec, world: World, *, as_failure: bool) -> list[BaseTool]:
    tools: list[BaseTool] = []
    for name, schema in spec.tool_schemas().items():
        tool = ServiceTool(name=name, description=spec.tool_description(name), args_schema=schema)
        tool._world = world
        tool._as_failure = as_failure
        tools.append(tool)
    return tools


class CrewAIRunner:
    name = "crewai"

    @contextlib.contextmanager
    def world(self, arm: str, world: World) -> Iterator[None]:
        rng = random.Random(unit_hash(world.seed, world.name, arm, "crewai-llm-retry"))
        run_with_retry = crew_retry.run_with_rate_limit_retry
        with (
            mock.patch.object(
                crew_base_llm,
                "run_with_rate_limit_retry",
                lambda operation: run_with_retry(operation, sleep=world.clock.sleep),
            ),
            mock.patch.object(
                crew_retry,
                "get_retry_delay_seconds",
                functools.partial(crew_retry.get_retry_delay_seconds, random_value=rng.random),
            ),
        ):
            yield

    def run(self, arm: str, spec: TaskSpec, world: World, attempt: int) -> str:
        if isinstance(world.behaviour, RealModel):
            # a real model through crewAI's native OpenAI LLM, metered and capped (see real_model)
            meter = Meter(world.behaviour.settings, world, spec.task_id)
            try:
                llm = crewai_llm(world.behaviour.settings, meter)
                return self._run(arm, spec, world, llm, SYSTEM_PROMPT, task_prompt(spec))
            finally:
                meter.close()
        llm = PolicyLLM(model="loop-governor-bench-policy").bind(spec, world)
        return self._run(arm, spec, world, llm, spec.goal, spec.goal)

    def _run(self, arm: str, spec: TaskSpec, world: World, llm: Any, goal: str, description: str) -> str:
        tools = make_tools(spec, world, as_failure=arm == "builtins")
        if arm == "governed":
            assert world.governor is not None
            tools = list(govern_tools(tools, world.governor))
        agent = Agent(
            role="operator",
            goal=goal,
            backstory="Runs operational tasks with tools.",
            llm=llm,
            tools=tools,
            max_iter=MAX_ITER[arm],
            verbose=False,
        )
        task = Task(description=description, expected_output="what was delivered", agent=agent)
        crew = Crew(agents=[agent], tasks=[task], verbose=False)
        governor = world.governor

        def kickoff() -> Any:
            if arm == "governed":
                assert governor is not None
                with install(governor, task_id=spec.task_id):
                    return crew.kickoff()
            return crew.kickoff()

        # crewAI keeps its event scopes in a contextvar and leaves them there when a
        # kickoff aborts (REPEATED_CALL, a fatal error, the deadline); after a few dozen
        # aborted kickoffs in one context every kickoff raises StackDepthExceededError.
        # A copy of the context per kickoff keeps each run's leftovers to itself.
        out = contextvars.copy_context().run(kickoff)
        return str(getattr(out, "raw", out))
