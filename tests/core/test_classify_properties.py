"""Classifier behaviour a user relies on: structure beats text, chains and groups are
walked, signatures ignore what varies, and nothing makes it raise."""

from __future__ import annotations

import json
import sys

import pytest
import tenacity
from hypothesis import given, settings
from hypothesis import strategies as st
from lg_testing import HTTPError

import loop_governor as lg


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (408, "transient"),
        (425, "transient"),
        (429, "transient"),
        (500, "transient"),
        (503, "transient"),
        (529, "transient"),
        (401, "fatal"),
        (402, "fatal"),
        (403, "permanent"),
        (404, "permanent"),
        (400, "permanent"),
        (422, "permanent"),
        (409, "permanent"),
    ],
)
def test_http_status_table(status: int, expected: str) -> None:
    assert lg.classify(HTTPError(status, "request failed")).error_type == expected


def test_403_with_billing_or_key_is_fatal() -> None:
    assert lg.classify(HTTPError(403, "Your account is suspended due to billing")).error_type == "fatal"
    assert lg.classify(HTTPError(403, "API key not valid. Please pass a valid API key.")).error_type == "fatal"


def test_billing_exhaustion_is_fatal_even_as_429_or_400() -> None:
    class ProviderError(Exception):
        def __init__(self, status: int, body: dict) -> None:
            super().__init__(f"Error code: {status} - {body}")
            self.status_code = status
            self.body = body["error"]
            self.code = body["error"].get("code")

    quota = ProviderError(429, {"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "x"}})
    assert lg.classify(quota).error_type == "fatal"
    rate = ProviderError(429, {"error": {"type": "requests", "code": "rate_limit_exceeded", "message": "slow"}})
    assert lg.classify(rate).error_type == "transient"
    credit = HTTPError(400, "Your credit balance is too low to access the Anthropic API.")
    assert lg.classify(credit).error_type == "fatal"


def test_grpc_style_code_method_and_botocore_style_response() -> None:
    class StatusCode:
        def __init__(self, name: str) -> None:
            self.name = name

    class RpcError(Exception):
        def __init__(self, name: str) -> None:
            super().__init__("rpc failed")
            self._name = name

        def code(self) -> StatusCode:
            return StatusCode(self._name)

    assert lg.classify(RpcError("UNAVAILABLE")).error_type == "transient"
    assert lg.classify(RpcError("UNAUTHENTICATED")).error_type == "fatal"
    assert lg.classify(RpcError("NOT_FOUND")).error_type == "permanent"

    class ClientError(Exception):
        def __init__(self, code: str, status: int) -> None:
            super().__init__(f"An error occurred ({code})")
            self.response = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}

    assert lg.classify(ClientError("ThrottlingException", 400)).error_type == "transient"
    assert lg.classify(ClientError("ExpiredToken", 400)).error_type == "fatal"
    assert lg.classify(ClientError("NoSuchKey", 404)).error_type == "permanent"
    assert lg.classify(ClientError("NoSuchKey", 404)).status == 404


def test_builtins() -> None:
    assert lg.classify(TimeoutError("read timed out")).error_type == "transient"
    assert lg.classify(ConnectionRefusedError(111, "Connection refused")).error_type == "transient"
    assert lg.classify(FileNotFoundError(2, "No such file", "/tmp/x")).error_type == "permanent"
    assert lg.classify(KeyError("k")).error_type == "permanent"
    assert lg.classify(json.JSONDecodeError("Expecting value", "", 0)).error_type == "permanent"
    assert lg.classify(PermissionError(13, "Permission denied")).error_type == "permanent"


def test_wrapper_defers_to_informative_cause() -> None:
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as inner:
            raise RuntimeError("tool search failed") from inner
    except RuntimeError as outer:
        info = lg.classify(outer)
    assert info.error_type == "transient"
    try:
        try:
            raise HTTPError(401, "unauthorized")
        except HTTPError:
            raise ValueError("could not fetch")  # noqa: B904 - implicit __context__ on purpose
    except ValueError as outer:
        assert lg.classify(outer).error_type == "fatal"


def test_tenacity_retry_error_uses_last_attempt() -> None:
    @tenacity.retry(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())
    def flaky() -> None:
        raise HTTPError(404, "gone")

    with pytest.raises(tenacity.RetryError) as err:
        flaky()
    assert lg.classify(err.value).error_type == "permanent"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="ExceptionGroup is 3.11+")
