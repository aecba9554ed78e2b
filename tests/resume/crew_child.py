"""Child process for the crewAI crash test: a 3-task crew run through ``resume_crew``.

Usage: ``python crew_child.py WORKDIR [--crash-in-task-3]``. Every LLM call appends
"<class> <task>" to WORKDIR/llm_calls.log *before* answering; with ``--crash-in-task-3``
the model SIGKILLs its own process on its first call for task 3, i.e. after task 2's
checkpoint was saved and while task 3 is running. On success the final output and the
task outputs are written to WORKDIR/result.json.

Imports only what the run needs (crewAI, the adapter, the core, the crewAI test helpers
from ``tests/``): no pytest, no conftest.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the lg_* helpers

from lg_crewai_env import offline_crewai

WORKDIR = Path(sys.argv[1])
CRASH = "--crash-in-task-3" in sys.argv[2:]
offline_crewai(WORKDIR / "home")

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

from crewai import Crew  # noqa: E402
from lg_crewai import TaskAnswerLLM, make_crew  # noqa: E402

import loop_governor as lg  # noqa: E402
from crewai_governor import resume_crew  # noqa: E402
from loop_governor.checkpoint import FileCheckpointStore  # noqa: E402


class UserLLM(TaskAnswerLLM):
    """The user's own LLM: answers each task from the prompt, logging every call."""

    def on_task(self, task: str) -> None:
        with open(WORKDIR / "llm_calls.log", "a", encoding="utf-8") as log:
            log.write(f"{type(self).__name__} {task}\n")
            log.flush()
            os.fsync(log.fileno())
        if CRASH and task == "task-3":
            os.kill(os.getpid(), signal.SIGKILL)


def build_crew() -> Crew:
    tasks = [(f"TASK-{i}: write part {i}.", f"part {i}") for i in (1, 2, 3)]
    return make_crew(UserLLM(model="user-llm"), role="writer", goal="write", tasks=tasks, max_iter=3)


governor = lg.Governor(checkpoint_store=FileCheckpointStore(WORKDIR / "checkpoints"))
output = resume_crew(build_crew, governor, "crew-run-1")
(WORKDIR / "result.json").write_text(
    json.dumps({"final": output.raw, "tasks": [t.raw for t in output.tasks_output]}), encoding="utf-8"
)
