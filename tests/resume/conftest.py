"""Shared helpers for the crash/resume tests of both adapters.

The crewAI environment is set at module top, before anything imports crewai (importing
it writes under ~/.local/share/crewai and would start telemetry otherwise). The crash
tests run their agents in child processes (``agent_child.py``, ``crew_child.py``) that
are SIGKILLed mid-run and resumed in a fresh process.
"""

from __future__ import annotations

import os
import tempfile

os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_DISABLE_TRACKING"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["HOME"] = tempfile.mkdtemp(prefix="lg-resume-home-")

import logging
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from crewai.llms.base_llm import BaseLLM
from pydantic import PrivateAttr

HERE = Path(__file__).parent
CHILD_TIMEOUT_S = 120

logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)


def run_child(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``tests/resume/<script>`` in a fresh interpreter; returns the finished process."""
    return subprocess.run(
        [sys.executable, str(HERE / script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )


def assert_killed(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == -signal.SIGKILL, f"expected SIGKILL, got {proc.returncode}:\n{proc.stderr[-3000:]}"


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}"


_TASK = re.compile(r"TASK-(\d)")


class TaskLLM(BaseLLM):
    """A crewAI LLM answering each task at once (ReAct final answer), recording calls.

    The answer names the task (from the prompt's "Current Task:" part) and which earlier
    outputs the prompt carried as context, so tests can see what ran and what it saw.
    """

    fail_on: str | None = None  # "task-N": raise on every call for that task (a crash)
    _calls: list[str] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def calls(self) -> list[str]:
        return self._calls

    def supports_function_calling(self) -> bool:
        return False

    def call(
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> str:
        text = messages if isinstance(messages, str) else "\n".join(str(m.get("content") or "") for m in messages)
        task = _TASK.search(text.rsplit("Current Task:", 1)[-1])
        name = task.group(1) if task else "?"
        with self._lock:
            self._calls.append(f"task-{name}")
        if self.fail_on == f"task-{name}":
            raise RuntimeError(f"model crashed in task-{name}")
        seen = sorted(set(re.findall(r"OUTPUT-(\d)", text)))
        return f"Thought: done.\nFinal Answer: OUTPUT-{name} (context saw {','.join(seen) or 'nothing'})"


class RefusingLLM(BaseLLM):
    """Stands in for the OpenAI LLM crewAI's restore brings back: must never be called."""

    def call(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("the restored default LLM was called instead of the user's")


def make_crew(
    llm: BaseLLM,
    descriptions: tuple[str, ...] = ("TASK-1: part one.", "TASK-2: part two.", "TASK-3: part three."),
    **task_kwargs: Any,
) -> Any:
    from crewai import Agent, Crew, Task

    agent = Agent(role="writer", goal="write", backstory="careful", llm=llm, max_iter=3)
    tasks = [Task(description=d, expected_output="a part", agent=agent, **task_kwargs) for d in descriptions]
    return Crew(agents=[agent], tasks=tasks, verbose=False)


@pytest.fixture
def rs() -> SimpleNamespace:
    """The helpers above (``--import-mode=importlib``: test modules can't import conftest)."""
    return SimpleNamespace(
        run_child=run_child,
        assert_killed=assert_killed,
        assert_ok=assert_ok,
        TaskLLM=TaskLLM,
        RefusingLLM=RefusingLLM,
        make_crew=make_crew,
    )
