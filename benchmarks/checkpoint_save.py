"""Save latency of the checkpoint stores vs a bare write + fsync + rename of the same bytes.

The bare baseline is the floor for any crash-safe file write; the target is a
FileCheckpointStore.save at most 1.5x that (it also serializes, redacts, checksums,
takes the directory lock, reads the stored version and fsyncs the directory). Two bare
baselines: the temp file named by ``tempfile.mkstemp`` (what Python code writes) and a
fixed temp name (no name generation at all, the tightest floor). The "bare+dirsync"
column adds the directory fsync the store must do to make the rename durable: on this
project's machine that alone is ~1.35x the bare write, so it is most of the store's cost.

    .venv/bin/python benchmarks/checkpoint_save.py [--rounds 1000] [--dir /path/on/real/disk]

Prints medians per checkpoint size and the ratios. Calls are interleaved (store, bare,
bare fixed, bare+dirsync, sqlite, store...) so disk and CPU drift hit all alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from loop_governor.checkpoint import FileCheckpointStore, SQLiteCheckpointStore, TaskCheckpoint
from loop_governor.errors import ErrorType, GovernedError


def make_checkpoint(task_id: str, calls: int, result_chars: int) -> TaskCheckpoint:
    """A checkpoint shaped like a real agent task: tool results, a few errors, sub-results."""
    cp = TaskCheckpoint(task_id=task_id)
    for i in range(calls):
        key = f'search_docs:{{"query":"topic {i}","limit":5}}'
        text = (f"result {i}: " + "lorem ipsum dolor sit amet " * (result_chars // 27 + 1))[:result_chars]
        cp.record_success(key, {"hits": [{"title": f"doc {i}", "snippet": text}], "total": i})
        cp.step += 1
    for i in range(max(1, calls // 10)):
        cp.record_failure(
            f'fetch_url:{{"url":"https://example.com/{i}"}}',
            GovernedError(error_type=ErrorType.PERMANENT, tool="fetch_url", status=404, message="not found"),
        )
    for i in range(max(1, calls // 5)):
        cp.add_result({"subtask": i, "summary": f"done {i}"})
    cp.metadata["agent"] = "bench"
    return cp


def bare_write(directory: Path, name: str, data: bytes, dir_fsync: bool = False, fixed_temp: bool = False) -> None:
    """The floor: temp file in the same directory, write, fsync, rename (+ directory fsync).

    ``tempfile.mkstemp`` names the temp file, as Python code does; ``fixed_temp`` opens
    a fixed name instead (only safe for a single writer) for the tightest possible floor.
    """
    if fixed_temp:
        tmp = str(directory / ".bare.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".bare-")
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / name)
    if dir_fsync:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def bench(directory: Path, calls: int, result_chars: int, rounds: int) -> dict[str, float]:
    file_store = FileCheckpointStore(directory / "file")
    sqlite_store = SQLiteCheckpointStore(directory / "ckpt.db")
    bare_dir = directory / "bare"
    bare_dir.mkdir()
    cp_file = make_checkpoint("bench-task", calls, result_chars)
    cp_sql = make_checkpoint("bench-task", calls, result_chars)
    file_store.save(cp_file)
    data = file_store.path_for("bench-task").read_bytes()
    steps = {
        "file": lambda: file_store.save(cp_file),
        "bare": lambda: bare_write(bare_dir, "bench-task.json", data),
        "bare_fixed": lambda: bare_write(bare_dir, "bench-task.json", data, fixed_temp=True),
        "bare_dirsync": lambda: bare_write(bare_dir, "bench-task.json", data, dir_fsync=True),
        "sqlite": lambda: sqlite_store.save(cp_sql),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    sqlite_store.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    medians["bytes"] = len(data)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    print(
        f"rounds={args.rounds}; medians in microseconds; ratio = file store / bare write+fsync+rename "
        "(temp file from mkstemp); ratio fixed = the same against a fixed temp name"
    )
    header = ("checkpoint", "bytes", "bare", "bare fixed", "bare+dirsync", "file store")
    header += ("ratio", "ratio fixed", "sqlite")
    print(f"{header[0]:<20}" + "".join(f"{h:>13}" for h in header[1:]))
    sizes = (("small (5 calls)", 5, 200), ("typical (50 calls)", 50, 400), ("large (500 calls)", 500, 1000))
    for label, calls, chars in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            m = bench(Path(tmp), calls, chars, args.rounds)
        cells = (
            f"{m['bytes']:.0f}",
            f"{m['bare'] * 1e6:.0f}",
            f"{m['bare_fixed'] * 1e6:.0f}",
            f"{m['bare_dirsync'] * 1e6:.0f}",
            f"{m['file'] * 1e6:.0f}",
            f"{m['file'] / m['bare']:.2f}x",
            f"{m['file'] / m['bare_fixed']:.2f}x",
            f"{m['sqlite'] * 1e6:.0f}",
        )
        print(f"{label:<20}" + "".join(f"{c:>13}" for c in cells))


if __name__ == "__main__":
    main()
