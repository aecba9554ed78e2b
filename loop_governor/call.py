"""One governed call as a value, and the two shapes a policy can take.

A governed call -- of a tool or of a model -- is described by one [`Call`][loop_governor.call.Call]: its
kind, the name the breaker and rate limit key on, the task scope, the resolved settings
and what the call learns on its way (attempts, the last failure's classification, why
retrying stopped). Policies read and annotate it; nothing else is threaded through.

Policies come in two shapes, each with at most three moments:

* a [`Policy`][loop_governor.call.Policy] wraps the whole call: ``before`` (may refuse by raising a governed
  error, or short-circuit with [`Resumed`][loop_governor.call.Resumed]), ``after_failure`` (may record, or
  replace the outcome with a stronger one) and ``after_success`` (may record, annotate
  the result, or stop the run);
* an [`AttemptPolicy`][loop_governor.call.AttemptPolicy] wraps each attempt inside the retry loop: ``before_attempt``
  (may refuse with [`Refused`][loop_governor.call.Refused], or ask the caller to wait), ``after_attempt_failure``
  (may veto further retries) and ``after_attempt_success``.

tenacity owns the retry decision between attempts (see [`loop_governor.retry`][loop_governor.retry]).
The base classes' moments do nothing, and the chain skips a moment a policy does not
override, so a policy with nothing to do costs nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from loop_governor.fingerprint import (
    Fingerprint,
    args_entity,
    args_shape,
    args_signature,
    args_subject,
    args_text,
    result_text,
)
from loop_governor.keys import call_key
from loop_governor.reasons import StopReason as StopReason
from loop_governor.scope_vars import _CALL_META

if TYPE_CHECKING:
    from loop_governor.classify import ErrorInfo
    from loop_governor.config import ResolvedPolicy
    from loop_governor.errors import AgentToolError
    from loop_governor.runtime import Runtime
    from loop_governor.state.breaker import Admission
    from loop_governor.task import TaskScope
    from loop_governor.usage import Usage

TOOL = "tool"
MODEL = "model"

_T = TypeVar("_T")


class _once(Generic[_T]):  # a decorator, named like property
    """A property computed on first use, then a plain attribute of the instance: the loop
    guards read a call's signatures several times each. Hand-written because
    ``functools.cached_property`` takes a lock on every first use before Python 3.12
    (measured: three reads cost 2-3x those of a plain property)."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _once[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object, owner: type | None = None) -> _T | _once[_T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(slots=True)
class ModelOptions:
    """What a model call adds to a call: how to read its usage and describe it, how to
    shrink its prompt, and which models may answer instead."""

    usage: Callable[[Any], Usage | None] | None = None
    describe: Callable[[Any], dict[str, Any]] | None = None
    # prompt tokens; a callable is asked once per arguments sent, only if needed
    estimate: int | Callable[..., int] | None = None
    compact: Callable[..., Any] | None = None
    fallbacks: Sequence[tuple[str, Callable[..., Any]]] = ()
    _estimated: tuple[Any, int | None] | None = field(default=None, init=False, repr=False)

    def estimated_tokens(self, args: tuple[Any, ...] | None = None) -> int | None:
        """The estimated tokens of the prompt ``args`` (computed on first use: only a token
        rate limit or a missing usage report needs them). A callable that takes the call's
        arguments is asked again for other arguments: a compacted retry is charged its own
        size, not the original prompt's (issue 27)."""
        estimate = self.estimate
        if not callable(estimate):
            return estimate
        cached = self._estimated
        if cached is not None and (args is None or cached[0] is args):
            return cached[1]
        try:
            value: int | None = int(estimate(*args) if args is not None and _takes_args(estimate) else estimate())
        except Exception:
            value = None
        if value is not None and value < 0:
            value = None
        self._estimated = (args, value)
        return value


