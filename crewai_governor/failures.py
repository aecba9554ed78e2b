"""How a governed failure travels through crewAI: raised as the tool's failure, or as a stop.

crewAI 1.15 catches every ``Exception`` a tool raises, and that is its contract for a
failed tool call: a ``ToolUsageErrorEvent`` (dashboards count these), ``task.tools_errors``
incremented, a failure recorded with reason ``exception``. So:

* a transient or permanent failure is *raised* as a [`GovernedToolError`][crewai_governor.failures.GovernedToolError]
  whose text is the governor's compact JSON. crewAI records it as above, and the global
  ``after_tool_call`` hook ([`ensure_fatal_relay`][crewai_governor.failures.ensure_fatal_relay]) hands the model that
  JSON instead of crewAI's error wording around it. crewAI's ReAct path re-runs a raising tool (three
  attempts, two invocations each); the governor already retried, so those re-runs get
  the same outcome without a call ([`GovernedStructuredTool`][crewai_governor.tools.GovernedStructuredTool]);
* a fatal failure is *returned* as a [`GovernedToolFailure`][crewai_governor.failures.GovernedToolFailure] carrying the
  ``lg.FatalError`` (crewAI would swallow a raised one); the same hook then raises it
  again as a ``HookAborted``. ``HookAborted`` is the one exception crewAI passes through
  its tool, executor, agent-retry and crew layers untouched (agent/core.py keeps it out
  of the ``max_retry_limit`` loop), so the run stops. The raised object is also an
  instance of the original fatal class, so ``except lg.FatalError`` around
  ``crew.kickoff()`` catches it with ``.info`` intact.
"""

from __future__ import annotations

import threading
from typing import Any

from crewai.hooks.dispatch import HookAborted, InterceptionPoint, get_global_hook_list, register
from crewai.tools.tool_failure import ToolFailure, ToolFailureReason
from pydantic import PrivateAttr

import loop_governor as lg
from loop_governor.adapter import STOP_PREFIX, stop_reason

__all__ = ["GovernedToolError", "GovernedToolFailure", "ensure_fatal_relay", "failure_from_error", "stop_error"]


class GovernedToolError(Exception):
    """A non-fatal governed failure (transient after retries, permanent, breaker open,
    loop detected), raised out of a governed crewAI tool.

    ``str()`` is the governor's model-facing JSON; ``.error`` is the
    [`loop_governor.AgentToolError`][loop_governor.errors.AgentToolError] (``.info`` its classification) and
    ``__cause__`` the tool's own exception, when there was one.
    """

    def __init__(self, error: lg.AgentToolError) -> None:
        self.error = error
        super().__init__(error.info.to_model_text())

    @property
    def info(self) -> lg.GovernedError:
        return self.error.info

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.error,))


# The JSON of the last GovernedToolError raised on this thread, until crewAI's
# after_tool_call hooks for that call ran (crewAI runs a call's hooks on its thread).
_raised = threading.local()


def raise_governed(error: lg.AgentToolError) -> GovernedToolError:
    """The exception a governed tool raises for ``error``, remembered for the hook."""
    exc = GovernedToolError(error)
    _raised.text = str(exc)
    return exc


class GovernedToolFailure(ToolFailure):
    """A ``ToolFailure`` produced by the governor.

    ``message`` is exactly ``GovernedError.to_model_text()`` and ``code`` stays empty, so
    the text the model reads is the governor's byte-stable JSON (crewAI would append
    "(code: ...)" otherwise). ``details`` holds the same fields as a dict for consumers of
    ``TaskOutput.tool_failures``. ``fatal`` is set when the run must stop.
    """

    _fatal: lg.FatalError | None = PrivateAttr(default=None)

    @property
    def fatal(self) -> lg.FatalError | None:
        return self._fatal

    @property
    def error_type(self) -> str:
        return str(self.details.get("error_type", ""))

    def raise_if_fatal(self) -> None:
        """Re-raise the fatal error, for callers that ran the tool outside a crew."""
        if self._fatal is not None:
            raise self._fatal


def failure_from_error(exc: lg.AgentToolError) -> GovernedToolFailure:
    """The ``ToolFailure`` a governed tool returns for ``exc``."""
    info = exc.info
    failure = GovernedToolFailure(
        message=info.to_model_text(),
        reason=ToolFailureReason.TOOL_REPORTED,
        retryable=info.retryable,
        details=info.model_dump(mode="json"),
    )
    if isinstance(exc, lg.FatalError):
        failure._fatal = exc
    return failure


_stop_classes: dict[type[lg.AgentToolError], type[lg.AgentToolError]] = {}
_stop_lock = threading.Lock()


def _stop_class(cls: type[lg.AgentToolError]) -> type[lg.AgentToolError]:
    with _stop_lock:
        stop_cls = _stop_classes.get(cls)
        if stop_cls is None:
            # Both bases are plain Exception subclasses, so the layouts are compatible;
            # the MRO runs AgentToolError.__init__ then HookAborted.__init__ via super().
            stop_cls = type(
                cls.__name__,
                (cls, HookAborted),
                {
                    "__module__": __name__,
                    "__doc__": f"{cls.__name__} raised through crewAI as a HookAborted stop.",
                },
            )
            _stop_classes[cls] = stop_cls
        return stop_cls


