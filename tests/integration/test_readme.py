"""Every Python snippet of the README runs as written.

The snippets are executed in order in one namespace, as a reader would paste them into
one session. The only names provided are the ones the README says are the reader's own:
a LangChain chat model (``model``) and tools (``search``, ``fetch_page``), a runnable
(``chain``), a crewAI LLM (``llm``) and tools (``search_docs``, ``fetch_page`` for the crew),
a plain function (``search_api``) -- here scripted, offline stand-ins -- and an openai SDK
``client``, the real one, talking to the test's OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import openai
import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import tool
from lg_crewai import CallableTool, Final, ScriptedLLM, ToolStep
from lg_langchain import ScriptedChatModel
from lg_openai_server import OpenAIServer
from pydantic import BaseModel, Field

README = Path(__file__).resolve().parents[2] / "README.md"
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _snippets() -> list[str]:
    return _PYTHON_BLOCK.findall(README.read_text(encoding="utf-8"))


class _Query(BaseModel):
    query: str = Field(description="what to look for")


class _Url(BaseModel):
    url: str = Field(description="the page")


class _SearchDocs(CallableTool):
    name: str = "search_docs"
    description: str = "Search the documentation."
    args_schema: type[BaseModel] = _Query


class _FetchPage(CallableTool):
    name: str = "fetch_page"
    description: str = "Fetch a page."
    args_schema: type[BaseModel] = _Url


def _langchain_model() -> ScriptedChatModel:
    def script(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return AIMessage(content="The docs say: rotate keys yearly.")
        call = {"name": "search", "args": {"query": "docs"}, "id": "call_1", "type": "tool_call"}
        return AIMessage(content="", tool_calls=[call])

    return ScriptedChatModel(script=script)


def _readers_names() -> dict[str, Any]:
    @tool
    def search(query: str) -> str:
        """Search the docs."""
        return f"results for {query}"

    @tool
    def fetch_page(url: str) -> str:
        """Fetch a page."""
        return f"page {url}"

    llm = ScriptedLLM(
        model="scripted",
        native=True,
        script=[ToolStep("search_docs", {"query": "refund policy"}), Final("Refunds within 30 days.")],
    )
    return {
        "model": _langchain_model(),
        "search": search,
        "fetch_page": fetch_page,
        "chain": ChatPromptTemplate.from_messages([("user", "{q}")]) | _langchain_model(),
        "llm": llm,
        "search_docs": _SearchDocs(lambda query: f"results for {query}"),
        "search_api": lambda query: f"results for {query}",
    }


def test_every_python_snippet_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    monkeypatch.chdir(tmp_path)  # the tracing snippet writes trace.jsonl
    snippets = _snippets()
    assert len(snippets) >= 5
    names = _readers_names()
    openai_server.set_script(["Refunds are accepted within 30 days."])
    names["client"] = openai.OpenAI(base_url=openai_server.url, api_key="sk-test-readme-0000", max_retries=0)
    namespace: dict[str, Any] = dict(names)
    for number, code in enumerate(snippets, 1):
        if "crewai" in code:
            # the crew's own fetch_page is a crewAI tool (the LangChain one stays the LangChain snippets')
            namespace["fetch_page"] = _FetchPage(lambda url: f"page {url}")
        exec(compile(code, f"README.md python snippet {number}", "exec"), namespace)
        if "crewai" in code:
            namespace["fetch_page"] = names["fetch_page"]

    # the snippets did what they say
    assert namespace["result"].raw == "Refunds within 30 days."  # the crew ran
    assert namespace["agent"].tools[0].inner is names["search_docs"]
    assert namespace["page"] == "results for refund policy"  # the plain governed call
    assert namespace["reply"].choices[0].message.content == "Refunds are accepted within 30 days."
    assert openai_server.count() == 1  # the governed model call
    assert (tmp_path / "trace.jsonl").stat().st_size > 0  # the callback's trace, flushed
