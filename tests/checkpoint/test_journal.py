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
from hypothesis import strategies as st

from loop_governor.checkpoint import (
    CheckpointCorruptedError,
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    SQLiteCheckpointStore,
    TaskCheckpoint,
)
from loop_governor.errors import ErrorType, GovernedError

NOT_FOUND = GovernedError(error_type=ErrorType.PERMANENT, tool="fetch", status=404, message="gone")


def _grow(cp: TaskCheckpoint) -> None:
    """One governed call's worth of checkpoint: a result, a completed call, now and then an error."""
    step = cp.step + 1
    cp.record_success(f"search:{step}", {"hits": [f"doc {step}"], "n": step})
    cp.add_result({"step": step})
    if step % 5 == 0:
        cp.record_failure(f"fetch:{step}", NOT_FOUND)
    cp.metadata["last"] = step
    cp.step = step


def _assert_grown_to(cp: TaskCheckpoint | None, steps: int) -> None:
    assert cp is not None
    assert cp.step == steps and cp.version >= steps
    assert list(cp.completed) == [f"search:{i}" for i in range(1, steps + 1)]
    assert cp.results == [{"step": i} for i in range(1, steps + 1)]
    assert list(cp.known_bad) == [f"fetch:{i}" for i in range(5, steps + 1, 5)]
    assert cp.metadata == ({"last": steps} if steps else {})


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_a_save_appends_one_small_record_and_leaves_the_snapshot_alone(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    cp = TaskCheckpoint(task_id="t")
    for _ in range(200):
        _grow(cp)
        store.save(cp)
    snapshot = store.path_for("t").read_bytes()
    journal = store.journal_path_for("t")
    size = journal.stat().st_size
    _grow(cp)
    store.save(cp)
    assert store.path_for("t").read_bytes() == snapshot  # the first save's snapshot, untouched
    grown = journal.stat().st_size - size
    assert 0 < grown < 400, grown  # one call's record, not the task (the snapshot is 200 bytes)
    assert len(_lines(journal)) == 1 + 200  # header + one line per save after the first
    _assert_grown_to(FileCheckpointStore(tmp_path).load("t"), 201)


def test_sqlite_and_memory_saves_write_one_record_too(tmp_path: Path) -> None:
    sqlite_store = SQLiteCheckpointStore(tmp_path / "c.db")
    memory_store = MemoryCheckpointStore()
    for store in (sqlite_store, memory_store):
        cp = TaskCheckpoint(task_id="t")
        for _ in range(50):
            _grow(cp)
            store.save(cp)
        _assert_grown_to(store.load("t"), 50)
    with sqlite3.connect(tmp_path / "c.db") as db:
        rows = db.execute("SELECT version, length(body) FROM lg_checkpoint_journal ORDER BY version").fetchall()
    assert [v for v, _ in rows] == list(range(2, 51)) and max(n for _, n in rows) < 300
    sqlite_store.close()


def _three_saves(tmp_path: Path) -> tuple[FileCheckpointStore, TaskCheckpoint, Path]:
    store = FileCheckpointStore(tmp_path)
    cp = TaskCheckpoint(task_id="t")
    for _ in range(4):  # a snapshot, then three records
        _grow(cp)
        store.save(cp)
    return store, cp, store.journal_path_for("t")


@pytest.mark.parametrize("cut", [1, 10, 60, -1])
def test_a_torn_last_record_is_dropped_and_cut_off_by_the_next_save(tmp_path: Path, cut: int) -> None:
    store, cp, journal = _three_saves(tmp_path)
    complete = journal.read_bytes()
    _grow(cp)
    store.save(cp)
    record = journal.read_bytes()[len(complete) :]
    journal.write_bytes(complete + record[:cut])  # a writer killed mid-append (never acknowledged)
    resumed = FileCheckpointStore(tmp_path).load("t")
    _assert_grown_to(resumed, 4)
    assert resumed is not None
    _grow(resumed)
    FileCheckpointStore(tmp_path).save(resumed)  # the torn bytes are cut off, not glued to
    assert journal.read_bytes().startswith(complete) and journal.read_bytes().endswith(b"\n")
    _assert_grown_to(FileCheckpointStore(tmp_path).load("t"), 5)
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
    _grow(fresh)
    store.save(fresh, force=True)
    _assert_grown_to(store.load("t"), 1)


def test_a_journal_that_names_another_snapshot_is_ignored_never_applied_twice(tmp_path: Path) -> None:
    # A compaction killed after its snapshot's rename and before the journal reset leaves
    # the old records next to a snapshot that already holds them.
    store = FileCheckpointStore(tmp_path)
    cp = TaskCheckpoint(task_id="t")
    for _ in range(6):
        _grow(cp)
        store.save(cp)
    stale = store.journal_path_for("t").read_bytes()
    store.save(cp, force=True)  # a snapshot holding all six steps; the journal is emptied
    store.journal_path_for("t").write_bytes(stale)  # as if the reset never happened
    loaded = FileCheckpointStore(tmp_path).load("t")
    _assert_grown_to(loaded, 6)
    assert loaded is not None
    _grow(loaded)
    FileCheckpointStore(tmp_path).save(loaded)  # restarts the journal for the new snapshot
    _assert_grown_to(FileCheckpointStore(tmp_path).load("t"), 7)


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
        _grow(cp)
        store.save(cp)
        snapshots.add(cp.sync_state().snapshot_bytes)
        # the journal never outgrows its bound by more than one record
        assert cp.sync_state().journal_bytes <= max(2000, cp.sync_state().snapshot_bytes / 2) + 300
    assert len(snapshots) > 3  # it did compact, several times
    _assert_grown_to(store.load("t"), 300)
    if isinstance(store, FileCheckpointStore):
        assert len(_lines(store.journal_path_for("t"))) < 300
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
            _grow(cp)
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
    cp = TaskCheckpoint(task_id="t")
    for _ in range(steps):
        _grow(cp)
        store.save(cp)
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
                _assert_grown_to(loaded, reached)
            if code == _FINISHED:
                assert reached == steps + 1
            # whoever comes next resumes from there and saves on top of it
            resumed = loaded or TaskCheckpoint(task_id="t")
            _grow(resumed)
            FileCheckpointStore(work, **options).save(resumed)
            _assert_grown_to(FileCheckpointStore(work).load("t"), reached + 1)
        if code == _FINISHED:
            calls = call
            break
    print(scenario, "writes:", calls - 1)
    assert calls > 1, "the save never reached its writes"


# -- any edits, any saves, any reloads ---------------------------------------------------------

_keys = st.sampled_from(["search:1", "search:2", "fetch:1", "fetch:2", "read:1"])
_values = st.one_of(st.integers(-3, 3), st.text("ab ", max_size=4), st.lists(st.integers(0, 2), max_size=2))
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("success"), _keys, _values),
        st.tuples(st.just("failure"), _keys, st.none()),
        st.tuples(st.just("result"), st.just(""), _values),
        st.tuples(st.just("set"), _keys, _values),
        st.tuples(st.just("delete"), _keys, st.none()),
        st.tuples(st.just("forget_failure"), _keys, st.none()),
        st.tuples(st.just("replace_result"), st.just(""), _values),
        st.tuples(st.just("append_result"), st.just(""), _values),
        st.tuples(st.just("metadata"), _keys, _values),
        st.tuples(st.just("step"), st.just(""), st.none()),
        st.tuples(st.just("save"), st.just(""), st.none()),
        st.tuples(st.just("reload"), st.just(""), st.none()),
    ),
    max_size=30,
)


def _apply(cp: TaskCheckpoint, op: str, key: str, value: Any) -> None:
    if op == "success":
        cp.record_success(key, value)
    elif op == "failure":
        cp.record_failure(key, NOT_FOUND)
    elif op == "result":
        cp.add_result(value)
    elif op == "set":
        cp.completed[key] = value
    elif op == "delete":
        cp.completed.pop(key, None)
    elif op == "forget_failure" and key in cp.known_bad:
        del cp.known_bad[key]
    elif op == "replace_result" and cp.results:
        cp.results[len(cp.results) // 2] = value
    elif op == "append_result":
        cp.results.append(value)
    elif op == "metadata":
        cp.metadata[key] = value
    elif op == "step":
        cp.step += 1


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
@given(ops=_ops)
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
                _apply(cp, op, key, value)
    finally:
        for opened_store in opened:
            opened_store.close()
