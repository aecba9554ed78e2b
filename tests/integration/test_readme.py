"""Every Python snippet of the README and of every docs page runs as written.

A page's snippets are executed in order in one namespace, as a reader would paste them into
one session. The only names provided are the ones the pages say are the reader's own:
a LangChain chat model (``model``) and tools (``search``, ``fetch_page``), a runnable
(``chain``), a crewAI LLM (``llm``) and tools (``search_docs``, ``crew_fetch_page``; the
README's crew calls its page tool ``fetch_page`` too), a plain function (``search_api``) --
here scripted, offline stand-ins -- and an openai SDK ``client``, the real one, talking to
the test's OpenAI-compatible server on 127.0.0.1.

A block fenced as ```` ```python {test="compile"} ```` needs something the suite does not
start (a Redis server, an OTLP collector) or shows a feature still being built: it is only
compiled. The option is documented in docs/contributing.md and does not show on the site.
Blocks in other languages (bash, toml, json) are not run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
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

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
README_MAX_BYTES = 12 * 1024
# a python fence at the start of a line, with an optional attribute list: ```python {test="compile"}
_PYTHON_BLOCK = re.compile(r"^```python(?:[ \t]+\{([^}\n]*)\})?[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_ANY_PYTHON_FENCE = re.compile(r"^[ \t]*```+[ \t]*python", re.MULTILINE)
_OPTIONS = {"": "run", 'test="compile"': "compile"}


def _snippets(path: Path) -> list[tuple[str, str]]:
    """``(mode, code)`` of every python block of ``path``; ``mode`` is "run" or "compile"."""
    text = path.read_text(encoding="utf-8")
    blocks = _PYTHON_BLOCK.findall(text)
    # every python fence is one the pattern sees: an indented block or an unknown option
    # would otherwise leave a snippet unchecked
    assert len(_ANY_PYTHON_FENCE.findall(text)) == len(blocks), f"{path.name}: a python fence the test cannot read"
    found = []
    for options, code in blocks:
        assert options.strip() in _OPTIONS, f"{path.name}: unknown fence option {{{options}}}"
        found.append((_OPTIONS[options.strip()], code))
    return found


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


def _crew_fetch_page() -> _FetchPage:
    return _FetchPage(lambda url: f"page {url}")


@pytest.fixture
def logger_restored() -> Iterator[None]:
    """The pages turn the ``loop_governor`` logger on; leave it as it was for other tests."""
    logger = logging.getLogger("loop_governor")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def _run_page(path: Path, names: dict[str, Any], upto: int | None = None) -> dict[str, Any]:
    """Run the page's snippets (the first ``upto`` of them if given) in one namespace."""
    namespace: dict[str, Any] = dict(names)
    for number, (mode, code) in enumerate(_snippets(path)[:upto], 1):
        compiled = compile(code, f"{path.name} python snippet {number}", "exec")
        if mode == "compile":
            continue
        if "crewai" in code:
            # the README's crew calls its page tool fetch_page; the LangChain snippets' one is a LangChain tool
            namespace["fetch_page"] = _crew_fetch_page()
        exec(compiled, namespace)
        if "crewai" in code:
            namespace["fetch_page"] = names["fetch_page"]
    return namespace


def _names(openai_server: OpenAIServer) -> dict[str, Any]:
    names = _readers_names()
    openai_server.set_script(["Refunds are accepted within 30 days."])
    names["client"] = openai.OpenAI(base_url=openai_server.url, api_key="sk-test-readme-0000", max_retries=0)
    names["crew_fetch_page"] = _crew_fetch_page()
    return names


