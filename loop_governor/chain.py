"""The governed call as a chain of policies: composed once, run for every call.


    call policies .before           (resume, known-bad replay, budgets)
      for each endpoint (a model's fallbacks after it):
        attempt policies .before_attempt   (rate limits: may wait; breaker, retry budget)
        the attempt                        (the first outside tenacity, retries inside it)
        attempt policies .after_attempt_*  (breaker records; vetoes end the retries)
    call policies .after_success / .after_failure   (events, checkpoint, known-bad,
                                                     repeated errors, no progress)

A [`Plan`][loop_governor.chain.Plan] holds, per kind of call and per "inside a task or not", only the moments
some policy overrides, so a policy with nothing to do costs nothing. The sync and async
drivers share every decision (the helpers below); they differ only where one sleeps or
awaits.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tenacity import AsyncRetrying, Retrying

from loop_governor.call import (
    MODEL,
    AttemptPolicy,
    Call,
    PassThrough,
    Policy,
    Refused,
    Resumed,
    StopReason,
    overrides,
    programming_error,
)
from loop_governor.errors import AgentToolError, BudgetExhaustedError, FatalError, TransientError
from loop_governor.fingerprint import result_text
from loop_governor.outcome import failure
from loop_governor.redaction import redact
from loop_governor.retry import RetryLoop
from loop_governor.runtime import Runtime
from loop_governor.usage import Usage, usage_of


class _Failed(Exception):
    """Internal: the attempts at one endpoint ended in ``error`` (caused by ``cause``)."""

    def __init__(self, error: AgentToolError, cause: BaseException | None) -> None:
        super().__init__(error.info.message)
        self.error = error
        self.cause = cause


class _OwnError(BaseException):
    """Internal: an error of the governor's own policies during a retry.

    Not the tool's failure, so never classified or retried: a BaseException, which the
    retry predicate refuses and tenacity re-raises; unwrapped when it leaves the loop.
    """

    def __init__(self, exc: Exception) -> None:
        super().__init__(str(exc))
        self.exc = exc


@contextlib.contextmanager
def _own_errors() -> Iterator[None]:
    try:
        yield
    except Refused:
        raise
    except Exception as exc:
        raise _OwnError(exc) from exc


class Plan:
    """The overridden moments of the policies that apply to one kind of call."""

    __slots__ = (
        "after_attempt_cancelled",
        "after_attempt_failure",
        "after_attempt_success",
        "after_failure",
        "after_success",
        "before",
        "before_first",
        "before_retry",
    )

    def __init__(self, policies: Sequence[Policy], attempts: Sequence[AttemptPolicy]) -> None:
        def moments(items: Sequence[Any], base: type, name: str) -> tuple[Callable[..., Any], ...]:
            return tuple(getattr(p, name) for p in items if overrides(p, base, name))

        self.before = moments(policies, Policy, "before")
        self.after_failure = moments(policies, Policy, "after_failure")
        self.after_success = moments(policies, Policy, "after_success")
        self.before_first = moments([a for a in attempts if a.first_attempt], AttemptPolicy, "before_attempt")
        self.before_retry = moments(attempts, AttemptPolicy, "before_attempt")
        self.after_attempt_failure = moments(attempts, AttemptPolicy, "after_attempt_failure")
        self.after_attempt_success = moments(attempts, AttemptPolicy, "after_attempt_success")
        self.after_attempt_cancelled = moments(attempts, AttemptPolicy, "after_attempt_cancelled")


class Chain:
    """Runs calls through the governor's policies (built once, by the Governor)."""

    __slots__ = ("_plans", "rt")

    def __init__(self, rt: Runtime, policies: Sequence[Policy], attempts: Sequence[AttemptPolicy]) -> None:
        self.rt = rt
        self._plans: dict[tuple[str, bool, bool, bool], Plan] = {}
        for kind in ("tool", MODEL):
            for in_task, rated, heard in itertools.product((False, True), repeat=3):
                chosen = [
                    p
                    for p in policies
                    if kind in p.kinds and (in_task or not p.in_task_only) and (heard or not p.listeners_only)
                ]
                steps = [a for a in attempts if kind in a.kinds and (rated or not a.rated_only)]
                self._plans[kind, in_task, rated, heard] = Plan(chosen, steps)

    def plan_of(self, kind: str, in_task: bool, rated: bool, heard: bool) -> Plan:
        """The moments of one kind of call (the Governor checks its fast path against them)."""
        return self._plans[kind, in_task, rated, heard]

    def plan(self, call: Call) -> Plan:
        """The moments for this kind of call: inside a task or not, with a rate limit or
        not, with someone listening to events or not."""
        return self._plans[call.kind, call.scope is not None, call.policy.rated, self.rt.events.emitting]

    # -- the two drivers ---------------------------------------------------------------

    def run(self, call: Call, first: Exception | None = None) -> Any:
        """Govern ``call`` (sync). ``first``: the first attempt already ran and failed
        (the governor's fast path), so the call starts in the retry loop."""
        plan = self._plans[call.kind, call.scope is not None, call.policy.rated, self.rt.events.emitting]
        if first is None and plan.before:
            resumed = self._open(plan, call)
            if resumed is not None:
                return resumed.value
        while True:
            try:
                if first is not None:
                    caught, first = first, None
                    result = self._retries(plan, call, caught)
                else:
                    result = self._attempts(plan, call)
            except _Failed as failed:
                if self._fall_back(call, failed.error):
                    plan = self.plan(call)  # the fallback's own limits (it may be rated, the model not)
                    continue
                raise self._close_failed(plan, call, failed.error) from failed.cause
            except PassThrough as passed:
                self._cancelled(call)  # no verdict either: a probe it held is handed back
                foreign = passed.exc
                break
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    self._cancelled(call)
                raise
            call.fn = _spent  # done: guards that keep the call must not keep what it closed over
            for moment in plan.after_success:
                result = moment(call, result)
            return result
        raise foreign  # not the call's failure: as it came, outside the except block

    async def arun(self, call: Call) -> Any:
        """Async twin of [`run`][loop_governor.chain.Chain.run] (same decisions; awaits the attempts and the waits)."""
        plan = self.plan(call)
        resumed = self._open(plan, call)
        if resumed is not None:
            return resumed.value
        while True:
            try:
                result = await self._aattempts(plan, call)
            except _Failed as failed:
                if self._fall_back(call, failed.error):
                    plan = self.plan(call)
                    continue
                raise self._close_failed(plan, call, failed.error) from failed.cause
            except PassThrough as passed:
                self._cancelled(call)  # no verdict either: a probe it held is handed back
                foreign = passed.exc
                break
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    self._cancelled(call)
                raise
            call.fn = _spent  # done: guards that keep the call must not keep what it closed over
            for moment in plan.after_success:
                result = moment(call, result)
            return result
        raise foreign  # not the call's failure: as it came, outside the except block

    def _attempts(self, plan: Plan, call: Call) -> Any:
        try:
            for moment in plan.before_first:
                wait = moment(call)
                if wait > 0:
                    self._wait(call, moment, wait)
        except Refused as refused:
            raise self._refused(call, refused) from None
        call.attempt = 1
        try:
            result = call.fn(*call.args, **call.kwargs)
        except Exception as exc:
            first = exc
        else:
            if call.kind == MODEL:
                call.usage = self._usage(call, result)
            for moment in plan.after_attempt_success:
                moment(call)
            return result
        # Outside the except block: later attempts must not inherit `first` as __context__.
        return self._retries(plan, call, first)

    def _retries(self, plan: Plan, call: Call, first: Exception) -> Any:
        if programming_error(first):
            raise PassThrough(first)  # the caller's bug, not the call's failure: as it came
        loop = RetryLoop(self.rt, call, plan.after_attempt_failure)
        pending: list[Exception] = [first]

        def attempt() -> Any:
            if pending:  # the first failure, already caught: tenacity decides on it too
                raise pending.pop()
            with _own_errors():
                # compacted before admission: with nothing left to cut the call ends here,
                # not after waiting out an open breaker and taking its probe
                compacted = self._compacted(call) if call.pending is not None else None
                self._ready(call, compacted)
                self._admit(plan, call)
                if call.pending is not None:
                    self._compact(call, compacted)
            call.attempt += 1
            return call.fn(*call.args, **call.kwargs)

        try:
            result = Retrying(sleep=lambda seconds: self._sleep(call, seconds), **loop.tenacity_kwargs())(attempt)
        except Refused as refused:
            raise self._stopped(call, refused) from None
        except _OwnError as own:
            raise own.exc from None
        except Exception as final:
            raise _Failed(failure(call), final) from None
        return self._attempt_ok(plan, call, result)

    async def _aattempts(self, plan: Plan, call: Call) -> Any:
        try:
            await self._aadmit(plan, call)
        except Refused as refused:
            raise self._refused(call, refused) from None
        call.attempt = 1
        try:
            result = await _awaited(call.fn(*call.args, **call.kwargs))
        except Exception as exc:
            first = exc
        else:
            return self._attempt_ok(plan, call, result)
        if programming_error(first):
            raise PassThrough(first)  # the caller's bug, not the call's failure: as it came
        loop = RetryLoop(self.rt, call, plan.after_attempt_failure)
        pending: list[Exception] = [first]

        async def attempt() -> Any:
            if pending:
                raise pending.pop()
            with _own_errors():
                compacted = await self._acompacted(call) if call.pending is not None else None
                self._ready(call, compacted)
                await self._aadmit(plan, call)
                if call.pending is not None:
                    self._compact(call, compacted)
            call.attempt += 1
            return await _awaited(call.fn(*call.args, **call.kwargs))

        try:
            result = await AsyncRetrying(sleep=lambda seconds: self._asleep(call, seconds), **loop.tenacity_kwargs())(
                attempt
            )
        except Refused as refused:
            raise self._stopped(call, refused) from None
        except _OwnError as own:
            raise own.exc from None
        except Exception as final:
            raise _Failed(failure(call), final) from None
        return self._attempt_ok(plan, call, result)

    def _admit(self, plan: Plan, call: Call) -> None:
        for moment in plan.before_retry if call.attempt else plan.before_first:
            wait = moment(call)
            if wait > 0:
                self._wait(call, moment, wait)

    def _wait(self, call: Call, moment: Callable[[Call], float], wait: float) -> None:
        """Sleep while an attempt policy (a rate limit) asks to, then ask it again."""
        while wait > 0:
            self._sleep(call, wait)
            wait = moment(call)

    async def _aadmit(self, plan: Plan, call: Call) -> None:
        for moment in plan.before_retry if call.attempt else plan.before_first:
            wait = moment(call)
            while wait > 0:
                await self._asleep(call, wait)
                wait = moment(call)

    def _sleep(self, call: Call, seconds: float) -> None:
        """Sleep, and count what the wait took against the call's wait limit: the time it
        really took (a monotonic clock: sleeps overshoot, a busy host more so), at least
        what was asked (an injected sleep that does not sleep still counts)."""
        clock = _monotonic(self.rt.clock)
        started = clock()
        try:
            self.rt.sleep(seconds)
        finally:
            call.waited_s += max(seconds, clock() - started)

    async def _asleep(self, call: Call, seconds: float) -> None:
        clock = _monotonic(self.rt.clock)
        started = clock()
        try:
            await self.rt.asleep(seconds)
        finally:
            call.waited_s += max(seconds, clock() - started)

    # -- shared steps ------------------------------------------------------------------

    def _cancelled(self, call: Call) -> None:
        """Cancellation (or an interpreter exit), or a foreign exception (PassThrough),
        passed through the call without a verdict: the attempt policies hand back what the
        attempt held (the breaker's half-open probe)."""
        for moment in self.plan(call).after_attempt_cancelled:
            try:
                moment(call)
            except Exception:  # the cancellation, not our bookkeeping, goes on
                continue

    def _open(self, plan: Plan, call: Call) -> Resumed | None:
        """The call policies' ``before``: a refusal is the call's outcome at once."""
        try:
            for moment in plan.before:
                resumed = moment(call)
                if resumed is not None:
                    return resumed  # type: ignore[no-any-return]
        except AgentToolError as refused:
            raise self._close_failed(plan, call, refused) from None
        return None

    @staticmethod
    def _refused(call: Call, refused: Refused) -> _Failed:
        """A first attempt refused by an attempt policy: the refusal is the outcome."""
        call.stop_reason = refused.reason
        assert refused.error is not None  # first attempts are always refused with an outcome
        return _Failed(refused.error, None)

    @staticmethod
    def _stopped(call: Call, refused: Refused) -> _Failed:
        """A retry refused before it ran: the call ends with its last failure."""
        call.stop_reason = refused.reason
        return _Failed(failure(call), call.exc)

    def _compacted(self, call: Call) -> Any:
        """The caller's compaction of the prompt; None when it has none to offer."""
        compact = call.model.compact if call.model is not None else None
        if compact is None:
            return None
        try:
            return compact(*call.args)
        except Exception as exc:
            return self._compaction_failed(call, exc)

    async def _acompacted(self, call: Call) -> Any:
        compact = call.model.compact if call.model is not None else None
        if compact is None:
            return None
        try:
            return await _awaited(compact(*call.args))
        except Exception as exc:
            return self._compaction_failed(call, exc)

    def _compaction_failed(self, call: Call, exc: Exception) -> None:
        # A broken compactor (the caller's code, or a summarizer's backend) is not the
        # model's failure: the context error stands, and the trace says why.
        self.rt.events.emit("compaction_failed", model=call.name, error=redact(f"{type(exc).__name__}: {exc}")[:500])

    def _ready(self, call: Call, compacted: Any) -> None:
        """A compaction retry with nothing to send is refused before the attempt policies
        admit it (an open breaker's probe, once taken, would be kept by a retry never sent);
        one with a prompt to send is admitted on that prompt's size (the rate limit)."""
        if call.pending is not None:
            if compacted is None:
                self._compact(call, None)
            call.upcoming = _as_args(compacted)

    def _compact(self, call: Call, compacted: Any) -> None:
        """Run the retry after ``context_length_exceeded`` on the compacted arguments."""
        call.pending = None
        call.compacted = True
        call.upcoming = None
        if compacted is None:
            raise Refused(StopReason.COMPACTION)  # nothing left to cut: the context error stands
        call.args = _as_args(compacted)
        self.rt.events.emit("compaction", model=call.name)

    def _attempt_ok(self, plan: Plan, call: Call, result: Any) -> Any:
        if call.kind == MODEL:
            call.usage = self._usage(call, result)
        for moment in plan.after_attempt_success:
            moment(call)
        return result

    def _usage(self, call: Call, result: Any) -> Usage | None:
        options = call.model
        read = options.usage if options is not None and options.usage is not None else usage_of
        try:
            usage = read(result)
        except Exception:
            usage = None
        estimate = options.estimated_tokens(call.args) if usage is None and options is not None else None
        if estimate:
            # No usage reported (a stream without usage, a client that drops it): the
            # budgets and the token rate limit go on estimates -- the prompt's, and the
            # answer's from its text -- and the trace says so.
            answer = _answer_tokens(result)
            usage = Usage(estimate, answer, estimated=True)
            self.rt.events.emit("usage_estimated", model=call.name, input_tokens=estimate, output_tokens=answer)
        return usage

    def _fall_back(self, call: Call, error: AgentToolError) -> bool:
        """Move a model call to its next fallback while the model is down (breaker open,
        transient retries spent, rate limited) or its endpoint's credentials or account
        are refused (a fatal outcome of this endpoint: a revoked key, an exhausted quota --
        another endpoint has its own); permanent outcomes, and the task's own stops, stand."""
        options = call.model
        if options is None or not options.fallbacks:
            return False
        if not isinstance(error, TransientError) and (
            not isinstance(error, FatalError) or isinstance(error, BudgetExhaustedError)
        ):
            return False
        index = call.next_fallback
        if index >= len(options.fallbacks):
            return False
        call.next_fallback = index + 1
        name, fn = options.fallbacks[index]
        failed = call.name
        call.switch(name, fn, self.rt.policy(MODEL, name))
        self.rt.events.emit(
            "model_fallback",
            model=name,
            from_model=failed,
            error_type=error.info.error_type.value,
            reason=error.info.code,
        )
        return True

    def _close_failed(self, plan: Plan, call: Call, error: AgentToolError) -> AgentToolError:
        # done: the guards that remember the call must not keep the framework objects its
        # function closed over (a LangGraph run's config, so the run itself, for the task)
        call.fn = _spent
        for moment in plan.after_failure:
            error = moment(call, error)
        fmt = self.rt.config.error_format
        if fmt != "text":
            error.info = error.info.rendered(fmt)  # what the model reads, as configured
        return error


def _spent(*_args: Any, **_kwargs: Any) -> Any:
    """A finished call's function: what it closed over is let go (see ``_close_failed``)."""
    raise RuntimeError("this governed call is over")


def _answer_tokens(result: Any) -> int:
    """About 4 characters a token, of the answer's text (a string, ``.content``, a
    ``{"content": ...}``, or the last message of a LangChain ``ModelResponse``)."""
    inner = getattr(result, "result", None)
    if isinstance(inner, list) and inner:
        result = inner[-1]
    text = result_text(result)
    return -(-len(text) // 4) if text else 0


def _monotonic(clock: Callable[[], float]) -> Callable[[], float]:
    """The clock local waits are measured on: an injected one as it is (virtual time),
    else the monotonic clock (the wall clock steps)."""
    return time.monotonic if clock is time.time else clock


def _as_args(compacted: Any) -> tuple[Any, ...]:
    return compacted if isinstance(compacted, tuple) else (compacted,)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
