"""The Governor: one object that governs every tool call and model call of an agent.

``g.call(tool, fn, *args)`` runs ``fn`` and returns its value, or raises a typed
[`AgentToolError`][loop_governor.errors.AgentToolError] whose ``.info`` is what the model should
read; ``g.call_model(endpoint, fn, *args)`` does the same for a model call. Both run
through one chain of policies ([`loop_governor.chain`][loop_governor.chain]), composed here once from the
config: resume and known-bad memory, budgets, breaker, rate limits, retries, repeated
errors, no progress, checkpoints and events -- each a small object in a module named for
it. This file only composes them and keeps the public surface.

Task scope travels in a contextvar (``with g.task("id"):``), so adapters never thread
it through framework code; it follows asyncio tasks and can be copied into threads.
"""

from __future__ import annotations

import asyncio
import random as _random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from loop_governor.call import MODEL, TOOL, Call, ModelOptions, PassThrough
from loop_governor.chain import Chain
from loop_governor.classify import ErrorInfo, Rule
from loop_governor.config import GovernorConfig, ResolvedPolicy
from loop_governor.errors import AgentToolError, CircuitOpenError, FatalError, GovernedError
from loop_governor.events import Subscriber, call_context
from loop_governor.outcome import circuit_open
from loop_governor.policies import budget, checkpointing, report
from loop_governor.policies.breaker import Breaker
from loop_governor.policies.order import DEFAULT_ATTEMPT_ORDER, DEFAULT_ORDER
from loop_governor.redaction import mask_url
from loop_governor.runtime import Runtime
from loop_governor.scope_vars import _SCOPE
from loop_governor.state.breaker import ADMIT, Admission, BreakerPolicy, BreakerState
from loop_governor.stores import Store, store_from_url
from loop_governor.task import TaskScope, call_key
from loop_governor.usage import Usage

if TYPE_CHECKING:
    from loop_governor.checkpoint import CheckpointStore, TaskCheckpoint

T = TypeVar("T")


class _NoLens:
    """``Governor.lens`` without a ``trace_path``: falsy, and closing or flushing it is a
    no-op, so shutdown code need not ask whether tracing was on."""

    path = None
    anomalies: list[dict[str, Any]] = []  # noqa: RUF012  # always empty, never mutated
    failures: dict[str, int] = {}  # noqa: RUF012

    def __bool__(self) -> bool:
        return False

    def flush(self, timeout: float = 10.0) -> bool:
        return True

    def close(self, timeout: float = 10.0) -> None:
        return None


def _config_of(config: object) -> GovernorConfig:
    """The ``config`` argument as a GovernorConfig: a mapping of settings is accepted
    (validated like keyword arguments, env and config file included); anything else
    fails here with a TypeError naming the parameter."""
    if config is None:
        return GovernorConfig()
    if isinstance(config, GovernorConfig):
        return config
    if isinstance(config, Mapping):
        return GovernorConfig(**{str(k): v for k, v in config.items()})
    raise TypeError(
        f"config must be a loop_governor.GovernorConfig, a mapping of its settings or None, not {type(config).__name__}"
    )


def _check_fast_path(chain: Chain) -> None:
    """`Governor.call` runs a tool outside a task (no rate limit, nobody listening) as one
    breaker admission and the call, past the chain. That is only right while the chain
    has nothing else to do there: no ``before`` moment, and the breaker as the only step
    before and after the first attempt. A policy that breaks this (a ``before`` that works
    outside a task, say) fails here, at construction, instead of being skipped unseen."""
    plan = chain.plan_of(TOOL, in_task=False, rated=False, heard=False)
    moments = {
        "before": (plan.before, ()),
        "before_attempt (first attempt)": (plan.before_first, (Breaker,)),
        "after_attempt_success": (plan.after_attempt_success, (Breaker,)),
    }
    for moment, (hooks, allowed) in moments.items():
        owners = tuple(type(getattr(hook, "__self__", None)) for hook in hooks)
        if owners != allowed:
            names = ", ".join(cls.__name__ for cls in owners if cls not in allowed)
            raise TypeError(
                f"{names}: a {moment} moment outside a task, which Governor.call's fast path skips; "
                "set in_task_only (or rated_only / listeners_only) on the policy, or teach the fast path"
            )