def _takes_args(fn: Callable[..., Any]) -> bool:
    """Whether an estimate callable takes the call's arguments (a zero-argument one is the
    older form: it closes over the prompt)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is not p.KEYWORD_ONLY and p.kind is not p.VAR_KEYWORD for p in params)


class Call:
    """One governed call and what it learned on the way.

    No ``__slots__``: the per-call state defaults live on the class, so building a call
    on the hot path sets only what differs (measured: a third cheaper than slots).
    """

    _key: str | None = None
    attempt = 0  # attempts made so far
    admission: Admission | None = None  # the breaker's verdict on the attempt in flight
    info: ErrorInfo | None = None  # the last failed attempt's classification
    exc: BaseException | None = None  # ... and its exception
    stop_reason: StopReason | None = None  # why the call ended short of its answer
    veto: StopReason | None = None  # a policy's reason to retry no more
    pending: str | None = None  # work the next attempt must do first ("compact")
    compacted = False
    throttles = 0  # failed attempts that were throttles/overloads waited out (not counted as attempts)
    started = 0.0
    waited_s = 0.0
    waited_before = 0.0  # waited_s when the call moved to its current endpoint
    breaker_waiting = False  # waiting for an open (or another's half-open) breaker: one event per wait
    usage: Usage | None = None
    rate_tokens: float | None = None  # the prompt tokens the attempt in flight took from the token bucket
    upcoming: tuple[Any, ...] | None = None  # the arguments the next attempt sends (a compacted prompt)
    fallback_from: str | None = None
    next_fallback = 0
    warned = False  # a guard already told the model about this call (one note per result)
    fixed: bool | None = None  # whether this success may have fixed something (fixes.did_something)
    _fingerprint: Fingerprint | None = None

    def __init__(
        self,
        kind: str,
        name: str,
        policy: ResolvedPolicy,
        scope: TaskScope | None,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        model: ModelOptions | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.breaker_key = f"model:{name}" if kind == MODEL else name
        self.policy = policy
        self.scope = scope
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.model = model

    @property
    def key(self) -> str:
        """Tool + canonical arguments: what known-bad memory and checkpoints key on."""
        if self._key is None:
            self._key = call_key(self.name, self.args, self.kwargs)
        return self._key

    @key.setter
    def key(self, value: str) -> None:
        self._key = value

    def fingerprint(self, result: Any) -> Fingerprint | None:
        """The call's result as the loop guards compare it (computed once per call)."""
        if self._fingerprint is None:
            text = result_text(result)
            if text is None:
                return None
            self._fingerprint = Fingerprint(text)
        return self._fingerprint

    @_once
    def args_signature(self) -> tuple[int, int]:
        """Normalized arguments, walking ones masked (see [`loop_governor.fingerprint`][loop_governor.fingerprint])."""
        return args_signature(self.args, self.kwargs)

    @_once
    def subject(self) -> tuple[int, int]:
        """``(entity, content)`` of the arguments (see [`args_subject`][loop_governor.fingerprint.args_subject]):
        calls with the same entity ask the same question, revised or not. Computed on first use
        (a repeat or a failure asks for it, a healthy call never does)."""
        return args_subject(self.args, self.kwargs)

    @_once
    def entity(self) -> int:
        """The entity part of [`subject`][loop_governor.call.Call.subject] (what the loop guards compare), without
        digesting the content: ``subject[0]``, computed on first use."""
        return args_entity(self.args, self.kwargs)

    @property
    def key_if_known(self) -> str | None:
        return self._key

    @_once
    def args_shape(self) -> int:
        """The arguments with every digit dropped: "the same call but for a number" (the
        next flight, another line range) shares it."""
        text = self.args_text
        # arguments without a repr: a shape of their own (their identity)
        return args_shape(text) if text else hash((id(self.args), id(self.kwargs)))

    @_once
    def args_text(self) -> str:
        """The arguments as text ("" when an argument's repr fails), computed once: the
        shape and [`walks`][loop_governor.fingerprint.walks] both read it."""
        return args_text(self.args, self.kwargs) or ""

    @_once
    def same_decision(self) -> bool:
        """Whether this call re-runs the task's previous tool call (same tool call id): a
        retrying middleware around the governor, not a repeat by the model. Asked once per
        call; the first ask moves the task's marker on."""
        invocation, scope = self.invocation, self.scope
        same = invocation is not None and scope is not None and scope.last_invocation == invocation
        if scope is not None:
            scope.last_invocation = invocation
        return same

    @property
    def invocation(self) -> Any:
        """The framework's id of the decision this call carries out (LangChain's
        ``tool_call_id``), when the adapter gave one: a middleware outside the governor
        that retries the same tool call re-runs the same decision, the model did not
        repeat itself, and the loop guards do not count it."""
        meta = _CALL_META.get()
        return meta.get("tool_call_id") if meta else None

    def switch(self, name: str, fn: Callable[..., Any], policy: ResolvedPolicy) -> None:
        """Point the call at a fallback model: a fresh breaker, rate limit and retry loop."""
        if self.fallback_from is None:
            self.fallback_from = self.name
        self.name = name
        self.breaker_key = f"model:{name}"
        self.fn = fn
        self.policy = policy
        self.admission = None
        self.attempt = 0
        self.info = None
        self.exc = None
        self.stop_reason = None
        self.veto = None
        self.compacted = False
        self.throttles = 0
        self.waited_before = self.waited_s  # the fallback's wait limit is its own

    @property
    def fallback_left(self) -> bool:
        """Whether another model may still answer this call (its fallbacks not yet tried)."""
        options = self.model
        return options is not None and self.next_fallback < len(options.fallbacks)

    @property
    def may_wait(self) -> bool:
        """Whether this call waits for its turn (``max_wait``) rather than handing back:
        not while a fallback is left -- that is what fallbacks are for."""
        return self.policy.max_wait > 0 and not self.fallback_left

    @property
    def wait_left(self) -> float:
        """Seconds this call may still wait for its turn: what is left of ``max_wait`` on
        this endpoint, and of the task's ``max_wall_s``."""
        left = self.policy.max_wait - (self.waited_s - self.waited_before)
        scope = self.scope
        if scope is not None:
            rt = scope.rt
            wall = rt.config.max_wall_s
            if wall is not None:
                left = min(left, wall - (rt.clock() - scope.started_at))
        return left

    @property
    def waits_out_throttle(self) -> bool:
        """Whether the last failure is a throttle or an overload this call waits out
        instead of spending an attempt on it."""
        info = self.info
        return info is not None and (info.throttled or info.overloaded) and self.may_wait


