"""Success rates with their 95% intervals, and whether two arms differ beyond them.

A few runs of a real model are a sample: 5 successes in 10 is a rate anywhere from about
0.24 to 0.76. The real-model bench reports each arm's success rate with a Wilson score
interval and calls two arms different only when the 95% interval of their difference
(Newcombe's method 10, built from the two Wilson intervals) leaves out zero.

Written here by hand: neither scipy nor statsmodels is a dependency of the package, and
both formulas are a few lines of closed-form arithmetic (Wilson 1927; Newcombe 1998,
"Interval estimation for the difference between independent proportions", method 10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054
"""The standard normal quantile for a two-sided 95% interval."""


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` in ``n`` trials.

    Unlike the normal approximation (p ± z·sqrt(p(1-p)/n)) it stays inside [0, 1] and does
    not shrink to a point at 0 or n successes: 0 in 10 is [0, 0.28], not [0, 0].
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n, got {successes} of {n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # exact at the ends: the formula gives them only up to rounding
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


@dataclass(frozen=True)
class Difference:
    """Success rate of ``a`` minus that of ``b``, with its 95% interval."""

    a: str
    b: str
    difference: float
    low: float
    high: float

    @property
    def beyond_interval(self) -> bool:
        """The arms differ: the interval of the difference leaves out zero."""
        return self.low > 0 or self.high < 0


def difference(a: str, a_successes: int, a_n: int, b: str, b_successes: int, b_n: int) -> Difference:
    """Newcombe's hybrid score interval for ``p_a - p_b`` (independent samples).

    The tasks of two arms are paired (same world, same run), but a model sampled at a
    temperature above 0 answers each arm afresh; treating them as independent makes the
    verdict conservative, never bolder.
    """
    pa = a_successes / a_n if a_n else 0.0
    pb = b_successes / b_n if b_n else 0.0
    la, ua = wilson(a_successes, a_n)
    lb, ub = wilson(b_successes, b_n)
    d = pa - pb
    low = d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2)
    high = d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)
    return Difference(a, b, d, max(-1.0, low), min(1.0, high))
