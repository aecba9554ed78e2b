"""FileCheckpointStore: names that cannot escape, files that are JSON, corruption that is kept."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loop_governor.checkpoint import (
    CheckpointConflictError,
    CheckpointCorruptedError,
    FileCheckpointStore,
    TaskCheckpoint,
)
from loop_governor.checkpoint.codec import checksum, legacy_checksum
from loop_governor.checkpoint.file_store import decode_task_id, encode_task_id

HOSTILE = [
    "../x",
    "../../etc/passwd",
    "/etc/passwd",
    "C:\\Windows\\x",
    "..",
    ".",
    ".hidden",
    "a\x00b",
    "x" * 10_000,
    "😀" * 300,
    "dir/",
    "%2e%2e",
]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_hostile_ids_never_leave_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "outer"
    store_dir = root / "store"
    store = FileCheckpointStore(store_dir)
    before = _tree(root)
    for task_id in HOSTILE:
        path = store.path_for(task_id)
        assert path.parent == store_dir
        assert len(path.name.encode()) <= 255
        store.save(TaskCheckpoint(task_id=task_id))
    created = _tree(root) - before
    assert all(p.startswith("store/") and p.count("/") == 1 for p in created), created
    assert len(created) == len(HOSTILE)
    assert store.list() == sorted(HOSTILE)


def test_case_only_differences_get_different_files(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    # different even on a case-insensitive file system (macOS, Windows)
    assert store.path_for("Task").name.lower() != store.path_for("task").name.lower()


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=300))
def test_encoding_is_safe_and_reversible(task_id: str) -> None:
    stem = encode_task_id(task_id)
    assert set(stem) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_%~")
    assert stem not in ("", ".", "..") and not stem.startswith(".")
    assert len(stem) <= 180
    decoded = decode_task_id(stem)
    assert decoded == task_id or (decoded is None and "~" in stem)


def test_file_is_plain_json_with_owner_only_permissions(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    cp = TaskCheckpoint(task_id="t", step=2)
    cp.record_success("k", [1, "two"])
    store.save(cp)
    path = store.path_for("t")
    doc = json.loads(path.read_bytes())
    assert doc["version"] == 1 and doc["checkpoint"]["completed"] == {"k": [1, "two"]}
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def _saved(tmp_path: Path) -> tuple[FileCheckpointStore, Path, bytes]:
    store = FileCheckpointStore(tmp_path)
    cp = TaskCheckpoint(task_id="victim", step=1)
    cp.add_result("important")
    store.save(cp)
    path = store.path_for("victim")
    return store, path, path.read_bytes()


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flip_byte_in_body(data: bytes) -> bytes:
    i = data.index(b"important")
    return data[:i] + b"J" + data[i + 1 :]


def _garbage(data: bytes) -> bytes:
    return b"\x00\xff not a checkpoint"


def _empty(data: bytes) -> bytes:
    return b""


def _other_version(data: bytes) -> bytes:
    # the checksum is seeded with the version: a changed counter is caught too
    return data.replace(b'"version":1,', b'"version":7,', 1)


@pytest.mark.parametrize("damage", [_truncate, _flip_byte_in_body, _garbage, _empty, _other_version])
def test_corrupt_file_raises_keeps_original_and_quarantines_a_copy(tmp_path: Path, damage: object) -> None:
    store, path, good = _saved(tmp_path)
    bad = damage(good)  # type: ignore[operator]
    path.write_bytes(bad)
    with pytest.raises(CheckpointCorruptedError) as info:
        store.load("victim")
    err = info.value
    assert err.task_id == "victim" and err.location == str(path)
    assert path.read_bytes() == bad  # original left in place
    assert err.quarantine is not None and Path(err.quarantine).read_bytes() == bad
    # asking again raises again (nothing was reset) and writes no second copy
    with pytest.raises(CheckpointCorruptedError):
        store.load("victim")
    assert len(list((tmp_path / ".quarantine").iterdir())) == 1
    assert store.list() == ["victim"]


def test_body_of_another_task_is_corruption(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    store.save(TaskCheckpoint(task_id="a"))
    store.path_for("b").write_bytes(store.path_for("a").read_bytes())
    with pytest.raises(CheckpointCorruptedError, match="belongs to task 'a'"):
        store.load("b")


def test_save_refuses_to_replace_an_unreadable_file_unless_forced(tmp_path: Path) -> None:
    store, path, _ = _saved(tmp_path)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointCorruptedError):
        store.save(TaskCheckpoint(task_id="victim"))
    assert path.read_bytes() == b"garbage"
    store.save(TaskCheckpoint(task_id="victim", step=9), force=True)
    loaded = store.load("victim")
    assert loaded is not None and loaded.step == 9


def test_conflict_leaves_the_stored_file_untouched(tmp_path: Path) -> None:
    store, path, good = _saved(tmp_path)
    with pytest.raises(CheckpointConflictError):
        store.save(TaskCheckpoint(task_id="victim"))
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_stale_temp_files_from_killed_writers_are_removed_on_open(tmp_path: Path) -> None:
    old = tmp_path / ".tmp-abc.part"
    fresh = tmp_path / ".tmp-def.part"
    old.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    os.utime(old, (1000.0, 1000.0))
    os.utime(fresh, (5000.0, 5000.0))
    FileCheckpointStore(tmp_path, clock=lambda: 5000.0 + 60, stale_temp_s=3600)
    assert not old.exists() and fresh.exists()


def test_a_leftover_temp_file_with_our_name_is_neither_reused_nor_touched(tmp_path: Path) -> None:
    # A killed writer whose pid came back to us left its temp file: the save must pick
    # another name rather than write into (or truncate) the leftover.
    store = FileCheckpointStore(tmp_path)
    leftover = tmp_path / f".tmp-{os.getpid()}-0.part"
    leftover.write_bytes(b"partial")
    cp = TaskCheckpoint(task_id="t")
    cp.record_success("k", "v")
    store.save(cp)
    assert leftover.read_bytes() == b"partial"
    loaded = store.load("t")
    assert loaded is not None and loaded.get_result("k") == (True, "v")


def test_long_ids_are_listed_from_the_file_contents(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    long_id = "step/" * 100
    store.save(TaskCheckpoint(task_id=long_id))
    assert "~" in store.path_for(long_id).name
    assert store.list() == [long_id]
    assert FileCheckpointStore(tmp_path).load(long_id) is not None


def test_a_long_id_checkpoint_too_damaged_to_name_its_task_is_reported_not_aliased(tmp_path: Path) -> None:
    # A hashed file name does not spell its task id, and the id is read from the file. A
    # file too damaged to name it is reported by unidentified() (``checkpoints ls`` shows
    # it), never listed under its stem: the stem is a valid task id of its own, and
    # load/delete of that id must not reach this file (issue 17, item 6).
    store = FileCheckpointStore(tmp_path)
    long_id = "Customer-Onboarding-Run-" + "X" * 70
    store.save(TaskCheckpoint(task_id=long_id))
    store.save(TaskCheckpoint(task_id="short"))
    path = store.path_for(long_id)
    path.write_bytes(path.read_bytes()[:60])
    stem = path.name[: -len(".ckpt.json")]
    assert "~" in stem
    assert store.list() == ["short"]
    assert [name for name, _ in store.unidentified()] == [path.name]
    assert store.load(stem) is None and store.delete(stem) is False and path.exists()
    with pytest.raises(CheckpointCorruptedError) as info:
        store.load(long_id)
    assert info.value.location == str(path)
    assert store.delete(long_id)
    assert not path.exists() and store.unidentified() == []


def _increment(store: FileCheckpointStore, times: int) -> None:
    for _ in range(times):
        while True:
            cp = store.load("counter")
            assert cp is not None
            cp.step += 1
            try:
                store.save(cp)
                break
            except CheckpointConflictError:
                continue


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
def test_forked_children_using_the_parents_store_lose_no_update(tmp_path: Path) -> None:
    # The store keeps its directory open between saves; a forked child must not share
    # the parent's open directory (flock would then let both in at once).
    store = FileCheckpointStore(tmp_path)
    store.save(TaskCheckpoint(task_id="counter"))
    children = [multiprocessing.get_context("fork").Process(target=_increment, args=(store, 25)) for _ in range(3)]
    for child in children:
        child.start()
    _increment(store, 25)
    for child in children:
        child.join(60)
    assert [child.exitcode for child in children] == [0, 0, 0]
    final = store.load("counter")
    assert final is not None and final.step == 100


@pytest.mark.parametrize("layout", [1, 2])
def test_checkpoints_of_earlier_layouts_still_load_and_are_continued(tmp_path: Path, layout: int) -> None:
    # Layouts 1 (CRC-32 header) and 2 (XXH3, no journal) are what earlier releases wrote:
    # a task in flight during the upgrade must resume, not be quarantined as corrupt.
    old = TaskCheckpoint(task_id="t")
    old.record_success("search:1", {"hits": 3})
    body = old.encode_body(1.0)
    if layout == 1:
        header = b'{"lg_checkpoint":1,"version":4,"crc32":"%s","checkpoint":' % legacy_checksum(4, body).encode()
    else:
        header = b'{"lg_checkpoint":2,"version":4,"xxh3":"%s","checkpoint":' % checksum(4, body).encode()
    store = FileCheckpointStore(tmp_path)
    store.path_for("t").write_bytes(header + body + b"}")
    loaded = store.load("t")
    assert loaded is not None and loaded.version == 4 and loaded.get_result("search:1") == (True, {"hits": 3})
    loaded.step = 5
    loaded.record_success("search:2", {"hits": 1})
    assert store.save(loaded) == 5
    assert store.path_for("t").read_bytes() == header + body + b"}"  # continued by a journal record
    again = FileCheckpointStore(tmp_path).load("t")
    assert again is not None and again.version == 5 and again.step == 5
    assert again.get_result("search:2") == (True, {"hits": 1}) and again.get_result("search:1")[0]
    assert store.save(again, force=True) == 6  # a snapshot: the current layout
    assert store.path_for("t").read_bytes().startswith(b'{"lg_checkpoint":3,"version":6,"xxh3":"')
    # a damaged old-layout file is still caught
    store.path_for("t").write_bytes(header + body.replace(b"3", b"4") + b"}")
    with pytest.raises(CheckpointCorruptedError):
        store.load("t")


class _TaggedStore(FileCheckpointStore):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.tag = "mine"


def test_a_store_can_be_handed_to_a_worker_process(tmp_path: Path) -> None:
    # spawn / ProcessPoolExecutor pickle the store: the copy gets its own directory
    # handle and lock, and sees the same checkpoints.
    store = _TaggedStore(tmp_path)
    store.save(TaskCheckpoint(task_id="t"))
    copy = pickle.loads(pickle.dumps(store))
    assert isinstance(copy, _TaggedStore) and copy.tag == "mine"  # a subclass and its settings survive
    cp = copy.load("t")
    assert cp is not None
    cp.step = 2
    copy.save(cp)
    reloaded = store.load("t")
    assert reloaded is not None and reloaded.step == 2 and reloaded.version == 2


def test_a_relative_directory_stays_the_same_directory_after_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = FileCheckpointStore("ck")
    store.save(TaskCheckpoint(task_id="t"))
    monkeypatch.chdir(tmp_path / "b")  # the store keeps its directory open meanwhile
    cp = store.load("t")
    assert cp is not None
    store.save(cp)
    assert (tmp_path / "a" / "ck" / "t.ckpt.json").exists() and not (tmp_path / "b" / "ck").exists()
