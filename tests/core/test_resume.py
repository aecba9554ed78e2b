"""Resume through the governed call: finished and known-bad calls are not made again."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore, MemoryCheckpointStore, TaskCheckpoint


def _governor(tmp_path: Path, clock: VirtualClock) -> lg.Governor:
    config = lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}")
    return lg.Governor(config, clock=clock, sleep=clock.sleep)


def test_resumed_task_skips_completed_and_known_bad_calls(tmp_path: Path, clock: VirtualClock) -> None:
    search = Backend()
    missing = Backend(forever=HTTPError(404, "no such doc"))
    crash = Backend(forever=HTTPError(401, "token expired"))
    gov = _governor(tmp_path, clock)
    with gov.task("job-1") as scope:
        assert gov.call("search", search, "q1") == "ok"
        scope.add_result({"section": 1})
        with pytest.raises(lg.PermanentError):
            gov.call("fetch", missing, doc=7)
        with pytest.raises(lg.FatalError):
            gov.call("crm", crash)  # the run stops here

    # a new process: new governor, same checkpoint directory
    gov2 = _governor(tmp_path, clock)
    with gov2.task("job-1") as scope:
        assert scope.results == [{"section": 1}]
        assert gov2.call("search", search, "q1") == "ok"
        with pytest.raises(lg.PermanentError) as err:
            gov2.call("fetch", missing, doc=7)
        assert gov2.call("search", search, "q2") == "ok"  # new work runs
        scope.add_result({"section": 2})
    assert (search.calls, missing.calls) == (2, 1)
    assert json.loads(err.value.info.to_model_text("json"))["error"]["status"] == 404
    stored = FileCheckpointStore(tmp_path / "cps").load("job-1")
    assert stored is not None and stored.results == [{"section": 1}, {"section": 2}]


def test_non_json_results_still_succeed_and_are_not_checkpointed(tmp_path: Path, clock: VirtualClock) -> None:
    gov = _governor(tmp_path, clock)
    events: list[dict] = []
    gov.subscribe(events.append)
    marker = object()
    with gov.task("job-2"):
        assert gov.call("make", lambda: marker) is marker
    assert any(e["event"] == "checkpoint_skipped" for e in events)


def test_secrets_never_reach_the_checkpoint_file(tmp_path: Path, clock: VirtualClock) -> None:
    gov = _governor(tmp_path, clock)
    with gov.task("job-3"):
        gov.call("login", lambda: "session ok, api_key=sk-live-abcdefghijklmnopqrst")
    raw = b"".join(p.read_bytes() for p in (tmp_path / "cps").rglob("*") if p.is_file())
    assert b"abcdefghijklmnopqrst" not in raw


def test_budget_exhaustion_keeps_partial_results_in_the_checkpoint(tmp_path: Path, clock: VirtualClock) -> None:
    config = lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}", max_steps=3)
    gov = lg.Governor(config, clock=clock, sleep=clock.sleep)
    with gov.task("batch") as scope, pytest.raises(lg.BudgetExhaustedError):
        for i in range(10):
            scope.add_result(gov.call("step", lambda n: n * n, i))
    stored = FileCheckpointStore(tmp_path / "cps").load("batch")
    assert stored is not None and stored.results == [0, 1, 4]


class _BrokenStore:
    """A checkpoint store whose backend went away after the task started."""

    def __init__(self) -> None:
        self.saves = 0

    def load(self, task_id: str) -> None:
        return None

    def save(self, cp: object, *, force: bool = False) -> int:
        self.saves += 1
        raise ConnectionError("checkpoint backend unreachable")

    def delete(self, task_id: str) -> bool:
        return False

    def list(self) -> list[str]:
        return []

    def close(self) -> None:
        return None


def test_a_failing_checkpoint_store_never_fails_the_call(clock: VirtualClock) -> None:
    store = _BrokenStore()
    gov = lg.Governor(checkpoint_store=store, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    events: list[dict] = []
    gov.subscribe(events.append)
    with gov.task("job") as scope:
        assert gov.call("search", lambda q: f"hits for {q}", "x") == "hits for x"
        scope.add_result("partial")
    # the call, the sub-result and the task's end (marked finished): none raised
    assert store.saves == 3 and gov.checkpoint_failures == 3
    assert [e["event"] for e in events].count("checkpoint_failed") == 3


def test_merge_keeps_this_writers_metadata(tmp_path: Path, clock: VirtualClock) -> None:
    config = lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}")
    first, second = lg.Governor(config, clock=clock), lg.Governor(config, clock=clock)
    with first.task("job") as a, second.task("job") as b:
        a.add_result("A")
        assert b.checkpoint is not None
        b.checkpoint.metadata["owner"] = "worker-2"
        b.add_result("B")  # conflicts with A's save: merged
    stored = FileCheckpointStore(tmp_path / "cps").load("job")
    assert stored is not None and stored.metadata.get("owner") == "worker-2"


def test_parallel_calls_of_one_task_all_reach_the_checkpoint(tmp_path: Path, clock: VirtualClock) -> None:
    # Parallel tool calls (LangGraph's ToolNode runs them on a thread pool) record into
    # one task checkpoint: none of them may be lost to a concurrent save, or a resume
    # would run it again.
    ran: list[int] = []

    def search(i: int) -> str:
        ran.append(i)
        return f"hits for {i}"

    gov = _governor(tmp_path, clock)
    with gov.task("job-1"), ThreadPoolExecutor(8) as pool:
        context = contextvars.copy_context()  # the task scope, as each tool thread sees it
        list(pool.map(lambda i: context.copy().run(gov.call, "search", search, i), range(120)))
    stored = FileCheckpointStore(tmp_path / "cps").load("job-1")
    assert stored is not None and len(stored.completed) == 120
    gov2 = _governor(tmp_path, clock)
    with gov2.task("job-1", resume=True):  # the task finished: resumed only when asked
        assert [gov2.call("search", search, i) for i in range(120)] == [f"hits for {i}" for i in range(120)]
    assert sorted(ran) == list(range(120))  # each ran once, none again on resume


def test_checkpoint_events_reach_a_subscriber_that_waits_on_the_event_loop(tmp_path: Path) -> None:
    # A sync tool on a worker thread and an async tool on the loop, in one task; the
    # subscriber hands events to the loop and waits. Emitting while holding the task's
    # checkpoint lock would deadlock: the loop thread waits for that lock.
    gov = lg.Governor(checkpoint_store=FileCheckpointStore(tmp_path))
    seen: list[str] = []

    async def main() -> None:
        loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()

        async def put(event: str) -> None:
            seen.append(event)

        def forward(event: dict[str, Any]) -> None:
            if threading.get_ident() == loop_thread:
                seen.append(event["event"])
                return
            if event["event"] == "checkpoint_saved":
                time.sleep(0.1)  # let the async tool finish meanwhile and want the lock
            asyncio.run_coroutine_threadsafe(put(event["event"]), loop).result(timeout=5)

        async def async_tool(x: int) -> dict[str, int]:
            await asyncio.sleep(0.05)
            return {"async": x}

        gov.subscribe(forward)
        async with gov.task("job-1"):
            await asyncio.gather(
                asyncio.to_thread(gov.call, "sync", lambda x: {"sync": x}, 1), gov.acall("async", async_tool, 2)
            )

    asyncio.run(main())
    assert gov.sink_failures == 0
    assert seen.count("checkpoint_saved") == 3  # two calls, then the task's end


def test_sub_results_survive_two_conflicting_writers_in_a_row(clock: VirtualClock) -> None:
    # Another process saves the task twice while this one saves once: the first merge
    # conflicts again, and our sub-result must be merged into the second copy too.
    class Contended(MemoryCheckpointStore):
        other_writes = 0

        def save(self, cp: TaskCheckpoint, *, force: bool = False) -> int:
            if self.other_writes < 2 and cp.results and cp.results[-1] == "ours":
                self.other_writes += 1
                theirs = super().load(cp.task_id)
                assert theirs is not None
                theirs.add_result(f"theirs{self.other_writes}")
                super().save(theirs)
            return super().save(cp, force=force)

    store = Contended()
    gov = lg.Governor(checkpoint_store=store, clock=clock, sleep=clock.sleep)
    with gov.task("job-1") as scope:
        scope.add_result("first")
        scope.add_result("ours")
    stored = store.load("job-1")
    assert stored is not None and sorted(stored.results) == ["first", "ours", "theirs1", "theirs2"]  # type: ignore[type-var]
