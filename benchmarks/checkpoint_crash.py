"""SIGKILL a checkpointing process 1000 times per store and tally what survived.

    .venv/bin/python benchmarks/checkpoint_crash.py [--kills 1000] [--stores file,sqlite,redis]
        [--redis-url redis://127.0.0.1:6379/0] [--max-delay-ms 40] [--seed 0]
        [--compact-min-bytes 8192] [--compact-ratio 0]

A worker grows a checkpoint one step per save and acknowledges each save after it
returned; it is killed at a uniformly random instant (see
``loop_governor.checkpoint.crashcheck`` for the mechanics and why the check is sound).
The worker's store compacts whenever its journal holds 8 KB (about every 20 saves), so
many kills land mid-compaction; for the file store the tally says what each kill
interrupted (a snapshot write, the step between the snapshot's rename and the journal
reset, an append). After each kill the checkpoint is reloaded and checked: it parses, it
is consistent (step, results, completed and known-bad calls, the hash chain in metadata
agree), and it holds every acknowledged save. Without ``--redis-url`` a throw-away
redis-server is started (no persistence: the kills hit the client, not the server).
For comparison, the issue notes CrewAI 1.15's own checkpoints lost 3 of 16 hard kills.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from loop_governor.checkpoint import CheckpointError, FileCheckpointStore, checkpoint_store_from_url
from loop_governor.checkpoint.crashcheck import CrashHarness, file_store_state, problems, temp_files

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redis_latency import start_server  # the benchmarks' shared throw-away redis-server

KILLS_PER_TASK = 25


def run(url: str, kills: int, max_delay_s: float, seed: int, workdir: Path, options: dict[str, Any]) -> Counter[str]:
    tally: Counter[str] = Counter()
    rng = random.Random(seed)
    reader = checkpoint_store_from_url(url)
    stored: dict[str, int] = {}
    snapshot_bytes: dict[str, int] = {}
    with CrashHarness(url, workdir, options) as harness:
        for kill in range(kills):
            task_id = f"crash-{seed}-{kill // KILLS_PER_TASK}"
            temps = temp_files(reader.directory) if isinstance(reader, FileCheckpointStore) else set()
            outcome = harness.kill_after(task_id, rng.uniform(0, max_delay_s))
            tally["kills"] += 1
            tally["killed by SIGKILL" if outcome.death == "signal 9" else f"worker died: {outcome.death}"] += 1
            previous = stored.get(task_id, 0)
            if isinstance(reader, FileCheckpointStore):
                if previous and temp_files(reader.directory) - temps:
                    tally["  killed writing a compaction snapshot"] += 1
                state = file_store_state(reader, task_id)
                if state == "stale journal":
                    tally["  killed after the snapshot rename, before the journal reset"] += 1
                elif state != "clean":
                    tally[f"  killed leaving a {state}"] += 1
            try:
                cp = reader.load(task_id)
            except CheckpointError as exc:
                tally[f"load failed: {type(exc).__name__}"] += 1
                continue
            step = 0 if cp is None else cp.step
            found = problems(cp, outcome.acked, previous) if cp is not None else []
            if cp is None and max(outcome.acked, previous) > 0:
                found.append("checkpoint vanished")
            if found:
                tally["reloads with a problem"] += 1
                for problem in found:
                    tally[f"  {problem.split(',')[0]}"] += 1
            else:
                tally["reloads ok"] += 1
            if cp is not None:
                size = cp.sync_state().snapshot_bytes
                tally["compactions seen between kills"] += size != snapshot_bytes.get(task_id, size)
                snapshot_bytes[task_id] = size
            if step == max(outcome.acked, previous) + 1:
                tally["saved but not yet acknowledged (allowed)"] += 1
            tally["steps gained"] += max(0, step - previous)
            stored[task_id] = step
    reader.close()
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=1000, help="kills per store")
    parser.add_argument("--stores", default="file,sqlite,redis", help="comma list of file, sqlite, redis")
    parser.add_argument("--redis-url", default=None, help="a redis server (default: start a throw-away one)")
    parser.add_argument("--max-delay-ms", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compact-min-bytes", type=int, default=8192)
    parser.add_argument("--compact-ratio", type=float, default=0.0)
    args = parser.parse_args()
    options = {"compact_min_bytes": args.compact_min_bytes, "compact_ratio": args.compact_ratio}
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            for kind in args.stores.split(","):
                if kind == "file":
                    url = f"file://{root}/files"
                elif kind == "sqlite":
                    url = f"sqlite:///{root}/checkpoints.db"
                elif kind == "redis":
                    url = args.redis_url
                    if url is None:
                        server, url = start_server(tmp)
                else:
                    raise SystemExit(f"unknown store {kind!r}")
                started = time.perf_counter()
                tally = run(url, args.kills, args.max_delay_ms / 1000, args.seed, root / f"harness-{kind}", options)
                elapsed = time.perf_counter() - started
                print(f"== {kind} store: {tally['kills']} kills in {elapsed:.1f}s (compaction: {options})")
                for name, count in tally.items():
                    if name != "kills":
                        print(f"   {name:<62}{count:>7}")
                lost = tally["reloads with a problem"] + sum(v for k, v in tally.items() if k.startswith("load failed"))
                print(f"   => {lost} of {tally['kills']} kills lost or damaged a checkpoint")
        finally:
            if server is not None:
                server.kill()
                server.wait()


if __name__ == "__main__":
    main()
