"""Shared helpers for the crash/resume tests of both adapters.

crewAI is switched offline at module top, before anything imports crewai (importing it
writes under ~/.local/share/crewai and would start telemetry otherwise). The crash tests
run their agents in child processes (``agent_child.py``, ``crew_child.py``) that are
SIGKILLed mid-run and resumed in a fresh process.
"""

from __future__ import annotations

from lg_crewai_env import offline_crewai

offline_crewai(prefix="lg-resume-home-")

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import lg_crewai  # noqa: E402
import pytest  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from lg_crewai import TaskAnswerLLM  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

HERE = Path(__file__).parent
CHILD_TIMEOUT_S = 120


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


class TaskLLM(TaskAnswerLLM):
    """Answers each task at once (see ``lg_crewai.TaskAnswerLLM``), recording the calls."""

    fail_on: str | None = None  # "task-N": raise on every call for that task (a crash)
    _calls: list[str] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def calls(self) -> list[str]:
        return self._calls

    def on_task(self, task: str) -> None:
        with self._lock:
            self._calls.append(task)
        if self.fail_on == task:
            raise RuntimeError(f"model crashed in {task}")


class RefusingLLM(BaseLLM):
    """Stands in for the OpenAI LLM crewAI's restore brings back: must never be called."""

    def call(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("the restored default LLM was called instead of the user's")


def make_crew(
    llm: BaseLLM,
    descriptions: tuple[str, ...] = ("TASK-1: part one.", "TASK-2: part two.", "TASK-3: part three."),
    **task_kwargs: Any,
) -> Any:
    return lg_crewai.make_crew(
        llm,
        role="writer",
        goal="write",
        tasks=[(d, "a part") for d in descriptions],
        max_iter=3,
        task_kwargs=task_kwargs,
    )


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
