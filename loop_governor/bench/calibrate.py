"""How real agents react to a failed tool call, measured on recorded runs.

``loop-governor bench calibrate CORPUS --out calibration.json`` reads every run under
CORPUS (the formats [`loop_governor.context.replay.load_runs`][loop_governor.context.replay.load_runs] reads:
mini-swe-agent JSON, tau-bench trajectory lists, plain message lists; each sub-directory is one
*source*) and writes the parameters of the benchmark's ``calibrated`` model policy. The
shipped defaults (``calibration.json`` next to this module) are this command run on the
project's shared corpus; the bench README quotes its figures.

Definitions (also written into the JSON):

* a run is its tool results in the order they came back, each matched to its call by
  ``tool_call_id`` (parallel calls flattened in order);
* a *failure* is a result with ``<returncode>N</returncode>``, N != 0 (shell agents:
  kind ``command_failed``), or a result that starts with ``Error`` (API agents: kind
  ``not_found`` when it says "not found", else ``invalid``: the request was refused);
* the *move* after a failure is read from the run's next tool call: ``identical`` (same
  tool, JSON-equal arguments), ``changed`` (same tool, other arguments), ``switch``
  (another tool) or ``give_up`` (no further tool call in the run);
* the *position* of a failure is 1 + the number of failed calls of the same tool right
  before it; a *streak* is a failure at position 1 and the calls of that tool that
  follow failures without interruption (its length counts calls, the last one
  included, successful or not).

Moves are counted per kind and position (1, 2, 3+): the streak lengths follow from them,
so the policy reproduces both; no streak grows past the longest one the sources show
(``longest_streak``). ``default`` pools the failures of sources whose agents
use more than one tool (only there can a model switch tools); the benchmark uses it for
failure kinds the corpus does not contain (rate limits, outages, expired credentials).
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loop_governor.context.replay import load_runs

FORMAT = "loop-governor-bench-calibration/1"
MOVES: tuple[str, ...] = ("identical", "changed", "switch", "give_up")
POSITIONS = 3
"""Positions 1, 2 and 3+ are counted apart (few failures come third or later)."""

_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")
_ERROR = re.compile(r"\s*error\b", re.I)

DEFINITIONS: dict[str, str] = {
    "failure": "a tool result with <returncode>N</returncode>, N != 0 (kind command_failed), or starting "
    "with 'Error' (kind not_found if it says 'not found', else invalid)",
    "move": "the run's next tool call after the failure: identical (same tool, JSON-equal arguments), changed "
    "(same tool, other arguments), switch (another tool), give_up (no further tool call in the run)",
    "position": "1 + the number of failed calls of the same tool right before this failure; 3 means 3 or more",
    "streak": "a failure at position 1 and the calls of that tool that follow failures without interruption; "
    "its length counts calls, the last one included",
    "identical_next_rate": "identical moves / failures followed by another tool call",
    "default": "all failures of sources whose agents used more than one tool, pooled over kinds",
    "longest_streak": "the longest streak (calls) in the sources counted: the policy leaves a call after that many",
}


@dataclass(frozen=True)
class Result:
    tool: str
    args: Any
    kind: str | None  # the failure kind, None for a success


def _parse(value: Any) -> Any:
    """JSON text, a Python literal (tau-bench stores tool calls as repr strings), or as is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content, default=str)


def failure_kind(text: str) -> str | None:
    """The kind of failure a tool result reports, or None for a success (see the module)."""
    code = _RETURNCODE.search(text)
    if code is not None:
        return "command_failed" if code.group(1) != "0" else None
    if _ERROR.match(text):
        return "not_found" if "not found" in text.lower() else "invalid"
    return None


def tool_results(messages: Sequence[dict[str, Any]]) -> list[Result]:
    """A run's tool results in arrival order, each with its call's tool and arguments."""
    calls: dict[str, tuple[str, Any]] = {}
    out: list[Result] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            raw = _parse(message.get("tool_calls"))
            for call in raw if isinstance(raw, list) else []:
                if not isinstance(call, dict):
                    continue
                fn = call["function"] if isinstance(call.get("function"), dict) else call
                name = str(fn.get("name", "?"))
                calls[str(call.get("id", ""))] = (name, _parse(fn.get("arguments", fn.get("args"))))
        elif role == "tool":
            name, args = calls.get(str(message.get("tool_call_id", "")), (str(message.get("name") or "?"), None))
            out.append(Result(name, args, failure_kind(_text(message.get("content")))))
    return out


