"""The benchmark's building blocks: virtual time, the fault schedule, the model policy."""

from __future__ import annotations

import json

import pytest

from loop_governor.bench.clock import DeadlineExceeded, VirtualClock, participant
from loop_governor.bench.policy import PATIENCE, Answer, CallTool, decide
from loop_governor.bench.world import SCENARIO_BY_NAME, Downstream, Request, ServiceError, peak_retry_rate


def test_concurrent_participants_overlap_in_virtual_time_deterministically() -> None:
    def trace() -> list[tuple[float, int | None]]:
        clock = VirtualClock()
        log: list[tuple[float, int | None]] = []

        def job(delays: list[float]) -> float:
            for d in delays:
                clock.sleep(d)
                log.append((clock(), participant()))
            return clock()

        out = clock.run_concurrently([lambda: job([2, 2]), lambda: job([1, 1, 1]), lambda: job([3])])
        assert [e for _, e in out] == [None, None, None]
        assert [v for v, _ in out] == [4, 3, 3]
        return log

    first = trace()
    assert first == trace()
    assert [t for t, _ in first] == sorted(t for t, _ in first)  # time never goes back


def test_deadline_stops_a_task() -> None:
    clock = VirtualClock()
    clock.set_deadline(10.0)
    clock.sleep(9.0)
    with pytest.raises(DeadlineExceeded):
        clock.sleep(5.0)


def test_faults_are_a_function_of_virtual_time() -> None:
    scenario = SCENARIO_BY_NAME["rate_limited_search"]
    clock = VirtualClock()
    ds = Downstream(clock, 1, "w", scenario.faults())
    with pytest.raises(ServiceError) as info:
        ds.call("search", {"query": "x"})
    assert info.value.status_code == 429 and info.value.headers["Retry-After"] == "75"
    clock.sleep(40 * 60)
    assert ds.call("search", {"query": "x"}).startswith("RESULT")
    assert [r.ok for r in ds.requests] == [False, True]


def test_capacity_overload_and_peak_concurrency() -> None:
    scenario = SCENARIO_BY_NAME["concurrent_flaky"]
    clock = VirtualClock()
    ds = Downstream(clock, 1, "w", {}, dict(scenario.capacity))
    errors = clock.run_concurrently([lambda: ds.call("quote_service", {"symbol": "A"}) for _ in range(3)])
    assert [isinstance(e, ServiceError) for _, e in errors] == [False, False, True]
    assert ds.peak_concurrency("quote_service") == 3


def test_peak_retry_rate_counts_only_retries_in_a_sliding_second() -> None:
    def req(task: str, start: float, ok: bool, tool: str = "svc") -> Request:
        return Request(task, tool, start, start + 1.5, ok)

    first_wave = [req(t, 10.0, t in "ab") for t in "abcde"]  # 5 at once: concurrency 5, no retry
    log = [
        *first_wave,
        req("c", 12.0, False),  # c, d, e retry 0.9 s apart: one sliding second holds all three
        req("d", 12.4, True),
        req("e", 12.9, True),
        req("c", 14.0, True),  # c's second retry
        req("a", 20.0, True),  # a's earlier call succeeded: a new call, not a retry
        req("x", 19.0, False, "other"),
        req("x", 20.5, False, "other"),  # x's retries are exactly 1 s apart: never in the same
        req("x", 21.5, True, "other"),  # [t, t + 1) window
        req("y", 21.5, False, "other"),  # y's first attempt, at the same instant: not a retry
    ]
    assert peak_retry_rate(first_wave) == 0
    assert peak_retry_rate(log) == 3
    assert peak_retry_rate(log, window_s=0.5) == 2
    assert peak_retry_rate(log[::-1]) == 3  # order of the log does not matter, start times do
    assert peak_retry_rate([r for r in log if r.tool == "other"]) == 1
    ds = Downstream(VirtualClock(), 0, "w", {}, requests=log)
    assert ds.peak_concurrency("svc") == 5
    assert ds.peak_retry_rate("svc") == 3 and ds.peak_retry_rate("other") == 1


def _spec() -> object:
    return SCENARIO_BY_NAME["missing_document"].tasks("w")[0]


def test_policy_repeats_a_call_on_plain_error_text() -> None:
    spec = _spec()
    ok = "RESULT search(query=Q3 revenue) ok"
    move = decide(spec, [ok, "Error: HTTP 404: document 'Q3-report' not found"])
    assert move == CallTool("fetch_doc", {"doc_id": "Q3-report"})
    move = decide(spec, [ok] + ["Error: HTTP 404"] * PATIENCE)
    assert move == CallTool("search_archive", {"query": "Q3 report"})


def test_policy_follows_the_governors_structured_error() -> None:
    spec = _spec()
    ok = "RESULT search(query=Q3 revenue) ok"
    permanent = json.dumps({"error": {"type": "permanent", "retryable": False, "advice": "change them"}})
    assert decide(spec, [ok, permanent]) == CallTool("search_archive", {"query": "Q3 report"})
    retry = json.dumps({"error": {"type": "transient", "retryable": True}})
    assert decide(spec, [ok, retry]) == CallTool("fetch_doc", {"doc_id": "Q3-report"})
    fatal = json.dumps({"error": {"type": "fatal", "retryable": False}})
    move = decide(spec, [ok, fatal])
    assert isinstance(move, Answer) and move.delivered == ("search",)