def _check_callable(name: str, value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


class Governor:
    """Governs tool and model calls. Thread- and asyncio-safe; one per process is typical.

    ``config`` is a `GovernorConfig` or a mapping of its settings
    (``Governor({"retry_max_attempts": 2})``); ``None`` reads the environment
    (``LOOP_GOVERNOR_*``) and ``LOOP_GOVERNOR_CONFIG_FILE``. ``lens`` is the trace
    (`Lens`) when ``trace_path`` is set, else a falsy object
    whose ``close()`` and ``flush()`` do nothing."""

    def __init__(
        self,
        config: GovernorConfig | Mapping[str, Any] | None = None,
        *,
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        asleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] | None = None,
        rules: list[Rule] | tuple[Rule, ...] = (),
        checkpoint_store: CheckpointStore | None = None,
    ) -> None:
        config = _config_of(config)
        for name, fn in (("clock", clock), ("sleep", sleep), ("asleep", asleep), ("random", random)):
            _check_callable(name, fn)
        if checkpoint_store is not None and not callable(getattr(checkpoint_store, "load", None)):
            raise TypeError(f"checkpoint_store must be a CheckpointStore, not {type(checkpoint_store).__name__}")
        if isinstance(rules, Rule) or not isinstance(rules, list | tuple):
            raise TypeError(f"rules must be a list of loop_governor.Rule, not {type(rules).__name__}")
        if checkpoint_store is None and config.checkpoint_url:
            from loop_governor.checkpoint import checkpoint_store_from_url  # optional feature

            checkpoint_store = checkpoint_store_from_url(config.checkpoint_url)
        # Wall clock by default: breaker timestamps are shared with other processes
        # through the SQLite/Redis stores. Tests and the benchmark inject a virtual one.
        self.rt = rt = Runtime(
            config,
            store if store is not None else store_from_url(config.store_url),
            clock or time.time,
            sleep or time.sleep,
            asleep or asyncio.sleep,
            random or _random.Random().random,
            tuple(rules),
            checkpoint_store,
        )
        self._chain = self._compose()
        if hasattr(rt.store, "on_event"):
            # Redis outages and recoveries (fallback to local state) go to the trace.
            rt.store.on_event = self._store_event
        self.lens: Any = _NoLens()
        if config.trace_path:
            from loop_governor import trace

            self.lens = trace.install(self, path=config.trace_path)

    def _compose(self) -> Chain:
        """The chain of policies, in [`DEFAULT_ORDER`][loop_governor.policies.order.DEFAULT_ORDER]
        (policies with nothing to do left out), checked against what `call`'s fast path skips."""
        rt = self.rt
        chain = Chain(
            rt,
            [cls(rt) for cls in DEFAULT_ORDER if cls.applies(rt)],  # type: ignore[call-arg]
            [cls(rt) for cls in DEFAULT_ATTEMPT_ORDER if cls.applies(rt)],  # type: ignore[call-arg]
        )
        _check_fast_path(chain)
        return chain

    # -- the governed calls --------------------------------------------------------------

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` governed; returns its value or raises AgentToolError."""
        scope = _SCOPE.get()
        rt = self.rt
        policy = rt.tools.get(tool) or rt.policy(TOOL, tool)
        if scope is None and policy.rate_per_s is None and not rt.events.emitting:
            # The hot path: a healthy tool outside a task is one breaker read and the call.
            admission = rt.store.breaker_admit(tool, rt.clock, policy.breaker)[0]
            if admission is ADMIT:
                first: Exception | PassThrough
                try:
                    value = fn(*args, **kwargs)
                except Exception as exc:
                    first = exc
                except PassThrough as passed:
                    first = passed
                else:
                    # A success resets failures other calls completed meanwhile (breaker.py);
                    # ok-records never read their time, and a store skips the no-op write.
                    rt.store.breaker_record(tool, True, False, 0.0, policy.breaker)
                    return value
                if isinstance(first, PassThrough):
                    raise first.exc  # not the call's failure: as it came (outside the except block)
                call = Call(TOOL, tool, policy, None, fn, args, kwargs)
                call.attempt, call.admission = 1, ADMIT
                return self._chain.run(call, first)  # type: ignore[no-any-return]
            call = Call(TOOL, tool, policy, None, fn, args, kwargs)
            call.admission = admission  # a probe or a refusal: the breaker policy takes it from here
            return self._chain.run(call)  # type: ignore[no-any-return]
        return self._chain.run(Call(TOOL, tool, policy, scope, fn, args, kwargs))  # type: ignore[no-any-return]

    async def acall(
        self, tool: str, fn: Callable[..., Awaitable[T]] | Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> T:
        """Async twin of [`call`][loop_governor.governor.Governor.call] (same decisions; tenacity's AsyncRetrying
        sleeps)."""
        call = Call(TOOL, tool, self.rt.policy(TOOL, tool), _SCOPE.get(), fn, args, kwargs)
        return await self._chain.arun(call)  # type: ignore[no-any-return]

    def call_model(
        self,
        model: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        usage: Callable[[Any], Usage | None] | None = None,
        describe: Callable[[Any], dict[str, Any]] | None = None,
        estimated_tokens: int | Callable[[], int] | None = None,
        compact: Callable[..., Any] | None = None,
        fallbacks: Sequence[tuple[str, Callable[..., Any]]] = (),
    ) -> T:
        """Run the model call ``fn(*args)`` governed (pass the model's own keyword arguments
        with ``functools.partial``): the same policies as a tool call, keyed on the
        endpoint ``model`` (``"provider:model"`` or a base URL).

        ``usage(result)`` reads the call's token usage (default: LangChain, OpenAI and
        Anthropic shapes); without usage the budgets use ``estimated_tokens`` and a
        ``usage_estimated`` event says so. ``describe(result)`` adds fields to the
        ``model_call`` event (``result`` is None on failure). ``estimated_tokens`` (or a
        function computing them, asked only when needed) feeds token rate limits and
        stands in for missing usage. ``compact(*args)`` returns
        shorter arguments for one retry after ``context_length_exceeded``.
        ``fallbacks``: ``(endpoint, fn)`` pairs tried in order while this model's breaker
        is open or its transient retries are spent. Raises ``FatalError`` (with the
        task's partial results) for credentials, billing and quota once no fallback is
        left. A fallback naming ``model`` itself (or another fallback) is refused
        (``ValueError``): it would send the failing endpoint the same requests again.
        """
        model, fallbacks = _endpoints(model, fallbacks)
        options = ModelOptions(usage, describe, estimated_tokens, compact, fallbacks)
        call = Call(MODEL, model, self.rt.policy(MODEL, model), _SCOPE.get(), fn, args, {}, options)
        return self._chain.run(call)  # type: ignore[no-any-return]

    async def acall_model(
        self,
        model: str,
        fn: Callable[..., Awaitable[T]] | Callable[..., T],
        /,
        *args: Any,
        usage: Callable[[Any], Usage | None] | None = None,
        describe: Callable[[Any], dict[str, Any]] | None = None,
        estimated_tokens: int | Callable[[], int] | None = None,
        compact: Callable[..., Any] | None = None,
        fallbacks: Sequence[tuple[str, Callable[..., Any]]] = (),
    ) -> T:
        """Async twin of [`call_model`][loop_governor.governor.Governor.call_model] (``compact`` may be async)."""
        model, fallbacks = _endpoints(model, fallbacks)
        options = ModelOptions(usage, describe, estimated_tokens, compact, fallbacks)
        call = Call(MODEL, model, self.rt.policy(MODEL, model), _SCOPE.get(), fn, args, {}, options)
        return await self._chain.arun(call)  # type: ignore[no-any-return]

    # -- task scope ----------------------------------------------------------------------

    def task(self, task_id: str | None = None, *, name: str | None = None, resume: bool | None = None) -> TaskScope:
        """Open a task scope: ``with g.task("id"):`` or ``async with g.task("id"):``.

        With a checkpoint store, a task that did not finish resumes from its checkpoint;
        one that finished starts over (``resume=True``: resume it anyway; ``False``:
        always start over). ``name`` is what log lines and the report call the task
        (default: its id; a generated id is no name, so give one). See
        [`TaskScope`][loop_governor.task.TaskScope]."""
        if resume is not None and not isinstance(resume, bool):
            raise TypeError(f"resume must be True, False or None, not {type(resume).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string or None, not {type(name).__name__}")
        return TaskScope(self, task_id if task_id is not None else uuid.uuid4().hex, resume, name)

    @staticmethod
    def current_task() -> TaskScope | None:
        return _SCOPE.get()

    call_context = staticmethod(call_context)

    @staticmethod
    def attach(scope: TaskScope) -> Any:
        """Make an already-open task scope current again, without starting or ending it.

        Frameworks run each step in a context of their own (LangGraph nodes, crewAI
        worker threads); an adapter keeps one open scope per run and attaches it to
        each step, so budgets and known-bad memory span the whole run.
        """
        return scope.attached()

    def count_step(self, kind: str = "model") -> None:
        """Count a model call the governor does not run itself (a callback saw it) against
        the task's budgets; raises BudgetExhaustedError (checkpoint saved) when spent."""
        scope = _SCOPE.get()
        if scope is None:
            return
        try:
            budget.charge(self.rt, scope, MODEL if kind == "model" else TOOL, None)
        except FatalError as stop:
            checkpointing.stop_run(self.rt, scope, stop)
            raise

    def record_usage(
        self,
        model: str | None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_creation_tokens: int = 0,
    ) -> None:
        """Add one model call's usage to the task (for ``max_tokens`` / ``max_cost``)."""
        scope = _SCOPE.get()
        if scope is not None:
            usage = Usage(int(input_tokens or 0), int(output_tokens or 0), cache_read_tokens, cache_creation_tokens)
            budget.record_usage(self.rt, scope, model, usage)

    # -- breakers (adapters' pre-call hooks) -----------------------------------------------

    def breaker_state(self, tool: str) -> BreakerState:
        """The tool's breaker state as the store has it."""
        rec = self.rt.store.breaker_get(tool)
        if rec.state is BreakerState.OPEN and self.clock() >= rec.opened_at + self.policy(tool).breaker.cooldown_s:
            return BreakerState.HALF_OPEN  # the next call will be admitted as the probe
        return rec.state

    def check_breaker(self, tool: str) -> None:
        """Raise CircuitOpenError when ``tool`` would be refused now, without consuming a probe
        (a tool that may wait, ``ToolPolicy(max_wait_s=...)``, is left to wait in its call)."""
        rec = self.rt.store.breaker_get(tool)
        if rec.state is BreakerState.CLOSED:
            return
        policy = self.policy(tool)
        if policy.max_wait > 0:
            return
        ready_at = (rec.opened_at if rec.state is BreakerState.OPEN else rec.probe_at) + policy.breaker.cooldown_s
        now = self.clock()
        if now < ready_at:
            admission = Admission(False, state=rec.state, retry_in=ready_at - now, failures=rec.failures)
            refusal = circuit_open(TOOL, tool, admission)
            refusal.info = refusal.info.rendered(self.config.error_format)
            raise refusal

    # -- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, scope: TaskScope) -> None:
        """Save the task's checkpoint atomically, merging with a concurrent writer."""
        checkpointing.update_checkpoint(self.rt, scope)

    def update_checkpoint(self, scope: TaskScope, record: Callable[[TaskCheckpoint], object] | None = None) -> None:
        """Apply ``record`` to the task's checkpoint, then save it (no-op without one)."""
        checkpointing.update_checkpoint(self.rt, scope, record)

    # -- configuration, events and services ------------------------------------------------

    def policy(self, tool: str) -> ResolvedPolicy:
        return self.rt.policy(TOOL, tool)

    def model_policy(self, endpoint: str) -> ResolvedPolicy:
        return self.rt.policy(MODEL, endpoint)

    def subscribe(self, fn: Subscriber, *, raw: bool = False) -> Callable[[], None]:
        """Receive every event dict, redacted like every other sink; returns a function
        that unsubscribes. ``raw=True``: the event as built, secrets included -- only for
        a sink that redacts before writing anything out (the Agent Lens does)."""
        return self.rt.events.subscribe(fn, raw=raw)

    def emit(self, event: str, **fields: Any) -> None:
        """Send an event to subscribers. A failing subscriber never breaks the agent."""
        self.rt.events.emit(event, **fields)

    def emit_tool_error(
        self, tool: str, info: GovernedError | ErrorInfo, *, attempts: int = 0, duration_s: float = 0.0, **fields: Any
    ) -> None:
        """The ``tool_call`` event of a call that ended in ``info`` (see report.tool_error)."""
        report.tool_error(self.rt.events, tool, info, attempts=attempts, duration_s=duration_s, **fields)

    def _store_event(self, event: dict[str, Any]) -> None:
        fields = dict(event)
        self.emit(str(fields.pop("event", "store_event")), **fields)

    @property
    def emitting(self) -> bool:
        """Whether anyone listens: adapters skip building event payloads otherwise."""
        return self.rt.events.emitting

    @property
    def sink_failures(self) -> int:
        return self.rt.events.sink_failures

    @property
    def checkpoint_failures(self) -> int:
        return self.rt.checkpoint_failures

    @property
    def config(self) -> GovernorConfig:
        return self.rt.config

    @property
    def store(self) -> Store:
        return self.rt.store

    @property
    def checkpoints(self) -> CheckpointStore | None:
        return self.rt.checkpoints

    @checkpoints.setter
    def checkpoints(self, value: CheckpointStore | None) -> None:
        self.rt.checkpoints = value
        self._chain = self._compose()

    @property
    def clock(self) -> Callable[[], float]:
        return self.rt.clock

    @property
    def sleep(self) -> Callable[[float], None]:
        return self.rt.sleep

    @sleep.setter
    def sleep(self, value: Callable[[float], None]) -> None:
        self.rt.sleep = value

    @property
    def asleep(self) -> Callable[[float], Awaitable[None]]:
        return self.rt.asleep

    @property
    def random(self) -> Callable[[], float]:
        return self.rt.random

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.rt.rules


Fallbacks = Sequence[tuple[str, Callable[..., Any]]]


def _endpoint_name(endpoint: str) -> str:
    """The name a model endpoint is known by everywhere (breaker and rate-limit keys, the
    ``tool`` field of events, traces, reports, spans, ``loop-governor breakers``): a base
    URL's password masked (``https://user:pw@host`` -> ``https://user:[REDACTED]@host``)."""
    return mask_url(endpoint) if "://" in endpoint else endpoint


def _endpoints(model: str, fallbacks: Fallbacks) -> tuple[str, Fallbacks]:
    """The model's and its fallbacks' endpoint names; a fallback naming the model itself
    or an earlier fallback is refused: it would send the failing endpoint the same
    requests again, under the same breaker."""
    model = _endpoint_name(model)
    if not fallbacks:
        return model, fallbacks
    named = [(_endpoint_name(endpoint), fn) for endpoint, fn in fallbacks]
    seen = {model}
    for endpoint, _ in named:
        if endpoint in seen:
            which = "the model's own endpoint" if endpoint == model else "named twice"
            raise ValueError(f"fallbacks: {endpoint!r} is {which}; a fallback must be another endpoint")
        seen.add(endpoint)
    return model, named


_default: Governor | None = None
_default_lock = threading.Lock()


def default_governor() -> Governor:
    """The process-wide governor adapters use when none is given (config from env/TOML)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Governor()
    return _default


def set_default_governor(governor: Governor | None) -> None:
    global _default
    with _default_lock:
        _default = governor


__all__ = [
    "AgentToolError",
    "BreakerPolicy",
    "CircuitOpenError",
    "Governor",
    "TaskScope",
    "call_key",
    "default_governor",
    "set_default_governor",
]
