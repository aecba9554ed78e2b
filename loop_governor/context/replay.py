"""Replay recorded agent runs through pruning policies and bill them with prompt caching.

Each LLM request of a run is the list of messages before an assistant message; replaying
a run through a policy gives, request by request, what the model would have seen. The
bill charges uncached prompt tokens at 1 and the message prefix identical to the previous
request at ``cache_price`` (how Anthropic, OpenAI and DeepSeek bill cached prefixes).

Formats read: a JSON (optionally gzipped) object with ``"messages"`` (mini-swe-agent), a
JSON list of ``{"traj": [...]}`` (tau-bench), a JSON list of messages, or a directory of
such files.
"""

from __future__ import annotations

import copy
import gc
import gzip
import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .pruner import ContextPruner, _fingerprint
from .text import head_tail
from .tokens import approx_tokens

_KEEP_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
_ROLES = {"system", "user", "assistant", "tool", "function", "developer"}

Step = Callable[[int], list[Any]]
"""Given ``i``, the messages the model sees for the request made before message ``i``."""
PolicyFactory = Callable[[list[dict[str, Any]]], Step]


@dataclass
class Run:
    name: str
    messages: list[dict[str, Any]]
    provider_prompt_tokens: list[int] = field(default_factory=list)


def _clean(messages: Iterable[Any]) -> tuple[list[dict[str, Any]], list[int]]:
    out: list[dict[str, Any]] = []
    usage: list[int] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in _ROLES:
            continue
        out.append({k: m[k] for k in _KEEP_KEYS if k in m and m[k] is not None})
        u = m.get("usage")
        if m.get("role") == "assistant" and isinstance(u, dict) and isinstance(u.get("prompt_tokens"), int):
            usage.append(u["prompt_tokens"])
    return out, usage


def _load_file(path: Path) -> list[Run]:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    runs: list[Run] = []
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        runs.append(Run(stem, *_clean(data["messages"])))
    elif isinstance(data, list) and data and all(isinstance(x, dict) and "role" in x for x in data):
        runs.append(Run(stem, *_clean(data)))
    elif isinstance(data, list):
        for k, item in enumerate(data):
            if not isinstance(item, dict):
                continue
            msgs = item.get("traj", item.get("messages"))
            if isinstance(msgs, list):
                label = f"{stem}#{item.get('task_id', k)}.{item.get('trial', 0)}"
                runs.append(Run(label, *_clean(msgs)))
    return runs


def load_runs(paths: Sequence[str | Path], unreadable: list[Path] | None = None) -> list[Run]:
    """Runs from files and directories (``*.json`` and ``*.json.gz``, sorted by name).

    A file that is not (gzipped) JSON is skipped and appended to ``unreadable``."""
    runs: list[Run] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted(x for x in p.rglob("*") if x.name.endswith((".json", ".json.gz")))
        else:
            files = [p]
        for f in files:
            try:
                runs.extend(_load_file(f))
            except (OSError, EOFError, ValueError, RecursionError):  # gzip, UTF-8 and JSON errors included
                if unreadable is not None:
                    unreadable.append(f)
    return runs


# ---------------------------------------------------------------------------- policies
def raw_policy(messages: list[dict[str, Any]]) -> Step:
    return lambda i: messages[:i]


def ours_policy(**kwargs: Any) -> PolicyFactory:
    def make(messages: list[dict[str, Any]]) -> Step:
        pruner = ContextPruner(**kwargs)
        return lambda i: pruner.prune(messages[:i])

    return make


def seed_policy(keep: int = 3, threshold: int = 5000, head: int = 1500, tail: int = 1500) -> PolicyFactory:
    """The seeds' pruner: every request, tool results older than the last ``keep`` are
    head/tail trimmed beyond ``threshold`` chars (no batching)."""

    def make(messages: list[dict[str, Any]]) -> Step:
        trimmed: dict[int, dict[str, Any]] = {}

        def step(i: int) -> list[Any]:
            prefix = messages[:i]
            tools = [j for j, m in enumerate(prefix) if m.get("role") == "tool"]
            old = tools[:-keep] if keep else tools
            for j in old:
                if j not in trimmed:
                    c = prefix[j].get("content")
                    t = head_tail(c, head, tail, threshold) if isinstance(c, str) else c
                    trimmed[j] = prefix[j] if t is c else {**prefix[j], "content": t}
                prefix[j] = trimmed[j]
            return prefix

        return step

    return make


def langchain_clear_policy(trigger: int = 20_000, keep: int = 3) -> PolicyFactory | None:
    """LangChain's ClearToolUsesEdit as ContextEditingMiddleware applies it (deep copy, then
    edit), or None when langchain is not installed. Guarded import: a peer comparison only."""
    try:
        from langchain.agents.middleware.context_editing import ClearToolUsesEdit
        from langchain_core.messages import convert_to_messages
        from langchain_core.messages.utils import count_tokens_approximately
    except ImportError:
        return None

    def make(messages: list[dict[str, Any]]) -> Step:
        lc = convert_to_messages([{**m, "content": m.get("content") or ""} for m in messages])
        edit = ClearToolUsesEdit(trigger=trigger, keep=keep)

        def step(i: int) -> list[Any]:
            edited = copy.deepcopy(lc[:i])
            edit.apply(edited, count_tokens=count_tokens_approximately)  # type: ignore[arg-type]
            return edited

        return step

    return make


