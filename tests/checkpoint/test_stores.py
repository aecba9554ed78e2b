"""The rules every checkpoint store follows (memory, file, SQLite, Redis alike)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from loop_governor.checkpoint import (
    CheckpointConflictError,
    CheckpointSchemaError,
    CheckpointStore,
    TaskCheckpoint,
)
from loop_governor.errors import ErrorType, GovernedError

StoreFactory = Callable[[], CheckpointStore]

HOSTILE_IDS = ["../x", "/etc/passwd", "a/b\\c", "..", ".", "nul\x00byte", "Task", "task", "тест 😀", "x" * 600]


def _populated(task_id: str = "task-1") -> TaskCheckpoint:
    cp = TaskCheckpoint(task_id=task_id, step=3, metadata={"agent": "a", "n": 1.5})
    cp.record_success('search:{"q":"x"}', {"hits": ["a", "b"], "n": 2})
    cp.record_success("noop:{}", None)
    cp.record_failure(
        'fetch:{"u":1}', GovernedError(error_type=ErrorType.PERMANENT, tool="fetch", status=404, message="gone")
    )
    cp.add_result({"sub": 1})
    return cp


def _content(cp: TaskCheckpoint) -> dict[str, object]:
    return cp.model_dump(exclude={"version", "updated_at"})


def test_missing_task_loads_as_none(store: CheckpointStore) -> None:
    assert store.load("never-saved") is None


def test_save_then_load_round_trips_everything(store: CheckpointStore) -> None:
    cp = _populated()
    assert store.save(cp) == 1
    loaded = store.load("task-1")
    assert loaded is not None
    assert _content(loaded) == _content(cp)
    assert loaded.version == cp.version == 1
    assert loaded.updated_at == cp.updated_at is not None
    assert loaded.get_failure('fetch:{"u":1}') == cp.get_failure('fetch:{"u":1}')


def test_each_save_bumps_the_version(store: CheckpointStore) -> None:
    cp = TaskCheckpoint(task_id="t")
    assert [store.save(cp) for _ in range(3)] == [1, 2, 3]
    loaded = store.load("t")
    assert loaded is not None and loaded.version == 3


def test_second_writer_with_a_stale_copy_gets_a_conflict(make_store: StoreFactory) -> None:
    store_a, store_b = make_store(), make_store()
    store_a.save(TaskCheckpoint(task_id="t"))
    a, b = store_a.load("t"), store_b.load("t")
    assert a is not None and b is not None
    a.add_result("from a")
    store_a.save(a)
    b.add_result("from b")
    with pytest.raises(CheckpointConflictError) as info:
        store_b.save(b)
    assert (info.value.expected, info.value.found) == (1, 2)
    assert b.version == 1  # a failed save changes nothing
    loaded = store_b.load("t")
    assert loaded is not None and loaded.results == ["from a"]


def test_fresh_checkpoint_does_not_overwrite_a_stored_one(store: CheckpointStore) -> None:
    store.save(_populated("t"))
    with pytest.raises(CheckpointConflictError):
        store.save(TaskCheckpoint(task_id="t"))
    loaded = store.load("t")
    assert loaded is not None and loaded.step == 3


def test_force_overwrites_and_stays_ahead(store: CheckpointStore) -> None:
    store.save(_populated("t"))
    fresh = TaskCheckpoint(task_id="t")
    version = store.save(fresh, force=True)
    loaded = store.load("t")
    assert loaded is not None and loaded.step == 0 and loaded.version == version == 2


@pytest.mark.parametrize("one_instance", [False, True], ids=["instance-per-thread", "shared-instance"])
def test_concurrent_writers_lose_no_update(make_store: StoreFactory, one_instance: bool) -> None:
    """Load-modify-save with retry on conflict, from several threads, each with its own
    store instance or all sharing one: every increment survives (a lost update would
    show as a smaller count)."""
    writers, increments = 4, 15
    shared = make_store()
    shared.save(TaskCheckpoint(task_id="counter"))
    errors: list[BaseException] = []

    def work(idx: int) -> None:
        store = shared if one_instance else make_store()
        try:
            for _ in range(increments):
                while True:
                    cp = store.load("counter")
                    assert cp is not None
                    cp.step += 1
                    cp.add_result(idx)
                    try:
                        store.save(cp)
                        break
                    except CheckpointConflictError:
                        continue
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    final = make_store().load("counter")
    assert final is not None
    assert final.step == len(final.results) == writers * increments
    assert final.version == writers * increments + 1
    assert sorted(final.results) == sorted(i for i in range(writers) for _ in range(increments))  # type: ignore[type-var]


def test_delete_and_list(store: CheckpointStore) -> None:
    for task_id in ("b", "a", "c"):
        store.save(TaskCheckpoint(task_id=task_id))
    assert store.list() == ["a", "b", "c"]
    assert store.delete("b") is True
    assert store.delete("b") is False
    assert store.load("b") is None
    assert store.list() == ["a", "c"]


def test_hostile_task_ids_round_trip_and_stay_distinct(store: CheckpointStore) -> None:
    for i, task_id in enumerate(HOSTILE_IDS):
        cp = TaskCheckpoint(task_id=task_id, step=i)
        store.save(cp)
    assert store.list() == sorted(HOSTILE_IDS)
    for i, task_id in enumerate(HOSTILE_IDS):
        loaded = store.load(task_id)
        assert loaded is not None and loaded.task_id == task_id and loaded.step == i


def test_newer_schema_is_refused_not_guessed(store: CheckpointStore) -> None:
    store.save(TaskCheckpoint(task_id="t", schema_version=99))
    with pytest.raises(CheckpointSchemaError, match="schema version 99"):
        store.load("t")


def test_invalid_task_ids_are_rejected(store: CheckpointStore) -> None:
    with pytest.raises(ValueError):
        store.load("")
    with pytest.raises(ValueError):
        store.delete("bad\udc80")
