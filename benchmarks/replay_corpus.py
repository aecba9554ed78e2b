"""Replay recorded agent runs through the pruning policies (same as `loop-governor replay`).

    .venv/bin/python benchmarks/replay_corpus.py ../shared/corpus/swe-dev --cache-price 0.1

Prints tokens/request, tokens at turn 30, the bill with cached prefixes and p50/p99 ms per
request for: raw, LangChain ClearToolUsesEdit (if installed), seed head/tail, ours.
"""

from __future__ import annotations

import typer

from loop_governor.cli.replay import replay_command

if __name__ == "__main__":
    typer.run(replay_command)
