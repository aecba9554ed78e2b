"""Checkpoint-side memory stays bounded in bytes and goes when the task goes (issue 17, item 5)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore, TaskCheckpoint

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint_memory.py"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_many_tasks_with_one_large_checkpointed_result_keep_no_memory(tmp_path: Path) -> None:
    # Regression: an lru_cache of redacted strings (8192 entries, whatever their size)
    # kept every task's 100 KB result: +39 MB after these 400 tasks, +295 MB after 3000.
    run = subprocess.run(
        [sys.executable, str(BENCHMARK), "--tasks", "400", "--kb", "100", "--dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    figures = json.loads(run.stdout)
    assert figures["growth_mb"] < 12, figures  # 400 x 100 KB = 39 MB if results were kept


def test_a_finished_task_leaves_its_checkpoint_to_the_garbage_collector(tmp_path: Path) -> None:
    governor = lg.Governor(checkpoint_store=FileCheckpointStore(tmp_path))
    refs = []
    for i in range(3):
        with governor.task(f"t{i}") as scope:
            governor.call("fetch", lambda: "x" * 100_000)
            refs.append(weakref.ref(scope.checkpoint))
        del scope
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]


def test_the_file_name_memo_stays_within_its_byte_budget(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path, path_cache_bytes=16 * 1024)
    for i in range(100):
        task_id = f"{i}-" + "long task id " * 50  # ~650 characters each
        store.save(TaskCheckpoint(task_id=task_id))
        assert store._files_bytes <= store.path_cache_bytes
    assert store.load(f"7-{'long task id ' * 50}") is not None  # evicted names are computed again


def test_the_key_memo_stays_within_its_byte_budget_and_holds_no_long_names() -> None:
    from loop_governor.checkpoint import model

    model.configure_key_memo(64 * 1024)
    try:
        cp = TaskCheckpoint(task_id="t")
        for i in range(2000):
            cp.record_success(f"k{i}", {f"name-{i}": 1})
            assert model.key_memo_bytes() <= 64 * 1024
        assert model.key_memo_bytes() > 0
        model.configure_key_memo(10 << 20)  # room to spare: a long name would show as an entry
        cp.record_success("short", {"name-1": 1})
        held = model._memo_storage_key.cache_info().currsize
        assert held == 1
        for i in range(50):
            cp.record_success(f"long{i}", {"L" * 100_000 + str(i): 2})  # such names are never memoized
        assert model._memo_storage_key.cache_info().currsize == held
        model.configure_key_memo(0)
        cp.record_success("again", {"name-1": 1})
        assert model.key_memo_bytes() == 0
    finally:
        model.configure_key_memo(2 << 20)
