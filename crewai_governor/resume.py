"""Crash-proof crewAI runs: an atomic checkpoint after every task, and a resume that skips
the finished ones.

crewAI 1.15's own checkpointing writes from a background thread with a plain
``open("w")`` (lost on a hard kill in 3 of 16 tries), and ``Crew.from_checkpoint``
rebuilds the crew from JSON, which brings back an OpenAI LLM in place of the user's own.
[`resume_crew`][crewai_governor.resume.resume_crew] does it the other way round:

* the user's crew object (or a factory building it) stays the source of truth for
  agents, LLMs and tools; only task *outputs* are checkpointed;
* every task's output is saved *synchronously* from the task callback, before the next
  task starts, through the governor's checkpoint store (temp file, fsync,
  ``os.replace``; or one SQLite transaction);
* on the next call with the same ``run_id``, finished tasks get their stored outputs
  back and are skipped, and later tasks receive those outputs as context exactly as in
  an uninterrupted run. The skip itself is crewAI's own resume path (a task before the
  start index with an ``output`` is fed to the context and not run), reached through
  ``Crew.checkpoint_kickoff_event_id``, the field ``Crew.from_checkpoint`` sets.

The checkpoint is the governor task ``run_id``: with [`crewai_governor.install`][crewai_governor.install] on
the same governor, completed *tool calls* of an interrupted task are in it too, and are
not repeated either. Outputs are stored as redacted JSON (``TaskOutput.messages`` are
not kept), so a secret in an output comes back masked.

A run that finished is recorded as such; calling [`resume_crew`][crewai_governor.resume.resume_crew] again returns the
stored outputs without running anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from crewai import Crew, Task
from crewai.crews.crew_output import CrewOutput
from crewai.tasks.output_format import OutputFormat
from crewai.tasks.task_output import TaskOutput

import loop_governor as lg
from loop_governor.adapter import CheckpointStore, TaskCheckpoint, checkpoint_store_from_url

__all__ = ["CrewResumeError", "rebind_llm", "restore_task_outputs", "resume_crew"]

_RESUME_MARK = "loop-governor-resume"


class CrewResumeError(ValueError):
    """The stored checkpoint does not belong to this crew (tasks changed since)."""


def rebind_llm(crew: Crew, llm: Any) -> Crew:
    """Give every agent of ``crew`` (and its manager LLM, if set) the user's ``llm``.

    For crews rebuilt from serialized config (``Crew.from_checkpoint``, JSON/YAML), whose
    agents came back with a default OpenAI LLM. crewAI copies ``agent.llm`` into a reused
    executor before each task, so assigning it is enough.
    """
    for agent in crew.agents:
        agent.llm = llm
    if crew.manager_llm is not None:
        crew.manager_llm = llm
    return crew


def _output_doc(index: int, task: Task, output: TaskOutput) -> dict[str, Any]:
    """What a resumed run needs of one task output, as JSON."""
    return {
        "index": index,
        "key": task.key,
        "name": output.name,
        "description": output.description,
        "expected_output": output.expected_output,
        "raw": output.raw,
        "json_dict": output.json_dict,
        "pydantic": output.pydantic.model_dump(mode="json") if output.pydantic is not None else None,
        "agent": output.agent,
        "output_format": output.output_format.value,
    }


def _task_output(task: Task, doc: Mapping[str, Any]) -> TaskOutput:
    pydantic = None
    if doc.get("pydantic") is not None and task.output_pydantic is not None:
        pydantic = task.output_pydantic.model_validate(doc["pydantic"])
    return TaskOutput(
        name=doc.get("name"),
        description=doc["description"],
        expected_output=doc.get("expected_output"),
        raw=doc.get("raw") or "",
        json_dict=doc.get("json_dict"),
        pydantic=pydantic,
        agent=doc["agent"],
        output_format=OutputFormat(doc.get("output_format", OutputFormat.RAW.value)),
    )


def restore_task_outputs(crew: Crew, results: list[Any]) -> int:
    """Put stored outputs back on ``crew``'s tasks; returns how many leading tasks are done.

    Raises [`CrewResumeError`][crewai_governor.resume.CrewResumeError] when a stored output belongs to a task that is
    not at that position any more (its description or expected output changed): resuming would
    skip the wrong work.
    """
    by_index: dict[int, Mapping[str, Any]] = {}
    for doc in results:
        if isinstance(doc, Mapping) and isinstance(doc.get("index"), int):
            by_index[doc["index"]] = doc
    for index, doc in by_index.items():
        if index >= len(crew.tasks) or crew.tasks[index].key != doc.get("key"):
            raise CrewResumeError(
                f"checkpointed output #{index} ({str(doc.get('description'))[:60]!r}) does not match "
                "the crew's task at that position; the crew changed since the checkpoint was written"
            )
    done = 0
    for index, task in enumerate(crew.tasks):
        doc = by_index.get(index)
        if doc is None:
            break
        task.output = _task_output(task, doc)
        done += 1
    return done


def _governor_for(checkpoints: lg.Governor | CheckpointStore | str) -> lg.Governor:
    if isinstance(checkpoints, lg.Governor):
        if checkpoints.checkpoints is None:
            raise ValueError(
                "the governor has no checkpoint store: pass Governor(checkpoint_store=...) "
                "or GovernorConfig(checkpoint_url=...)"
            )
        return checkpoints
    store = checkpoint_store_from_url(checkpoints) if isinstance(checkpoints, str) else checkpoints
    return lg.Governor(checkpoint_store=store)


def _checkpointing_callback(
    scope: lg.TaskScope, lock: threading.Lock, index: int, task: Task, original: Callable[[TaskOutput], Any] | None
) -> Callable[[TaskOutput], Any]:
    def on_task_done(output: TaskOutput) -> Any:
        # Durable before anything else sees the output (the user's callback, the next
        # task): a crash from here on resumes *after* this task.
        with lock:  # async_execution tasks finish on worker threads
            scope.add_result(_output_doc(index, task, output))
        return original(output) if original is not None else None

    return on_task_done


def resume_crew(
    crew: Crew | Callable[[], Crew],
    checkpoints: lg.Governor | CheckpointStore | str,
    run_id: str,
    *,
    inputs: dict[str, Any] | None = None,
    llm: Any = None,
) -> CrewOutput:
    """Run ``crew`` as the resumable run ``run_id``: first run and every resume alike.

    Args:
        crew: the crew, or a zero-argument factory returning it (preferred after a
            crash: the factory builds it with the user's own LLMs and tools).
        checkpoints: a governor with a checkpoint store (its task ``run_id`` holds the
            checkpoint), a checkpoint store, or a store URL (``sqlite:///crew.db``).
        run_id: names the run; the same id resumes it.
        inputs: kickoff inputs (interpolated into tasks as usual).
        llm: if given, re-bound to every agent first (see [`rebind_llm`][crewai_governor.resume.rebind_llm]).

    Tasks finished in an earlier run are not run again; their stored outputs are fed to
    later tasks as context and appear in the returned ``CrewOutput``. Only a leading run
    of finished tasks is skipped (with ``async_execution`` tasks finishing out of order,
    a finished task after an unfinished one runs again).
    """
    the_crew = crew if isinstance(crew, Crew) else crew()
    if the_crew.stream:
        raise ValueError("resume_crew needs a crew with stream=False (a streamed kickoff returns before it ends)")
    if llm is not None:
        rebind_llm(the_crew, llm)
    governor = _governor_for(checkpoints)
    lock = threading.Lock()
    originals = [task.callback for task in the_crew.tasks]
    # resume=True: resume_crew is the explicit resume (a finished run returns its stored
    # outputs), unlike a plain governor task, whose finished checkpoint starts over
    with governor.task(run_id, resume=True) as scope:
        done = restore_task_outputs(the_crew, list(scope.results))
        governor.emit("crew_resume", run_id=run_id, tasks=len(the_crew.tasks), skipped=done)
        for index, task in enumerate(the_crew.tasks):
            task.callback = _checkpointing_callback(scope, lock, index, task, originals[index])
        if done:
            # crewAI's own resume switch: start at the first task without an output.
            the_crew.checkpoint_kickoff_event_id = f"{_RESUME_MARK}:{run_id}"
        try:
            result = the_crew.kickoff(inputs=inputs)
        finally:
            the_crew.checkpoint_kickoff_event_id = None
            for task, original in zip(the_crew.tasks, originals, strict=True):
                task.callback = original
        assert isinstance(result, CrewOutput)  # stream=True was refused above
        governor.update_checkpoint(scope, _mark_finished)
        return result


def _mark_finished(cp: TaskCheckpoint) -> None:
    cp.metadata["status"] = "finished"