def _move(failed: Result, following: Result | None) -> str:
    if following is None:
        return "give_up"
    if following.tool != failed.tool:
        return "switch"
    return "identical" if following.args == failed.args else "changed"


class SourceStats:
    """The counts of one source (a sub-directory of the corpus)."""

    def __init__(self) -> None:
        self.runs = 0
        self.results = 0
        self.failures = 0
        self.tools: set[str] = set()
        self.moves: dict[tuple[str, int], Counter[str]] = {}
        self.streaks: Counter[int] = Counter()

    def add_run(self, results: list[Result]) -> None:
        self.runs += 1
        self.results += len(results)
        self.tools.update(r.tool for r in results)
        position = 0
        for i, result in enumerate(results):
            prev = results[i - 1] if i else None
            continued = prev is not None and prev.kind is not None and prev.tool == result.tool
            position = position + 1 if continued else 1
            if result.kind is None:
                continue
            self.failures += 1
            following = results[i + 1] if i + 1 < len(results) else None
            bucket = min(position, POSITIONS)
            self.moves.setdefault((result.kind, bucket), Counter())[_move(result, following)] += 1
            if position == 1:
                length = 1
                while i + length < len(results):
                    before, nxt = results[i + length - 1], results[i + length]
                    if before.kind is None or nxt.tool != result.tool:
                        break
                    length += 1
                self.streaks[length] += 1

    def summary(self) -> dict[str, Any]:
        total: Counter[str] = Counter()
        for counts in self.moves.values():
            total.update(counts)
        followed = self.failures - total["give_up"]
        return {
            "runs": self.runs,
            "tool_results": self.results,
            "tools": len(self.tools),
            "failures": self.failures,
            "failures_followed_by_a_call": followed,
            "identical_next": total["identical"],
            "identical_next_rate": round(total["identical"] / followed, 4) if followed else 0.0,
            "moves": {m: total[m] for m in MOVES},
            "streak_lengths": {str(k): v for k, v in sorted(self.streaks.items())},
            "longest_streak": max(self.streaks, default=0),
        }


def _positions(counters: Iterable[dict[tuple[str, int], Counter[str]]], kinds: set[str] | None) -> list[dict[str, int]]:
    counters = list(counters)
    rows = []
    for bucket in range(1, POSITIONS + 1):
        counts: Counter[str] = Counter()
        for moves in counters:
            for (kind, b), c in moves.items():
                if b == bucket and (kinds is None or kind in kinds):
                    counts.update(c)
        rows.append({"n": sum(counts[m] for m in MOVES), **{m: counts[m] for m in MOVES}})
    return rows


def calibrate(corpus: Path) -> dict[str, Any]:
    """The calibration parameters measured on ``corpus`` (a directory, see the module)."""
    corpus = Path(corpus)
    if not corpus.exists():
        raise FileNotFoundError(f"corpus not found: {corpus}")
    groups: dict[str, list[Path]] = {}
    if corpus.is_dir():
        for child in sorted(corpus.iterdir()):
            if child.is_dir():
                groups[child.name] = [child]
            elif child.name.endswith((".json", ".json.gz")):
                groups.setdefault(corpus.name, []).append(child)
    else:
        groups[corpus.name.removesuffix(".gz").removesuffix(".json")] = [corpus]
    stats: dict[str, SourceStats] = {}
    for name, paths in groups.items():
        source = SourceStats()
        for run in load_runs(paths):
            source.add_run(tool_results(run.messages))
        if source.runs:
            stats[name] = source
    if not stats:
        raise ValueError(f"no runs with messages found under {corpus}")
    kinds: dict[str, Any] = {}
    for kind in sorted({k for s in stats.values() for k, _ in s.moves}):
        sources = sorted(n for n, s in stats.items() if any(k == kind for k, _ in s.moves))
        kinds[kind] = {"sources": sources, "positions": _positions((stats[n].moves for n in sources), {kind})}
    multi = sorted(n for n, s in stats.items() if len(s.tools) > 1)
    return {
        "format": FORMAT,
        "corpus": corpus.name,
        "definitions": DEFINITIONS,
        "moves": list(MOVES),
        "sources": {n: s.summary() for n, s in sorted(stats.items())},
        "kinds": kinds,
        "default": {
            "sources": multi,
            "positions": _positions((stats[n].moves for n in multi), None),
            "longest_streak": max((max(stats[n].streaks, default=0) for n in multi), default=0),
        },
    }


def write(params: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(params, indent=2, sort_keys=True) + "\n", encoding="utf-8")
