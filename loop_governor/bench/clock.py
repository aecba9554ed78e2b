"""Virtual time for the benchmark: 40-minute incidents that run in milliseconds.

Every sleep in a benchmark world (model latency, tool latency, the governor's backoff,
LangChain's ToolRetryMiddleware backoff) advances this clock instead of waiting.

Concurrent tasks (the "5 tasks hitting one flaky service" scenario) run on real threads,
but only one of them runs at a time: a thread that sleeps hands the baton to the
participant with the earliest wake-up time, and the clock jumps there. That is a
discrete-event scheduler; it makes concurrent runs exactly reproducible (ties are
broken by participant number) while still letting their requests overlap in virtual
time, which is what the service's concurrency measure needs. Written by hand because
no library runs blocking third-party code (LangGraph, crewAI) on a virtual clock; the
asyncio virtual-time helpers only cover coroutines.
"""

from __future__ import annotations

import contextvars
import heapq
import threading
from collections.abc import Callable, Sequence
from typing import Any

_PARTICIPANT: contextvars.ContextVar[int | None] = contextvars.ContextVar("lg_bench_participant", default=None)


class DeadlineExceeded(BaseException):
    """The task ran past its deadline: the harness stops it, as a supervisor would.

    A ``BaseException`` so that no framework or governor ``except Exception`` turns it
    into model-facing text; it unwinds the agent run like a killed worker.
    """


class VirtualClock:
    """A callable clock whose ``sleep`` advances virtual time (and schedules threads)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0
        self._running: int | None = None
        self._deadlines: dict[int | None, float] = {}
        self.concurrent = False

    def __call__(self) -> float:
        return self.now

    def set_deadline(self, deadline: float | None, participant: int | None = None) -> None:
        if deadline is None:
            self._deadlines.pop(participant, None)
        else:
            self._deadlines[participant] = deadline

    def _check_deadline(self, participant: int | None) -> None:
        deadline = self._deadlines.get(participant)
        if deadline is not None and self.now > deadline:
            raise DeadlineExceeded(f"task deadline passed at t={self.now:.0f}s")

    def sleep(self, seconds: float) -> None:
        seconds = max(0.0, float(seconds))
        if not self.concurrent:
            self._check_deadline(None)
            self.now += seconds
            self._check_deadline(None)
            return
        me = _PARTICIPANT.get()
        if me is None:
            raise RuntimeError("a thread outside the benchmark's participants slept on the virtual clock")
        self._check_deadline(me)
        with self._cond:
            self._push(self.now + seconds, me)
            self._dispatch()
            while self._running != me:
                self._cond.wait()
        self._check_deadline(me)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    # -- the scheduler ----------------------------------------------------------------

    def _push(self, wake: float, participant: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (wake, self._seq, participant))

    def _dispatch(self) -> None:
        """Hand the baton to the earliest waiter (caller holds the condition)."""
        if self._heap:
            wake, _, nxt = heapq.heappop(self._heap)
            self.now = max(self.now, wake)
            self._running = nxt
        else:
            self._running = None
        self._cond.notify_all()

    def run_concurrently(self, jobs: Sequence[Callable[[], Any]]) -> list[tuple[Any, BaseException | None]]:
        """Run ``jobs`` as concurrent participants starting now; returns (value, error) each."""
        results: list[tuple[Any, BaseException | None]] = [(None, None)] * len(jobs)
        self.concurrent = True

        def body(index: int, job: Callable[[], Any]) -> None:
            _PARTICIPANT.set(index)
            with self._cond:
                while self._running != index:
                    self._cond.wait()
            try:
                results[index] = (job(), None)
            except BaseException as exc:  # reported to the harness, per task
                results[index] = (None, exc)
            finally:
                with self._cond:
                    self._dispatch()

        threads = []
        with self._cond:
            for index in range(len(jobs)):
                self._push(self.now, index)
        for index, job in enumerate(jobs):
            ctx = contextvars.copy_context()
            thread = threading.Thread(target=ctx.run, args=(body, index, job), daemon=True)
            threads.append(thread)
            thread.start()
        with self._cond:
            self._dispatch()
        for thread in threads:
            thread.join()
        self.concurrent = False
        self._deadlines.clear()
        return results


def participant() -> int | None:
    """The concurrent participant running in this context (``None`` outside a group)."""
    return _PARTICIPANT.get()
