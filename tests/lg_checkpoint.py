"""Shared by the checkpoint tests: a growing task, and random edits of a checkpoint."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from loop_governor.checkpoint import CheckpointStore, TaskCheckpoint
from loop_governor.errors import ErrorType, GovernedError

NOT_FOUND = GovernedError(error_type=ErrorType.PERMANENT, tool="fetch", status=404, message="gone")


def grow(cp: TaskCheckpoint) -> None:
    """One governed call's worth of checkpoint: a result, a completed call, now and then an error."""
    step = cp.step + 1
    cp.record_success(f"search:{step}", {"hits": [f"doc {step}"], "n": step})
    cp.add_result({"step": step})
    if step % 5 == 0:
        cp.record_failure(f"fetch:{step}", NOT_FOUND)
    cp.metadata["last"] = step
    cp.step = step


def grown(store: CheckpointStore, steps: int, task_id: str = "t") -> TaskCheckpoint:
    """A task grown ``steps`` calls, saved after each (the first save is its snapshot)."""
    cp = TaskCheckpoint(task_id=task_id)
    for _ in range(steps):
        grow(cp)
        store.save(cp)
    return cp


def assert_grown_to(cp: TaskCheckpoint | None, steps: int) -> None:
    """``cp`` is exactly what :func:`grow` made in ``steps`` calls, in order."""
    assert cp is not None
    assert cp.step == steps and cp.version >= steps
    assert list(cp.completed) == [f"search:{i}" for i in range(1, steps + 1)]
    assert cp.results == [{"step": i} for i in range(1, steps + 1)]
    assert list(cp.known_bad) == [f"fetch:{i}" for i in range(5, steps + 1, 5)]
    assert cp.metadata == ({"last": steps} if steps else {})


KEYS = st.sampled_from(["search:1", "search:2", "fetch:1", "fetch:2", "read:1"])
VALUES = st.one_of(st.integers(-3, 3), st.text("ab ", max_size=4), st.lists(st.integers(0, 2), max_size=2))
EDIT_NAMES = (
    "success",
    "failure",
    "result",
    "set",
    "delete",
    "forget_failure",
    "replace_result",
    "append_result",
    "metadata",
    "step",
)


def edits(*extra: str) -> st.SearchStrategy[list[tuple[str, str, Any]]]:
    """Lists of ``(edit, key, value)``: the edits :func:`apply_edit` knows, plus ``extra``
    names the test handles itself (``"save"``, ``"reload"``)."""
    return st.lists(st.tuples(st.sampled_from(EDIT_NAMES + extra), KEYS, VALUES), max_size=30)


def apply_edit(cp: TaskCheckpoint, edit: str, key: str, value: Any) -> None:
    """Change ``cp`` the way code using checkpoints does: through record_* or directly."""
    if edit == "success":
        cp.record_success(key, value)
    elif edit == "failure":
        cp.record_failure(key, NOT_FOUND)
    elif edit == "result":
        cp.add_result(value)
    elif edit == "set":
        cp.completed[key] = value
    elif edit == "delete":
        cp.completed.pop(key, None)
    elif edit == "forget_failure" and key in cp.known_bad:
        del cp.known_bad[key]
    elif edit == "replace_result" and cp.results:
        cp.results[len(cp.results) // 2] = value
    elif edit == "append_result":
        cp.results.append(value)
    elif edit == "metadata":
        cp.metadata[key] = value
    elif edit == "step":
        cp.step += 1
