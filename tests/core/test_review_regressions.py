"""Behaviour that an independent review found broken once: keep it fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg
from loop_governor.checkpoint import FileCheckpointStore


class _Array:
    """Array-like whose repr abbreviates, as numpy's does for large arrays."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def tolist(self) -> list[int]:
        return self.values

    def __repr__(self) -> str:
        return "array([0, 1, 2, ..., 1997, 1998, 1999])"


def test_call_keys_never_come_from_abbreviated_reprs(gov: lg.Governor) -> None:
    a, b = _Array(list(range(2000))), _Array([*range(1999), 7])
    assert lg.call_key("t", (a,)) != lg.call_key("t", (b,))
    assert lg.call_key("t", ({3, 1, 2},)) == lg.call_key("t", ({1, 2, 3},))  # order-free, stable across processes
    backend = Backend(HTTPError(404, "bad input"))
    with gov.task("t"):
        with pytest.raises(lg.PermanentError):
            gov.call("score", backend, a)
        assert gov.call("score", backend, b) == "ok"  # a different argument really runs
    assert backend.calls == 2


def test_two_writers_keep_both_sub_results(tmp_path: Path, clock: VirtualClock) -> None:
    config = lg.GovernorConfig(checkpoint_url=f"file://{tmp_path / 'cps'}")
    first, second = lg.Governor(config, clock=clock), lg.Governor(config, clock=clock)
    with first.task("job") as a, second.task("job") as b:
        a.add_result({"part": "A"})
        b.add_result({"part": "B"})  # conflicts with A's save: merged, not dropped
        a.add_result({"part": "C"})
    stored = FileCheckpointStore(tmp_path / "cps").load("job")
    assert stored is not None
    assert sorted(r["part"] for r in stored.results) == ["A", "B", "C"]


def test_a_retry_refused_after_the_sleep_spends_no_budget(clock: VirtualClock) -> None:
    gov = lg.Governor(clock=clock, random=lambda: 0.5)

    def sleep_while_the_breaker_opens(seconds: float) -> None:
        clock.sleep(seconds)
        gov.store.breaker_force("api", "open", clock())  # another caller tripped it meanwhile

    gov.sleep = sleep_while_the_breaker_opens
    backend = Backend(forever=HTTPError(503))
    with gov.task("t"):
        with pytest.raises(lg.TransientError) as err:
            gov.call("api", backend)
        assert gov.store.budget_used("t") == 0
    assert backend.calls == 1
    assert "circuit open" in (err.value.info.advice or "")


def test_retry_after_stays_finite_and_whole_seconds_in_model_text(gov: lg.Governor) -> None:
    assert lg.classify(HTTPError(429, "x", {"retry-after": "inf"})).retry_after == 86_400
    assert lg.classify(HTTPError(429, "x", {"retry-after": "nan"})).retry_after is None
    texts = {
        lg.GovernedError(error_type="transient", tool="t", message="m", retry_after=wait).to_model_text("json")
        for wait in (29.01, 29.6, 30.0)
    }
    assert texts == {json.dumps(json.loads(next(iter(texts))), separators=(",", ":"))}
    assert json.loads(next(iter(texts)))["error"]["retry_after"] == 30
