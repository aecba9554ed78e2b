"""Memory a process keeps after many checkpointed tasks with one large result each.

    .venv/bin/python benchmarks/checkpoint_memory.py [--tasks 3000] [--kb 100] [--store file] [--json]

Each task is one governed call (``Governor.call`` inside ``governor.task(...)``) whose
tool returns a distinct ``--kb`` KB string, checkpointed to a file (or SQLite) store;
the task then ends. What the process still holds afterwards is memory no task needs:
caches keyed by results, per-task state kept after the task. The figure is resident
memory (RSS, after ``gc.collect()`` and ``malloc_trim``, so freed memory the allocator
keeps for reuse is not counted) after the tasks minus before them, with 50 tasks run
first so imports and warm-up are not counted either. Issue 17 measured +286 MB for
3000 tasks x 100 KB (an entry-bounded redaction cache in the checkpoint model).
Linux only (reads /proc/self/statm).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import tempfile
import time
from pathlib import Path

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore, SQLiteCheckpointStore


def rss_bytes() -> int:
    """Resident memory now, after a collection and returning free heap pages to the OS."""
    gc.collect()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_tasks(governor: lg.Governor, first: int, count: int, size: int) -> None:
    for i in range(first, first + count):
        text = f"result {i} " + "x" * size  # distinct per task, like real tool output

        def fetch(page: int, _text: str = text) -> str:
            return _text

        with governor.task(f"task-{i}"):
            governor.call("fetch", fetch, i)


def measure(tasks: int, kb: int, store_kind: str, directory: Path) -> dict[str, float]:
    store = (
        FileCheckpointStore(directory / "files")
        if store_kind == "file"
        else SQLiteCheckpointStore(directory / "checkpoints.db")
    )
    governor = lg.Governor(checkpoint_store=store)
    size = kb * 1024
    run_tasks(governor, 0, 50, size)  # warm-up
    before = rss_bytes()
    started = time.perf_counter()
    run_tasks(governor, 50, tasks, size)
    elapsed = time.perf_counter() - started
    after = rss_bytes()
    store.close()
    return {
        "tasks": tasks,
        "result_kb": kb,
        "rss_before_mb": before / 2**20,
        "rss_after_mb": after / 2**20,
        "growth_mb": (after - before) / 2**20,
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--kb", type=int, default=100, help="size of each task's result")
    parser.add_argument("--store", choices=("file", "sqlite"), default="file")
    parser.add_argument("--dir", default=None, help="where the store goes (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        figures = measure(args.tasks, args.kb, args.store, Path(tmp))
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{figures['tasks']} tasks x one {figures['result_kb']} KB checkpointed result ({args.store} store): "
        f"RSS {figures['rss_before_mb']:.1f} MB -> {figures['rss_after_mb']:.1f} MB, "
        f"growth {figures['growth_mb']:+.1f} MB ({figures['seconds']:.1f} s)"
    )


if __name__ == "__main__":
    main()
