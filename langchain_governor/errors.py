"""What a governed failure becomes inside LangGraph: a fatal stop, or a typed tool error.

A plain [`loop_governor.FatalError`][loop_governor.errors.FatalError] raised by a tool is an ordinary exception to
LangGraph: ``ToolNode(handle_tool_errors=True)`` (common with ``create_react_agent``)
turns it into a ``ToolMessage`` and the run goes on with bad credentials. LangGraph lets
only its control-flow exceptions (``GraphBubbleUp``: interrupts, parent commands)
through every error handler, retry policy and node boundary, up to the caller of
``invoke`` / ``stream``. [`GovernedFatalError`][langchain_governor.errors.GovernedFatalError] is both: LangGraph passes
it through, and ``except lg.FatalError`` (or the specific class it stands for, such as
``lg.BudgetExhaustedError``) still catches it.

A non-fatal governed failure inside a LangGraph run is raised as a
[`GovernedToolError`][langchain_governor.errors.GovernedToolError]: LangGraph's ``ToolNode`` turns it into
``ToolMessage(status="error")`` holding the governor's JSON (it is a
``ToolInvocationError``, which the default error handler answers with its
``.message``), while a ``ToolErrorMiddleware``, a ``ToolRetryMiddleware`` or a user's retry
wrapper outside the governor still sees an exception -- of the tool's own class where
Python allows it, so ``except ValueError`` keeps matching.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from langchain_core.tools import ToolException
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolInvocationError

import loop_governor as lg
from loop_governor.adapter import redact_obj, retried_by_class

__all__ = ["GovernedFatalError", "GovernedToolError", "fatal_stop", "model_error", "tool_error"]


class GovernedFatalError(lg.FatalError, GraphBubbleUp):
    """A [`loop_governor.FatalError`][loop_governor.errors.FatalError] that LangGraph lets through to the caller.

    ``.info`` (and, for a budget stop, ``.partial_results``) are the original error's; the
    original is also the ``__cause__``. For a subclass of ``FatalError`` the raised object
    is an instance of that subclass too (see [`fatal_stop`][langchain_governor.errors.fatal_stop]).
    """

    stands_for: ClassVar[type[lg.FatalError]] = lg.FatalError

    def __reduce__(self) -> tuple[Any, ...]:
        # Variants are made at run time; pickle the class they stand for instead.
        return (_rebuild, (self.stands_for, dict(self.__dict__)))


_variants: dict[tuple[type[BaseException], type[BaseException]], type[BaseException] | None] = {}
_variants_lock = threading.Lock()


def _mixed(first: type[BaseException], second: type[BaseException], **attrs: Any) -> type[BaseException] | None:
    """A class deriving from both (cached), or None where Python cannot combine them
    (e.g. an ``OSError`` subclass and a plain ``Exception`` subclass: layout conflict)."""
    key = (first, second)
    with _variants_lock:
        if key not in _variants:
            own = first if first.__module__ != __name__ else second
            # A traceback prints the qualified name: never the bare name of the class it
            # mixes in ("langchain_governor.errors.RuntimeError" would read like the
            # builtin). ``own_name`` (the tool's or model's exception class) stays its
            # ``__name__``, which is what the frameworks' formatters print ("`search` failed
            # with ValueError": LangChain's tool/model error and retry middlewares).
            own_name: str | None = attrs.pop("own_name", None)
            qualname = f"Governed{own_name or own.__name__}"
            name = own_name or qualname
            body = {"__module__": __name__, "__qualname__": qualname, "__doc__": own.__doc__, **attrs}
            try:
                _variants[key] = type(name, (first, second), body)
            except Exception:
                _variants[key] = None
        return _variants[key]


def _variant(cls: type[lg.FatalError]) -> type[GovernedFatalError]:
    if cls is lg.FatalError:
        return GovernedFatalError
    variant = _mixed(cls, GovernedFatalError, stands_for=cls)
    assert variant is not None  # both derive from lg.FatalError alone
    return variant  # type: ignore[return-value]


def fatal_stop(exc: lg.FatalError) -> GovernedFatalError:
    """``exc`` as a [`GovernedFatalError`][langchain_governor.errors.GovernedFatalError] of its own class (``exc`` if it
    is one)."""
    if isinstance(exc, GovernedFatalError):
        return exc
    return _rebuild(type(exc), exc.__dict__, exc.args)


def _rebuild(
    cls: type[lg.FatalError], state: dict[str, Any], args: tuple[Any, ...] | None = None
) -> GovernedFatalError:
    variant = _variant(cls)
    stop = variant.__new__(variant)
    stop.__dict__.update(state)
    info = state.get("info")
    stop.args = args if args is not None else ((info.message,) if isinstance(info, lg.GovernedError) else ())
    return stop


class GovernedToolError(ToolException):
    """A non-fatal governed failure (transient after retries, permanent, breaker open,
    loop detected), raised out of a governed tool run inside LangGraph.

    ``str()`` and ``.message`` are the governor's model-facing JSON; ``.error`` is the
    [`loop_governor.AgentToolError`][loop_governor.errors.AgentToolError] (``.error.info`` the classification) and
    ``__cause__`` the tool's own exception, when there was one. A raised object is an
    instance of the tool exception's class too, under its name and with its attributes,
    where Python can combine the two classes (see `tool_error`), so handlers
    that match the tool's exception keep matching.

    Raised from the tool, it is a plain ``ToolException`` that climbs through every
    ``wrap_tool_call`` middleware (a ``ToolErrorMiddleware`` formats it, a
    ``ToolRetryMiddleware`` retries it). ``GovernorMiddleware`` re-raises it on its way out
    as an *answerable* copy that is also a ``ToolInvocationError``: the ToolNode's default
    error handler answers the model with ``.message``, the governor's JSON, once nothing
    further out handled it. Without the middleware a governed tool raises the answerable
    form directly, and the ToolNode answers at once.
    """

    error: lg.AgentToolError

    def __init__(self, error: lg.AgentToolError) -> None:
        self.error = error
        self.message = error.info.to_model_text()
        # ToolInvocationError's attributes, for the answerable form
        self.tool_name = error.info.tool or ""
        self.tool_kwargs: dict[str, Any] = {}
        self.source = error.__cause__
        self.filtered_errors = None
        ToolException.__init__(self, self.message)

    @property
    def info(self) -> lg.GovernedError:
        return self.error.info

    @property
    def answerable(self) -> bool:
        """Whether LangGraph's ToolNode answers the model with this error's JSON."""
        return isinstance(self, ToolInvocationError)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Variants are made at run time; a copy comes back as the plain class.
        return (GovernedToolError, (self.error,))


class _Answerable(GovernedToolError, ToolInvocationError):  # type: ignore[misc]  # attrs set as ToolInvocationError's
    """The answerable form of a GovernedToolError whose tool exception has no class of
    its own to combine with (it shows as ``GovernedToolError``)."""

    __init__ = GovernedToolError.__init__


_Answerable.__name__ = _Answerable.__qualname__ = "GovernedToolError"


def tool_error(error: lg.AgentToolError, *, answerable: bool, cause: BaseException | None = None) -> GovernedToolError:
    """``error`` as a [`GovernedToolError`][langchain_governor.errors.GovernedToolError] (answerable by a ToolNode or
    not) that is also an instance of the class of the tool's own exception (``cause``, by default the
    error's ``__cause__``) where the classes combine."""
    cause = cause if cause is not None else error.__cause__
    base: type[BaseException] = _Answerable if answerable else GovernedToolError
    cls = base
    if isinstance(cause, Exception) and not isinstance(cause, lg.AgentToolError | ToolException | GraphBubbleUp):
        own = type(cause)
        cls = _mixed(base, own, __init__=GovernedToolError.__init__, own_name=own.__name__) or base
    try:
        raised: Any = Exception.__new__(cls)
        if cls is not base and cause is not None:
            raised.__dict__.update(getattr(cause, "__dict__", {}))  # e.g. .status_code, .response
    except Exception:  # an exotic __new__ or __dict__: the plain class still carries everything
        raised = Exception.__new__(base)
    GovernedToolError.__init__(raised, error)
    result: GovernedToolError = raised
    return result


