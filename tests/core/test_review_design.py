"""Defects an adversarial review confirmed that need a design decision (not fixed).

Each test states the behaviour a user would expect and is marked ``xfail(strict=True)``:
it fails today with the error named in ``raises`` (any other failure is red), and the
suite goes red (XPASS) on the day the behaviour is fixed, so
the marker is removed with the fix.
"""

from __future__ import annotations

import json

import pytest

import loop_governor as lg


@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,  # DID NOT RAISE NoProgressError
    reason="a walk whose empty answer echoes the page number never repeats exactly",
)
def test_paging_through_empty_pages_that_echo_the_page_is_stopped(gov: lg.Governor) -> None:
    def list_orders(customer: str, page: int) -> str:
        return json.dumps({"customer": customer, "page": page, "orders": []})

    with gov.task("pager"), pytest.raises(lg.NoProgressError):
        for page in range(1, 30):
            gov.call("list_orders", list_orders, customer="c-1", page=page)
