"""The benchmark's building blocks: virtual time, the fault schedule, the model policy."""

from __future__ import annotations

import json

import pytest

from loop_governor.bench.clock import DeadlineExceeded, VirtualClock, participant
from loop_governor.bench.policy import (
    PATIENCE,
    Answer,
    Calibrated,
    CallTool,
    Seen,
    decide,
    failure_kind,
    make_behaviour,
)
from loop_governor.bench.provider import (
    Provider,
    ProviderError,
    key_rate_limit,
    overloaded,
    quota_after,
    quota_exhausted,
    rate_limited,
    sdk_request,
    sdk_should_retry,
)
from loop_governor.bench.world import (
    SCENARIO_BY_NAME,
    Downstream,
    Request,
    ServiceError,
    peak_concurrent_retries,
    peak_retry_rate,
)


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


def test_stubborn_reads_the_structured_error_like_a_plain_string() -> None:
    spec = _spec()
    ok = "RESULT search(query=Q3 revenue) ok"
    permanent = json.dumps({"error": {"type": "permanent", "retryable": False, "advice": "change them"}})
    stubborn = make_behaviour("stubborn")
    assert decide(spec, [ok, permanent], stubborn) == CallTool("fetch_doc", {"doc_id": "Q3-report"})
    move = decide(spec, [ok] + [permanent] * PATIENCE, stubborn)
    assert move == CallTool("search_archive", {"query": "Q3 report"})


def _params(*, identical: int = 0, changed: int = 0, switch: int = 0, give_up: int = 0, longest: int = 0) -> dict:
    row = {"identical": identical, "changed": changed, "switch": switch, "give_up": give_up}
    row["n"] = sum(row.values())
    return {
        "format": "loop-governor-bench-calibration/1",
        "kinds": {"not_found": {"positions": [{**row, "n": 1}] * 3}},  # too few: the default answers
        "default": {"positions": [row] * 3, "longest_streak": longest},
    }


def test_calibrated_policy_moves() -> None:
    missing = _spec()
    ok = "RESULT search(query=Q3 revenue) ok"
    not_found = "Error: HTTP 404: document 'Q3-report' not found"
    assert decide(missing, [ok, not_found], Calibrated(_params(identical=9))) == CallTool(
        "fetch_doc", {"doc_id": "Q3-report"}
    )
    assert decide(missing, [ok, not_found], Calibrated(_params(switch=9))) == CallTool(
        "search_archive", {"query": "Q3 report"}
    )
    give_up = decide(missing, [ok, not_found], Calibrated(_params(give_up=9)))
    assert give_up == CallTool("pricing_api", {"sku": "sku-1"})  # the document is skipped, the task goes on
    # changed arguments where the plan has no fix: a variant the service reads as the same request
    varied_call = decide(missing, [ok, not_found], Calibrated(_params(changed=9)))
    assert varied_call == CallTool("fetch_doc", {"doc_id": "Q3-report ~v1"})
    ds = Downstream(VirtualClock(), 0, "w", SCENARIO_BY_NAME["missing_document"].faults())
    with pytest.raises(ServiceError) as info:
        ds.call(varied_call.tool, varied_call.kwargs)
    assert info.value.status_code == 404
    # changed arguments where the plan has the corrected ones (422 -> priority=high)
    invalid = SCENARIO_BY_NAME["invalid_arguments"].tasks("w")[0]
    lookup = "RESULT crm_lookup(account=acme) ok"
    bad = json.dumps({"error": {"type": "permanent", "status": 422, "message": "invalid value 'urgent'"}})
    assert decide(invalid, [lookup, bad], Calibrated(_params(changed=9))) == CallTool(
        "create_ticket", {"account": "acme", "priority": "high"}
    )


def test_calibrated_policy_leaves_a_call_after_the_longest_real_streak() -> None:
    spec = _spec()
    ok = "RESULT search(query=Q3 revenue) ok"
    stays = Calibrated(_params(identical=9, switch=1, longest=3))
    fails = ["Error: HTTP 404: not found"]
    assert decide(spec, [ok, *fails * 2], stays) == CallTool("fetch_doc", {"doc_id": "Q3-report"})  # 9 in 10
    assert decide(spec, [ok, *fails * 3], stays) == CallTool("search_archive", {"query": "Q3 report"})


def test_calibrated_draws_are_seeded_and_read_the_failure_kind() -> None:
    spec = _spec()
    ok = "RESULT search(query=Q3 revenue) ok"
    fifty = Calibrated(_params(identical=5, switch=5))
    moves = {str(decide(spec, [ok, "Error: HTTP 503"], fifty, seed)) for seed in range(20)}
    assert len(moves) == 2  # both moves occur across seeds ...
    assert len({str(decide(spec, [ok, "Error: HTTP 503"], fifty, 7)) for _ in range(5)}) == 1  # ... one per seed
    assert failure_kind(Seen("Error: HTTP 404: gone", None)) == "not_found"
    assert failure_kind(Seen("{}", {"status": 422})) == "invalid"
    assert failure_kind(Seen("Error: HTTP 429: slow down", None)) == "default"
    assert failure_kind(Seen("ToolFailure (code: 409)", None)) == "invalid"


def test_provider_key_limit_and_sdk_retries() -> None:
    clock = VirtualClock()
    provider = Provider(clock, 0, "w", key_rate_limit(rpm=60, burst=2))
    provider.request(10, 0.0)
    provider.request(10, 0.0)
    with pytest.raises(ProviderError) as info:
        provider.request(10, 0.0)
    assert info.value.status_code == 429 and info.value.response.headers["retry-after"] == "1"
    # the SDK waits the retry-after and gets through
    sdk_request(provider, 10, 0.0, max_retries=2)
    assert [r.ok for r in provider.requests] == [True, True, False, False, True]
    # a quota error is retried by the SDK too (as openai-python does); max_retries=0 sends it once
    quota = Provider(VirtualClock(), 0, "w", quota_after(0.0))
    with pytest.raises(ProviderError):
        sdk_request(quota, 10, 1.0, max_retries=2)
    assert len(quota.requests) == 3
    with pytest.raises(ProviderError):
        sdk_request(quota, 10, 1.0, max_retries=0)
    assert len(quota.requests) == 4


def test_provider_errors_read_like_the_real_sdks() -> None:
    import loop_governor as lg

    limit = lg.classify(rate_limited(5, 12), "m")
    assert (limit.error_type, limit.status, limit.code, limit.retry_after) == (
        "transient",
        429,
        "rate_limit_exceeded",
        5,
    )
    assert lg.classify(quota_exhausted(), "m").error_type == "fatal"
    busy = lg.classify(overloaded(), "m")
    assert (busy.error_type, busy.status, busy.code) == ("transient", 529, "overloaded_error")
    assert not sdk_should_retry(ProviderError(429, "rate_limit_exceeded", "x", {"retry-after": "600"}))
    assert sdk_should_retry(overloaded()) and not sdk_should_retry(ProviderError(400, "invalid_request_error", "x"))


def test_peak_concurrent_retries() -> None:
    log = [
        Request("a", "svc", 0.0, 0.1, False),
        Request("b", "svc", 0.0, 0.1, False),
        Request("a", "svc", 0.5, 0.6, False),  # both retry at once: 2 in flight
        Request("b", "svc", 0.5, 0.6, True),
        Request("a", "svc", 0.6, 0.7, True),  # starts as the last one ends: not concurrent
    ]
    assert peak_concurrent_retries(log) == 2
    assert peak_concurrent_retries(log[:2]) == 0
