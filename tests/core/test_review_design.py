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
    raises=lg.PermanentError,
    reason="known-bad memory outlives the cause; escalation now ends the run on it",
)
def test_a_call_retried_after_the_model_fixed_its_cause_runs_again(gov: lg.Governor) -> None:
    files: dict[str, str] = {}

    def read_file(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return files[path]

    def write_file(path: str, text: str) -> str:
        files[path] = text
        return f"wrote {len(text)} bytes"

    with gov.task("fix-then-retry"):
        with pytest.raises(lg.PermanentError):
            gov.call("read_file", read_file, "config.yaml")
        gov.call("write_file", write_file, "config.yaml", "debug: true\n")  # the model fixed it
        assert gov.call("read_file", read_file, "config.yaml") == "debug: true\n"


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


@pytest.mark.xfail(
    strict=True,
    raises=lg.NoProgressError,
    reason="the no-progress guard counts identical answers to different questions",
)
def test_a_batch_of_lookups_with_the_same_answer_is_not_a_loop(gov: lg.Governor) -> None:
    def order_status(order_id: str) -> str:
        return "Status: delivered (signed for at the front desk)"

    with gov.task("batch"):
        for order_id in ("A-17", "B-22", "C-9", "D-41", "E-3", "F-8"):
            gov.call("order_status", order_status, order_id)
