"""Damaged or hostile checkpoint files: typed errors, quarantine copies, file names that
never alias another task, links never followed (issue 17, item 6)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from loop_governor.checkpoint import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    FileCheckpointStore,
    MemoryCheckpointStore,
    TaskCheckpoint,
)
from loop_governor.checkpoint.codec import checksum
from loop_governor.checkpoint.file_store import encode_task_id
from loop_governor.checkpoint.model import MAX_DEPTH
from loop_governor.cli import app

needs_links = pytest.mark.skipif(sys.platform == "win32", reason="symbolic links and FIFOs")


def _nested(depth: int, kind: str) -> str:
    return ("[" * depth + "0" + "]" * depth) if kind == "list" else ('{"a":' * depth + "0" + "}" * depth)


def _file_with_valid_checksum(task_id: str, deep: str, where: str) -> bytes:
    """A snapshot file whose checksum verifies but whose body nests ``deep`` somewhere."""
    sections = {"completed": '{"k":%s}', "results": "[%s]", "metadata": '{"m":%s}'}
    parts = {name: ("{}" if name != "results" else "[]") for name in sections}
    parts[where] = sections[where] % deep
    body = (
        f'{{"schema_version":1,"task_id":"{task_id}","step":0,"updated_at":null,"completed":{parts["completed"]},'
        f'"known_bad":{{}},"results":{parts["results"]},"metadata":{parts["metadata"]}}}'
    ).encode()
    return b'{"lg_checkpoint":2,"version":1,"xxh3":"%s","checkpoint":' % checksum(1, body).encode() + body + b"}"


@settings(max_examples=25, deadline=None)
@given(
    depth=st.integers(300, 60_000),
    kind=st.sampled_from(["list", "dict"]),
    where=st.sampled_from(["completed", "results", "metadata"]),
)
@example(depth=100_000, kind="list", where="completed")
def test_a_deeply_nested_body_with_a_valid_checksum_is_typed_corruption_with_a_copy(
    depth: int, kind: str, where: str
) -> None:
    # Regression: json.loads raised an untyped RecursionError: no quarantine copy, and the
    # caller (the governor's resume, `checkpoints ls`) died on it.
    with tempfile.TemporaryDirectory() as tmp:
        store = FileCheckpointStore(tmp)
        store.save(TaskCheckpoint(task_id="good"))
        data = _file_with_valid_checksum("deep", _nested(depth, kind), where)
        store.path_for("deep").write_bytes(data)
        with pytest.raises(CheckpointCorruptedError) as info:
            store.load("deep")
        assert info.value.quarantine is not None and Path(info.value.quarantine).read_bytes() == data
        assert store.path_for("deep").read_bytes() == data
        assert store.list() == ["deep", "good"]


def test_ls_lists_every_task_when_one_body_is_nested_too_deeply(tmp_path: Path) -> None:
    # Regression: list() parsed long-id files whole to find their id, so one deep body
    # made `checkpoints ls` fail for every task.
    store = FileCheckpointStore(tmp_path)
    store.save(TaskCheckpoint(task_id="good"))
    long_id = "L" * 200
    store.path_for(long_id).write_bytes(_file_with_valid_checksum(long_id, _nested(50_000, "list"), "results"))
    store.path_for("deep").write_bytes(_file_with_valid_checksum("deep", _nested(50_000, "dict"), "completed"))
    assert store.list() == sorted(["good", long_id, "deep"])
    result = CliRunner().invoke(app, ["checkpoints", "ls", "--store", f"file://{tmp_path}"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "good" in result.output and "3 checkpoint(s), 2 corrupt" in result.output


def test_a_deeply_nested_journal_record_is_corruption_too(tmp_path: Path) -> None:
    from loop_governor.checkpoint.file_journal import frame

    store = FileCheckpointStore(tmp_path)
    cp = TaskCheckpoint(task_id="t")
    store.save(cp)
    cp.add_result("one")
    store.save(cp)
    journal = store.journal_path_for("t")
    deep = b'{"v":3,"t":1.0,"step":0,"r":[1,[' + _nested(50_000, "list").encode() + b"]]}"
    journal.write_bytes(journal.read_bytes() + frame(3, deep)[0])
    with pytest.raises(CheckpointCorruptedError) as info:
        store.load("t")
    assert info.value.location == str(journal) and info.value.quarantine is not None


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 600), where=st.sampled_from(["result", "sub-result", "metadata"]))
@example(depth=MAX_DEPTH, where="result")
@example(depth=300, where="result")
def test_whatever_a_checkpoint_accepts_loads_back(depth: int, where: str) -> None:
    # Regression: a result nested 255-400 levels was recorded and saved, then refused as
    # "corrupt" on load (pydantic validates JSON only ~250 levels deep): the task was lost.
    value: object = 0
    for _ in range(depth):
        value = [value]
    cp = TaskCheckpoint(task_id="t")
    try:
        if where == "result":
            cp.record_success("k", value)
        elif where == "sub-result":
            cp.add_result(value)
        else:
            cp.metadata["m"] = value
            cp.encode_body(None)
    except CheckpointSerializationError:
        assert depth >= MAX_DEPTH - 1
        return
    store = MemoryCheckpointStore()
    store.save(cp)
    loaded = store.load("t")
    assert loaded is not None
    assert (loaded.completed.get("k"), loaded.results, loaded.metadata.get("m")) == (
        cp.completed.get("k"),
        cp.results,
        cp.metadata.get("m"),
    )


# -- file names --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(a=st.text(min_size=1, max_size=400), b=st.text(min_size=1, max_size=400))
def test_file_names_are_injective(a: str, b: str) -> None:
    assume(a != b)
    assert encode_task_id(a) != encode_task_id(b)
    stem = encode_task_id(a)
    if "~" in stem:  # a task id spelling a long id's hashed file name gets a file of its own
        assert encode_task_id(stem) != stem


@settings(max_examples=25, deadline=None)
@given(long_id=st.text(min_size=181, max_size=400))
def test_a_task_id_spelling_another_tasks_hashed_file_name_is_a_task_of_its_own(long_id: str) -> None:
    # Regression: load/delete of an id equal to a long id's hashed file stem fell back to
    # that file: a false CheckpointCorruptedError, and delete removed the other task.
    with tempfile.TemporaryDirectory() as tmp:
        store = FileCheckpointStore(tmp)
        cp = TaskCheckpoint(task_id=long_id)
        cp.add_result("long")
        store.save(cp)
        path = store.path_for(long_id)
        stem = path.name[: -len(".ckpt.json")]
        assert "~" in stem
        assert store.load(stem) is None
        assert store.delete(stem) is False and path.exists()
        other = TaskCheckpoint(task_id=stem)
        other.add_result("stem")
        store.save(other)
        loaded_long, loaded_stem = store.load(long_id), store.load(stem)
        assert loaded_long is not None and loaded_long.results == ["long"]
        assert loaded_stem is not None and loaded_stem.results == ["stem"]
        assert store.list() == sorted([long_id, stem])
        assert store.delete(stem) and store.load(long_id) is not None


def test_a_long_id_file_holding_another_task_is_not_listed_as_that_task(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    a, b = "a" * 200, "b" * 200
    store.save(TaskCheckpoint(task_id=a))
    store.path_for(b).write_bytes(store.path_for(a).read_bytes())  # copied under b's name
    assert store.list() == [a]
    assert [name for name, _ in store.unidentified()] == [store.path_for(b).name]
    with pytest.raises(CheckpointCorruptedError, match="belongs to task"):
        store.load(b)


# -- links and special files -------------------------------------------------------------------


@needs_links
def test_a_symlinked_checkpoint_is_refused_never_followed(tmp_path: Path) -> None:
    # Regression: load read through the link and copied its target into .quarantine/.
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_bytes(b"TOP-SECRET, and no checkpoint")
    store = FileCheckpointStore(tmp_path / "ck")
    link = store.path_for("t")
    link.symlink_to(secret)
    with pytest.raises(CheckpointCorruptedError, match="symbolic link") as info:
        store.load("t")
    assert link.is_symlink()  # left in place
    copies = list((tmp_path / "ck" / ".quarantine").iterdir())
    assert copies and all(b"TOP-SECRET" not in p.read_bytes() for p in copies)
    assert info.value.quarantine is not None and str(secret).encode() in Path(info.value.quarantine).read_bytes()
    with pytest.raises(CheckpointCorruptedError):
        store.save(TaskCheckpoint(task_id="t"))
    store.save(TaskCheckpoint(task_id="t", step=3), force=True)  # replaces the link, not its target
    assert not link.is_symlink() and secret.read_bytes() == b"TOP-SECRET, and no checkpoint"
    loaded = store.load("t")
    assert loaded is not None and loaded.step == 3


@needs_links
def test_a_link_to_another_valid_checkpoint_is_refused_too(tmp_path: Path) -> None:
    elsewhere = FileCheckpointStore(tmp_path / "elsewhere")
    planted = TaskCheckpoint(task_id="t")
    planted.record_success("pay:1", "paid")  # a resume would skip this call
    elsewhere.save(planted)
    store = FileCheckpointStore(tmp_path / "ck")
    store.path_for("t").symlink_to(elsewhere.path_for("t"))
    with pytest.raises(CheckpointCorruptedError, match="symbolic link"):
        store.load("t")


@needs_links
def test_a_symlinked_journal_is_never_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target.txt"
    target.write_bytes(b"someone else's file\n")
    store = FileCheckpointStore(tmp_path / "ck")
    cp = TaskCheckpoint(task_id="t")
    store.save(cp)
    store.journal_path_for("t").symlink_to(target)
    cp.add_result("x")
    with pytest.raises(CheckpointCorruptedError, match="symbolic link"):
        store.save(cp)
    with pytest.raises(CheckpointCorruptedError, match="symbolic link"):
        store.load("t")
    assert target.read_bytes() == b"someone else's file\n"
    store.save(cp, force=True)
    assert target.read_bytes() == b"someone else's file\n" and not store.journal_path_for("t").exists()
    loaded = store.load("t")
    assert loaded is not None and loaded.results == ["x"]


@needs_links
@pytest.mark.timeout(20)
def test_a_fifo_in_place_of_a_checkpoint_is_refused_without_hanging(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path)
    os.mkfifo(store.path_for("t"))
    with pytest.raises(CheckpointCorruptedError, match="special file"):
        store.load("t")
    with pytest.raises(CheckpointCorruptedError):
        store.save(TaskCheckpoint(task_id="t"))


@needs_links
def test_a_quarantine_directory_planted_as_a_link_is_not_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    store = FileCheckpointStore(tmp_path / "ck")
    (tmp_path / "ck" / ".quarantine").symlink_to(outside)
    store.path_for("t").write_bytes(b"garbage")
    with pytest.raises(CheckpointCorruptedError) as info:
        store.load("t")
    assert info.value.quarantine is None and list(outside.iterdir()) == []
