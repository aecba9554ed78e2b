"""A real crewAI crew with memory=Memory(storage=GovernedStorage(LanceDBStorage(...))) and a
local embedder stand-in: a failed tool's result never reaches the store, a good one does."""

from __future__ import annotations

from typing import Any

import lg_crewai
from crewai.llms.base_llm import BaseLLM
from crewai.memory.storage.lancedb_storage import LanceDBStorage
from crewai.memory.unified_memory import Memory
from lg_crewai import CallableTool, Final, ScriptedLLM, ToolStep
from pydantic import BaseModel, Field

import loop_governor as lg
from crewai_governor import GovernedStorage, govern_tool, install


class OfflineLLM(BaseLLM):
    """The memory's own LLM (extraction, analysis) when there is none: crewAI falls back to
    storing the task's full text with default scope and importance, as it does on any LLM
    failure -- which is exactly when a failed tool's output would be stored verbatim."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("no model offline")

    def supports_function_calling(self) -> bool:
        return True


class SearchArgs(BaseModel):
    query: str = Field(description="what to look for")


class SearchTool(CallableTool):
    name: str = "search_docs"
    description: str = "Search the documentation for a query."
    args_schema: type[BaseModel] = SearchArgs


def _answer_with_last_result(messages: list[dict[str, Any]], turn: int) -> Any:
    """Search once, then answer with what the search returned (as a model relaying it would)."""
    if turn == 0:
        again = any("again" in str(m.get("content")) for m in messages)
        return ToolStep("search_docs", {"query": "units, second try" if again else "units"})
    last = next(m for m in reversed(messages) if m.get("role") == "tool")
    return Final(f"The search returned: {last['content']}")


def _crew(memory: Memory, governor: lg.Governor, mk: Any) -> tuple[Any, list[str]]:
    calls: list[str] = []

    def search(query: str) -> str:
        calls.append(query)
        if len(calls) == 1:
            raise mk.HTTPError(404, f"HTTP 404: no page for {query}")
        return "metric units are the default"

    llm = ScriptedLLM(model="scripted", native=True, script=_answer_with_last_result)
    crew = lg_crewai.make_crew(
        llm,
        [govern_tool(SearchTool(search), governor)],
        role="researcher",
        goal="answer the question",
        tasks=[("Look up the units (first try).", "the units"), ("Look up the units again.", "the units")],
        max_iter=4,
        memory=memory,
    )
    return crew, calls


def _memory(storage: Any, mk: Any) -> Memory:
    return Memory(storage=storage, embedder=mk.hash_embedder, llm=OfflineLLM(model="offline"))


def test_a_failed_tool_result_never_reaches_the_store(
    tmp_path: Any, governor: lg.Governor, events: list[dict[str, Any]], mk: Any
) -> None:
    lance = LanceDBStorage(path=str(tmp_path / "lance"))
    memory = _memory(GovernedStorage(lance, governor), mk)
    crew, calls = _crew(memory, governor, mk)

    with install(governor):
        out = crew.kickoff()
    memory.drain_writes()

    assert len(calls) == 2
    assert "Permanent failure: " in out.tasks_output[0].raw  # the crew did relay the failure
    stored = [r.content for r in lance.list_records()]
    assert len(stored) == 1 and "metric units are the default" in stored[0]
    assert not any("Permanent failure" in s for s in stored)
    assert [e["reason"] for e in mk.named(events, "memory_dropped")] == ["governed_error"]
    memory.close()


def test_the_same_crew_without_the_wrapper_stores_the_failure(tmp_path: Any, governor: lg.Governor, mk: Any) -> None:
    lance = LanceDBStorage(path=str(tmp_path / "lance"))
    memory = _memory(lance, mk)
    crew, _ = _crew(memory, governor, mk)

    with install(governor):
        crew.kickoff()
    memory.drain_writes()

    stored = [r.content for r in lance.list_records()]
    assert len(stored) == 2 and any("Permanent failure: " in s for s in stored)
    memory.close()


def test_a_crew_whose_memory_backend_refuses_writes_completes(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any
) -> None:
    """A store that reads but cannot write (a read-only replica, a full disk): crewAI's
    save flow reads it, then the write fails, is retried, and degrades to an event."""
    storage = mk.DictStorage()
    writes: list[int] = []

    def refuse(_records: Any) -> None:
        writes.append(1)
        raise mk.HTTPError(503, "vector db is read-only")

    storage.save = refuse
    memory = _memory(GovernedStorage(storage, governor), mk)
    crew, _ = _crew(memory, governor, mk)

    with install(governor):
        out = crew.kickoff()
    memory.drain_writes()

    assert len(out.tasks_output) == 2 and "metric units" in out.tasks_output[1].raw
    assert storage.records == {} and len(writes) == governor.config.retry_max_attempts
    (failed,) = mk.named(events, "memory_save_failed")
    assert failed["tool"] == "memory:DictStorage" and failed["error_type"] == "transient"


def test_a_crew_whose_memory_backend_is_down_completes(governor: lg.Governor, mk: Any) -> None:
    """Reads fail too: crewAI's save flow gets the typed error from its first read and drops
    the save on its own; the crew is not affected."""
    storage = mk.DictStorage()
    storage.faults.forever = mk.HTTPError(503, "vector db unavailable")
    memory = _memory(GovernedStorage(storage, governor), mk)
    crew, _ = _crew(memory, governor, mk)

    with install(governor):
        out = crew.kickoff()
    memory.drain_writes()

    assert len(out.tasks_output) == 2 and "metric units" in out.tasks_output[1].raw
    assert storage.records == {}
    assert governor.breaker_state("memory:DictStorage").value == "open"
