"""Shared fixtures for the crewAI adapter tests: offline crewAI, a scripted LLM, backends.

crewAI is switched offline at module top, before anything imports crewai: importing crewai
writes under ~/.local/share/crewai and would start telemetry otherwise.
"""

from __future__ import annotations

from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-crewai-home-")

import functools  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import lg_crewai  # noqa: E402
import pytest  # noqa: E402
from lg_crewai import CallableTool, Final, ScriptedLLM, Step, ToolStep  # noqa: E402
from lg_testing import no_asleep, no_sleep  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

import loop_governor as lg  # noqa: E402
from loop_governor.errors import _PLAIN, read_model_text  # noqa: E402


def all_text(llm: ScriptedLLM) -> str:
    """Every message content the model was shown, across all its calls."""
    return "\n".join(str(m.get("content") or "") for msgs in llm.received for m in msgs)


def governed_errors(llm: ScriptedLLM) -> list[dict[str, Any]]:
    """The governed failures found in what the model was shown (last call), in either
    rendering: the JSON bodies, or the fields of each plain "Error: ..." text."""
    found: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for m in llm.received[-1]:
        text = str(m.get("content") or "")
        start = text.find('{"error":')
        while start != -1:
            body, end = decoder.raw_decode(text, start)
            found.append(body["error"])
            start = text.find('{"error":', end)
        for match in _PLAIN.finditer(text):
            fields = read_model_text(match.group(0))
            assert fields is not None
            found.append(fields)
    return found


# -- backends that fail like HTTP services ------------------------------------------------
class HTTPStatusError(Exception):
    """Raised by the fake backends; the classifier reads ``status_code``."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass
class Backend:
    """Counts every request that reaches the service; fails with ``status`` when set."""

    status: int | None = None
    message: str = "backend error"
    fail_first: int | None = None  # fail only the first N requests (None: every one)
    hits: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, **kwargs: Any) -> str:
        with self.lock:
            self.hits.append(kwargs)
            n = len(self.hits)
        failing = self.fail_first is None or n <= self.fail_first
        if self.status is not None and failing:
            raise HTTPStatusError(self.status, f"HTTP {self.status}: {self.message}")
        return f"results for {kwargs}"

    @property
    def count(self) -> int:
        return len(self.hits)


class SearchArgs(BaseModel):
    query: str = Field(description="what to look for")


class SearchTool(CallableTool):
    """A BaseTool subclass backed by a :class:`Backend` (``SearchTool(backend)``)."""

    name: str = "search_docs"
    description: str = "Search the documentation for a query."
    args_schema: type[BaseModel] = SearchArgs


make_crew = functools.partial(
    lg_crewai.make_crew,
    role="researcher",
    goal="answer the question",
    tasks=[("Find the answer.", "the answer")],
    max_iter=12,
)


@pytest.fixture
def make_governor() -> Callable[..., lg.Governor]:
    """A governor on virtual time: retries back off without sleeping."""

    def build(**config: Any) -> lg.Governor:
        return lg.Governor(lg.GovernorConfig(**config), sleep=no_sleep, asleep=no_asleep)

    return build


@pytest.fixture
def governor(make_governor: Callable[..., lg.Governor]) -> lg.Governor:
    return make_governor()


@pytest.fixture
def events(governor: lg.Governor) -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def sink(record: dict[str, Any]) -> None:
        with lock:
            seen.append(record)

    unsubscribe = governor.subscribe(sink)
    yield seen
    unsubscribe()


@pytest.fixture(params=[True, False], ids=["native", "react"])
def native(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


class CrewKit:
    """The helpers above, handed to tests as a fixture (``--import-mode=importlib`` means
    a test module cannot ``import conftest``)."""

    ScriptedLLM = ScriptedLLM
    ToolStep = ToolStep
    Final = Final
    Backend = Backend
    SearchTool = SearchTool
    HTTPStatusError = HTTPStatusError
    make_crew = staticmethod(make_crew)
    all_text = staticmethod(all_text)
    governed_errors = staticmethod(governed_errors)

    @staticmethod
    def four_searches(answer: str = "no docs today, answering from memory") -> list[Step]:
        """The model searches four times with different queries, then answers."""
        return [ToolStep("search_docs", {"query": f"q{i}"}) for i in range(4)] + [Final(answer)]


@pytest.fixture
def kit() -> type[CrewKit]:
    return CrewKit
