"""Issue 35: every fatal stop has a ``.code`` to branch on; a tool's 401 is ``"unauthorized"``."""

from __future__ import annotations

import pytest
from lg_testing import Backend, HTTPError, VirtualClock

import loop_governor as lg


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (HTTPError(401, "token expired"), "unauthorized"),
        (HTTPError(402, "payment required"), "payment_required"),
        (HTTPError(403, "the billing account is suspended"), "forbidden"),
        (HTTPError(407, "proxy authentication required"), "proxy_authentication_required"),
        (PermissionError("API key revoked"), "unauthorized"),
        (MemoryError(), "memory_error"),
    ],
)
def test_a_fatal_failure_without_a_code_of_its_own_gets_one(clock: VirtualClock, error: Exception, code: str) -> None:
    info = lg.classify(error, "crm")
    assert info.error_type is lg.ErrorType.FATAL and info.code == code
    gov = lg.Governor(clock=clock, sleep=clock.sleep)
    with gov.task("t"), pytest.raises(lg.FatalError) as stop:
        gov.call("crm", Backend(forever=error))
    assert stop.value.code == code and stop.value.info.code == code
    assert f"crm ({code}" in str(stop.value)  # the reason names it too


def test_a_providers_own_code_is_kept() -> None:
    class QuotaError(Exception):
        status_code = 429
        code = "insufficient_quota"

    assert lg.classify(QuotaError("You exceeded your current quota, check your plan and billing")).code == (
        "insufficient_quota"
    )