def answerable(exc: GovernedToolError) -> GovernedToolError:
    """The form of ``exc`` a ToolNode answers the model with (``exc`` if it is one)."""
    if exc.answerable:
        return exc
    return tool_error(exc.error, answerable=True, cause=exc.__cause__)


def model_error(error: lg.AgentToolError) -> lg.AgentToolError:
    """A governed model call's failure as it leaves ``create_agent``: the governor's typed
    error (``.info``; a fatal one as a [`GovernedFatalError`][langchain_governor.errors.GovernedFatalError], so
    LangGraph lets it through to the caller) that is also an instance of the model's own exception class
    where Python can combine the two -- ``except lg.FatalError`` and
    ``except openai.AuthenticationError`` both catch a revoked key, and a middleware or a
    caller matching the model's exceptions keeps matching. A stop whose model exception is
    of a class clients retry (``openai.RateLimitError`` for an exhausted quota, a 5xx)
    is not mixed with it: an ``except RateLimitError: retry`` must not retry a stopped run. The class reads
    ``Governed<ModelErrorClass>`` in a traceback (its ``__qualname__``; its ``__name__`` is
    the model error's, as formatters print it); the model's exception is its ``__cause__``. A fatal
    stop reads ``"loop-governor stopped the run: <reason>"``; another failure keeps the
    model exception's text. ``.info`` holds the governor's (redacted) classification."""
    cause = error.__cause__
    governed: lg.AgentToolError = fatal_stop(error) if isinstance(error, lg.FatalError) else error
    if not isinstance(cause, Exception) or isinstance(cause, lg.AgentToolError | GraphBubbleUp):
        return governed
    if isinstance(error, lg.FatalError) and retried_by_class(cause):
        # a stop must not be caught by ``except openai.RateLimitError: retry`` (an
        # exhausted quota is one): it keeps the provider's exception as its cause only
        governed.__cause__ = cause
        return governed
    own = type(cause)
    cls = _mixed(type(governed), own, own_name=own.__name__)
    if cls is None:
        return governed
    try:
        # the class's own __new__ (an OSError subclass has one), without its __init__
        raised: Any = cls.__new__(cls, *cause.args)
        raised.__dict__.update(getattr(cause, "__dict__", {}))  # e.g. .status_code, .response, .body
        raised.__dict__.update(governed.__dict__)  # .info, .partial_results
        # its text and body redacted: a provider echoes the key it refused ("Incorrect API
        # key provided: sk-proj-..."), and str() of this error reaches logs and reports
        raised.args = tuple(redact_obj(arg) for arg in cause.args)
        for name in ("message", "body"):
            if name in raised.__dict__:
                raised.__dict__[name] = redact_obj(raised.__dict__[name])
    except Exception:  # an exotic __new__ or __dict__: the governor's class still carries everything
        return governed
    raised.__cause__ = cause
    result: lg.AgentToolError = raised
    return result
