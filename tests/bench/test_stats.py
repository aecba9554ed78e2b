"""The intervals the real-model bench prints, and the verdict that reads them.

The reference values are the published ones: Wilson score intervals from Newcombe (1998),
"Two-sided confidence intervals for the single proportion", method 3; the difference from
Newcombe (1998), "Interval estimation for the difference between independent
proportions", method 10 (56/70 vs 48/80).
"""

from __future__ import annotations

from typing import Any

import pytest

from loop_governor.bench.model_bench import verdict
from loop_governor.bench.stats import difference, wilson


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718)],
)
def test_wilson_matches_the_published_intervals(successes: int, n: int, low: float, high: float) -> None:
    got = wilson(successes, n)
    assert got == pytest.approx((low, high), abs=5e-5)


def test_wilson_at_the_ends_and_with_no_tasks() -> None:
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=5e-5))  # 0 of 10 is not a rate of 0
    assert wilson(10, 10) == (pytest.approx(0.7225, abs=5e-5), 1.0)
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson(3, 2)


def test_newcombe_matches_the_published_interval() -> None:
    d = difference("a", 56, 70, "b", 48, 80)
    assert (d.low, d.high) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    assert d.beyond_interval


def test_the_sessions_measurements_read_as_the_issue_reads_them() -> None:
    """10 seeds per arm with a 1.5B model (issues 38 and 39): 5/10 against 0/10 tells the
    arms apart, 8/10 against 9/10 does not, and neither does 3/10 against 0/10."""
    assert difference("bare", 5, 10, "governed", 0, 10).beyond_interval
    assert not difference("governed", 9, 10, "bare", 8, 10).beyond_interval
    assert not difference("text", 3, 10, "json", 0, 10).beyond_interval


def _arms(**rates: tuple[int, int]) -> dict[str, dict[str, Any]]:
    return {arm: {"successes": k, "tasks": n} for arm, (k, n) in rates.items()}


def test_the_verdict_says_too_weak_when_every_arm_fails_and_ranks_nothing() -> None:
    v = verdict(_arms(baseline=(0, 21), builtins=(0, 21), governed=(0, 21)))
    assert v["kind"] == "too_weak" and v["differences"] == []
    assert "too weak for this tier" in v["text"]


def test_the_verdict_names_only_differences_beyond_the_interval() -> None:
    v = verdict(_arms(baseline=(5, 10), builtins=(3, 10), governed=(0, 10)))
    assert v["kind"] == "differ"
    differ = [(p["a"], p["b"]) for p in v["differences"] if p["beyond_interval"]]
    assert differ == [("governed", "baseline")]
    # told from the better arm's side, with the interval of its lead
    assert v["text"] == "plain agent finished more tasks than loop-governor: 50 points (95% interval +12 to +76 points)"
    same = verdict(_arms(baseline=(8, 10), builtins=(8, 10), governed=(9, 10)))
    assert same["kind"] == "no_difference" and "do not differ beyond the 95% interval" in same["text"]