def stop_error(exc: lg.FatalError) -> lg.FatalError:
    """``exc`` as an object that is both its own fatal class and a crewAI ``HookAborted``."""
    if isinstance(exc, HookAborted):
        return exc
    stop_cls = _stop_class(type(exc))
    stop: Any = Exception.__new__(stop_cls, *exc.args)
    stop.__dict__.update(exc.__dict__)  # .info, and e.g. BudgetExhaustedError.partial_results
    stop.reason = exc.reason  # the same .reason as the governor's (str() adds the prefix)
    stop.source = "loop_governor"
    stop.__cause__ = exc
    result: lg.FatalError = stop.with_traceback(exc.__traceback__)
    return result


def model_stop(exc: lg.AgentToolError) -> lg.AgentToolError:
    """A governed model call's failure as a crewAI run stop (``HookAborted``) that is also
    ``exc``'s own class (``except lg.FatalError`` / ``lg.AgentToolError`` still catch it),
    with the provider's exception as its ``__cause__`` (never its class: an
    ``except openai.RateLimitError: retry`` must not retry a stopped run).

    crewAI wraps every LLM class's call method in its own rate-limit retry, which walks an
    exception's ``__cause__`` chain for a 429; a governed LLM's call is not wrapped (see
    `crewai_governor.llm`), and crewAI's agent retry loop lets a ``HookAborted``
    through. The stop's text carries no "rate limit" wording either (the provider's words
    stay in ``.info``).
    """
    stop_cls = _stop_class(type(exc))
    info = exc.info
    reason = stop_reason(info)
    if not isinstance(exc, lg.FatalError):
        reason += f" (model call failed: {info.outcome_text()})"
    summary = STOP_PREFIX + reason
    stop: Any = Exception.__new__(stop_cls, summary)
    stop.__dict__.update(exc.__dict__)
    stop.args = (summary,)
    stop.reason = reason
    stop.source = "loop_governor"
    stop.__cause__ = exc.__cause__  # the provider's exception, as in the LangChain adapter
    stop.__context__ = None
    stop.__suppress_context__ = True
    result: lg.AgentToolError = stop
    return result


_overflow_classes: dict[type[lg.AgentToolError], type[lg.AgentToolError]] = {}


def context_overflow(exc: lg.AgentToolError) -> lg.AgentToolError:
    """A governed model call's context overflow as crewAI's own
    ``LLMContextLengthExceededError`` (and still ``exc``'s class, ``.info`` intact).

    crewAI's executor answers that error itself: ``respect_context_window=True`` (its
    default) summarizes the history and calls the model again, ``False`` ends the run. A
    run stop here would skip what the crew was configured to do; the governor already
    compacted once if it had a pruner to do it with.
    """
    from crewai.utilities.exceptions.context_window_exceeding_exception import LLMContextLengthExceededError

    cls = type(exc)
    with _stop_lock:
        overflow_cls = _overflow_classes.get(cls)
        if overflow_cls is None:
            overflow_cls = type(cls.__name__, (cls, LLMContextLengthExceededError), {"__module__": __name__})
            _overflow_classes[cls] = overflow_cls
    info = exc.info
    text = LLMContextLengthExceededError._get_error_message(info.message or "context_length_exceeded")
    overflow: Any = Exception.__new__(overflow_cls, text)
    overflow.__dict__.update(exc.__dict__)
    overflow.args = (text,)
    overflow.original_error_message = info.message
    result: lg.AgentToolError = overflow
    return result


def _relay_fatal(context: Any) -> str | None:
    """Global ``after_tool_call`` hook: turn a returned fatal failure into a run stop,
    and give the model a raised governed failure's JSON without crewAI's wording around
    it ("Error executing tool: ...", the ReAct "I encountered an error ..." text)."""
    raw = getattr(context, "raw_tool_result", None)
    if isinstance(raw, GovernedToolFailure) and raw.fatal is not None:
        raise stop_error(raw.fatal)
    text: str | None = getattr(_raised, "text", None)
    if text is None:
        return None
    _raised.text = None
    result = getattr(context, "tool_result", None)
    if isinstance(result, str) and text in result and result != text:
        return text
    return None


_relay_lock = threading.Lock()


def ensure_fatal_relay() -> None:
    """Register [`_relay_fatal`][crewai_governor.failures._relay_fatal] globally unless it is registered already.

    Checked again on every fatal outcome, so a test suite's ``clear_all_global_hooks()``
    between runs cannot silently downgrade a fatal error into model-facing text.
    """
    hooks = get_global_hook_list(InterceptionPoint.POST_TOOL_CALL)
    if _relay_fatal in hooks:
        return
    with _relay_lock:
        if _relay_fatal not in hooks:
            register(InterceptionPoint.POST_TOOL_CALL, _relay_fatal)
