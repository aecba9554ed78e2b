"""Issue 17: the Lens's memory is bounded in bytes, whatever the number of tasks or the size of
their messages; per-task state goes at task end; dedup survives eviction.

Measured with tracemalloc (Python allocations, exact, immune to allocator noise); the RSS
figure for 3000 x 100 KB messages is ``benchmarks/trace_memory.py``.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import loop_governor as lg
from loop_governor.trace import Lens, TraceBudget, install, load_trace, rebuild_prompt, snapshot_path_for

MiB = 1 << 20


def _retained(run: Callable[[], Lens]) -> tuple[int, Lens]:
    """Bytes still allocated after ``run`` (the Lens it returns stays alive, flushed)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lens = run()
        assert lens.flush(timeout=60)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, lens
    finally:
        tracemalloc.stop()


def test_large_distinct_messages_leave_at_most_the_budgets_behind(tmp_path: Path) -> None:
    # Regression: every 100 KB message stayed in the snapshot memo (raw text + redacted
    # copy): 3000 of them held +575 MB RSS after all tasks had ended.
    gov = lg.Governor(lg.GovernorConfig())
    base = "the agent reads a file then calls search and writes a patch " * 1700  # ~100 KB

    def run() -> Lens:
        lens = install(gov, tmp_path / "trace.jsonl", spans=False)
        for i in range(150):
            with gov.task(f"task-{i}"):
                gov.emit("model_call", model="m", messages=[{"role": "tool", "content": f"{i} {base}"}])
        return lens

    retained, lens = _retained(run)
    budgets = sum(budget for _, budget in lens.memory().values())
    assert budgets == 14 * MiB  # the defaults
    assert all(held <= budget for held, budget in lens.memory().values()), lens.memory()
    assert retained < budgets + 2 * MiB, f"{retained / MiB:.1f} MB retained after 150 x 100 KB messages"
    lens.close()
    assert len(load_trace(tmp_path / "trace.jsonl").model_calls) == 150


def test_many_tasks_leave_no_per_task_state_and_bounded_caches(tmp_path: Path) -> None:
    # Regression: Lens._anomalies and JsonlWriter._stored grew with every task.
    budget = TraceBudget(snapshot_memo=256 << 10, stored_hashes=64 << 10, record_memo=64 << 10, anomalies=64 << 10)
    gov = lg.Governor(lg.GovernorConfig())

    def run() -> Lens:
        lens = install(gov, tmp_path / "trace.jsonl", spans=False, budget=budget)
        for i in range(3000):
            prompt = [{"role": "system", "content": "shared"}, {"role": "user", "content": f"question {i}"}]
            with gov.task(f"task-{i}"):
                for _ in range(2):  # the same prefix, no cache read: one anomaly per task
                    gov.emit("model_call", model="m", input_tokens=2000, cache_read_tokens=0, messages=prompt)
        return lens

    retained, lens = _retained(run)
    memory = lens.memory()
    assert all(held <= cap for held, cap in memory.values()), memory
    assert retained < 2 * MiB, f"{retained / MiB:.2f} MB retained after 3000 tasks"
    assert len(lens.anomalies) < 3000 and lens.anomalies_dropped == 3000 - len(lens.anomalies)
    assert lens.anomalies[-1]["task_id"] == "task-2999"  # the most recent are kept
    lens.close()
    assert len(load_trace(tmp_path / "trace.jsonl").anomalies) == 3000  # the trace has them all


def test_a_message_evicted_from_the_dedup_memo_is_written_again_and_every_prompt_rebuilds(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lens = Lens(path, spans=False, budget=TraceBudget(stored_hashes=400, snapshot_memo=0))  # two hashes
    prompts: list[list[dict[str, Any]]] = []
    for i in range(6):
        prompt = [{"role": "user", "content": f"m{j}"} for j in (0, i % 3, i)]
        prompts.append(prompt)
        lens({"event": "model_call", "task_id": "t", "messages": prompt})
    lens.close()
    stored = snapshot_path_for(path).read_text(encoding="utf-8").splitlines()
    assert len(stored) > len({m["content"] for p in prompts for m in p})  # some written twice
    trace = load_trace(path)
    assert trace.skipped_snapshot_lines == 0
    assert [rebuild_prompt(trace, call) for call in trace.model_calls] == prompts


def test_budgets_are_checked() -> None:
    import pytest

    with pytest.raises(ValueError, match="stored_hashes"):
        TraceBudget(stored_hashes=-1)
