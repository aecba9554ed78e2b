"""Child process for the crewAI crash test: a 3-task crew run through ``resume_crew``.

Usage: ``python crew_child.py WORKDIR [--crash-in-task-3]``. Every LLM call appends
"<class> <task>" to WORKDIR/llm_calls.log *before* answering; with ``--crash-in-task-3``
the model SIGKILLs its own process on its first call for task 3, i.e. after task 2's
checkpoint was saved and while task 3 is running. On success the final output and the
task outputs are written to WORKDIR/result.json.

Imports only what the run needs (crewAI, the adapter, the core): no pytest, no conftest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WORKDIR = Path(sys.argv[1])
CRASH = "--crash-in-task-3" in sys.argv[2:]

os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_DISABLE_TRACKING"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["HOME"] = str(WORKDIR / "home")

import json  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
from typing import Any  # noqa: E402

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402

import loop_governor as lg  # noqa: E402
from crewai_governor import resume_crew  # noqa: E402
from loop_governor.checkpoint import FileCheckpointStore  # noqa: E402

logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)
_TASK = re.compile(r"TASK-(\d)")


class UserLLM(BaseLLM):
    """The user's own LLM: answers each task from the prompt, logging every call."""

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
        # The task's own marker is in the newest "Current Task:" line; earlier outputs
        # arrive as context in the same prompt.
        current = text.rsplit("Current Task:", 1)[-1]
        task = _TASK.search(current)
        name = f"task-{task.group(1)}" if task else "unknown"
        with open(WORKDIR / "llm_calls.log", "a", encoding="utf-8") as log:
            log.write(f"{type(self).__name__} {name}\n")
            log.flush()
            os.fsync(log.fileno())
        if CRASH and name == "task-3":
            os.kill(os.getpid(), signal.SIGKILL)
        seen = sorted(set(re.findall(r"OUTPUT-(\d)", text)))
        return f"Thought: done.\nFinal Answer: OUTPUT-{name[-1]} (context saw {','.join(seen) or 'nothing'})"

    def supports_function_calling(self) -> bool:
        return False


def build_crew() -> Crew:
    agent = Agent(role="writer", goal="write", backstory="careful", llm=UserLLM(model="user-llm"), max_iter=3)
    tasks = [
        Task(description=f"TASK-{i}: write part {i}.", expected_output=f"part {i}", agent=agent) for i in (1, 2, 3)
    ]
    return Crew(agents=[agent], tasks=tasks, verbose=False)


governor = lg.Governor(checkpoint_store=FileCheckpointStore(WORKDIR / "checkpoints"))
output = resume_crew(build_crew, governor, "crew-run-1")
(WORKDIR / "result.json").write_text(
    json.dumps({"final": output.raw, "tasks": [t.raw for t in output.tasks_output]}), encoding="utf-8"
)
