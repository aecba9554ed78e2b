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


def test_a_kickoff_is_named_by_its_task_description_or_the_crews_name() -> None:
    """Issue 35: log lines and the report name a crew's task by what it was asked, not
    by the generated ``crewai-crew-<uuid>`` id."""
    from lg_crewai import Final, ScriptedLLM, make_crew

    gov = lg.Governor()
    starts: list[dict[str, object]] = []
    gov.subscribe(lambda e: starts.append(e) if e["event"] == "task_start" else None)

    def crew(name: str | None, tasks: list[tuple[str, str]]) -> object:
        llm = ScriptedLLM(model="scripted", native=True, script=[Final("done")])
        extra = {"name": name} if name else {}
        return make_crew(llm, role="r", goal="g", tasks=tasks, max_iter=3, **extra)

    long = "Read the refund policy   and\nsummarise it " + "in detail " * 20
    for built in (
        crew(None, [("What is our refund policy?", "one paragraph")]),
        crew(None, [(long, "a page"), ("Then the shipping policy", "a page")]),
        crew("weekly-report", [("What changed?", "a list")]),
    ):
        with install(gov):
            built.kickoff()  # type: ignore[attr-defined]
    names = [str(e["name"]) for e in starts]
    assert names[0] == "What is our refund policy?"
    assert names[1].startswith("Read the refund policy and summarise it in detail") and names[1].endswith(
        "… (+1 more tasks)"
    )
    assert len(names[1]) <= 80 and "\n" not in names[1]
    assert names[2] == "weekly-report"
    assert all(str(e["task_id"]).startswith("crewai-crew-") for e in starts)  # the id is unchanged
