"""Checkpoint save latency against task size, for every store, beside bare writes.

    .venv/bin/python benchmarks/checkpoint_save.py [--sizes 1,100,1000,5000,10000] [--repeat 1]
        [--redis-url redis://...] [--dir /path/on/real/disk] [--json]

A task grows by one governed call at a time (a ~500-byte result, a sub-result every 5th
call, a known-bad call every 10th, as ``Governor.call`` records them) and is saved after
each call, in every store: file, SQLite, Redis and memory. There is one task per size
n, staggered so that all of them reach their last 100 calls at the same moments (the
10000-call task starts first, the 100-call task 100 steps before the end): the saves
compared are made side by side, so a shared machine's drift hits every size alike. At
n=1 the figure is 100 fresh tasks' first saves, made in the same window.

In that window, next to the stores, two floors: a bare append + fsync of the very
record the file store just appended for its 5000-call task (what any journal pays), and
a bare write + fsync + rename of that record into a fresh file (``tempfile.mkstemp``,
what one crash-atomic file write pays). Every 10th step the whole checkpoint of each
size is also written + fsynced + renamed, as every save did before the journal (the
floor of the old design). The order rotates each step.

Prints medians in microseconds, the mean and maximum over every save of the largest
task (the maximum is a compaction) and the goals of issue 19: the file store's median
at call 5000 <= 1.3x its median at call 100, and <= 2x a bare write + fsync + rename.
Without ``--redis-url`` a throw-away redis-server is started (no persistence: a Redis
save is a round trip, not a disk write).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loop_governor.checkpoint import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    RedisCheckpointStore,
    SQLiteCheckpointStore,
    TaskCheckpoint,
)
from loop_governor.errors import ErrorType, GovernedError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redis_latency import start_server  # the benchmarks' shared throw-away redis-server

WINDOW = 100
STORES = ("file", "sqlite", "redis", "memory")
BARE = ("bare append+fsync", "bare write+fsync+rename")
REWRITE = "whole rewrite (old design floor)"
SNIPPET = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 8

Times = dict[str, dict[int, list[float]]]  # subject -> task size -> save times (s)


def grow(cp: TaskCheckpoint, call: int) -> None:
    """Call ``call`` of a task, recorded as the governor records it."""
    cp.record_success(
        f'search_docs:{{"query":"topic {call}","limit":5}}',
        {"hits": [{"title": f"doc {call}", "snippet": f"{call}: {SNIPPET}"[:430]}], "total": call},
    )
    if call % 5 == 0:
        cp.add_result({"subtask": call // 5, "summary": f"done {call}"})
    if call % 10 == 0:
        cp.record_failure(
            f'fetch_url:{{"url":"https://example.com/{call}"}}',
            GovernedError(error_type=ErrorType.PERMANENT, tool="fetch_url", status=404, message="not found"),
        )
    cp.step = call


def bare_rename(directory: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".bare-")
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / "record.json")


class _Bare:
    """The two floors, fed the record the file store appended last."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.record = b"{}\n"
        self.fd = os.open(directory / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self) -> None:
        os.write(self.fd, self.record)
        os.fsync(self.fd)

    def rename(self) -> None:
        bare_rename(self.directory, self.record)


