"""Issue 25 in crewAI: misuse fails at construction, naming the parameter."""

from __future__ import annotations

import pytest
from crewai.tools import BaseTool

import loop_governor as lg
from crewai_governor import govern_tools, install
from loop_governor.context import ContextPruner


class Lookup(BaseTool):
    name: str = "lookup"
    description: str = "Look a city up."

    def _run(self, city: str) -> str:
        return city


def test_misuse_fails_at_construction_naming_the_parameter() -> None:
    gov = lg.Governor()
    with pytest.raises(TypeError, match=r"govern_tools: tools must be a list of tools.*pass \[tool\]"):
        govern_tools(Lookup(), gov)  # type: ignore[arg-type]
    assert len(govern_tools([Lookup()], gov)) == 1
    with pytest.raises(TypeError, match=r"governor must be a loop_governor\.Governor .*lg\.Governor\(config\)"):
        govern_tools([Lookup()], lg.GovernorConfig())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pruner must be an object with a prune"):
        install(gov, pruner=ContextPruner)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pruner_factory must be a function returning a new pruner"):
        install(gov, pruner_factory=ContextPruner())  # type: ignore[arg-type]


def test_a_tool_that_is_no_tool_fails_at_construction_naming_the_parameter() -> None:
    """Issue 35: ``govern_tools(fn, g)`` used to fail with "'function' object is not iterable"."""
    from crewai_governor import govern_tool

    gov = lg.Governor()

    def search(query: str) -> str:
        """Search the docs."""
        return query

    with pytest.raises(TypeError, match=r"^govern_tools: tools must be a list of tools, got the function search"):
        govern_tools(search, gov)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^govern_tools: tools must be a list of tools, got NoneType"):
        govern_tools(None, gov)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^tools\[0\] must be a crewAI BaseTool .*crewai\.tools\.tool.*function search"
    ):
        govern_tools([search], gov)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^tools\[1\] must be a crewAI BaseTool .*the string 'search' .*not its name"):
        govern_tools([Lookup(), "search"], gov)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^tool must be a crewAI BaseTool .*not the class"):
        govern_tool(Lookup, gov)  # type: ignore[arg-type]
