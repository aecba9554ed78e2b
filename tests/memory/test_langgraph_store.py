"""langchain_governor.GovernedStore: a LangGraph BaseStore with each filter, a backend that
fails once and recovers, and a create_agent agent whose tools write to store=GovernedStore(...)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.store.base import BaseStore, GetOp, PutOp
from langgraph.store.memory import InMemoryStore
from lg_langchain import ScriptedChatModel, tool_call
from lg_testing import governed

import loop_governor as lg
from langchain_governor import GovernedStore, GovernorMiddleware

NS = ("users", "u1")


def test_it_is_a_base_store(governor: lg.Governor) -> None:
    inner = InMemoryStore()
    store = GovernedStore(inner, governor)
    assert isinstance(store, BaseStore)
    assert store.guard.tool == "memory:InMemoryStore"
    with pytest.raises(TypeError, match="inner"):
        GovernedStore({}, governor)  # type: ignore[arg-type]


def test_failures_stay_out(governor: lg.Governor, events: list[dict[str, Any]], mk: Any, make_store: Any) -> None:
    inner = make_store()
    store = GovernedStore(inner, governor)

    store.put(NS, "a", {"result": mk.GOVERNED_JSON})
    store.put(NS, "b", {"text": mk.TRACEBACK})
    store.put(NS, "c", {"content": "looked fine", "status": "error"})  # a job record: kept
    store.put(NS, "d", {"text": "prefers metric units"})

    assert inner.faults.calls == 2  # the dropped puts never reached the backend
    assert {i.key: i.value for ns in inner.list_namespaces() for i in inner.search(ns)} == {
        "c": {"content": "looked fine", "status": "error"},
        "d": {"text": "prefers metric units"},
    }
    assert [e["reason"] for e in mk.named(events, "memory_dropped")] == ["governed_error", "traceback"]


def test_secrets_blobs_and_size(governor: lg.Governor, mk: Any) -> None:
    inner = InMemoryStore()
    store = GovernedStore(inner, governor)

    store.put(NS, "k", {"password": "hunter2", "note": f"token sk-live {mk.SECRET}", "n": 3})
    store.put(NS, "img", {"shot": "data:image/jpeg;base64," + "/9j/4AAQSkZJRgABAQ" * 100})
    store.put(NS, "log", {"log": "start " + "." * 8000 + " end"})

    assert inner.get(NS, "k").value == {"password": "[REDACTED]", "note": "token sk-live [REDACTED]", "n": 3}
    assert inner.get(NS, "img").value["shot"].startswith("[image/jpeg data removed:")
    log = inner.get(NS, "log").value["log"]
    assert log.startswith("start ") and log.endswith(" end") and "chars trimmed" in log


def test_every_put_is_stored_under_its_own_key(governor: lg.Governor, events: list[dict[str, Any]], mk: Any) -> None:
    inner = InMemoryStore()
    store = GovernedStore(inner, governor)

    store.put(NS, "first", {"fact": "order 1001 shipped on 2026-11-29"})
    store.put(NS, "second", {"fact": "order 1002 shipped on 2026-11-30"})
    store.put(NS, "third", {"fact": "order 1001 shipped on 2026-11-29"})

    assert {i.key: i.value["fact"] for i in inner.search(NS)} == {
        "first": "order 1001 shipped on 2026-11-29",
        "second": "order 1002 shipped on 2026-11-30",
        "third": "order 1001 shipped on 2026-11-29",
    }
    (repeat,) = mk.named(events, "memory_repeat")
    assert (repeat["key"], repeat["same_as"], repeat["scope"]) == ("third", "first", "users/u1")
    store.delete(NS, "first")
    store.delete(NS, "third")
    store.put(NS, "fourth", {"fact": "order 1001 shipped on 2026-11-29"})
    assert inner.get(NS, "fourth") is not None and store.stats["repeats"] == 1  # no longer a repeat


def test_reads_pass_through_untouched(governor: lg.Governor, mk: Any) -> None:
    inner = InMemoryStore()
    inner.put(NS, "raw", {"text": "written behind the wrapper", "status": "error"})
    store = GovernedStore(inner, governor)

    item = store.get(NS, "raw")
    assert item is not None and item.value == {"text": "written behind the wrapper", "status": "error"}
    assert [i.key for i in store.search(NS)] == ["raw"]
    assert store.list_namespaces() == [NS]
    # a mixed batch: the dropped put answers None, the get its item
    results = store.batch([PutOp(NS, "x", {"log": mk.TRACEBACK}), GetOp(NS, "raw")])
    assert results[0] is None and results[1].key == "raw"


def test_backend_fails_once_then_recovers(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any, make_store: Any
) -> None:
    inner = make_store()
    inner.faults.queue = [mk.HTTPError(503, "postgres: connection reset")]
    store = GovernedStore(inner, governor)

    store.put(NS, "k", {"text": "kept"})

    assert inner.faults.calls == 2
    assert store.get(NS, "k").value == {"text": "kept"}
    assert not mk.named(events, "memory_save_failed")


def test_a_put_that_keeps_failing_degrades_a_read_raises(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any, make_store: Any
) -> None:
    inner = make_store()
    inner.faults.forever = mk.HTTPError(503, "store down")
    store = GovernedStore(inner, governor)

    store.put(NS, "k", {"text": "lost, but the agent goes on"})

    (failed,) = mk.named(events, "memory_save_failed")
    assert failed["tool"] == "memory:FlakyStore" and failed["error_type"] == "transient"
    with pytest.raises(lg.TransientError):
        store.get(NS, "k")


def test_async_twins(governor: lg.Governor, mk: Any, make_store: Any) -> None:
    inner = make_store()
    inner.faults.queue = [mk.HTTPError(503, "blip")]
    store = GovernedStore(inner, governor)

    async def main() -> Any:
        await store.aput(NS, "a", {"text": f"secret=hunter2 and {mk.GOVERNED_JSON}"})
        await store.aput(NS, "b", {"text": "key 7 works"})
        await store.aput(NS, "c", {"text": "key 8 works"})
        return [i.value for i in await store.asearch(NS)], await store.aget(NS, "b")

    values, item = asyncio.run(main())
    assert values == [{"text": "key 7 works"}, {"text": "key 8 works"}] and item.value == {"text": "key 7 works"}


# -- a create_agent agent with a governed store -------------------------------------------------


def _script(messages: list[BaseMessage]) -> AIMessage:
    """Search (it fails), write the search result to memory (poisoned), write a real
    preference, answer. The turn is read from the tool results so far."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return tool_call("search_docs", {"query": "units"}, "c0")
    if len(results) == 1:
        return tool_call("remember", {"fact": f"search_docs said {results[0].content}"}, "c1")
    if len(results) == 2:
        return tool_call("remember", {"fact": "user prefers metric units"}, "c2")
    return AIMessage(content="noted")


