"""Incremental saves: one journal record per save, torn tails dropped, damage reported,
compaction that survives a process dying at any step, and loads that equal what was saved."""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from lg_checkpoint import NOT_FOUND, apply_edit, assert_grown_to, edits, grow, grown

from loop_governor.checkpoint import (
    CheckpointCorruptedError,
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    SQLiteCheckpointStore,
    TaskCheckpoint,
)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_a_save_appends_one_small_record_and_leaves_the_snapshot_alone(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    cp = grown(store, 200)
    snapshot = store.path_for("t").read_bytes()
    journal = store.journal_path_for("t")
    size = journal.stat().st_size
    grow(cp)
    store.save(cp)
    assert store.path_for("t").read_bytes() == snapshot  # the first save's snapshot, untouched
    added = journal.stat().st_size - size
    assert 0 < added < 400, added  # one call's record, not the task (the snapshot is 200 bytes)
    assert len(_lines(journal)) == 1 + 200  # header + one line per save after the first
    assert_grown_to(FileCheckpointStore(tmp_path).load("t"), 201)


def test_sqlite_and_memory_saves_write_one_record_too(tmp_path: Path) -> None:
    sqlite_store = SQLiteCheckpointStore(tmp_path / "c.db")
    memory_store = MemoryCheckpointStore()
    for store in (sqlite_store, memory_store):
        grown(store, 50)
        assert_grown_to(store.load("t"), 50)
    with sqlite3.connect(tmp_path / "c.db") as db:
        rows = db.execute("SELECT version, length(body) FROM lg_checkpoint_journal ORDER BY version").fetchall()
    assert [v for v, _ in rows] == list(range(2, 51)) and max(n for _, n in rows) < 300
    sqlite_store.close()


def _three_saves(tmp_path: Path) -> tuple[FileCheckpointStore, TaskCheckpoint, Path]:
    store = FileCheckpointStore(tmp_path)
    cp = grown(store, 4)  # a snapshot, then three records
    return store, cp, store.journal_path_for("t")


@pytest.mark.parametrize("cut", [1, 10, 60, -1])
def test_a_torn_last_record_is_dropped_and_cut_off_by_the_next_save(tmp_path: Path, cut: int) -> None:
    store, cp, journal = _three_saves(tmp_path)
    complete = journal.read_bytes()
    grow(cp)
    store.save(cp)
    record = journal.read_bytes()[len(complete) :]
    journal.write_bytes(complete + record[:cut])  # a writer killed mid-append (never acknowledged)
    resumed = FileCheckpointStore(tmp_path).load("t")
    assert_grown_to(resumed, 4)
    assert resumed is not None
    grow(resumed)
    FileCheckpointStore(tmp_path).save(resumed)  # the torn bytes are cut off, not glued to
    assert journal.read_bytes().startswith(complete) and journal.read_bytes().endswith(b"\n")
    assert_grown_to(FileCheckpointStore(tmp_path).load("t"), 5)
    assert not (tmp_path / ".quarantine").exists()


@pytest.mark.parametrize("line", [1, 2, 3], ids=["first-record", "middle-record", "last-record"])
def test_a_damaged_record_raises_stays_on_disk_and_is_quarantined(tmp_path: Path, line: int) -> None:
    store, _, journal = _three_saves(tmp_path)
    lines = _lines(journal)
    lines[line] = lines[line].replace(b"doc", b"dog", 1)  # a complete line: damage, not a torn append
    damaged = b"".join(lines)
    journal.write_bytes(damaged)
    with pytest.raises(CheckpointCorruptedError) as info:
        FileCheckpointStore(tmp_path).load("t")
    assert info.value.location == str(journal)
    assert journal.read_bytes() == damaged
    assert info.value.quarantine is not None and Path(info.value.quarantine).read_bytes() == damaged
    # force overwrites (a snapshot), after which the task loads again
    fresh = TaskCheckpoint(task_id="t")
    grow(fresh)
    store.save(fresh, force=True)
    assert_grown_to(store.load("t"), 1)


def test_a_journal_that_names_another_snapshot_is_ignored_never_applied_twice(tmp_path: Path) -> None:
    # A compaction killed after its snapshot's rename and before the journal reset leaves
    # the old records next to a snapshot that already holds them.
    store = FileCheckpointStore(tmp_path)
    cp = grown(store, 6)
    stale = store.journal_path_for("t").read_bytes()
    store.save(cp, force=True)  # a snapshot holding all six steps; the journal is emptied
    store.journal_path_for("t").write_bytes(stale)  # as if the reset never happened
    loaded = FileCheckpointStore(tmp_path).load("t")
    assert_grown_to(loaded, 6)
    assert loaded is not None
    grow(loaded)
    FileCheckpointStore(tmp_path).save(loaded)  # restarts the journal for the new snapshot
    assert_grown_to(FileCheckpointStore(tmp_path).load("t"), 7)


@pytest.mark.parametrize("kind", ["file", "sqlite", "memory"])
def test_compaction_folds_the_journal_into_the_snapshot(tmp_path: Path, kind: str) -> None:
    options: dict[str, Any] = {"compact_min_bytes": 2000, "compact_ratio": 0.5}
    store: CheckpointStore
    if kind == "file":
        store = FileCheckpointStore(tmp_path, **options)
    elif kind == "sqlite":
        store = SQLiteCheckpointStore(tmp_path / "c.db", **options)
    else:
        store = MemoryCheckpointStore(**options)
    cp = TaskCheckpoint(task_id="t")
    snapshots = set()
    for _ in range(300):
        grow(cp)
        store.save(cp)
        snapshots.add(cp.sync_state().snapshot_bytes)
        # the journal never outgrows its bound by more than one record
        assert cp.sync_state().journal_bytes <= max(2000, cp.sync_state().snapshot_bytes / 2) + 300
    assert len(snapshots) > 3  # it did compact, several times
    assert_grown_to(store.load("t"), 300)
    if isinstance(store, FileCheckpointStore):
        assert len(_lines(store.journal_path_for("t"))) < 300
    store.close()


@pytest.mark.parametrize("kind", ["file", "sqlite", "memory"])
def test_no_record_carries_a_secret_not_even_a_removal(tmp_path: Path, kind: str) -> None:
    secret = "sk-proj-abcdefghijklmnop1234567890"
    store: CheckpointStore
    if kind == "file":
        store = FileCheckpointStore(tmp_path)
    elif kind == "sqlite":
        store = SQLiteCheckpointStore(tmp_path / "c.db")
    else:
        store = MemoryCheckpointStore()
    cp = TaskCheckpoint(task_id="t")
    store.save(cp)
    direct = f'call:{{"api_key":"{secret}"}}'
    cp.completed[direct] = f"token {secret}"  # put in directly: converted by the save
    cp.results.append({"password": "hunter2-secret"})
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None and len(loaded.completed) == 1
    del cp.completed[direct]
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None and loaded.completed == {}
    if isinstance(store, MemoryCheckpointStore):
        stored = b"".join(r[2] for r in store._data["t"].records)
    else:
        stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert secret.encode() not in stored and b"hunter2-secret" not in stored
    store.close()


@pytest.mark.parametrize("swap", ["another checkpoint's section", "a plain dict"])
def test_a_section_swapped_for_another_container_is_saved_whole(tmp_path: Path, swap: str) -> None:
    # Changes are tracked by the containers themselves; a swapped-in container's changes
    # are relative to someone else's saves, so the next save must be a full snapshot.
    store = FileCheckpointStore(tmp_path)
    other_store = MemoryCheckpointStore()
    cp, other = TaskCheckpoint(task_id="t"), TaskCheckpoint(task_id="o")
    cp.record_success("mine", 1)
    store.save(cp)
    other.record_success("theirs:1", 1)
    other_store.save(other)  # its section now has nothing left to report
    other.record_success("theirs:2", 2)
    cp.completed = other.completed if swap.startswith("another") else dict(other.completed)
    store.save(cp)
    loaded = FileCheckpointStore(tmp_path).load("t")
    assert loaded is not None and list(loaded.completed) == ["theirs:1", "theirs:2"]


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_saves_racing_with_a_recording_thread_never_lose_or_double_an_entry(tmp_path: Path, kind: str) -> None:
    # The governor records and saves under the task's lock; code that does not must still
    # get a loadable checkpoint that converges on what was recorded (snapshots included).
    options: dict[str, Any] = {"compact_min_bytes": 400, "compact_ratio": 0.0}
    store: CheckpointStore = (
        MemoryCheckpointStore(**options) if kind == "memory" else FileCheckpointStore(tmp_path, **options)
    )
    cp = TaskCheckpoint(task_id="t")
    stop = threading.Event()
    errors: list[BaseException] = []

    def saver() -> None:
        while not stop.is_set():
            try:
                store.save(cp)
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    thread = threading.Thread(target=saver)
    thread.start()
    try:
        for i in range(300):
            cp.record_success(f"k{i}", i)
            cp.add_result(i)
            if i % 7 == 0:
                cp.completed.pop(f"k{i - 3}", None)
            if i % 11 == 0:
                cp.record_failure(f"f{i}", NOT_FOUND)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old_interval)
    assert errors == []
    store.save(cp)
    reader = store if kind == "memory" else FileCheckpointStore(tmp_path)
    loaded = reader.load("t")
    assert loaded is not None and _state(loaded) == _state(cp)