POLICY_NOTES = {
    "raw": "every message verbatim",
    "langchain-clear": "LangChain ClearToolUsesEdit(trigger=20000, keep=3), applied per request",
    "seed-headtail": "results older than the last 3 head/tail trimmed beyond 5000 chars (1500+1500)",
    "ours": "ContextPruner() defaults (cache-aware batches)",
}


def default_policies() -> dict[str, PolicyFactory]:
    policies: dict[str, PolicyFactory] = {"raw": raw_policy}
    lc = langchain_clear_policy()
    if lc is not None:
        policies["langchain-clear"] = lc
    policies["seed-headtail"] = seed_policy()
    policies["ours"] = ours_policy()
    return policies


# ---------------------------------------------------------------------------- measuring
@dataclass
class PolicyResult:
    name: str
    requests: int = 0
    tokens: int = 0
    bill: float = 0.0
    turn30: list[int] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    failed_runs: int = 0
    """Runs this policy raised on (left out of every figure)."""

    def add(self, other: PolicyResult) -> None:
        self.requests += other.requests
        self.tokens += other.tokens
        self.bill += other.bill
        self.turn30 += other.turn30
        self.ms += other.ms
        self.cpu_ms += other.cpu_ms

    def summary(self, raw: PolicyResult | None) -> dict[str, Any]:
        ms, cpu = sorted(self.ms), sorted(self.cpu_ms)
        tpr = self.tokens / self.requests if self.requests else 0.0
        out: dict[str, Any] = {
            "policy": self.name,
            "requests": self.requests,
            "tokens_per_request": round(tpr, 1),
            "tokens_at_turn_30": round(statistics.fmean(self.turn30), 1) if self.turn30 else None,
            "bill": round(self.bill, 1),
            "p50_ms": round(ms[len(ms) // 2], 4) if ms else None,
            "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 4) if ms else None,
            # CPU time of the calling thread: unaffected by other processes on a busy machine.
            "p50_cpu_ms": round(cpu[len(cpu) // 2], 4) if cpu else None,
            "p99_cpu_ms": round(cpu[min(len(cpu) - 1, int(len(cpu) * 0.99))], 4) if cpu else None,
            "failed_runs": self.failed_runs,
        }
        if raw is not None and raw.requests and raw.tokens:
            out["token_change"] = round(tpr / (raw.tokens / raw.requests) - 1.0, 4)
            out["bill_vs_raw"] = round(self.bill / raw.bill, 4) if raw.bill else None
        return out


class _Meter:
    """Token counts and equality signatures per message object, computed once per object."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, int, tuple[Any, ...]]] = {}

    def get(self, m: Any) -> tuple[int, tuple[Any, ...]]:
        hit = self._memo.get(id(m))
        if hit is not None and hit[0] is m:
            return hit[1], hit[2]
        tokens, sig = approx_tokens(m), _fingerprint(m)
        self._memo[id(m)] = (m, tokens, sig)
        return tokens, sig


def replay_run(run: Run, make: PolicyFactory, result: PolicyResult, cache_price: float) -> None:
    # The benchmark holds every run in memory; freezing those objects keeps Python's full
    # GC passes (which would scan the whole corpus) out of the per-request timings.
    gc.freeze()
    step = make(run.messages)
    meter = _Meter()
    prev: list[tuple[int, tuple[Any, ...]]] = []
    turn = 0
    for i, m in enumerate(run.messages):
        if m.get("role") != "assistant":
            continue
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        seen = step(i)
        t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        result.ms.append((t1 - t0) / 1e6)
        result.cpu_ms.append((c1 - c0) / 1e6)
        cur = [meter.get(x) for x in seen]
        total = sum(t for t, _ in cur)
        cached = 0
        for (ta, sa), (_, sb) in zip(cur, prev, strict=False):
            if sa != sb:
                break
            cached += ta
        result.bill += (total - cached) + cache_price * cached
        result.tokens += total
        result.requests += 1
        turn += 1
        if turn == 30:
            result.turn30.append(total)
        prev = cur


def replay(
    runs: Sequence[Run], policies: dict[str, PolicyFactory] | None = None, cache_price: float = 0.1
) -> list[dict[str, Any]]:
    """One summary dict per policy (the first policy is the baseline for ratios)."""
    policies = policies or default_policies()
    results: list[PolicyResult] = []
    for name, make in policies.items():
        res = PolicyResult(name)
        for run in runs:
            one = PolicyResult(name)
            try:
                replay_run(run, make, one, cache_price)
            except Exception:  # a peer policy choking on a malformed run: count it, go on
                res.failed_runs += 1
                continue
            res.add(one)
        results.append(res)
    base = results[0] if results else None
    return [r.summary(base) for r in results]


def provider_calibration(runs: Sequence[Run]) -> dict[str, float] | None:
    """Mean provider-reported prompt tokens vs this module's estimate on the raw requests."""
    reported = [t for r in runs for t in r.provider_prompt_tokens]
    if not reported:
        return None
    estimated: list[int] = []
    for r in runs:
        if not r.provider_prompt_tokens:
            continue
        running = 0
        for m in r.messages:
            if m.get("role") == "assistant":
                estimated.append(running)
            running += approx_tokens(m)
    n = min(len(reported), len(estimated))
    if not n:
        return None
    rep, est = statistics.fmean(reported[:n]), statistics.fmean(estimated[:n])
    return {"provider_prompt_tokens": round(rep, 1), "estimated": round(est, 1), "ratio": round(est / rep, 4)}


__all__ = [
    "PolicyResult",
    "Run",
    "default_policies",
    "langchain_clear_policy",
    "load_runs",
    "ours_policy",
    "provider_calibration",
    "raw_policy",
    "replay",
    "seed_policy",
]
