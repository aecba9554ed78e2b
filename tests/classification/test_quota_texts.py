"""Quota texts (issue 27, item 1): a quota that refills is a throttle, only plan exhaustion is fatal.

The corpus holds the providers' real shapes (test_corpus.py); these properties vary the
wording, the period and the delay, since providers phrase quotas many ways.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import loop_governor as lg
from loop_governor.errors import ErrorType


class ProviderError(Exception):
    """An SDK's status error, as classify reads one: a status, a body with a code."""

    def __init__(self, status: int, message: str, code: str | None) -> None:
        super().__init__(message)
        self.status_code = status
        self.body: dict[str, Any] = {"message": message, "code": code}


QUOTA = st.sampled_from(
    [
        "You exceeded your current quota, please check your plan and billing details.",
        "Quota exceeded for metric: generate_content_paid_requests, limit: 0",
        "quota exhausted",
        "You have exceeded the quota",
    ]
)
REFILL = st.one_of(
    st.sampled_from(
        [
            "per minute",
            "requests per day",
            "_requests_per_minute_per_project",
            "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
            "tokens per hour",
            "(TPM)",
        ]
    ),
    st.floats(0.01, 3600, allow_nan=False).map(lambda s: f"Please retry in {s:.2f}s."),
    st.integers(1, 59).map(lambda s: f"Please try again in {s}s."),
)


@given(QUOTA, REFILL, st.sampled_from([429, 403, 400, None]), st.sampled_from([None, "resource_exhausted"]))
def test_a_quota_that_refills_is_transient(quota: str, refill: str, status: int | None, code: str | None) -> None:
    exc = ProviderError(status or 429, f"{quota} {refill}", code)
    info = lg.classify(exc)
    assert info.error_type is ErrorType.TRANSIENT, info


@given(QUOTA, st.sampled_from(["rate_limit_exceeded", "throttling", "too_many_requests"]))
def test_a_quota_text_under_a_rate_limit_code_is_transient(quota: str, code: str) -> None:
    info = lg.classify(ProviderError(429, quota, code))
    assert info.error_type is ErrorType.TRANSIENT and info.throttled, info


@given(QUOTA, st.sampled_from([429, 403, 400]))
def test_a_quota_that_does_not_refill_stays_fatal(quota: str, status: int) -> None:
    assert lg.classify(ProviderError(status, quota, None)).error_type is ErrorType.FATAL


@given(REFILL, st.sampled_from([429, 400]))
def test_billing_exhaustion_is_fatal_whatever_the_wait(refill: str, status: int) -> None:
    for message, code in (
        ("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota"),
        ("Billing hard limit has been reached", "billing_hard_limit_reached"),
        ("Your credit balance is too low to access the API.", None),
    ):
        info = lg.classify(ProviderError(status, f"{message} {refill}", code))
        assert info.error_type is ErrorType.FATAL, (message, refill, info)