def test_exception_group_most_severe_member_wins() -> None:
    group = ExceptionGroup("many", [TimeoutError("t"), HTTPError(404), HTTPError(401)])  # noqa: F821
    assert lg.classify(group).error_type == "fatal"
    group2 = ExceptionGroup("many", [TimeoutError("t"), HTTPError(404)])  # noqa: F821
    assert lg.classify(group2).error_type == "permanent"


def test_retry_after_header_and_http_date() -> None:
    assert lg.classify(HTTPError(429, "x", {"retry-after": "7"})).retry_after == 7.0
    assert lg.classify(HTTPError(429, "x", {"retry-after-ms": "1500"})).retry_after == 1.5
    when = lg.classify(HTTPError(503, "x", {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})).retry_after
    assert when == 0.0  # a date in the past: retry now


def test_messages_are_redacted() -> None:
    info = lg.classify(HTTPError(500, "failed GET https://bob:hunter2@api.example/v1?api_key=abc123secret"))
    assert "hunter2" not in info.message and "abc123secret" not in info.message


def test_signature_ignores_ids_numbers_paths_and_quotes() -> None:
    a = lg.classify(ValueError("row 17 of '/data/run-1/a.csv' failed (req 9f1c2a7b-1111-2222-3333-444455556666)"), "p")
    b = lg.classify(ValueError("row 99 of '/data/run-2/b.csv' failed (req 00000000-aaaa-bbbb-cccc-ddddeeeeffff)"), "p")
    assert a.signature == b.signature
    c = lg.classify(ValueError("column missing"), "p")
    assert c.signature != a.signature
    assert a.signature.startswith("p:ValueError:")


_messages = st.text(max_size=300)
_numbers = st.lists(st.integers(min_value=0, max_value=10**12), min_size=3, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    template=st.sampled_from(
        [
            "timeout after {} ms on shard {} (attempt {})",
            "record {} not found in table t{} at {}",
            "HTTP 503 from host-{}: retry {} of {}",
        ]
    ),
    first=_numbers,
    second=_numbers,
)
def test_signature_stable_under_changed_numbers(template: str, first: list[int], second: list[int]) -> None:
    sa = lg.classify(RuntimeError(template.format(*first)), "tool").signature
    sb = lg.classify(RuntimeError(template.format(*second)), "tool").signature
    assert sa == sb


class _Hostile(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __getattribute__(self, name: str) -> object:
        if name in ("status_code", "response", "code", "body", "headers"):
            raise RuntimeError("property explodes")
        return super().__getattribute__(name)


_attr_values = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=20),
    st.floats(allow_nan=True),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    st.lists(st.integers(), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(
    message=_messages,
    attrs=st.dictionaries(
        st.sampled_from(
            ["status_code", "status", "code", "response", "body", "headers", "errno", "type", "reason", "args"]
        ),
        _attr_values,
        max_size=6,
    ),
    wrap=st.booleans(),
)
def test_classifier_never_raises(message: str, attrs: dict, wrap: bool) -> None:
    exc: BaseException = Exception(message)
    for name, value in attrs.items():
        try:
            setattr(exc, name, value)
        except Exception:
            pass
    if wrap:
        outer = RuntimeError("wrapped")
        outer.__cause__ = exc
        exc.__context__ = outer  # a cycle
        exc = outer
    info = lg.classify(exc, "tool")
    assert info.error_type in ("transient", "permanent", "fatal")
    assert isinstance(info.signature, str) and info.signature


def test_classifier_survives_hostile_objects() -> None:
    assert lg.classify(_Hostile()).error_type == "permanent"
    assert lg.classify("not an exception").error_type == "permanent"  # type: ignore[arg-type]
    assert lg.classify(None).error_type == "permanent"  # type: ignore[arg-type]
    deep: BaseException = ValueError("leaf")
    for i in range(500):
        nxt = RuntimeError(f"level {i}")
        nxt.__cause__ = deep
        deep = nxt
    assert lg.classify(deep).error_type in ("transient", "permanent", "fatal")


def test_a_hostile_body_does_not_cost_the_rest_of_the_evidence() -> None:
    class Unsliceable(str):
        def __getitem__(self, item: object) -> str:
            raise RuntimeError("no slicing")

    class Weird(Exception):
        body = Unsliceable("abc")
        status_code = 503

    info = lg.classify(Weird("upstream down"))
    assert info.error_type == "transient" and info.status == 503 and info.message == "Weird: upstream down"