def _agent(store: BaseStore, governor: lg.Governor, mk: Any) -> Any:
    @tool
    def search_docs(query: str) -> str:
        """Search the documentation."""
        raise mk.HTTPError(404, f"no docs for {query}")

    @tool
    def remember(fact: str, runtime: ToolRuntime) -> str:
        """Save a fact about the user to long-term memory."""
        assert runtime.store is not None
        runtime.store.put(("memories", "u1"), uuid.uuid4().hex, {"fact": fact})
        return "saved"

    model = ScriptedChatModel(script=_script)
    return create_agent(model, [search_docs, remember], middleware=[GovernorMiddleware(governor)], store=store)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_create_agent_with_a_governed_store(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any, mode: str
) -> None:
    inner = InMemoryStore()
    agent = _agent(GovernedStore(inner, governor), governor, mk)
    payload = {"messages": [("user", "remember my units")]}

    result = agent.invoke(payload) if mode == "sync" else asyncio.run(agent.ainvoke(payload))

    assert result["messages"][-1].content == "noted"
    failed = [m for m in result["messages"] if isinstance(m, ToolMessage) and m.status == "error"]
    assert "no docs for units" in governed(failed[0].content)["message"]  # the model saw the failure...
    stored = [i.value for i in inner.search(("memories", "u1"))]
    assert stored == [{"fact": "user prefers metric units"}]  # ...but memory never did
    assert [e["reason"] for e in mk.named(events, "memory_dropped")] == ["governed_error"]


def test_create_agent_with_a_bare_store_remembers_the_failure(governor: lg.Governor, mk: Any) -> None:
    """The same agent without the wrapper: the governor's error lands in long-term memory."""
    inner = InMemoryStore()
    _agent(inner, governor, mk).invoke({"messages": [("user", "remember my units")]})

    facts = [i.value["fact"] for i in inner.search(("memories", "u1"))]
    assert len(facts) == 2 and any("Permanent failure: " in f for f in facts)


def test_an_agent_whose_store_is_down_completes(
    governor: lg.Governor, events: list[dict[str, Any]], mk: Any, make_store: Any
) -> None:
    inner = make_store()
    inner.faults.forever = mk.HTTPError(503, "store unavailable")

    result = _agent(GovernedStore(inner, governor), governor, mk).invoke({"messages": [("user", "remember")]})

    assert result["messages"][-1].content == "noted"
    saved = [m.content for m in result["messages"] if isinstance(m, ToolMessage) and m.name == "remember"]
    assert saved == ["saved", "saved"]  # the tool's put did not raise: the write degraded
    assert len(mk.named(events, "memory_save_failed")) == 1  # the poisoned put never tried the store