def test_the_readme_is_short_and_speaks_the_users_language() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= README_MAX_BYTES
    assert "pip install -e '.[langchain]'" in text and 'pip install "loop-governor[langchain]"' in text
    # the project's internal words mean nothing to a reader
    for word in (
        "seed",
        "shared/corpus",
        "obedient",
        "stubborn",
        "calibrated",
        "known-bad",
        "Agent Lens",
        "context health",
    ):
        assert word.lower() not in text.lower(), word
    # every docs link of the README points at a page that exists
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_every_python_snippet_of_the_readme_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer, logger_restored: None
) -> None:
    monkeypatch.chdir(tmp_path)
    assert len(_snippets(README)) >= 4
    names = _names(openai_server)
    namespace = _run_page(README, names)

    # the snippets did what they say
    assert namespace["result"]["messages"][-1].content == "The docs say: rotate keys yearly."  # the agent ran
    assert namespace["answer"].raw == "Refunds within 30 days."  # the crew ran
    assert namespace["researcher"].tools[0].inner is names["search_docs"]
    assert logging.getLogger("loop_governor").isEnabledFor(logging.INFO)  # the logging paragraph


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_python_snippet_of_the_docs_runs_as_written(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer, logger_restored: None
) -> None:
    monkeypatch.chdir(tmp_path)  # snippets write trace files, SQLite databases
    namespace = _run_page(page, _names(openai_server))
    if page.name == "getting-started.md":
        assert namespace["page"] == "results for refund policy"  # the plain governed call
        assert namespace["reply"].choices[0].message.content == "Refunds are accepted within 30 days."
        assert openai_server.count() == 1  # the governed model call: one request
        assert namespace["answer"].raw == "Refunds within 30 days."
    if page.name == "tracing.md":
        assert namespace["prompt"]  # the rebuilt prompt of the first model call
    if page.name == "checkpoints.md":
        assert (tmp_path / "checkpoints.db").stat().st_size > 0


def test_the_docs_have_python_snippets_and_each_runs_or_compiles() -> None:
    counts = {page.name: [mode for mode, _ in _snippets(page)] for page in DOCS}
    assert sum(len(modes) for modes in counts.values()) >= 20
    # most of what the site shows runs; compile-only is the exception
    compiled = sum(modes.count("compile") for modes in counts.values())
    assert compiled * 4 <= sum(len(modes) for modes in counts.values()), counts


def test_the_readmes_stop_snippet_catches_a_run_the_governor_stops(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
    logger_restored: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The "When the governor stops a run" snippet, with a model that repeats a failing call
    whatever it reads: the stop arrives as the FatalError the snippet catches, with its code."""
    monkeypatch.chdir(tmp_path)
    names = _names(openai_server)
    calls: list[str] = []

    @tool
    def search(query: str) -> str:
        """Search the docs."""
        calls.append(query)
        raise FileNotFoundError("HTTP 404: no document named refunds-2019.pdf")

    def script(messages: list[BaseMessage]) -> AIMessage:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        call = {"name": "search", "args": {"query": "refunds-2019"}, "id": f"call_{turn}", "type": "tool_call"}
        return AIMessage(content="", tool_calls=[call])

    snippets = _snippets(README)
    stop_block = next(i for i, (_, code) in enumerate(snippets) if "except lg.FatalError as stop" in code)
    namespace = _run_page(README, names, upto=stop_block)  # the snippets before it, as written
    # the quickstart's agent, built as the quickstart builds it, on the looping model and the failing tool
    from langchain.agents import create_agent

    from langchain_governor import GovernorMiddleware

    namespace["agent"] = create_agent(
        ScriptedChatModel(script=script), tools=[search], middleware=[GovernorMiddleware(namespace["governor"])]
    )
    exec(compile(snippets[stop_block][1], "README.md stop snippet", "exec"), namespace)

    printed = capsys.readouterr().out.splitlines()
    assert printed[-1] == "repeated_failure"  # print(stop.info.code)
    assert "search" in printed[-2]  # print(stop): the reason names the tool
    assert isinstance(namespace["kept"], list)  # stop.partial_results
    assert len(calls) == 1  # the repeats were answered from memory, then the run was stopped
