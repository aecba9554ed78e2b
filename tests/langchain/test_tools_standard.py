"""langchain-tests' standard tool suites run against governed tools.

The wrapper must be indistinguishable from the tool it wraps for LangChain's own
conformance tests: a plain ``@tool`` function, an async ``@tool``, a ``BaseTool``
subclass and a content-and-artifact tool.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import BaseTool, tool
from langchain_tests.integration_tests import ToolsIntegrationTests
from langchain_tests.unit_tests import ToolsUnitTests
from lg_testing import no_asleep, no_sleep
from pydantic import BaseModel, Field

import loop_governor as lg
from langchain_governor import GovernedTool, govern_tool

GOVERNOR = lg.Governor(lg.GovernorConfig(), sleep=no_sleep, asleep=no_asleep)


@tool
def city_population(city: str) -> str:
    """Look up the population of a city."""
    return f"{city}: 1,234,567"


@tool
async def city_area(city: str) -> str:
    """Look up the area of a city (async-only tool)."""
    return f"{city}: 105 km2"


class ForecastInput(BaseModel):
    city: str = Field(description="city name")
    days: int = Field(default=3, ge=1, le=10, description="how many days")


class ForecastTool(BaseTool):
    name: str = "forecast"
    description: str = "Weather forecast for a city."
    args_schema: type[BaseModel] = ForecastInput

    def _run(self, city: str, days: int = 3) -> str:
        return f"{city}: sunny for {days} days"


@tool(response_format="content_and_artifact")
def search_rows(query: str) -> tuple[str, list[dict[str, Any]]]:
    """Search a table; the rows are returned as an artifact."""
    rows = [{"id": 1, "q": query}, {"id": 2, "q": query}]
    return f"{len(rows)} rows", rows


# langchain-tests' async standard tests are plain ``async def`` (no marker) and must not
# be overridden; a class-wide asyncio mark runs them, and pytest-asyncio's notice about
# the suite's sync tests carrying that mark is expected here, so it is silenced.
def _async_standard(cls: type) -> type:
    cls.pytestmark = [  # type: ignore[attr-defined]
        pytest.mark.asyncio,
        pytest.mark.filterwarnings("ignore:The test <Function test_.*is marked with '@pytest.mark.asyncio'"),
    ]
    return cls


def test_wrapped_tools_are_governed_tools() -> None:
    for inner in (city_population, ForecastTool(), search_rows):
        assert isinstance(govern_tool(inner, GOVERNOR), GovernedTool)


class _FunctionTool:
    @property
    def tool_constructor(self) -> BaseTool:
        return govern_tool(city_population, GOVERNOR)

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"city": "Lyon"}


class _AsyncFunctionTool:
    @property
    def tool_constructor(self) -> BaseTool:
        return govern_tool(city_area, GOVERNOR)

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"city": "Lyon"}


class _SubclassTool:
    @property
    def tool_constructor(self) -> BaseTool:
        return govern_tool(ForecastTool(), GOVERNOR)

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"city": "Lyon", "days": 2}


class _ArtifactTool:
    @property
    def tool_constructor(self) -> BaseTool:
        return govern_tool(search_rows, GOVERNOR)

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {"query": "lyon"}


class TestFunctionToolUnit(_FunctionTool, ToolsUnitTests):
    pass


@_async_standard
class TestFunctionToolIntegration(_FunctionTool, ToolsIntegrationTests):
    pass


class TestAsyncFunctionToolUnit(_AsyncFunctionTool, ToolsUnitTests):
    pass


class TestSubclassToolUnit(_SubclassTool, ToolsUnitTests):
    pass


@_async_standard
class TestSubclassToolIntegration(_SubclassTool, ToolsIntegrationTests):
    pass


class TestArtifactToolUnit(_ArtifactTool, ToolsUnitTests):
    pass


@_async_standard
class TestArtifactToolIntegration(_ArtifactTool, ToolsIntegrationTests):
    pass