@pytest.mark.parametrize("kind", ["memory", "file", "sqlite"])
def test_a_result_appended_while_a_snapshot_is_being_written_is_saved_exactly_once(tmp_path: Path, kind: str) -> None:
    # Deterministically the race above: the serializer runs inside the save, after the
    # changes were taken and before the snapshot is encoded, and appends a result then.
    # It belongs to the next save's record; were it in the snapshot too, the record would
    # append it a second time and the load would fail.
    store: CheckpointStore
    if kind == "memory":
        store = MemoryCheckpointStore()
    elif kind == "file":
        store = FileCheckpointStore(tmp_path)
    else:
        store = SQLiteCheckpointStore(tmp_path / "c.db")
    cp = TaskCheckpoint(task_id="t")
    late = ["late"]

    def serializer(value: object) -> str:
        if late:
            cp.results.append(late.pop())
        return "marker"

    cp.serializer = serializer
    cp.metadata["m"] = object()
    cp.add_result("first")
    store.save(cp)  # a snapshot (first save); "late" arrives during it
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None and loaded.results == ["first", "late"]
    store.close()


# -- dying at any step of a save ---------------------------------------------------------------

_WRITES = ("writev", "pwrite", "write", "fsync", "fdatasync", "replace", "ftruncate", "unlink")
_DIED, _FINISHED = 71, 72