@dataclass(frozen=True, slots=True)
class Resumed:
    """``Policy.before``'s short-circuit: the call's result is already known."""

    value: Any


class PassThrough(BaseException):
    """Raise ``PassThrough(exc)`` from an attempt to hand back an exception that is not the
    call's own failure (another middleware's, a parser's after the model answered): the
    governor re-raises ``exc`` as it is -- not classified, not retried, not counted
    against a breaker. A ``BaseException``, so no ``except Exception`` on the way (the
    retry loop's included) takes it for a failure."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


def programming_error(exc: BaseException) -> bool:
    """Whether a first attempt's exception is the caller's programming error, which must
    reach the caller as it would without the governor (never classified, retried or told
    to the model as the tool's failure):

    * ``NotImplementedError`` -- e.g. an async-only tool called synchronously;
    * a ``TypeError`` raised by the call itself, before the function's body ran: the
      arguments do not fit its signature (the traceback holds only the calling frame).
    """
    if isinstance(exc, NotImplementedError):
        return True
    tb = exc.__traceback__
    return isinstance(exc, TypeError) and tb is not None and tb.tb_next is None


class Refused(Exception):
    """An [`AttemptPolicy`][loop_governor.call.AttemptPolicy] refused an attempt. On the first attempt ``error`` is the
    call's outcome; on a retry the call ends with its last failure, ``reason`` saying why.
    Internal: it never escapes the governor."""

    def __init__(self, reason: StopReason, error: AgentToolError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


class Policy:
    """A policy around the whole governed call (see the module docstring)."""

    kinds: ClassVar[frozenset[str]] = frozenset({TOOL, MODEL})
    in_task_only: ClassVar[bool] = True  # most policies keep per-task state
    listeners_only: ClassVar[bool] = False  # True: only needed while someone listens to events

    @classmethod
    def applies(cls, rt: Runtime) -> bool:
        """Whether this governor's chain needs the policy at all (its config uses it)."""
        return True

    def before(self, call: Call) -> Resumed | None:
        return None

    def after_failure(self, call: Call, error: AgentToolError) -> AgentToolError:
        return error

    def after_success(self, call: Call, result: Any) -> Any:
        return result


class AttemptPolicy:
    """A policy around each attempt of the retry loop (see the module docstring)."""

    kinds: ClassVar[frozenset[str]] = frozenset({TOOL, MODEL})
    first_attempt: ClassVar[bool] = True  # False: ``before_attempt`` only matters for retries
    rated_only: ClassVar[bool] = False  # True: only calls with a rate limit need this policy

    @classmethod
    def applies(cls, rt: Runtime) -> bool:
        """Whether this governor's chain needs the policy at all (its config uses it)."""
        return True

    def before_attempt(self, call: Call) -> float:
        """Seconds to wait before asking again (0: go ahead); raise [`Refused`][loop_governor.call.Refused] to
        refuse."""
        return 0.0

    def after_attempt_failure(self, call: Call) -> None:
        return None

    def after_attempt_success(self, call: Call) -> None:
        return None

    def after_attempt_cancelled(self, call: Call) -> None:
        """The attempt in flight was cancelled (``CancelledError``, ``KeyboardInterrupt``...):
        no verdict; hand back what it held. Must not raise: the cancellation goes on."""
        return None


def overrides(policy: object, base: type, name: str) -> bool:
    """Whether ``policy`` has its own ``name`` moment (the chain skips those it lacks)."""
    return getattr(type(policy), name) is not getattr(base, name)


AsyncFn = Callable[..., Awaitable[Any]]
