"""The fatal stop a governed tool raises inside LangGraph.

A plain :class:`loop_governor.FatalError` raised by a tool is an ordinary exception to
LangGraph: ``ToolNode(handle_tool_errors=True)`` (common with ``create_react_agent``)
turns it into a ``ToolMessage`` and the run goes on with bad credentials. LangGraph lets
only its control-flow exceptions (``GraphBubbleUp``: interrupts, parent commands)
through every error handler, retry policy and node boundary, up to the caller of
``invoke`` / ``stream``. :class:`GovernedFatalError` is both: LangGraph passes it
through, and ``except lg.FatalError`` (or the specific class it stands for, such as
``lg.BudgetExhaustedError``) still catches it.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from langgraph.errors import GraphBubbleUp

import loop_governor as lg

__all__ = ["GovernedFatalError", "fatal_stop"]


class GovernedFatalError(lg.FatalError, GraphBubbleUp):
    """A :class:`loop_governor.FatalError` that LangGraph lets through to the caller.

    ``.info`` (and, for a budget stop, ``.partial_results``) are the original error's; the
    original is also the ``__cause__``. For a subclass of ``FatalError`` the raised object
    is an instance of that subclass too (see :func:`fatal_stop`).
    """

    stands_for: ClassVar[type[lg.FatalError]] = lg.FatalError

    def __reduce__(self) -> tuple[Any, ...]:
        # Variants are made at run time; pickle the class they stand for instead.
        return (_rebuild, (self.stands_for, dict(self.__dict__)))


_variants: dict[type[lg.FatalError], type[GovernedFatalError]] = {lg.FatalError: GovernedFatalError}
_variants_lock = threading.Lock()


def _variant(cls: type[lg.FatalError]) -> type[GovernedFatalError]:
    with _variants_lock:
        variant = _variants.get(cls)
        if variant is None:
            name = f"Governed{cls.__name__}"
            variant = type(
                name,
                (cls, GovernedFatalError),
                {"__module__": __name__, "__qualname__": name, "__doc__": cls.__doc__, "stands_for": cls},
            )
            _variants[cls] = variant
        return variant


def fatal_stop(exc: lg.FatalError) -> GovernedFatalError:
    """``exc`` as a :class:`GovernedFatalError` of its own class (``exc`` if it is one)."""
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
