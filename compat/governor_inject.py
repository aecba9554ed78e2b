"""pytest plugin: put the governor into LangChain's, LangGraph's and crewAI's own test suites.

Loaded by ``compat/run.py`` as ``-p governor_inject --governor-inject=MODE`` into an
unchanged upstream test suite. The patches are applied in ``pytest_configure``, before
any test module imports the framework names it uses, and every test gets a fresh
governor (breakers, budgets and known-bad memory never leak from one test to the next)
on virtual time (its retry backoff never sleeps).

Modes:

* ``lc-first`` / ``lc-last``: every ``create_agent`` gets ``GovernorMiddleware`` as the
  first (outermost) or last (innermost) middleware. Its tool hooks are on when the agent
  has client-side tools or another middleware handles tool calls, exactly as a user
  is told to configure it (``govern_tool_calls=False`` for a chat-only agent).
* ``lc-tools``: every ``create_agent`` gets its tools wrapped with ``govern_tool``
  (``raise_errors=True`` when another middleware handles tool calls, as the README says).
* ``toolnode``: every LangGraph ``ToolNode`` gets its tools wrapped with ``govern_tool``.
* ``crewai``: every crewAI agent's and task's tools are wrapped with
  ``crewai_governor.govern_tool`` when the agent or task is built.
* ``store``: every LangGraph ``InMemoryStore`` a test builds is a
  ``langchain_governor.GovernedStore`` around one (LangGraph's own BaseStore suite).
* ``memory``: every crewai-memory-core ``InMemoryBackend`` and crewAI ``LanceDBStorage``
  a test builds is a ``crewai_governor.GovernedStorage`` around one (the StorageBackend
  contract suite).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import loop_governor as lg

MODES = ("lc-first", "lc-last", "lc-tools", "toolnode", "crewai", "store", "memory")

_governor: lg.Governor | None = None


def _no_sleep(_seconds: float) -> None:
    return None


async def _no_asleep(_seconds: float) -> None:
    return None


def current_governor() -> lg.Governor:
    """The governor of the running test (one per test)."""
    global _governor
    if _governor is None:
        _governor = _new_governor()
    return _governor


def _new_governor() -> lg.Governor:
    return lg.Governor(lg.GovernorConfig(), sleep=_no_sleep, asleep=_no_asleep)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--governor-inject", choices=MODES, default=None, help="where to put the governor")


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--governor-inject")
    if mode is None:
        return
    {
        "lc-first": lambda: _patch_create_agent(position="first"),
        "lc-last": lambda: _patch_create_agent(position="last"),
        "lc-tools": lambda: _patch_create_agent(position="tools"),
        "toolnode": _patch_tool_node,
        "crewai": _patch_crewai,
        "store": _patch_store,
        "memory": _patch_memory_backends,
    }[mode]()


@pytest.fixture(autouse=True)
def _fresh_governor() -> Iterator[None]:
    global _governor
    _governor = _new_governor()
    yield
    _governor = None


# -- LangChain create_agent -------------------------------------------------------------------


def _handles_tool_calls(middleware: Any) -> bool:
    from langchain.agents.middleware import AgentMiddleware

    cls = type(middleware)
    return (
        cls.wrap_tool_call is not AgentMiddleware.wrap_tool_call
        or cls.awrap_tool_call is not AgentMiddleware.awrap_tool_call
    )


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _governed_agent_args(
    position: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    from langchain_governor import GovernorMiddleware, govern_tool

    # create_agent(model, tools=None, *, system_prompt=None, middleware=(), ...)
    args_list = list(args)
    tools_positional = "tools" not in kwargs and len(args_list) > 1
    tools = list((args_list[1] if tools_positional else kwargs.get("tools")) or [])
    middleware = list(kwargs.get("middleware") or ())
    gov = current_governor()
    if position == "tools":
        # as the README says: with middleware around the tools that may handle their
        # errors, a governed tool raises its failures to it (raise_errors=True)
        options = {"raise_errors": any(_handles_tool_calls(m) for m in middleware)}
        if not _accepts(govern_tool, "raise_errors"):
            options = {}
        governed = [t if isinstance(t, dict) else govern_tool(t, gov, **options) for t in tools]
        if tools_positional:
            args_list[1] = governed
        else:
            kwargs["tools"] = governed
        return tuple(args_list), kwargs
    client_tools = [t for t in tools if not isinstance(t, dict)]
    middleware_tools = [t for m in middleware for t in getattr(m, "tools", [])]
    tool_calls = bool(client_tools or middleware_tools or any(_handles_tool_calls(m) for m in middleware))
    # (the keyword is probed so the same plugin measures releases that predate it)
    options = {"govern_tool_calls": tool_calls} if _accepts(GovernorMiddleware, "govern_tool_calls") else {}
    governor_mw = GovernorMiddleware(gov, **options)
    kwargs["middleware"] = [governor_mw, *middleware] if position == "first" else [*middleware, governor_mw]
    return tuple(args_list), kwargs


def _patch_create_agent(position: str) -> None:
    import langchain.agents
    import langchain.agents.factory as factory

    original = factory.create_agent

    @functools.wraps(original)
    def create_agent(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _governed_agent_args(position, args, kwargs)
        return original(*args, **kwargs)

    factory.create_agent = create_agent
    langchain.agents.create_agent = create_agent


# -- LangGraph ToolNode -----------------------------------------------------------------------


def _patch_tool_node() -> None:
    from langgraph.prebuilt import tool_node

    from langchain_governor import govern_tool

    original_init: Callable[..., None] = tool_node.ToolNode.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, tools: Any, *args: Any, **kwargs: Any) -> None:
        gov = current_governor()
        governed = [t if isinstance(t, dict) else govern_tool(t, gov) for t in tools]
        original_init(self, governed, *args, **kwargs)

    tool_node.ToolNode.__init__ = __init__  # type: ignore[method-assign]


# -- crewAI -----------------------------------------------------------------------------------


def _patch_crewai() -> None:
    from crewai import Task
    from crewai.agents.agent_builder.base_agent import BaseAgent
    from crewai.tools.base_tool import BaseTool

    from crewai_governor import govern_tool

    def users_tool(tool: Any) -> bool:
        # crewAI's own tools (delegation, ask-a-coworker, memory, ...) are added by crewAI,
        # not by a user who wraps their tools; @tool functions are crewAI Tool objects
        module = type(tool).__module__
        return isinstance(tool, BaseTool) and (not module.startswith("crewai.") or module == "crewai.tools.base_tool")

    def governed(tools: Any) -> Any:
        if not tools:
            return tools
        gov = current_governor()
        return [govern_tool(t, gov) if users_tool(t) else t for t in tools]

    def wrap_init(cls: type[Any]) -> None:
        original_init = cls.__init__

        @functools.wraps(original_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            if self.tools:
                self.tools = governed(self.tools)

        cls.__init__ = __init__

    wrap_init(BaseAgent)
    wrap_init(Task)


# -- memory backends --------------------------------------------------------------------------


def _patch_store() -> None:
    import langgraph.store.memory as memory

    from langchain_governor import GovernedStore

    original = memory.InMemoryStore

    class InMemoryStore(GovernedStore):
        """``InMemoryStore(...)`` as a user who wraps it has it: governed, same arguments."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(original(*args, **kwargs), current_governor(), name="InMemoryStore")

    memory.InMemoryStore = InMemoryStore  # type: ignore[misc]


def _patch_memory_backends() -> None:
    import crewai_memory_core.testing as testing
    from crewai.memory.storage import lancedb_storage

    from crewai_governor import GovernedStorage

    def governed(original: type[Any]) -> type[Any]:
        class Governed(GovernedStorage):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(original(*args, **kwargs), current_governor(), name=original.__name__)

        Governed.__name__ = Governed.__qualname__ = original.__name__
        return Governed

    testing.InMemoryBackend = governed(testing.InMemoryBackend)  # type: ignore[misc]
    lancedb_storage.LanceDBStorage = governed(lancedb_storage.LanceDBStorage)  # type: ignore[misc]