def run(root: Path, sizes: list[int], redis_url: str, tag: str) -> Times:
    """Grow one task per size in every store, all ending together."""
    stores: dict[str, CheckpointStore] = {
        "file": FileCheckpointStore(root / "file"),
        "sqlite": SQLiteCheckpointStore(root / "c.db"),
        "redis": RedisCheckpointStore(redis_url, prefix=f"bench:{tag}:", quarantine_prefix=f"bench-q:{tag}:"),
        "memory": MemoryCheckpointStore(),
    }
    file_store = stores["file"]
    assert isinstance(file_store, FileCheckpointStore)
    total = max(sizes)
    grown = [n for n in sizes if n >= WINDOW]
    cps = {(name, n): TaskCheckpoint(task_id=f"task-{n}") for name in stores for n in grown}
    probe = max((n for n in grown if n <= 5000), default=total)
    journal = file_store.journal_path_for(f"task-{probe}")
    (root / "bare").mkdir()
    bare = _Bare(root / "bare")
    times: Times = {name: {n: [] for n in sizes} for name in (*STORES, *BARE, REWRITE)}
    for step in range(1, total + 1):
        in_window = step > total - WINDOW
        jobs: list[tuple[str, int, Callable[[], object]]] = []
        for n in grown:
            call = step - (total - n)
            if call < 1:
                continue
            for name, store in stores.items():
                cp = cps[name, n]
                grow(cp, call)
                jobs.append((name, n, lambda store=store, cp=cp: store.save(cp)))
        if in_window and 1 in sizes:
            for name, store in stores.items():
                fresh = TaskCheckpoint(task_id=f"fresh-{step}")
                grow(fresh, 1)
                jobs.append((name, 1, lambda store=store, cp=fresh: store.save(cp)))
        if in_window:
            jobs.append((BARE[0], probe, bare.append))
            jobs.append((BARE[1], probe, bare.rename))
        size_before = journal.stat().st_size if journal.exists() else 0
        shift = step % len(jobs)
        for name, n, action in jobs[shift:] + jobs[:shift]:
            start = time.perf_counter()
            action()
            times[name][n].append(time.perf_counter() - start)
        size_after = journal.stat().st_size if journal.exists() else 0
        if 0 < size_after - size_before < 1 << 16:  # the line the file store appended (not a compaction)
            with open(journal, "rb") as fh:
                fh.seek(size_before)
                bare.record = fh.read()
        if in_window and step % 10 == 0:
            for n in grown:
                body = cps["memory", n].encode_body(time.time())
                start = time.perf_counter()
                bare_rename(bare.directory, body)
                times[REWRITE][n].append(time.perf_counter() - start)
    os.close(bare.fd)
    for name, store in stores.items():
        if name == "redis":
            for n in grown:
                store.delete(f"task-{n}")
        store.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000,5000,10000")
    parser.add_argument("--repeat", type=int, default=1, help="runs (each grows a task per size and store)")
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = sorted(set(map(int, args.sizes.split(","))))
    if max(sizes) < WINDOW:
        raise SystemExit(f"the largest size must be >= {WINDOW}")
    server = None
    runs: list[Times] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        try:
            url = args.redis_url
            if url is None:
                server, url = start_server(tmp)
            for r in range(args.repeat):
                root = Path(tmp) / f"run-{r}"
                root.mkdir()
                runs.append(run(root, sizes, url, f"{os.getpid()}-{r}"))
        finally:
            if server is not None:
                server.kill()
                server.wait()
    top = max(sizes)
    columns = (*STORES, *BARE, REWRITE)

    def window(name: str, n: int) -> list[float]:
        if name in BARE:  # timed once per step of the window, beside every size's saves
            return [v for one in runs for values in one[name].values() for v in values]
        return [v for one in runs for v in (one[name][n] if n == 1 or name == REWRITE else one[name][n][-WINDOW:])]

    medians = {
        name: {n: statistics.median(window(name, n)) * 1e6 for n in sizes if window(name, n)} for name in columns
    }
    summary = {}
    for name in STORES:
        values = [v for one in runs for v in one[name][top]]
        summary[name] = {"mean_us": statistics.fmean(values) * 1e6, "max_us": max(values) * 1e6, "saves": len(values)}
    goals = {}
    if 100 in sizes and 5000 in sizes:
        goals = {
            "file at 5000 / file at 100 (goal <= 1.3)": medians["file"][5000] / medians["file"][100],
            "file at 5000 / bare write+fsync+rename (goal <= 2)": medians["file"][5000] / medians[BARE[1]][5000],
            "file at 5000 / bare append+fsync": medians["file"][5000] / medians[BARE[0]][5000],
            "sqlite at 5000 / sqlite at 100": medians["sqlite"][5000] / medians["sqlite"][100],
            "redis at 5000 / redis at 100": medians["redis"][5000] / medians["redis"][100],
        }
    if args.json:
        print(json.dumps({"medians_us": medians, "summary": summary, "goals": goals}))
        return
    print(
        f"save latency in microseconds: median of the last {WINDOW} saves of a task of each size, "
        f"all made side by side ({args.repeat} run(s))"
    )
    widths = [max(9, len(c) + 2) for c in columns]
    print(f"{'calls':>7}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    for n in sizes:
        cells = [f"{medians[c][n]:.0f}" if n in medians[c] else "-" for c in columns]
        print(f"{n:>7}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))
    print(f"every save of the {top}-call task:")
    for name, figures in summary.items():
        print(f"  {name:<7} mean {figures['mean_us']:>7.0f}  max {figures['max_us']:>8.0f}  ({figures['saves']} saves)")
    for goal, ratio in goals.items():
        print(f"  {goal}: {ratio:.2f}")


if __name__ == "__main__":
    main()
