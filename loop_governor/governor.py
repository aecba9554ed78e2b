"""The Governor: one object that governs every tool call of an agent.

``g.call(tool, fn, *args)`` runs ``fn`` and returns its value, or raises a typed
:class:`~loop_governor.errors.AgentToolError` whose ``.info`` is what the model should
read. In between it applies, in order: the task's step budget, the known-bad memory,
the tool's circuit breaker, the call, classification of any failure, retries on
transient ones (tenacity, backoff with jitter, Retry-After, the task's retry budget),
the repeated-error guard, and events for the trace. The model sees one final outcome.

Task scope travels in a contextvar (``with g.task("id"):``), so adapters never thread
it through framework code; it follows asyncio tasks and can be copied into threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random as _random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import AsyncRetrying, Retrying

from loop_governor.breaker import ADMIT, Admission, BreakerPolicy, BreakerState, Transition
from loop_governor.classify import ErrorInfo, Rule, classify
from loop_governor.config import GovernorConfig, ResolvedPolicy
from loop_governor.errors import (
    AgentToolError,
    BudgetExhaustedError,
    CircuitOpenError,
    ErrorType,
    FatalError,
    GovernedError,
    LoopDetectedError,
    NoProgressError,
    PermanentError,
    TransientError,
    error_from_info,
)
from loop_governor.progress import NOTE, OK, annotate, result_text
from loop_governor.redaction import redact
from loop_governor.retry import CallAttempts, RetryRefused
from loop_governor.scope import _CALL_META, _SCOPE, TaskScope, call_key
from loop_governor.stores import Store, store_from_url

if TYPE_CHECKING:
    from loop_governor.checkpoint import CheckpointStore, TaskCheckpoint

T = TypeVar("T")
_CHECKPOINT_SAVE_ATTEMPTS = 3
_MISSING: Any = object()

Subscriber = Callable[[dict[str, Any]], None]


class Governor:
    """Governs tool calls. Thread- and asyncio-safe; one per process is typical."""

    def __init__(
        self,
        config: GovernorConfig | None = None,
        *,
        store: Store | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], None] | None = None,
        asleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] | None = None,
        rules: list[Rule] | tuple[Rule, ...] = (),
        checkpoint_store: CheckpointStore | None = None,
    ) -> None:
        self.config = config if config is not None else GovernorConfig()
        self.store: Store = store if store is not None else store_from_url(self.config.store_url)
        # Wall clock by default: breaker timestamps are shared with other processes
        # through the SQLite/Redis stores. Tests and the benchmark inject a virtual one.
        self.clock: Callable[[], float] = clock or time.time
        self.sleep: Callable[[float], None] = sleep or time.sleep
        self.asleep: Callable[[float], Awaitable[None]] = asleep or asyncio.sleep
        self.random: Callable[[], float] = random or _random.Random().random
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._policies: dict[str, ResolvedPolicy] = {}
        self._policy_lock = threading.Lock()
        cfg = self.config
        self._budgeted = any(
            limit is not None for limit in (cfg.max_steps, cfg.max_tokens, cfg.max_cost, cfg.max_wall_s)
        )
        self._subscribers: list[Subscriber] = []
        self._emitting = False
        self.sink_failures = 0
        self.checkpoint_failures = 0
        if checkpoint_store is None and self.config.checkpoint_url:
            from loop_governor.checkpoint import checkpoint_store_from_url  # optional feature

            checkpoint_store = checkpoint_store_from_url(self.config.checkpoint_url)
        self.checkpoints: CheckpointStore | None = checkpoint_store
        if hasattr(self.store, "on_event"):
            # Redis outages and recoveries (fallback to local state) go to the trace.
            self.store.on_event = self._store_event
        self.lens: Any = None
        if self.config.trace_path:
            from loop_governor import trace

            self.lens = trace.install(self, path=self.config.trace_path)

    def _store_event(self, event: dict[str, Any]) -> None:
        fields = dict(event)
        self.emit(str(fields.pop("event", "store_event")), **fields)

    # -- configuration -------------------------------------------------------------------

    def policy(self, tool: str) -> ResolvedPolicy:
        pol = self._policies.get(tool)
        if pol is None:
            with self._policy_lock:
                pol = self._policies.setdefault(tool, self.config.policy_for(tool))
        return pol

    # -- events --------------------------------------------------------------------------

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Receive every event dict; returns a function that unsubscribes."""
        self._subscribers = [*self._subscribers, fn]
        self._emitting = True

        def unsubscribe() -> None:
            self._subscribers = [s for s in self._subscribers if s is not fn]
            self._emitting = bool(self._subscribers)

        return unsubscribe

    @property
    def emitting(self) -> bool:
        """Whether anyone listens: adapters skip building event payloads otherwise."""
        return self._emitting

    def emit(self, event: str, **fields: Any) -> None:
        """Send an event to subscribers. A failing subscriber never breaks the agent."""
        if not self._emitting:
            return
        scope = _SCOPE.get()
        record = {"event": event, "ts": self.clock(), "task_id": scope.task_id if scope is not None else None}
        meta = _CALL_META.get()
        if meta:
            record.update(meta)
        record.update(fields)
        for fn in self._subscribers:
            try:
                fn(record)
            except Exception:
                self.sink_failures += 1

    def emit_tool_error(
        self, tool: str, info: GovernedError | ErrorInfo, *, attempts: int = 0, duration_s: float = 0.0, **fields: Any
    ) -> None:
        """The ``tool_call`` event of a call that ended in ``info``: one shape for every
        way a call can fail (failed, replayed known-bad, refused by an open breaker)."""
        self.emit(
            "tool_call",
            tool=tool,
            status="error",
            error_type=info.error_type.value,
            signature=info.signature,
            attempts=attempts,
            duration_s=duration_s,
            **fields,
        )

    # -- task scope ----------------------------------------------------------------------

    def task(self, task_id: str | None = None) -> TaskScope:
        """Open a task scope: ``with g.task("id"):`` or ``async with g.task("id"):``."""
        return TaskScope(self, task_id if task_id is not None else uuid.uuid4().hex)

    @staticmethod
    def current_task() -> TaskScope | None:
        return _SCOPE.get()

    @staticmethod
    @contextlib.contextmanager
    def call_context(**fields: Any) -> Iterator[None]:
        """Attach framework facts (``tool_call_id=...``) to every event of the calls made
        inside: an extra keyword on :meth:`call` would collide with the tool's arguments."""
        token = _CALL_META.set(fields)
        try:
            yield
        finally:
            _CALL_META.reset(token)

    @staticmethod
    @contextlib.contextmanager
    def attach(scope: TaskScope) -> Iterator[TaskScope]:
        """Make an already-open task scope current again, without starting or ending it.

        Frameworks run each step in a context of their own (LangGraph nodes, crewAI
        worker threads); an adapter keeps one open scope per run and attaches it to
        each step, so budgets and known-bad memory span the whole run.
        """
        token = _SCOPE.set(scope)
        try:
            yield scope
        finally:
            _SCOPE.reset(token)

    def count_step(self, kind: str = "model") -> None:
        """Count a model (or other) step against the task's ``max_steps``."""
        scope = _SCOPE.get()
        if scope is None:
            return
        self._take_step(scope, None)
        if kind == "model":
            scope.model_calls += 1

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
        if scope is None:
            return
        scope.tokens += int(input_tokens or 0) + int(output_tokens or 0)
        prices = self.config.prices
        price = prices.get(model or "") or prices.get("default")
        if price is not None:
            scope.cost += price.cost(input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens)
        elif prices:
            self.emit("unpriced_model", model=model)

    def _take_step(self, scope: TaskScope, tool: str | None) -> None:
        """Count a step; raise BudgetExhaustedError (with the partial results) when a task
        budget is spent. Checked before the step runs, so the cap is exact."""
        cfg = self.config
        if not self._budgeted:
            scope.steps += 1
            return
        spent: tuple[str, float, float] | None = None
        if cfg.max_steps is not None and scope.steps >= cfg.max_steps:
            spent = ("max_steps", cfg.max_steps, scope.steps)
        elif cfg.max_tokens is not None and scope.tokens >= cfg.max_tokens:
            spent = ("max_tokens", cfg.max_tokens, scope.tokens)
        elif cfg.max_cost is not None and scope.cost >= cfg.max_cost:
            spent = ("max_cost", cfg.max_cost, scope.cost)
        elif cfg.max_wall_s is not None and self.clock() - scope.started_at >= cfg.max_wall_s:
            spent = ("max_wall_s", cfg.max_wall_s, self.clock() - scope.started_at)
        if spent is None:
            scope.steps += 1
            return
        budget, limit, used = spent
        info = GovernedError(
            error_type=ErrorType.FATAL,
            tool=tool,
            code=budget,
            message=f"task {scope.task_id} spent its budget {budget}={limit:g} (used {used:g})",
            signature=f"{tool or '-'}:BudgetExhaustedError:{budget}",
            advice="the task budget is spent: stop and report what was done",
        )
        self.emit("budget_exhausted", budget=budget, limit=limit, used=used, tool=tool)
        self.save_checkpoint(scope)
        raise BudgetExhaustedError(info, partial_results=scope.results)

    # -- breaker helpers (used by CallAttempts too) --------------------------------------

    def admit(self, tool: str, policy: ResolvedPolicy) -> Admission:
        admission, transition = self.store.breaker_admit(tool, self.clock, policy.breaker)
        if transition is not None:
            self._emit_transition(tool, transition)
        return admission

    def record_breaker(self, tool: str, ok: bool, probe: bool, policy: ResolvedPolicy) -> None:
        transition = self.store.breaker_record(tool, ok, probe, self.clock(), policy.breaker)
        if transition is not None:
            self._emit_transition(tool, transition)

    def _emit_transition(self, tool: str, transition: Transition) -> None:
        self.emit("breaker", tool=tool, from_state=transition[0].value, to_state=transition[1].value)

    def breaker_state(self, tool: str) -> BreakerState:
        """The tool's breaker state as the store has it (for adapters' pre-call hooks)."""
        rec = self.store.breaker_get(tool)
        if rec.state is BreakerState.OPEN and self.clock() >= rec.opened_at + self.policy(tool).breaker.cooldown_s:
            return BreakerState.HALF_OPEN  # the next call will be admitted as the probe
        return rec.state

    def check_breaker(self, tool: str) -> None:
        """Raise CircuitOpenError when ``tool`` would be refused now, without consuming a probe."""
        rec = self.store.breaker_get(tool)
        if rec.state is BreakerState.CLOSED:
            return
        cooldown = self.policy(tool).breaker.cooldown_s
        ready_at = (rec.opened_at if rec.state is BreakerState.OPEN else rec.probe_at) + cooldown
        now = self.clock()
        if now < ready_at:
            raise self._circuit_open(
                tool, Admission(False, state=rec.state, retry_in=ready_at - now, failures=rec.failures)
            )

    # -- classification ------------------------------------------------------------------

    def classify_failure(self, exc: BaseException, tool: str, policy: ResolvedPolicy) -> ErrorInfo:
        if isinstance(exc, AgentToolError):
            i = exc.info
            return ErrorInfo(
                i.error_type,
                i.retryable,
                i.status,
                i.code,
                i.signature,
                i.retry_after,
                i.message,
                type(exc).__name__,
                "governed",
            )
        return classify(exc, tool, rules=self.rules, unknown=policy.unknown_error)

    # -- the governed call ---------------------------------------------------------------

    def _replay_failure(self, scope: TaskScope, tool: str, key: str, info: GovernedError) -> AgentToolError:
        """A known-bad call again: the same bytes as the first time (prompt cache), unless
        the model keeps insisting; then the repeated-error guard tells it to stop."""
        self.emit_tool_error(tool, info, call_key=key, known_bad=True)
        return self._guard_repeats(scope, info) or error_from_info(info)

    def _prepare(
        self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[TaskScope | None, ResolvedPolicy, str | None, Any]:
        """Task-level checks before a call (shared by call and acall).

        Returns the scope, the tool's policy, the call key when one was needed, and the
        result an earlier run of the task stored for this call (resume) or ``_MISSING``.
        """
        scope = _SCOPE.get()
        policy = self._policies.get(tool) or self.policy(tool)
        if scope is None:
            return None, policy, None, _MISSING
        key: str | None = None
        cp = scope.checkpoint
        if cp is not None:
            key = call_key(tool, args, kwargs)
            found, value = cp.get_result(key)
            if found:
                self.emit("tool_call", tool=tool, status="ok", attempts=0, duration_s=0.0, call_key=key, resumed=True)
                return scope, policy, key, value
            failure = cp.get_failure(key)
            if failure is not None:
                raise self._replay_failure(scope, tool, key, failure)
        if scope.known_bad:
            key = key or call_key(tool, args, kwargs)
            stored = self.store.known_bad_get(scope.task_id, key)
            if stored is not None:
                raise self._replay_failure(scope, tool, key, GovernedError.model_validate_json(stored))
        self._take_step(scope, tool)
        scope.tool_calls += 1
        return scope, policy, key, _MISSING

    def _admit_call(self, tool: str, policy: ResolvedPolicy, scope: TaskScope | None) -> tuple[Admission, float]:
        """Rate limit and breaker: (admission, seconds to wait before asking again)."""
        if policy.rate_per_s is None:
            admission, transition = self.store.breaker_admit(tool, self.clock, policy.breaker)
            wait = 0.0
        else:
            admission, transition, wait = self._admit_rated(tool, policy)
        if transition is not None:
            self._emit_transition(tool, transition)
        if wait > policy.max_delay:
            info = GovernedError(
                error_type=ErrorType.TRANSIENT,
                tool=tool,
                code="rate_limited",
                message=f"{tool} is over its shared rate limit of {policy.rate_per_s}/s",
                signature=f"{tool}:RateLimited:rate limit",
                attempts=0,
                retry_after=float(max(1, round(wait))),
                advice=f"{tool} is rate limited for ~{max(1, round(wait))}s; use another tool or continue without it",
            )
            raise self._guard_repeats(scope, info) or TransientError(info)
        if wait > 0:
            self.emit("rate_limited", tool=tool, delay_s=wait)
            return admission, wait
        if not admission.allowed:
            err = self._circuit_open(tool, admission)
            self.emit_tool_error(tool, err.info, circuit_open=True)
            raise self._guard_repeats(scope, err.info) or err
        return admission, 0.0

    def _admit_rated(self, tool: str, policy: ResolvedPolicy) -> tuple[Admission, Transition | None, float]:
        rate = policy.rate_per_s
        assert rate is not None
        combined = getattr(self.store, "admit_rate", None)
        if combined is not None:  # Redis: breaker and bucket in one round trip
            result: tuple[Admission, Transition | None, float] = combined(
                tool, self.clock, policy.breaker, rate, policy.burst
            )
            return result
        wait = self.store.rate_acquire(tool, rate, policy.burst, self.clock())
        if wait > 0:
            return ADMIT, None, wait
        admission, transition = self.store.breaker_admit(tool, self.clock, policy.breaker)
        return admission, transition, 0.0

    def _succeeded(
        self,
        tool: str,
        policy: ResolvedPolicy,
        admission: Admission,
        started: float,
        attempts: int,
        key: str | None,
        scope: TaskScope | None,
        result: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Record a success; returns the result the model should see (maybe annotated)."""
        if admission.dirty:
            self.record_breaker(tool, True, admission.probe, policy)
        if self._emitting:
            self.emit(
                "tool_call",
                tool=tool,
                status="ok",
                error_type=None,
                signature=None,
                attempts=attempts,
                duration_s=self.clock() - started,
                call_key=key,
            )
        if scope is None:
            return result
        if scope.checkpoint is not None and key is not None:
            self._checkpoint_success(scope, key, result)
        verdict = scope.progress.observe(tool, result_text(result), lambda: key or call_key(tool, args, kwargs))
        if verdict is OK:
            return result
        self.emit("no_progress", tool=tool, count=verdict.count, action=verdict.action)
        if verdict.action == "warn":
            return annotate(result, NOTE.format(tool=tool, count=verdict.count))
        self.save_checkpoint(scope)
        info = GovernedError(
            error_type=ErrorType.FATAL,
            tool=tool,
            code="no_progress",
            message=f"{tool} returned the same result {verdict.count} times in a row after the model was told",
            signature=f"{tool}:NoProgressError:no progress",
            advice="the loop stopped making progress: stop and report what was done",
            count=verdict.count,
        )
        raise NoProgressError(info, partial_results=scope.results)

    def call(self, tool: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` governed; returns its value or raises AgentToolError."""
        scope, policy, key, stored = self._prepare(tool, args, kwargs)
        if stored is not _MISSING:
            return stored  # type: ignore[no-any-return]
        admission, wait = self._admit_call(tool, policy, scope)
        while wait:
            self.sleep(wait)
            admission, wait = self._admit_call(tool, policy, scope)
        started = self.clock() if self._emitting else 0.0
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            attempts = CallAttempts(self, tool, policy, scope, admission)
            try:
                result = Retrying(sleep=self.sleep, **attempts.tenacity_kwargs())(
                    CallAttempts.replay(exc, fn, args, kwargs)
                )
            except RetryRefused:
                raise self._failed(attempts, args, kwargs, key, started) from attempts.last_exc
            except Exception as final:
                raise self._failed(attempts, args, kwargs, key, started) from final
            admission, n = attempts.admission, attempts.attempts + 1
        else:
            if not (admission.dirty or self._emitting or scope is not None):
                return result  # the hot path: a healthy tool outside a task
            n = 1
        return self._succeeded(tool, policy, admission, started, n, key, scope, result, args, kwargs)  # type: ignore[no-any-return]

    async def acall(
        self, tool: str, fn: Callable[..., Awaitable[T]] | Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> T:
        """Async twin of :meth:`call` (same decisions; tenacity's AsyncRetrying sleeps)."""
        scope, policy, key, stored = self._prepare(tool, args, kwargs)
        if stored is not _MISSING:
            return stored  # type: ignore[no-any-return]
        admission, wait = self._admit_call(tool, policy, scope)
        while wait:
            await self.asleep(wait)
            admission, wait = self._admit_call(tool, policy, scope)
        started = self.clock() if self._emitting else 0.0

        async def run(*a: Any, **kw: Any) -> Any:
            value = fn(*a, **kw)
            return await value if inspect.isawaitable(value) else value

        try:
            result = await run(*args, **kwargs)
        except Exception as exc:
            attempts = CallAttempts(self, tool, policy, scope, admission)
            try:
                retrying = AsyncRetrying(sleep=self.asleep, **attempts.tenacity_kwargs())
                result = await retrying(CallAttempts.areplay(exc, run, args, kwargs))
            except RetryRefused:
                raise self._failed(attempts, args, kwargs, key, started) from attempts.last_exc
            except Exception as final:
                raise self._failed(attempts, args, kwargs, key, started) from final
            admission, n = attempts.admission, attempts.attempts + 1
        else:
            n = 1
        return self._succeeded(tool, policy, admission, started, n, key, scope, result, args, kwargs)  # type: ignore[no-any-return]

    # -- failure outcome -----------------------------------------------------------------

    def _circuit_open(self, tool: str, admission: Admission) -> CircuitOpenError:
        wait = max(1, round(admission.retry_in))
        info = GovernedError(
            error_type=ErrorType.TRANSIENT,
            retryable=False,
            tool=tool,
            code="circuit_open",
            message=f"{tool} failed repeatedly; its circuit breaker is {admission.state.value}",
            signature=f"{tool}:CircuitOpenError:circuit open",
            attempts=0,
            retry_after=float(wait),
            advice=f"{tool} is unavailable for ~{wait}s; use another tool or continue without it",
        )
        return CircuitOpenError(info)

    def _advice(self, tool: str, info: ErrorInfo, reason: str | None, attempts: int) -> str:
        if info.error_type is ErrorType.FATAL:
            return "the run cannot continue: credentials, billing or quota must be fixed by an operator"
        if info.error_type is ErrorType.PERMANENT:
            return f"do not repeat this call to {tool} with the same arguments; change them or use another tool"
        if reason == "budget":
            return (
                f"the retry budget of this task is spent; do not call {tool} again now; continue without it or report"
            )
        if reason == "retry_after" and info.retry_after is not None:
            return f"{tool} asked for a pause of {info.retry_after:.0f}s; use another tool or continue without it"
        if reason == "breaker":
            return f"{tool} is unavailable (circuit open); use another tool or continue without it"
        return f"{tool} failed {attempts} times in a row; use another tool or continue without it"

    def _failed(
        self,
        attempts: CallAttempts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str | None,
        started: float,
    ) -> AgentToolError:
        """Turn the last failure into the one outcome the model sees."""
        tool, scope = attempts.tool, attempts.scope
        info = attempts.last_info
        assert info is not None  # the retry predicate ran for the first failure
        n = max(attempts.attempts, 1)
        governed = GovernedError(
            error_type=info.error_type,
            retryable=False,
            tool=tool,
            status=info.status,
            code=info.code,
            message=info.message,
            signature=info.signature,
            attempts=n,
            retry_after=info.retry_after if info.error_type is ErrorType.TRANSIENT else None,
            advice=self._advice(tool, info, attempts.stop_reason, n),
        )
        self.emit_tool_error(
            tool,
            info,
            attempts=n,
            duration_s=(self.clock() - started) if started else 0.0,
            call_key=key,
            stop_reason=attempts.stop_reason,
        )
        if info.error_type is ErrorType.FATAL:
            if scope is not None and scope.checkpoint is not None:
                self.save_checkpoint(scope)  # the run stops here: keep what it did
            return FatalError(governed)
        if info.error_type is ErrorType.PERMANENT and scope is not None:
            key = key or call_key(tool, args, kwargs)
            self.store.known_bad_put(scope.task_id, key, governed.model_dump_json())
            scope.known_bad += 1
            self.update_checkpoint(scope, lambda cp: cp.record_failure(key, governed))
        loop = self._guard_repeats(scope, governed)
        if loop is not None:
            return loop
        return PermanentError(governed) if info.error_type is ErrorType.PERMANENT else TransientError(governed)

    # -- checkpoints -----------------------------------------------------------------------

    def _checkpoint_success(self, scope: TaskScope, key: str, result: Any) -> None:
        from loop_governor.checkpoint import CheckpointSerializationError

        try:
            self.update_checkpoint(scope, lambda cp: cp.record_success(key, result))
        except CheckpointSerializationError as exc:
            # The call succeeded; failing the agent because its result isn't JSON would
            # be worse than not skipping it on resume. Say so in the trace instead.
            self.emit("checkpoint_skipped", call_key=key, reason=str(exc))

    def save_checkpoint(self, scope: TaskScope) -> None:
        """Save the task's checkpoint atomically, merging with a concurrent writer."""
        self.update_checkpoint(scope)

    def update_checkpoint(self, scope: TaskScope, record: Callable[[TaskCheckpoint], object] | None = None) -> None:
        """Apply ``record`` to the task's checkpoint, then save it (no-op without one).

        Parallel tool calls of one task record into one checkpoint, so recording and
        saving run under the task's lock: no record lands in a checkpoint object that a
        concurrent save has just replaced by the merged one. The resulting event is
        emitted after the lock is released: a subscriber may wait on another thread (an
        event loop) that is itself about to record into this task.

        Errors raised by ``record`` propagate (nothing is saved). Saving never raises
        into the agent: the call it records already happened, and failing it because
        the checkpoint store is down (Redis gone, disk full) would lose the result too.
        Failures become ``checkpoint_failed`` events.
        """
        with scope.checkpoint_lock:
            cp = scope.checkpoint
            if cp is None:
                return
            if record is not None:
                record(cp)
            event = self._save_locked(scope, cp)
        if event is not None:
            self.emit(event[0], **event[1])

    def _save_locked(self, scope: TaskScope, cp: TaskCheckpoint) -> tuple[str, dict[str, Any]] | None:
        """The save of :meth:`update_checkpoint` (lock held); returns the event to emit."""
        store = self.checkpoints
        if store is None:
            return None
        from loop_governor.checkpoint import CheckpointConflictError

        cp.step = max(cp.step, scope.steps)
        try:
            for attempt in range(_CHECKPOINT_SAVE_ATTEMPTS):
                try:
                    version = store.save(cp)
                    break
                except CheckpointConflictError:
                    if attempt == _CHECKPOINT_SAVE_ATTEMPTS - 1:
                        raise
                    latest = store.load(scope.task_id)
                    if latest is None:  # deleted meanwhile: ours is all there is
                        version = store.save(cp, force=True)
                        break
                    # Another writer of the same task: keep both sides' work. Only what
                    # the store holds counts as saved: if this save conflicts again, our
                    # results are merged into the next copy too.
                    stored_results = len(latest.results)
                    latest.completed.update(cp.completed)
                    latest.known_bad.update(cp.known_bad)
                    latest.results.extend(cp.results[scope.results_saved :])  # ours since the last save
                    latest.metadata.update(cp.metadata)
                    latest.step = max(latest.step, cp.step)
                    scope.checkpoint = cp = latest
                    scope.results = latest.results
                    scope.results_saved = stored_results
        except Exception as exc:
            self.checkpoint_failures += 1
            return "checkpoint_failed", {"error": redact(f"{type(exc).__name__}: {exc}")[:500], "step": scope.steps}
        scope.results_saved = len(scope.results)
        return "checkpoint_saved", {"version": version, "step": scope.steps}

    def _guard_repeats(self, scope: TaskScope | None, info: GovernedError) -> LoopDetectedError | None:
        """Same tool, same error signature, N times in one task: tell the model to stop."""
        if scope is None:
            return None
        count = self.store.signature_hit(scope.task_id, info.signature)
        threshold = self.config.repeated_error_threshold
        if count < threshold:
            return None
        self.emit("loop_detected", tool=info.tool, signature=info.signature, count=count)
        return LoopDetectedError(
            info.model_copy(
                update={
                    "error_type": ErrorType.PERMANENT,
                    "retryable": False,
                    "count": count,
                    "advice": f"{info.tool} failed the same way {count} times in this task; stop calling it "
                    "for this and continue without it or report the failure",
                }
            )
        )


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
    "BreakerPolicy",
    "Governor",
    "TaskScope",
    "call_key",
    "default_governor",
    "set_default_governor",
]