def _save_dying_at(directory: Path, options: dict[str, Any], call: int, after: bool) -> int:
    """Load, grow and save in a forked child that dies (``os._exit``: no cleanup, like a
    SIGKILL) just before or after its ``call``-th write-side system call."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        code = 1
        try:
            count = 0

            def dying(real: Callable[..., Any]) -> Callable[..., Any]:
                def call_or_die(*args: Any, **kwargs: Any) -> Any:
                    nonlocal count
                    count += 1
                    if count == call and not after:
                        os._exit(_DIED)
                    result = real(*args, **kwargs)
                    if count == call and after:
                        os._exit(_DIED)
                    return result

                return call_or_die

            for name in _WRITES:
                if hasattr(os, name):
                    setattr(os, name, dying(getattr(os, name)))
            store = FileCheckpointStore(directory, **options)
            cp = store.load("t") or TaskCheckpoint(task_id="t")
            grow(cp)
            store.save(cp)
            code = _FINISHED
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _copy_dir(src: Path, dst: Path) -> None:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
@pytest.mark.parametrize(
    ("scenario", "steps", "options"),
    [
        ("first save", 0, {}),
        ("append", 3, {}),
        ("compaction", 3, {"compact_min_bytes": 1, "compact_ratio": 0.0}),
        ("journal restart after a compaction", 3, {"restart": True}),
    ],
)
def test_dying_at_any_write_of_a_save_loses_nothing_saved_and_applies_nothing_twice(
    tmp_path: Path, scenario: str, steps: int, options: dict[str, Any]
) -> None:
    template = tmp_path / "template"
    store = FileCheckpointStore(template)
    cp = grown(store, steps)
    if options.pop("restart", False):
        store.save(cp, force=True)  # a snapshot; the journal is empty, the next save restarts it
    calls = 0
    for call in range(1, 40):
        for after in (False, True):
            work = tmp_path / f"run-{call}-{after}"
            _copy_dir(template, work)
            code = _save_dying_at(work, options, call, after)
            assert code in (_DIED, _FINISHED), code
            loaded = FileCheckpointStore(work).load("t")
            reached = 0 if loaded is None else loaded.step
            assert reached in (steps, steps + 1), (scenario, call, after)
            if reached:
                assert_grown_to(loaded, reached)
            if code == _FINISHED:
                assert reached == steps + 1
            # whoever comes next resumes from there and saves on top of it
            resumed = loaded or TaskCheckpoint(task_id="t")
            grow(resumed)
            FileCheckpointStore(work, **options).save(resumed)
            assert_grown_to(FileCheckpointStore(work).load("t"), reached + 1)
        if code == _FINISHED:
            calls = call
            break
    print(scenario, "writes:", calls - 1)
    assert calls > 1, "the save never reached its writes"


# -- any edits, any saves, any reloads ---------------------------------------------------------


def _state(cp: TaskCheckpoint) -> tuple[object, ...]:
    # order included: a replayed journal must rebuild the keys in the order they were made
    return (
        list(cp.completed.items()),
        list(cp.known_bad.items()),
        list(cp.results),
        cp.metadata,
        cp.step,
    )


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        yield Path(tmp)


@pytest.mark.parametrize("kind", ["file", "sqlite", "memory"])
@settings(max_examples=60, deadline=None)
@given(ops=edits("save", "reload"))
def test_whatever_is_edited_saved_and_reloaded_loads_back_equal(
    kind: str, ops: list[tuple[str, str, Any]], scratch: Path
) -> None:
    directory = Path(tempfile.mkdtemp(dir=scratch))
    options = {"compact_min_bytes": 300, "compact_ratio": 0.5}  # compactions in between too
    memory = MemoryCheckpointStore(**options)

    opened: list[CheckpointStore] = []

    def open_store() -> CheckpointStore:
        if kind == "memory":
            return memory
        store: CheckpointStore
        if kind == "file":
            store = FileCheckpointStore(directory, **options)
        else:
            store = SQLiteCheckpointStore(directory / "c.db", **options)
        opened.append(store)
        return store

    store = open_store()
    cp = TaskCheckpoint(task_id="t")
    try:
        for op, key, value in [*ops, ("save", "", None)]:
            if op == "save":
                store.save(cp)
                loaded = open_store().load("t")
                assert loaded is not None and _state(loaded) == _state(cp)
                assert loaded.version == cp.version
            elif op == "reload" and cp.version:
                store = open_store()  # a resumed process: it continues from what is stored
                loaded = store.load("t")
                assert loaded is not None
                cp = loaded
            else:
                apply_edit(cp, op, key, value)
    finally:
        for opened_store in opened:
            opened_store.close()
