"""crewAI: a per-task atomic checkpoint and a resume that skips finished tasks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import loop_governor as lg
from crewai_governor import CrewResumeError, resume_crew
from loop_governor.checkpoint import FileCheckpointStore


def test_sigkill_after_task_two_resumes_with_task_three_only(tmp_path: Path, rs: SimpleNamespace) -> None:
    rs.assert_killed(rs.run_child("crew_child.py", tmp_path, "--crash-in-task-3"))
    calls_log = tmp_path / "llm_calls.log"
    assert calls_log.read_text().splitlines() == ["UserLLM task-1", "UserLLM task-2", "UserLLM task-3"]
    assert not (tmp_path / "result.json").exists()

    rs.assert_ok(rs.run_child("crew_child.py", tmp_path))

    # Tasks 1-2 did not run again; task 3 ran once more, on the user's own LLM class.
    assert calls_log.read_text().splitlines()[3:] == ["UserLLM task-3"]
    result = json.loads((tmp_path / "result.json").read_text())
    # Task 3 was given the stored outputs of tasks 1 and 2 as context.
    assert result["final"] == "OUTPUT-3 (context saw 1,2)"
    assert result["tasks"] == ["OUTPUT-1 (context saw nothing)", "OUTPUT-2 (context saw 1)", result["final"]]


def test_finished_run_returns_stored_outputs_without_calling_the_llm(tmp_path: Path, rs: SimpleNamespace) -> None:
    store = FileCheckpointStore(tmp_path)
    first_llm = rs.TaskLLM(model="user")
    first = resume_crew(rs.make_crew(first_llm), store, "run")
    assert first_llm.calls == ["task-1", "task-2", "task-3"]

    again_llm = rs.TaskLLM(model="user")
    again = resume_crew(lambda: rs.make_crew(again_llm), store, "run")
    assert again_llm.calls == []
    assert again.raw == first.raw == "OUTPUT-3 (context saw 1,2)"
    assert [t.raw for t in again.tasks_output] == [t.raw for t in first.tasks_output]
    stored = store.load("run")
    assert stored is not None and stored.metadata["status"] == "finished"


def test_failed_run_resumes_after_last_finished_task_on_the_users_llm(tmp_path: Path, rs: SimpleNamespace) -> None:
    store = FileCheckpointStore(tmp_path)
    crashing = rs.TaskLLM(model="user", fail_on="task-2")
    with pytest.raises(Exception, match="model crashed in task-2"):
        resume_crew(rs.make_crew(crashing), store, "run")
    assert crashing.calls[0] == "task-1"
    # The crew comes back with a default LLM (as from crewAI's own restore);
    # llm= puts the user's own back on every agent.
    user_llm = rs.TaskLLM(model="user")
    out = resume_crew(rs.make_crew(rs.RefusingLLM(model="gpt-4o")), store, "run", llm=user_llm)
    assert user_llm.calls == ["task-2", "task-3"]
    assert out.raw == "OUTPUT-3 (context saw 1,2)"
    assert [t.raw for t in out.tasks_output][:2] == ["OUTPUT-1 (context saw nothing)", "OUTPUT-2 (context saw 1)"]


def test_changed_crew_is_refused_not_resumed(tmp_path: Path, rs: SimpleNamespace) -> None:
    store = FileCheckpointStore(tmp_path)
    resume_crew(rs.make_crew(rs.TaskLLM(model="user")), store, "run")
    llm = rs.TaskLLM(model="user")
    changed = rs.make_crew(llm, ("TASK-1: part one.", "TASK-2: something else.", "TASK-3: part three."))
    with pytest.raises(CrewResumeError, match="#1"):
        resume_crew(changed, store, "run")
    assert llm.calls == []


def test_user_callbacks_run_once_per_task_and_are_restored(tmp_path: Path, rs: SimpleNamespace) -> None:
    seen_task: list[str] = []
    seen_crew: list[str] = []

    def on_task(output: Any) -> None:
        seen_task.append(output.raw)

    crew = rs.make_crew(rs.TaskLLM(model="user"))
    crew.tasks[0].callback = on_task
    crew.task_callback = lambda output: seen_crew.append(output.raw)
    governor = lg.Governor(checkpoint_store=FileCheckpointStore(tmp_path))
    resume_crew(crew, governor, "run")
    assert seen_task == ["OUTPUT-1 (context saw nothing)"]
    assert len(seen_crew) == 3
    assert crew.tasks[0].callback is on_task
    assert crew.checkpoint_kickoff_event_id is None


def test_governor_without_checkpoint_store_is_refused(rs: SimpleNamespace) -> None:
    with pytest.raises(ValueError, match="checkpoint store"):
        resume_crew(rs.make_crew(rs.TaskLLM(model="user")), lg.Governor(), "run")
