"""False-positive rate of the no-progress guard on successful real agent runs.

    python benchmarks/loop_guard_calibration.py ../shared/corpus/swe-dev [--threshold 3]

Replays every tool result of every successful run (``exit_status == "Submitted"``) through
:class:`loop_governor.progress.ProgressGuard`, exactly as the governed call feeds it, and
counts the runs in which the guard would have warned or stopped the agent. Those runs
finished their task, so every warning is a false positive; the default settings must
show 0. Also prints how often trivial results repeat (why they are exempt).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from loop_governor.governor import call_key
from loop_governor.progress import ProgressGuard


def _runs(paths: list[Path]) -> list[dict[str, Any]]:
    files: list[Path] = []
    for path in paths:
        files += sorted(path.rglob("*.json.gz")) if path.is_dir() else [path]
    runs = []
    for file in files:
        with gzip.open(file, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
        data["_file"] = file.name
        runs.append(data)
    return runs


def _tool_results(messages: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(tool name, call key, result text) in the order the agent received them."""
    calls: dict[str, tuple[str, str]] = {}
    out = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call.get("function", {})
            name = fn.get("name", "?")
            calls[call.get("id", "")] = (name, call_key(name, (fn.get("arguments", ""),)))
        if message.get("role") == "tool":
            name, key = calls.get(message.get("tool_call_id", ""), ("?", "?"))
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
            out.append((name, key, content if isinstance(content, str) else json.dumps(content)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--trivial-chars", type=int, default=10)
    args = parser.parse_args()

    runs = [r for r in _runs(args.paths) if r.get("exit_status") == "Submitted"]
    flagged: list[tuple[str, str, int]] = []
    trivial_repeats = 0
    for run in runs:
        guard = ProgressGuard(args.threshold, args.trivial_chars)
        naive = ProgressGuard(args.threshold, trivial_chars=-1)  # no trivial exemption
        naive_hit = False
        for name, key, text in _tool_results(run["messages"]):
            verdict = guard.observe(name, text, lambda key=key: key)
            naive_hit = naive_hit or naive.observe(name, text, lambda key=key: key).action != "ok"
            if verdict.action != "ok":
                flagged.append((run["_file"], verdict.action, verdict.count))
                break
        trivial_repeats += naive_hit
    runs_flagged = len({f for f, _, _ in flagged})
    print(f"successful runs replayed: {len(runs)}")
    print(f"runs the guard would warn or stop (false positives): {runs_flagged} "
          f"({runs_flagged / max(len(runs), 1):.1%})")
    for file, action, count in flagged:
        print(f"  {file}: {action} after {count} identical results")
    print(f"runs with {args.threshold}+ repeated results if trivial ones (<= {args.trivial_chars} chars) counted: "
          f"{trivial_repeats} ({trivial_repeats / max(len(runs), 1):.1%})")


if __name__ == "__main__":
    main()
