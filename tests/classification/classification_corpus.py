"""The classification corpus: real exceptions from real clients, each with the label a careful
operator wants.

Labels follow the rules of issue 2, not what any implementation returns:

* transient: timeouts, refused/reset/closed connections, EAI_AGAIN, HTTP 408/425/429/5xx/529,
  rate-limit/throttling/overloaded codes, gRPC UNAVAILABLE/DEADLINE_EXCEEDED/
  RESOURCE_EXHAUSTED (rate)/ABORTED/INTERNAL, database "locked", redis LOADING/BUSY.
* fatal: HTTP 401/402, 403 whose body says billing/suspension/API key, quota or credit
  exhaustion even as 429/400, expired or invalid credentials.
* permanent: other 4xx, not found, validation, invalid argument, local programming and
  data errors, OS permission errors, SQL syntax/integrity, gRPC NOT_FOUND/INVALID_ARGUMENT/
  PERMISSION_DENIED/FAILED_PRECONDITION.
* wrapped: the informative inner cause decides; grouped: the most severe member wins
  (fatal > permanent > transient).

Exceptions cannot be serialized faithfully (and this project never pickles), so the corpus
is rebuilt on every run against the local peers in ``classification_servers``.  Every
builder also checks the *type* of what it caught, so a library upgrade that changes what
is raised breaks the build loudly instead of silently relabelling the corpus.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from classification_servers import GRPC_SERVICE, Scripted, Servers, running_servers

TRANSIENT, PERMANENT, FATAL = "transient", "permanent", "fatal"
LABELS = (TRANSIENT, PERMANENT, FATAL)
SEVERITY = {TRANSIENT: 0, PERMANENT: 1, FATAL: 2}

if sys.version_info >= (3, 11):
    from builtins import ExceptionGroup
else:  # pragma: no cover - the project's venv is 3.11; the backport ships with anyio on 3.10
    from exceptiongroup import ExceptionGroup

FAKE_OPENAI_KEY = "sk-test-corpus-0000000000000000"
FAKE_ANTHROPIC_KEY = "sk-ant-test-corpus-0000000000"


@dataclass(frozen=True)
class Case:
    description: str
    library: str
    expected: str
    exc: BaseException
    retry_after: float | None = None  # seconds the server asked for (Retry-After), if any


class CorpusBuildError(AssertionError):
    """A builder did not get the exception it was written for (the corpus would lie)."""


# =========================================================================== HTTP scenarios


def _oa(status: int, message: str, type_: str, code: str | None, headers: dict[str, str] | None = None) -> Scripted:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return Scripted(status, body, headers or {})


def _an(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> Scripted:
    body = {"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_011CorpusTest"}
    return Scripted(status, body, {"request-id": "req_011CorpusTest", **(headers or {})})


def _g(status: int, gstatus: str, message: str, reason: str | None = None) -> Scripted:
    err: dict[str, Any] = {"code": status, "message": message, "status": gstatus}
    if reason:
        err["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        ]
        err["errors"] = [{"message": message, "domain": "global", "reason": reason}]
    return Scripted(status, {"error": err})


def _ddb(status: int, shape: str, message: str, namespace: str = "com.amazonaws.dynamodb.v20120810") -> Scripted:
    return Scripted(
        status,
        {"__type": f"{namespace}#{shape}", "message": message},
        {"x-amzn-RequestId": "CORPUSREQ"},
        content_type="application/x-amz-json-1.0",
    )


def _s3(status: int, code: str, message: str) -> Scripted:
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>CORPUSREQ</RequestId><HostId>corpus-host-id</HostId></Error>"
    )
    return Scripted(status, xml, content_type="application/xml")


def _sts(status: int, code: str, message: str) -> Scripted:
    xml = (
        '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
        f"<Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>"
        "<RequestId>CORPUSREQ</RequestId></ErrorResponse>"
    )
    return Scripted(status, xml, content_type="text/xml")


def _rest_json(status: int, error_type: str, message: str) -> Scripted:
    return Scripted(
        status,
        {"message": message},
        {"x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"},
    )


OPENAI_QUOTA = _oa(
    429,
    "You exceeded your current quota, please check your plan and billing details. For more information "
    "on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
    "insufficient_quota",
    "insufficient_quota",
)
OPENAI_RATE = _oa(
    429,
    "Rate limit reached for gpt-4o in organization org-corpus on tokens per min (TPM): Limit 30000, "
    "Used 29000, Requested 2000. Please try again in 2s.",
    "tokens",
    "rate_limit_exceeded",
    {"retry-after": "2", "x-ratelimit-remaining-tokens": "0"},
)

# Gemini's free tier (issue 27): "exceeded your current quota ... check your plan and
# billing" on a quota that refills per minute, with QuotaFailure and RetryInfo details.
GEMINI_FREE_TIER_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more information on "
    "this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: "
    "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 15, model: gemini-2.0-flash"
    "\nPlease retry in 20.04s."
)


def _g_quota(message: str, quota_id: str, retry_delay: str | None) -> Scripted:
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                    "quotaId": quota_id,
                    "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                    "quotaValue": "15",
                }
            ],
        }
    ]
    if retry_delay is not None:
        details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
    return Scripted(
        429, {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED", "details": details}}
    )


GEMINI_FREE_TIER = _g_quota(GEMINI_FREE_TIER_MESSAGE, "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "20s")
VERTEX_RPM = _g_quota(
    "Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_minute_per_project_per_base_model "
    "with base model: gemini-1.5-pro. Please submit a quota increase request. "
    "https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.",
    "GenerateContentRequestsPerMinutePerProjectPerBaseModel",
    None,
)
OPENAI_RATE_QUOTA = _oa(
    429,
    "You exceeded your current quota of requests for this model, please slow down.",
    "requests",
    "rate_limit_exceeded",
)

# (status, headers, body) per scenario; bodies follow the providers' documented error shapes.
ROUTES: dict[str, Scripted] = {
    # ---- OpenAI
    "oa_quota": OPENAI_QUOTA,
    "oa_rate": OPENAI_RATE,
    "oa_rate_quota": OPENAI_RATE_QUOTA,
    "oa_gemini_free_tier": GEMINI_FREE_TIER,
    "oa_billing_limit": _oa(
        400, "Billing hard limit has been reached", "invalid_request_error", "billing_hard_limit_reached"
    ),
    "oa_bad_key": _oa(
        401,
        f"Incorrect API key provided: {FAKE_OPENAI_KEY[:8]}****0000. You can find your "
        "API key at https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    ),
    "oa_no_org": _oa(
        401,
        "You must be a member of an organization to use the API. Please contact us "
        "through our help center at help.openai.com.",
        "invalid_request_error",
        "no_organization",
    ),
    "oa_context": _oa(
        400,
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130412 tokens. Please reduce the length of the messages.",
        "invalid_request_error",
        "context_length_exceeded",
    ),
    "oa_model_404": _oa(
        404,
        "The model `gpt-9` does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    "oa_project_403": _oa(
        403,
        "Project `proj_corpus` does not have access to model `o1-pro`",
        "invalid_request_error",
        "model_not_found",
    ),
    "oa_region_403": _oa(
        403,
        "Country, region, or territory not supported",
        "request_forbidden",
        "unsupported_country_region_territory",
    ),
    "oa_server_500": _oa(
        500, "The server had an error while processing your request. Sorry about that!", "server_error", None
    ),
    "oa_overloaded_503": _oa(503, "The engine is currently overloaded, please try again later.", "server_error", None),
    "oa_502": Scripted(
        502,
        "<html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>",
        content_type="text/html",
    ),
    "oa_timeout_504": Scripted(
        504, "<html><body><h1>504 Gateway Time-out</h1></body></html>", content_type="text/html"
    ),
    "oa_422": _oa(
        422,
        "Invalid 'tools[0].function.name': string does not match pattern.",
        "invalid_request_error",
        "invalid_value",
    ),
    "oa_409": _oa(409, "The batch is already being cancelled.", "invalid_request_error", "conflict"),
    "oa_408": _oa(408, "Request timed out.", "timeout", None),
    "oa_402": _oa(402, "Payment required: your card was declined.", "billing_error", "payment_required"),
    "oa_deactivated_403": _oa(
        403,
        "Your account has been suspended. Please check your billing details.",
        "access_terminated",
        "account_deactivated",
    ),
    # ---- Anthropic
    "an_overloaded": _an(529, "overloaded_error", "Overloaded"),
    "an_credit": _an(
        400,
        "invalid_request_error",
        "Your credit balance is too low to access the Anthropic "
        "API. Please go to Plans & Billing to upgrade or purchase credits.",
    ),
    "an_auth": _an(401, "authentication_error", "invalid x-api-key"),
    "an_key_403": _an(403, "permission_error", "Your API key does not have permission to use the specified resource."),
    "an_org_disabled": _an(403, "permission_error", "This organization has been disabled."),
    "an_billing_402": _an(
        402, "billing_error", "Your account has an outstanding balance. Please update your payment method."
    ),
    "an_404": _an(404, "not_found_error", "model: claude-nonexistent-9"),
    "an_rate": _an(
        429,
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50,000 input tokens per minute.",
        {"retry-after": "7"},
    ),
    "an_500": _an(500, "api_error", "Internal server error"),
    "an_413": _an(413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
    "an_400": _an(
        400,
        "invalid_request_error",
        'messages: roles must alternate between "user" and "assistant", but found multiple "user" roles in a row',
    ),
    "an_504": _an(504, "timeout_error", "Request timed out"),
    # Spend and usage limits: bodies as the Messages API returns them (issue 17); no retry helps.
    "an_spend_429": _an(
        429,
        "rate_limit_error",
        "This request would exceed your account's monthly spend limit. Please try again later.",
        {"retry-after": "600"},
    ),
    "an_usage_limit_400": _an(
        400,
        "invalid_request_error",
        "You have reached your specified API usage limits. You will regain access on 2025-07-01 at 00:00 UTC.",
    ),
    "an_extra_usage_429": _an(429, "rate_limit_error", "Extra usage is required for long context requests."),
    "an_account_rate_429": _an(
        429,
        "rate_limit_error",
        "This request would exceed your account's rate limit. Please try again later.",
        {"retry-after": "12"},
    ),
    # ---- generic HTTP (httpx, requests, aiohttp, urllib)
    **{
        f"h{code}": Scripted(code, {"error": {"code": code, "message": f"scripted {code}"}})
        for code in (400, 401, 402, 403, 404, 408, 409, 410, 422, 425, 429, 500, 502, 503, 504, 529)
    },
    "h429_retry": Scripted(429, {"error": "Too Many Requests"}, {"Retry-After": "3"}),
    "h403_suspended": Scripted(
        403, {"error": {"message": "This account is suspended due to a billing issue. Contact support."}}
    ),
    "h403_apikey": Scripted(403, {"error": {"message": "The API key provided is not valid or has been revoked."}}),
    "html200": Scripted(200, "<!doctype html><html><body>Please sign in</body></html>", content_type="text/html"),
    "reset": Scripted(behavior="reset"),
    "close": Scripted(behavior="close"),
    "truncated": Scripted(behavior="truncated"),
    "loop": Scripted(behavior="redirect_loop"),
    "ok": Scripted(200, {"ok": True}),
    # ---- Google REST (google.api_core.exceptions.from_http_response)
    "g_429": _g(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).", "RATE_LIMIT_EXCEEDED"),
    "g_429_free_tier": GEMINI_FREE_TIER,
    "g_429_vertex_rpm": VERTEX_RPM,
    "g_503": _g(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
    "g_500": _g(
        500,
        "INTERNAL",
        "An internal error has occurred. Please retry or report in "
        "https://developers.generativeai.google/guide/troubleshooting",
    ),
    "g_504": _g(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
    "g_404": _g(404, "NOT_FOUND", "models/gemini-9-pro is not found for API version v1beta."),
    "g_400": _g(400, "INVALID_ARGUMENT", 'Invalid JSON payload received. Unknown name "temprature".'),
    "g_400_key": _g(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", "API_KEY_INVALID"),
    "g_401": _g(
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 "
        "access token, login cookie or other valid authentication credential.",
    ),
    "g_403": _g(403, "PERMISSION_DENIED", "The caller does not have permission"),
    "g_403_billing": _g(
        403,
        "PERMISSION_DENIED",
        "This API method requires billing to be enabled. Please enable billing on project #4242 then retry.",
        "BILLING_DISABLED",
    ),
    "g_400_location": _g(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
    "g_409": _g(409, "ALREADY_EXISTS", "Resource 'projects/p/datasets/d' already exists"),
    # ---- AWS: DynamoDB (JSON 1.0)
    "ddb_throttling": _ddb(400, "ThrottlingException", "Rate exceeded", "com.amazon.coral.availability"),
    "ddb_ptee": _ddb(
        400,
        "ProvisionedThroughputExceededException",
        "The level of configured provisioned "
        "throughput for the table was exceeded. Consider increasing your provisioning level "
        "with the UpdateTable API.",
    ),
    "ddb_request_limit": _ddb(
        400,
        "RequestLimitExceeded",
        "Throughput exceeds the current throughput limit for your account. Please contact AWS Support.",
    ),
    "ddb_not_found": _ddb(400, "ResourceNotFoundException", "Requested resource not found"),
    "ddb_validation": _ddb(
        400,
        "ValidationException",
        "1 validation error detected: Value null at 'tableName' failed to satisfy constraint: Member must not be null",
        "com.amazon.coral.validate",
    ),
    "ddb_unrecognized": _ddb(
        400,
        "UnrecognizedClientException",
        "The security token included in the request is invalid.",
        "com.amazon.coral.service",
    ),
    "ddb_expired": _ddb(
        400,
        "ExpiredTokenException",
        "The security token included in the request is expired",
        "com.amazon.coral.service",
    ),
    "ddb_access_denied": _ddb(
        400,
        "AccessDeniedException",
        "User: arn:aws:iam::123456789012:user/agent is "
        "not authorized to perform: dynamodb:GetItem on resource: "
        "arn:aws:dynamodb:us-east-1:123456789012:table/t",
        "com.amazon.coral.service",
    ),
    "ddb_conditional": _ddb(400, "ConditionalCheckFailedException", "The conditional request failed"),
    "ddb_internal": _ddb(500, "InternalServerError", "Internal server error"),
    "ddb_unavailable": _ddb(503, "ServiceUnavailable", "Service unavailable", "com.amazon.coral.availability"),
    # ---- AWS: S3 (REST-XML)
    "s3_no_such_key": _s3(404, "NoSuchKey", "The specified key does not exist."),
    "s3_no_such_bucket": _s3(404, "NoSuchBucket", "The specified bucket does not exist"),
    "s3_access_denied": _s3(403, "AccessDenied", "Access Denied"),
    "s3_slow_down": _s3(503, "SlowDown", "Please reduce your request rate."),
    "s3_internal": _s3(500, "InternalError", "We encountered an internal error. Please try again."),
    "s3_unavailable": _s3(503, "ServiceUnavailable", "Service is unable to handle request."),
    "s3_expired": _s3(400, "ExpiredToken", "The provided token has expired."),
    "s3_bad_key_id": _s3(
        403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
    ),
    "s3_signature": _s3(
        403,
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match "
        "the signature you provided. Check your key and signing method.",
    ),
    "s3_head_404": Scripted(404, b"", content_type="application/xml"),
    # ---- AWS: STS (query protocol)
    "sts_invalid_token": _sts(403, "InvalidClientTokenId", "The security token included in the request is invalid."),
    "sts_expired": _sts(400, "ExpiredToken", "The security token included in the request is expired"),
    "sts_throttling": _sts(400, "Throttling", "Rate exceeded"),
    "sts_access_denied": _sts(
        403,
        "AccessDenied",
        "User: arn:aws:iam::123456789012:user/agent is not "
        "authorized to perform: sts:AssumeRole on resource: arn:aws:iam::1:role/x",
    ),
    # ---- AWS: Bedrock runtime (REST-JSON)
    "br_throttling": _rest_json(
        429,
        "ThrottlingException",
        "Too many requests, please wait before trying "
        "again. You have sent too many requests.  Wait before trying again.",
    ),
    "br_validation": _rest_json(
        400,
        "ValidationException",
        'The model returned the following errors: messages: roles must alternate between "user" and "assistant"',
    ),
    "br_access_denied": _rest_json(
        403, "AccessDeniedException", "You don't have access to the model with the specified model ID."
    ),
    "br_model_timeout": _rest_json(
        408, "ModelTimeoutException", "Model has timed out in processing the request. Try your request again."
    ),
    "br_unavailable": _rest_json(503, "ServiceUnavailableException", "Bedrock is unable to process your request."),
    "br_not_found": _rest_json(
        404,
        "ResourceNotFoundException",
        "Could not resolve the foundation model from the provided model identifier.",
    ),
    "br_expired": _rest_json(403, "ExpiredTokenException", "The security token included in the request is expired"),
    "br_unrecognized": _rest_json(
        403, "UnrecognizedClientException", "The security token included in the request is invalid."
    ),
}


# =========================================================================== capture helpers

ExcSpec = type[BaseException] | tuple[type[BaseException], ...]


def _check(exc: BaseException, expect: ExcSpec, description: str) -> BaseException:
    if not isinstance(exc, expect):
        raise CorpusBuildError(f"{description}: expected {expect}, got {exc!r}") from exc
    return exc


def raised(fn: Callable[[], Any], expect: ExcSpec, description: str) -> BaseException:
    """Run ``fn`` and return the exception it raised (it must raise an ``expect``)."""
    try:
        fn()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _check(exc, expect, description)
    raise CorpusBuildError(f"{description}: no exception raised")


async def araised(fn: Callable[[], Awaitable[Any]], expect: ExcSpec, description: str) -> BaseException:
    try:
        await fn()
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) and not isinstance(exc, expect):
            raise
        return _check(exc, expect, description)
    raise CorpusBuildError(f"{description}: no exception raised")


class Builder:
    """Collects cases; one method per library."""

    def __init__(self, servers: Servers, tmp: Path) -> None:
        self.s = servers
        self.tmp = tmp
        self.cases: list[Case] = []
        self.by_key: dict[str, BaseException] = {}  # reused by wrapped/grouped cases

    # -- recording
    def add(
        self,
        library: str,
        expected: str,
        description: str,
        exc: BaseException,
        key: str | None = None,
        retry_after: float | None = None,
    ) -> BaseException:
        assert expected in LABELS, expected
        self.cases.append(Case(description, library, expected, exc, retry_after))
        if key:
            self.by_key[key] = exc
        return exc

    def case(
        self,
        library: str,
        expected: str,
        description: str,
        fn: Callable[[], Any],
        expect: ExcSpec,
        key: str | None = None,
        retry_after: float | None = None,
    ) -> BaseException:
        return self.add(library, expected, description, raised(fn, expect, description), key, retry_after)

    async def acase(
        self,
        library: str,
        expected: str,
        description: str,
        fn: Callable[[], Awaitable[Any]],
        expect: ExcSpec,
        key: str | None = None,
    ) -> BaseException:
        return self.add(library, expected, description, await araised(fn, expect, description), key)

    # -- addresses
    def url(self, scenario: str, path: str = "") -> str:
        return self.s.http.url(scenario, path)

    @property
    def closed_url(self) -> str:
        return f"http://127.0.0.1:{self.s.closed_port}"

    @property
    def blackhole_url(self) -> str:
        return f"http://127.0.0.1:{self.s.blackhole_port}"

    @property
    def backlog_url(self) -> str:
        return f"http://127.0.0.1:{self.s.full_backlog_port}"

    # ======================================================================= openai
    def openai(self) -> None:
        import httpx
        import openai

        http_client = httpx.Client(trust_env=False)

        def client(base: str, timeout: float = 5.0) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=base,
                api_key=FAKE_OPENAI_KEY,
                max_retries=0,
                timeout=timeout,
                http_client=http_client,
            )

        def chat(scenario: str) -> Callable[[], Any]:
            return lambda: client(self.url(scenario, "/v1")).chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )

        table = [
            ("oa_quota", FATAL, "429 insufficient_quota (quota exhausted, billing)", openai.RateLimitError),
            ("oa_rate", TRANSIENT, "429 rate_limit_exceeded TPM with retry-after: 2", openai.RateLimitError),
            ("oa_rate_quota", TRANSIENT, "429 rate_limit_exceeded whose text says quota", openai.RateLimitError),
            (
                "oa_gemini_free_tier",
                TRANSIENT,
                "429 Gemini free-tier per-minute quota (OpenAI-compatible endpoint)",
                openai.RateLimitError,
            ),
            ("oa_billing_limit", FATAL, "400 billing_hard_limit_reached", openai.BadRequestError),
            ("oa_bad_key", FATAL, "401 invalid_api_key", openai.AuthenticationError),
            ("oa_no_org", FATAL, "401 no_organization", openai.AuthenticationError),
            ("oa_context", PERMANENT, "400 context_length_exceeded", openai.BadRequestError),
            ("oa_model_404", PERMANENT, "404 model_not_found", openai.NotFoundError),
            (
                "oa_project_403",
                PERMANENT,
                "403 project has no access to model (plain 403)",
                openai.PermissionDeniedError,
            ),
            (
                "oa_region_403",
                PERMANENT,
                "403 unsupported_country_region_territory",
                openai.PermissionDeniedError,
            ),
            (
                "oa_deactivated_403",
                FATAL,
                "403 account suspended, check billing",
                openai.PermissionDeniedError,
            ),
            ("oa_server_500", TRANSIENT, "500 server_error", openai.InternalServerError),
            ("oa_overloaded_503", TRANSIENT, "503 engine overloaded", openai.InternalServerError),
            ("oa_502", TRANSIENT, "502 Bad Gateway (HTML body from the CDN)", openai.InternalServerError),
            ("oa_timeout_504", TRANSIENT, "504 Gateway Time-out (HTML body)", openai.InternalServerError),
            ("oa_422", PERMANENT, "422 invalid tool name", openai.UnprocessableEntityError),
            ("oa_409", PERMANENT, "409 conflict", openai.ConflictError),
            ("oa_408", TRANSIENT, "408 request timeout", openai.APIStatusError),
            ("oa_402", FATAL, "402 payment required", openai.APIStatusError),
        ]
        for scenario, label, desc, expect in table:
            self.case(
                "openai",
                label,
                f"openai chat.completions {desc}",
                chat(scenario),
                expect,
                key=scenario,
                retry_after={"oa_rate": 2.0, "oa_gemini_free_tier": 20.04}.get(scenario),
            )
        self.case(
            "openai",
            TRANSIENT,
            "openai APIConnectionError: connection refused (closed port)",
            lambda: client(self.closed_url + "/v1").models.list(),
            openai.APIConnectionError,
            key="oa_conn",
        )
        self.case(
            "openai",
            TRANSIENT,
            "openai APITimeoutError: server accepts but never answers (0.2 s)",
            lambda: client(self.blackhole_url + "/v1", timeout=0.2).models.list(),
            openai.APITimeoutError,
        )
        self._closers.append(http_client.close)

    async def openai_async(self) -> None:
        import httpx
        import openai

        async with httpx.AsyncClient(trust_env=False) as hc:
            c = openai.AsyncOpenAI(
                base_url=self.url("oa_rate", "/v1"), api_key=FAKE_OPENAI_KEY, max_retries=0, http_client=hc
            )
            await self.acase(
                "openai",
                TRANSIENT,
                "AsyncOpenAI 429 rate_limit_exceeded",
                lambda: c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
                openai.RateLimitError,
            )
            c2 = openai.AsyncOpenAI(
                base_url=self.url("oa_quota", "/v1"), api_key=FAKE_OPENAI_KEY, max_retries=0, http_client=hc
            )
            await self.acase(
                "openai",
                FATAL,
                "AsyncOpenAI 429 insufficient_quota",
                lambda: c2.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
                openai.RateLimitError,
            )
            c3 = openai.AsyncOpenAI(
                base_url=self.closed_url + "/v1", api_key=FAKE_OPENAI_KEY, max_retries=0, http_client=hc
            )
            await self.acase(
                "openai",
                TRANSIENT,
                "AsyncOpenAI connection refused",
                lambda: c3.models.list(),
                openai.APIConnectionError,
            )

    # ======================================================================= anthropic
    def anthropic(self) -> None:
        import anthropic

        # anthropic ships its own httpx fork (httpx2) and rejects an httpx.Client; proxies are
        # already cleared from the environment by _aws_env, so its default client stays local.
        def client(base: str, timeout: float = 5.0) -> anthropic.Anthropic:
            return anthropic.Anthropic(base_url=base, api_key=FAKE_ANTHROPIC_KEY, max_retries=0, timeout=timeout)

        def msg(base: str, timeout: float = 5.0) -> Callable[[], Any]:
            return lambda: client(base, timeout).messages.create(
                model="claude-corpus-model", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
            )

        table = [
            ("an_overloaded", TRANSIENT, "529 overloaded_error", anthropic.APIStatusError),
            ("an_credit", FATAL, "400 credit balance is too low", anthropic.BadRequestError),
            ("an_auth", FATAL, "401 authentication_error invalid x-api-key", anthropic.AuthenticationError),
            # the key may not use this resource (a model, a feature): permanent, the key still works
            ("an_key_403", PERMANENT, "403 permission_error on a resource", anthropic.PermissionDeniedError),
            ("an_org_disabled", FATAL, "403 organization has been disabled", anthropic.PermissionDeniedError),
            ("an_billing_402", FATAL, "402 billing_error", anthropic.APIStatusError),
            ("an_404", PERMANENT, "404 not_found_error (model)", anthropic.NotFoundError),
            ("an_rate", TRANSIENT, "429 rate_limit_error with retry-after: 7", anthropic.RateLimitError),
            ("an_500", TRANSIENT, "500 api_error", anthropic.InternalServerError),
            ("an_413", PERMANENT, "413 request_too_large", anthropic.APIStatusError),
            (
                "an_400",
                PERMANENT,
                "400 invalid_request_error roles must alternate",
                anthropic.BadRequestError,
            ),
            ("an_504", TRANSIENT, "504 timeout_error", anthropic.APIStatusError),
            ("an_spend_429", FATAL, "429 rate_limit_error: monthly spend limit", anthropic.RateLimitError),
            ("an_usage_limit_400", FATAL, "400 specified API usage limits reached", anthropic.BadRequestError),
            ("an_extra_usage_429", FATAL, "429 extra usage required", anthropic.RateLimitError),
            ("an_account_rate_429", TRANSIENT, "429 account rate limit", anthropic.RateLimitError),
        ]
        for scenario, label, desc, expect in table:
            self.case(
                "anthropic",
                label,
                f"anthropic messages.create {desc}",
                msg(self.url(scenario)),
                expect,
                key=scenario,
                retry_after={"an_rate": 7.0, "an_account_rate_429": 12.0}.get(scenario),
            )
        self.case(
            "anthropic",
            TRANSIENT,
            "anthropic APIConnectionError: connection refused",
            msg(self.closed_url),
            anthropic.APIConnectionError,
        )
        self.case(
            "anthropic",
            TRANSIENT,
            "anthropic APITimeoutError: no answer within 0.2 s",
            msg(self.blackhole_url, 0.2),
            anthropic.APITimeoutError,
        )

    async def anthropic_async(self) -> None:
        import anthropic

        c = anthropic.AsyncAnthropic(base_url=self.url("an_overloaded"), api_key=FAKE_ANTHROPIC_KEY, max_retries=0)
        await self.acase(
            "anthropic",
            TRANSIENT,
            "AsyncAnthropic 529 overloaded_error",
            lambda: c.messages.create(
                model="claude-corpus-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
            ),
            anthropic.APIStatusError,
        )
        c2 = anthropic.AsyncAnthropic(base_url=self.url("an_credit"), api_key=FAKE_ANTHROPIC_KEY, max_retries=0)
        await self.acase(
            "anthropic",
            FATAL,
            "AsyncAnthropic 400 credit balance too low",
            lambda: c2.messages.create(
                model="claude-corpus-model", max_tokens=8, messages=[{"role": "user", "content": "x"}]
            ),
            anthropic.BadRequestError,
        )
        await c.close()
        await c2.close()

    # ======================================================================= httpx
    STATUS_LABELS: ClassVar[dict[int, str]] = {
        400: PERMANENT,
        401: FATAL,
        402: FATAL,
        403: PERMANENT,
        404: PERMANENT,
        408: TRANSIENT,
        409: PERMANENT,
        410: PERMANENT,
        422: PERMANENT,
        425: TRANSIENT,
        429: TRANSIENT,
        500: TRANSIENT,
        502: TRANSIENT,
        503: TRANSIENT,
        504: TRANSIENT,
        529: TRANSIENT,
    }

    def httpx_sync(self) -> None:
        import httpx

        c = httpx.Client(trust_env=False, timeout=5.0)
        self._closers.append(c.close)

        def get_raise(scenario: str) -> Callable[[], Any]:
            return lambda: c.get(self.url(scenario)).raise_for_status()

        for code, label in self.STATUS_LABELS.items():
            self.case(
                "httpx",
                label,
                f"httpx raise_for_status {code}",
                get_raise(f"h{code}"),
                httpx.HTTPStatusError,
                key=f"httpx_{code}",
            )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx 429 with Retry-After: 3",
            get_raise("h429_retry"),
            httpx.HTTPStatusError,
            retry_after=3.0,
        )
        self.case(
            "httpx",
            FATAL,
            "httpx 403 whose body says the account is suspended (billing)",
            get_raise("h403_suspended"),
            httpx.HTTPStatusError,
        )
        self.case(
            "httpx",
            FATAL,
            "httpx 403 whose body says the API key is invalid/revoked",
            get_raise("h403_apikey"),
            httpx.HTTPStatusError,
        )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx ConnectError: connection refused",
            lambda: c.get(self.closed_url),
            httpx.ConnectError,
            key="httpx_connect",
        )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx ReadTimeout: no answer within 0.2 s",
            lambda: c.get(self.blackhole_url, timeout=0.2),
            httpx.ReadTimeout,
            key="httpx_read_timeout",
        )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx ConnectTimeout: SYN dropped (full accept queue)",
            lambda: c.get(self.backlog_url, timeout=0.2),
            httpx.ConnectTimeout,
        )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx RemoteProtocolError: server closed without a response",
            lambda: c.get(self.url("close")),
            httpx.RemoteProtocolError,
        )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx ReadError: connection reset by peer",
            lambda: c.get(self.url("reset")),
            (httpx.ReadError, httpx.RemoteProtocolError),
        )
        self.case(
            "httpx",
            TRANSIENT,
            "httpx RemoteProtocolError: chunked body cut off",
            lambda: c.get(self.url("truncated")),
            httpx.RemoteProtocolError,
        )
        self.case(
            "httpx",
            PERMANENT,
            "httpx TooManyRedirects: redirect loop",
            lambda: httpx.Client(trust_env=False, follow_redirects=True, max_redirects=3).get(self.url("loop")),
            httpx.TooManyRedirects,
        )
        self.case(
            "httpx",
            PERMANENT,
            "httpx UnsupportedProtocol: ftp:// URL",
            lambda: c.get("ftp://127.0.0.1/file"),
            httpx.UnsupportedProtocol,
        )

    async def httpx_async(self) -> None:
        import httpx

        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as c:
            for code in (503, 401, 404):

                async def call(code: int = code) -> None:
                    (await c.get(self.url(f"h{code}"))).raise_for_status()

                await self.acase(
                    "httpx",
                    self.STATUS_LABELS[code],
                    f"httpx.AsyncClient raise_for_status {code}",
                    call,
                    httpx.HTTPStatusError,
                )
            await self.acase(
                "httpx",
                TRANSIENT,
                "httpx.AsyncClient ConnectError: connection refused",
                lambda: c.get(self.closed_url),
                httpx.ConnectError,
            )
            await self.acase(
                "httpx",
                TRANSIENT,
                "httpx.AsyncClient ReadTimeout",
                lambda: c.get(self.blackhole_url, timeout=0.2),
                httpx.ReadTimeout,
            )
        async with httpx.AsyncClient(
            trust_env=False, limits=httpx.Limits(max_connections=1), timeout=httpx.Timeout(5.0, pool=0.1)
        ) as pc:
            async with pc.stream("GET", self.url("ok")):  # holds the only connection
                await self.acase(
                    "httpx",
                    TRANSIENT,
                    "httpx.AsyncClient PoolTimeout: pool exhausted",
                    lambda: pc.get(self.url("ok")),
                    httpx.PoolTimeout,
                )

    # ======================================================================= requests
    def requests_lib(self) -> None:
        import requests

        sess = requests.Session()
        sess.trust_env = False
        self._closers.append(sess.close)

        def get_raise(scenario: str) -> Callable[[], Any]:
            return lambda: sess.get(self.url(scenario), timeout=5).raise_for_status()

        for code in (400, 401, 402, 403, 404, 409, 422, 429, 500, 502, 503, 504):
            self.case(
                "requests",
                self.STATUS_LABELS[code],
                f"requests raise_for_status {code}",
                get_raise(f"h{code}"),
                requests.HTTPError,
                key=f"requests_{code}",
            )
        self.case(
            "requests",
            FATAL,
            "requests 403 whose body says the API key is invalid/revoked",
            get_raise("h403_apikey"),
            requests.HTTPError,
        )
        self.case(
            "requests",
            TRANSIENT,
            "requests ConnectionError: connection refused",
            lambda: sess.get(self.closed_url, timeout=5),
            requests.ConnectionError,
            key="requests_conn",
        )
        self.case(
            "requests",
            TRANSIENT,
            "requests ReadTimeout (0.2 s)",
            lambda: sess.get(self.blackhole_url, timeout=0.2),
            requests.ReadTimeout,
        )
        self.case(
            "requests",
            TRANSIENT,
            "requests ConnectTimeout: SYN dropped",
            lambda: sess.get(self.backlog_url, timeout=0.2),
            requests.ConnectTimeout,
        )
        self.case(
            "requests",
            TRANSIENT,
            "requests ConnectionError: connection reset by peer",
            lambda: sess.get(self.url("reset"), timeout=5),
            requests.ConnectionError,
        )
        self.case(
            "requests",
            TRANSIENT,
            "requests ConnectionError: RemoteDisconnected",
            lambda: sess.get(self.url("close"), timeout=5),
            requests.ConnectionError,
        )
        self.case(
            "requests",
            TRANSIENT,
            "requests ChunkedEncodingError: body cut off",
            lambda: sess.get(self.url("truncated"), timeout=5).content,
            requests.exceptions.ChunkedEncodingError,
        )
        self.case(
            "requests",
            PERMANENT,
            "requests JSONDecodeError: .json() on an HTML page",
            lambda: sess.get(self.url("html200"), timeout=5).json(),
            requests.exceptions.JSONDecodeError,
        )
        self.case(
            "requests",
            PERMANENT,
            "requests TooManyRedirects",
            lambda: sess.get(self.url("loop"), timeout=5),
            requests.TooManyRedirects,
        )
        self.case(
            "requests",
            PERMANENT,
            "requests MissingSchema: URL without scheme",
            lambda: sess.get("127.0.0.1/no-scheme", timeout=5),
            requests.exceptions.MissingSchema,
        )

    # ======================================================================= aiohttp
    async def aiohttp_lib(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as sess:
            for code in (400, 401, 402, 403, 404, 429, 500, 503):

                async def call(code: int = code) -> None:
                    async with sess.get(self.url(f"h{code}")) as r:
                        r.raise_for_status()

                await self.acase(
                    "aiohttp",
                    self.STATUS_LABELS[code],
                    f"aiohttp raise_for_status {code}",
                    call,
                    aiohttp.ClientResponseError,
                    key=f"aiohttp_{code}",
                )

            async def get(url: str, **kw: Any) -> None:
                async with sess.get(url, **kw) as r:
                    await r.read()

            async def get_json(url: str) -> None:
                async with sess.get(url) as r:
                    await r.json()

            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp ClientConnectorError: connection refused",
                lambda: get(self.closed_url),
                aiohttp.ClientConnectorError,
                key="aiohttp_conn",
            )
            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp SocketTimeoutError (sock_read 0.2 s)",
                lambda: get(self.blackhole_url, timeout=aiohttp.ClientTimeout(sock_read=0.2)),
                aiohttp.ServerTimeoutError,
            )
            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp ConnectionTimeoutError (connect 0.2 s)",
                lambda: get(self.backlog_url, timeout=aiohttp.ClientTimeout(connect=0.2)),
                asyncio.TimeoutError,
            )
            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp TimeoutError (total 0.2 s)",
                lambda: get(self.blackhole_url, timeout=aiohttp.ClientTimeout(total=0.2)),
                asyncio.TimeoutError,
                key="aiohttp_timeout",
            )
            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp ServerDisconnectedError",
                lambda: get(self.url("close")),
                aiohttp.ServerDisconnectedError,
            )
            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp connection reset by peer",
                lambda: get(self.url("reset")),
                aiohttp.ClientError,
            )
            await self.acase(
                "aiohttp",
                TRANSIENT,
                "aiohttp ClientPayloadError: body cut off",
                lambda: get(self.url("truncated")),
                aiohttp.ClientPayloadError,
            )
            await self.acase(
                "aiohttp",
                PERMANENT,
                "aiohttp ContentTypeError: .json() on text/html",
                lambda: get_json(self.url("html200")),
                aiohttp.ContentTypeError,
            )
            await self.acase(
                "aiohttp",
                PERMANENT,
                "aiohttp TooManyRedirects",
                lambda: get(self.url("loop"), max_redirects=3),
                aiohttp.TooManyRedirects,
            )
            await self.acase(
                "aiohttp",
                PERMANENT,
                "aiohttp InvalidUrlClientError: not a URL",
                lambda: get("not a url"),
                aiohttp.InvalidURL,
            )

    # ======================================================================= botocore
    def botocore_lib(self) -> None:
        from botocore.config import Config
        from botocore.exceptions import (
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ParamValidationError,
            ReadTimeoutError,
        )
        from botocore.session import get_session

        session = get_session()
        creds = {"aws_access_key_id": "AKIACORPUSTEST000000", "aws_secret_access_key": "corpus/secret/test"}

        def client(service: str, endpoint: str, timeout: float = 5.0, **kw: Any) -> Any:
            cfg = Config(retries={"total_max_attempts": 1}, connect_timeout=timeout, read_timeout=timeout)
            return session.create_client(
                service, region_name="us-east-1", endpoint_url=endpoint, config=cfg, **{**creds, **kw}
            )

        def ddb(endpoint: str, timeout: float = 5.0) -> Callable[[], Any]:
            return lambda: client("dynamodb", endpoint, timeout).get_item(TableName="t", Key={"id": {"S": "1"}})

        def s3(scenario: str) -> Callable[[], Any]:
            return lambda: client("s3", self.url(scenario)).get_object(Bucket="corpus-bucket", Key="k.json")

        def sts(scenario: str) -> Callable[[], Any]:
            return lambda: client("sts", self.url(scenario)).get_caller_identity()

        def bedrock(scenario: str) -> Callable[[], Any]:
            return lambda: client("bedrock-runtime", self.url(scenario)).converse(
                modelId="anthropic.claude-3-5-sonnet",
                messages=[{"role": "user", "content": [{"text": "hi"}]}],
            )

        table: list[tuple[str, str, str, Callable[[], Any]]] = [
            ("ddb_throttling", TRANSIENT, "dynamodb ThrottlingException", ddb(self.url("ddb_throttling"))),
            (
                "ddb_ptee",
                TRANSIENT,
                "dynamodb ProvisionedThroughputExceededException",
                ddb(self.url("ddb_ptee")),
            ),
            (
                "ddb_request_limit",
                TRANSIENT,
                "dynamodb RequestLimitExceeded",
                ddb(self.url("ddb_request_limit")),
            ),
            (
                "ddb_not_found",
                PERMANENT,
                "dynamodb ResourceNotFoundException",
                ddb(self.url("ddb_not_found")),
            ),
            ("ddb_validation", PERMANENT, "dynamodb ValidationException", ddb(self.url("ddb_validation"))),
            (
                "ddb_unrecognized",
                FATAL,
                "dynamodb UnrecognizedClientException (invalid token)",
                ddb(self.url("ddb_unrecognized")),
            ),
            ("ddb_expired", FATAL, "dynamodb ExpiredTokenException", ddb(self.url("ddb_expired"))),
            (
                "ddb_access_denied",
                PERMANENT,
                "dynamodb AccessDeniedException (not authorized for action)",
                ddb(self.url("ddb_access_denied")),
            ),
            (
                "ddb_conditional",
                PERMANENT,
                "dynamodb ConditionalCheckFailedException",
                ddb(self.url("ddb_conditional")),
            ),
            ("ddb_internal", TRANSIENT, "dynamodb 500 InternalServerError", ddb(self.url("ddb_internal"))),
            (
                "ddb_unavailable",
                TRANSIENT,
                "dynamodb 503 ServiceUnavailable",
                ddb(self.url("ddb_unavailable")),
            ),
            ("s3_no_such_key", PERMANENT, "s3 GetObject NoSuchKey", s3("s3_no_such_key")),
            ("s3_no_such_bucket", PERMANENT, "s3 GetObject NoSuchBucket", s3("s3_no_such_bucket")),
            ("s3_access_denied", PERMANENT, "s3 GetObject 403 AccessDenied", s3("s3_access_denied")),
            ("s3_slow_down", TRANSIENT, "s3 GetObject 503 SlowDown", s3("s3_slow_down")),
            ("s3_internal", TRANSIENT, "s3 GetObject 500 InternalError", s3("s3_internal")),
            ("s3_unavailable", TRANSIENT, "s3 GetObject 503 ServiceUnavailable", s3("s3_unavailable")),
            ("s3_expired", FATAL, "s3 GetObject 400 ExpiredToken", s3("s3_expired")),
            ("s3_bad_key_id", FATAL, "s3 GetObject 403 InvalidAccessKeyId", s3("s3_bad_key_id")),
            (
                "s3_signature",
                FATAL,
                "s3 GetObject 403 SignatureDoesNotMatch (wrong secret key)",
                s3("s3_signature"),
            ),
            (
                "s3_head_404",
                PERMANENT,
                "s3 HeadObject 404 (no body)",
                lambda: client("s3", self.url("s3_head_404")).head_object(Bucket="corpus-bucket", Key="k"),
            ),
            (
                "sts_invalid_token",
                FATAL,
                "sts GetCallerIdentity 403 InvalidClientTokenId",
                sts("sts_invalid_token"),
            ),
            ("sts_expired", FATAL, "sts GetCallerIdentity 400 ExpiredToken", sts("sts_expired")),
            ("sts_throttling", TRANSIENT, "sts GetCallerIdentity 400 Throttling", sts("sts_throttling")),
            (
                "sts_access_denied",
                PERMANENT,
                "sts 403 AccessDenied (not authorized)",
                sts("sts_access_denied"),
            ),
            (
                "br_throttling",
                TRANSIENT,
                "bedrock-runtime Converse 429 ThrottlingException",
                bedrock("br_throttling"),
            ),
            (
                "br_validation",
                PERMANENT,
                "bedrock-runtime Converse 400 ValidationException",
                bedrock("br_validation"),
            ),
            (
                "br_access_denied",
                PERMANENT,
                "bedrock-runtime Converse 403 AccessDeniedException (model access)",
                bedrock("br_access_denied"),
            ),
            (
                "br_model_timeout",
                TRANSIENT,
                "bedrock-runtime Converse 408 ModelTimeoutException",
                bedrock("br_model_timeout"),
            ),
            (
                "br_unavailable",
                TRANSIENT,
                "bedrock-runtime Converse 503 ServiceUnavailableException",
                bedrock("br_unavailable"),
            ),
            (
                "br_not_found",
                PERMANENT,
                "bedrock-runtime Converse 404 ResourceNotFoundException",
                bedrock("br_not_found"),
            ),
            (
                "br_expired",
                FATAL,
                "bedrock-runtime Converse 403 ExpiredTokenException",
                bedrock("br_expired"),
            ),
            (
                "br_unrecognized",
                FATAL,
                "bedrock-runtime Converse 403 UnrecognizedClientException",
                bedrock("br_unrecognized"),
            ),
        ]
        for key, label, desc, fn in table:
            self.case("botocore", label, f"botocore {desc}", fn, ClientError, key=key)
        self.case(
            "botocore",
            TRANSIENT,
            "botocore EndpointConnectionError: connection refused",
            ddb(self.closed_url),
            EndpointConnectionError,
            key="boto_conn",
        )
        self.case(
            "botocore",
            TRANSIENT,
            "botocore ReadTimeoutError (0.2 s)",
            ddb(self.blackhole_url, 0.2),
            ReadTimeoutError,
        )
        self.case(
            "botocore",
            TRANSIENT,
            "botocore ConnectTimeoutError: SYN dropped",
            ddb(self.backlog_url, 0.2),
            ConnectTimeoutError,
        )
        self.case(
            "botocore",
            TRANSIENT,
            "botocore ConnectionClosedError: server closed the connection",
            ddb(self.url("close")),
            ConnectionClosedError,
        )
        self.case(
            "botocore",
            PERMANENT,
            "botocore ParamValidationError: missing required Key",
            lambda: client("dynamodb", self.url("ok")).get_item(TableName="t"),
            ParamValidationError,
        )
        # No credentials anywhere: env cleared and config files empty (see _aws_env).
        nocred = get_session()
        self.case(
            "botocore",
            FATAL,
            "botocore NoCredentialsError: no credentials configured",
            lambda: nocred.create_client(
                "sts", region_name="us-east-1", endpoint_url=self.url("ok")
            ).get_caller_identity(),
            NoCredentialsError,
        )

    # ======================================================================= grpc
    GRPC_LABELS: ClassVar[dict[str, str]] = {
        "Unavailable": TRANSIENT,
        "ServerDeadline": TRANSIENT,
        "RateExhausted": TRANSIENT,
        "NotFound": PERMANENT,
        "InvalidArgument": PERMANENT,
        "PermissionDenied": PERMANENT,
        "Unauthenticated": FATAL,
        "Internal": TRANSIENT,
        "Aborted": TRANSIENT,
        "FailedPrecondition": PERMANENT,
        "AlreadyExists": PERMANENT,
        "OutOfRange": PERMANENT,
        "Unimplemented": PERMANENT,
    }
    GRPC_OPTIONS: ClassVar[list[tuple[str, int]]] = [("grpc.enable_http_proxy", 0)]

    def grpc_lib(self) -> None:
        import grpc

        channel = grpc.insecure_channel(self.s.grpc.target(), options=self.GRPC_OPTIONS)
        self._closers.append(channel.close)

        def call(method: str, timeout: float = 5.0, ch: Any = channel) -> Callable[[], Any]:
            return lambda: ch.unary_unary(f"/{GRPC_SERVICE}/{method}")(b"req", timeout=timeout)

        for method, label in self.GRPC_LABELS.items():
            self.case(
                "grpc",
                label,
                f"grpc server aborts {method}",
                call(method),
                grpc.RpcError,
                key=f"grpc_{method}",
            )
        self.case(
            "grpc",
            TRANSIENT,
            "grpc client deadline exceeded (0.1 s, slow server)",
            call("Slow", 0.1),
            grpc.RpcError,
        )
        self.case(
            "grpc",
            PERMANENT,
            "grpc UNIMPLEMENTED: method unknown to the server",
            call("NoSuchMethod"),
            grpc.RpcError,
        )
        small = grpc.insecure_channel(
            self.s.grpc.target(), options=[*self.GRPC_OPTIONS, ("grpc.max_receive_message_length", 1024)]
        )
        self._closers.append(small.close)
        self.case(
            "grpc",
            PERMANENT,
            "grpc RESOURCE_EXHAUSTED: response larger than max receive size (retrying cannot help)",
            call("Big", ch=small),
            grpc.RpcError,
        )
        closed = grpc.insecure_channel(f"127.0.0.1:{self.s.closed_port}", options=self.GRPC_OPTIONS)
        self._closers.append(closed.close)
        self.case(
            "grpc",
            TRANSIENT,
            "grpc UNAVAILABLE: connection refused (closed port)",
            call("Unavailable", 2.0, closed),
            grpc.RpcError,
            key="grpc_conn",
        )

    async def grpc_aio(self) -> None:
        import grpc
        import grpc.aio

        async with grpc.aio.insecure_channel(self.s.grpc.target(), options=self.GRPC_OPTIONS) as ch:
            for method in ("Unavailable", "Unauthenticated", "InvalidArgument"):
                await self.acase(
                    "grpc",
                    self.GRPC_LABELS[method],
                    f"grpc.aio server aborts {method}",
                    lambda m=method: ch.unary_unary(f"/{GRPC_SERVICE}/{m}")(b"x", timeout=5),
                    grpc.aio.AioRpcError,
                )

    # ======================================================================= google-api-core
    def google_lib(self) -> None:
        import grpc
        import requests
        from google.api_core import exceptions as gexc
        from google.api_core import grpc_helpers
        from google.api_core import retry as gretry

        channel = grpc.insecure_channel(self.s.grpc.target(), options=self.GRPC_OPTIONS)
        self._closers.append(channel.close)

        def wrapped(method: str, timeout: float = 5.0, ch: Any = channel) -> Callable[[], Any]:
            fn = grpc_helpers.wrap_errors(ch.unary_unary(f"/{GRPC_SERVICE}/{method}"))
            return lambda: fn(b"req", timeout=timeout)

        for method, label in self.GRPC_LABELS.items():
            self.case(
                "google-api-core",
                label,
                f"google-api-core (grpc_helpers) {method}",
                wrapped(method),
                gexc.GoogleAPICallError,
                key=f"g_grpc_{method}",
            )
        self.case(
            "google-api-core",
            TRANSIENT,
            "google-api-core DeadlineExceeded from a real client deadline",
            wrapped("Slow", 0.1),
            gexc.DeadlineExceeded,
        )
        closed = grpc.insecure_channel(f"127.0.0.1:{self.s.closed_port}", options=self.GRPC_OPTIONS)
        self._closers.append(closed.close)
        self.case(
            "google-api-core",
            TRANSIENT,
            "google-api-core ServiceUnavailable: connection refused",
            wrapped("Unavailable", 2.0, closed),
            gexc.ServiceUnavailable,
        )
        retry = gretry.Retry(
            predicate=gretry.if_exception_type(gexc.ServiceUnavailable),
            initial=0.01,
            maximum=0.02,
            multiplier=1.0,
            timeout=0.15,
        )
        self.case(
            "google-api-core",
            TRANSIENT,
            "google-api-core RetryError: retry timeout over UNAVAILABLE",
            lambda: retry(wrapped("Unavailable"))(),
            gexc.RetryError,
        )

        sess = requests.Session()
        sess.trust_env = False
        self._closers.append(sess.close)

        def http(scenario: str) -> Callable[[], Any]:
            def go() -> None:
                r = sess.post(self.url(scenario, "/v1beta/models/gemini:generateContent"), timeout=5)
                raise gexc.from_http_response(r)

            return go

        table = [
            ("g_429", TRANSIENT, "429 RESOURCE_EXHAUSTED rate limit"),
            ("g_429_free_tier", TRANSIENT, "429 RESOURCE_EXHAUSTED Gemini free-tier per-minute quota, retry in 20s"),
            ("g_429_vertex_rpm", TRANSIENT, "429 RESOURCE_EXHAUSTED Vertex requests_per_minute quota"),
            ("g_503", TRANSIENT, "503 UNAVAILABLE model overloaded"),
            ("g_500", TRANSIENT, "500 INTERNAL"),
            ("g_504", TRANSIENT, "504 DEADLINE_EXCEEDED"),
            ("g_404", PERMANENT, "404 NOT_FOUND model"),
            ("g_400", PERMANENT, "400 INVALID_ARGUMENT bad JSON field"),
            ("g_400_key", FATAL, "400 INVALID_ARGUMENT API_KEY_INVALID (Gemini API key not valid)"),
            ("g_401", FATAL, "401 UNAUTHENTICATED invalid credentials"),
            ("g_403", PERMANENT, "403 PERMISSION_DENIED (plain)"),
            ("g_403_billing", FATAL, "403 PERMISSION_DENIED BILLING_DISABLED"),
            ("g_400_location", PERMANENT, "400 FAILED_PRECONDITION user location not supported"),
            ("g_409", PERMANENT, "409 ALREADY_EXISTS"),
        ]
        for scenario, label, desc in table:
            self.case(
                "google-api-core",
                label,
                f"google-api-core from_http_response {desc}",
                http(scenario),
                gexc.GoogleAPICallError,
                key=scenario,
            )

    # ======================================================================= redis
    def redis_lib(self) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        def client(port: int, **kw: Any) -> redis.Redis:
            opts: dict[str, Any] = {
                "socket_timeout": 2,
                "socket_connect_timeout": 2,
                "retry": Retry(NoBackoff(), 0),
                **kw,
            }
            return redis.Redis(host="127.0.0.1", port=port, **opts)

        rp = self.s.resp.port
        self.case(
            "redis",
            TRANSIENT,
            "redis ConnectionError: connection refused",
            lambda: client(self.s.closed_port).ping(),
            redis.ConnectionError,
            key="redis_conn",
        )
        self.case(
            "redis",
            TRANSIENT,
            "redis TimeoutError: server never answers (0.2 s)",
            lambda: client(self.s.blackhole_port, socket_timeout=0.2).ping(),
            redis.TimeoutError,
        )
        self.case(
            "redis",
            TRANSIENT,
            "redis TimeoutError: connect timeout (SYN dropped)",
            lambda: client(self.s.full_backlog_port, socket_connect_timeout=0.2).ping(),
            redis.TimeoutError,
        )
        errors: list[tuple[str, str, str, type[BaseException]]] = [
            ("wrongtype", PERMANENT, "WRONGTYPE", redis.ResponseError),
            ("noauth", FATAL, "NOAUTH Authentication required", redis.AuthenticationError),
            ("loading", TRANSIENT, "LOADING dataset in memory", redis.exceptions.BusyLoadingError),
            ("busy", TRANSIENT, "BUSY running a script", redis.ResponseError),
            ("tryagain", TRANSIENT, "TRYAGAIN during slot rehashing", redis.exceptions.TryAgainError),
            ("maxclients", TRANSIENT, "ERR max number of clients reached", redis.ConnectionError),
            ("noperm", PERMANENT, "NOPERM ACL forbids the command", redis.exceptions.NoPermissionError),
        ]
        for key, label, desc, expect in errors:
            self.case(
                "redis",
                label,
                f"redis GET answered -{desc}",
                lambda k=key: client(rp).get(k),
                expect,
                key=f"redis_{key}",
            )
        self.case(
            "redis",
            FATAL,
            "redis WRONGPASS on HELLO AUTH (RESP3 handshake)",
            lambda: client(rp, password="wrong-password").ping(),
            redis.AuthenticationError,
        )
        self.case(
            "redis",
            FATAL,
            "redis WRONGPASS on AUTH (RESP2 handshake)",
            lambda: client(rp, password="wrong-password", protocol=2).ping(),
            redis.AuthenticationError,
        )
        self.case(
            "redis",
            PERMANENT,
            "redis ERR unknown command",
            lambda: client(rp).execute_command("FROBNICATE", "x"),
            redis.ResponseError,
        )
        self.case(
            "redis",
            PERMANENT,
            "redis NOSCRIPT on EVALSHA",
            lambda: client(rp).evalsha("0" * 40, 0),
            redis.exceptions.NoScriptError,
        )
        self.case(
            "redis",
            TRANSIENT,
            "redis ConnectionError: server closed the connection mid-command",
            lambda: client(rp).get("close"),
            redis.ConnectionError,
        )

    async def redis_async(self) -> None:
        import redis
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        async def run(port: int, key: str) -> None:
            c = aredis.Redis(host="127.0.0.1", port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0))
            try:
                await c.get(key)
            finally:
                await c.aclose()

        await self.acase(
            "redis",
            TRANSIENT,
            "redis.asyncio ConnectionError: connection refused",
            lambda: run(self.s.closed_port, "k"),
            redis.ConnectionError,
        )
        await self.acase(
            "redis",
            PERMANENT,
            "redis.asyncio WRONGTYPE",
            lambda: run(self.s.resp.port, "wrongtype"),
            redis.ResponseError,
        )
        await self.acase(
            "redis",
            TRANSIENT,
            "redis.asyncio LOADING",
            lambda: run(self.s.resp.port, "loading"),
            redis.exceptions.BusyLoadingError,
        )

    # ======================================================================= SQL
    def sql_lib(self) -> None:
        import psycopg
        import sqlalchemy as sa
        from sqlalchemy import exc as saexc
        from sqlalchemy.orm import Session

        pg_port = self.s.pg.port

        def pg_engine(port: int, db: str) -> sa.Engine:
            return sa.create_engine(
                f"postgresql+psycopg://app:pw@127.0.0.1:{port}/{db}",
                connect_args={"connect_timeout": 2, "sslmode": "disable", "gssencmode": "disable"},
                poolclass=sa.NullPool,
            )

        self.case(
            "sqlalchemy",
            TRANSIENT,
            "sqlalchemy+psycopg OperationalError: connection refused",
            lambda: pg_engine(self.s.closed_port, "app").connect(),
            saexc.OperationalError,
            key="sa_conn",
        )
        self.case(
            "sqlalchemy",
            FATAL,
            "sqlalchemy+psycopg OperationalError: password authentication failed",
            lambda: pg_engine(pg_port, "authfail").connect(),
            saexc.OperationalError,
        )

        def pg(db: str) -> psycopg.Connection[Any]:
            return psycopg.connect(
                host="127.0.0.1",
                port=pg_port,
                dbname=db,
                user="app",
                password="pw",
                connect_timeout=2,
                sslmode="disable",
                gssencmode="disable",
            )

        startup = [
            ("authfail", FATAL, "password authentication failed (28P01)"),
            ("toomany", TRANSIENT, "sorry, too many clients already (53300)"),
            ("startingup", TRANSIENT, "the database system is starting up (57P03)"),
            ("nodb", PERMANENT, "database does not exist (3D000)"),
        ]
        for db, label, desc in startup:
            self.case("psycopg", label, f"psycopg connect: {desc}", lambda d=db: pg(d), psycopg.OperationalError)
        queries = [
            ("deadlock", TRANSIENT, "deadlock detected (40P01)", psycopg.errors.DeadlockDetected),
            (
                "serialization",
                TRANSIENT,
                "serialization failure (40001)",
                psycopg.errors.SerializationFailure,
            ),
            ("statement_timeout", TRANSIENT, "statement timeout (57014)", psycopg.errors.QueryCanceled),
            ("unique", PERMANENT, "unique violation (23505)", psycopg.errors.UniqueViolation),
            ("missing_table", PERMANENT, "relation does not exist (42P01)", psycopg.errors.UndefinedTable),
            ("syntax", PERMANENT, "syntax error (42601)", psycopg.errors.SyntaxError),
            (
                "admin_shutdown",
                TRANSIENT,
                "terminating connection due to administrator command (57P01)",
                psycopg.errors.AdminShutdown,
            ),
        ]

        def query(sql: str) -> None:
            with pg("ok") as conn:
                conn.execute(sql)  # type: ignore[call-overload]

        for kw, label, desc, expect in queries:
            self.case(
                "psycopg",
                label,
                f"psycopg execute: {desc}",
                lambda k=kw: query(f"SELECT '{k}'"),
                expect,
                key=f"pg_{kw}",
            )

        db_path = self.tmp / "corpus.sqlite"
        eng = sa.create_engine(f"sqlite:///{db_path}", connect_args={"timeout": 0}, poolclass=sa.NullPool)
        with eng.begin() as conn:
            conn.execute(sa.text("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE)"))
            conn.execute(sa.text("INSERT INTO users (id, email) VALUES (1, 'a@example.com')"))

        def run(sql: str) -> Callable[[], Any]:
            def go() -> None:
                with eng.begin() as conn:
                    conn.execute(sa.text(sql))

            return go

        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy sqlite OperationalError: no such table",
            run("SELECT * FROM orders"),
            saexc.OperationalError,
            key="sa_no_table",
        )
        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy sqlite IntegrityError: UNIQUE constraint failed",
            run("INSERT INTO users (id, email) VALUES (2, 'a@example.com')"),
            saexc.IntegrityError,
        )
        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy sqlite IntegrityError: NOT NULL constraint failed",
            run("INSERT INTO users (id, email) VALUES (3, NULL)"),
            saexc.IntegrityError,
        )
        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy sqlite OperationalError: syntax error",
            run("SELEC * FROM users"),
            saexc.OperationalError,
        )
        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy NoResultFound from .one()",
            lambda: Session(eng).execute(sa.text("SELECT * FROM users WHERE id = 99")).one(),
            saexc.NoResultFound,
        )
        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy OperationalError: unable to open database file",
            lambda: sa.create_engine(f"sqlite:///{self.tmp}/no/such/dir/x.db").connect(),
            saexc.OperationalError,
        )
        self.case(
            "sqlalchemy",
            PERMANENT,
            "sqlalchemy NoSuchModuleError: unknown dialect in URL",
            lambda: sa.create_engine("nosuchdialect://u@h/db"),
            saexc.NoSuchModuleError,
        )
        locker = sqlite3.connect(db_path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            self.case(
                "sqlalchemy",
                TRANSIENT,
                "sqlalchemy sqlite OperationalError: database is locked",
                run("SELECT * FROM users"),
                saexc.OperationalError,
                key="sa_locked",
            )
            self.case(
                "sqlite3",
                TRANSIENT,
                "sqlite3 OperationalError: database is locked",
                lambda: sqlite3.connect(db_path, timeout=0).execute("INSERT INTO users VALUES (5, 'e')"),
                sqlite3.OperationalError,
            )
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        self.case(
            "sqlite3",
            PERMANENT,
            "sqlite3 IntegrityError: UNIQUE constraint failed",
            lambda: sqlite3.connect(db_path).execute("INSERT INTO users VALUES (1, 'dup@example.com')"),
            sqlite3.IntegrityError,
        )
        self.case(
            "sqlite3",
            PERMANENT,
            "sqlite3 OperationalError: no such column",
            lambda: sqlite3.connect(db_path).execute("SELECT nope FROM users"),
            sqlite3.OperationalError,
        )
        eng.dispose()

    # ======================================================================= pydantic / json
    def data_libs(self) -> None:
        import pydantic

        class SearchArgs(pydantic.BaseModel):
            query: str
            limit: int = 10

        self.case(
            "pydantic",
            PERMANENT,
            "pydantic ValidationError: missing required field",
            lambda: SearchArgs.model_validate({"limit": 3}),
            pydantic.ValidationError,
            key="pyd_missing",
        )
        self.case(
            "pydantic",
            PERMANENT,
            "pydantic ValidationError: wrong type",
            lambda: SearchArgs.model_validate({"query": "x", "limit": "many"}),
            pydantic.ValidationError,
        )
        self.case(
            "pydantic",
            PERMANENT,
            "pydantic ValidationError from model_validate_json on broken JSON",
            lambda: SearchArgs.model_validate_json('{"query": '),
            pydantic.ValidationError,
        )
        self.case(
            "json",
            PERMANENT,
            "json.JSONDecodeError: truncated object",
            lambda: json.loads('{"query": "x", '),
            json.JSONDecodeError,
            key="json",
        )
        self.case(
            "json",
            PERMANENT,
            "json.JSONDecodeError: empty string",
            lambda: json.loads(""),
            json.JSONDecodeError,
        )

    # ======================================================================= builtins / OS
    def builtins_lib(self) -> None:
        missing = self.tmp / "missing.txt"
        self.case(
            "builtins",
            PERMANENT,
            "FileNotFoundError from open()",
            lambda: open(missing),
            FileNotFoundError,
            key="fnf",
        )
        self.case(
            "builtins",
            PERMANENT,
            "PermissionError from a real os.open",
            self._permission_error,
            PermissionError,
        )
        self.case(
            "builtins",
            PERMANENT,
            "IsADirectoryError from open(dir)",
            lambda: open(self.tmp),
            IsADirectoryError,
        )
        afile = self.tmp / "afile"
        afile.write_text("x")
        self.case(
            "builtins",
            PERMANENT,
            "NotADirectoryError from os.listdir(file)",
            lambda: os.listdir(afile),
            NotADirectoryError,
        )
        self.case("builtins", PERMANENT, "KeyError from a dict lookup", lambda: {}["model"], KeyError, key="keyerr")
        self.case("builtins", PERMANENT, "ValueError from int('twelve')", lambda: int("twelve"), ValueError)
        self.case("builtins", PERMANENT, "TypeError from len(5)", lambda: len(5), TypeError)  # type: ignore[arg-type]
        self.case("builtins", PERMANENT, "ZeroDivisionError", lambda: 1 / 0, ZeroDivisionError)
        self.case("builtins", PERMANENT, "AttributeError on None", lambda: None.strip(), AttributeError)  # type: ignore[union-attr]
        self.case("builtins", PERMANENT, "IndexError on an empty list", lambda: [][0], IndexError)
        self.case(
            "builtins",
            PERMANENT,
            "UnicodeDecodeError",
            lambda: b"\xff\xfe\xfa".decode("utf-8"),
            UnicodeDecodeError,
        )
        self.case(
            "builtins",
            PERMANENT,
            "NotImplementedError from an abstract tool",
            self._not_implemented,
            NotImplementedError,
        )

        def recv_blackhole() -> None:
            with socket.create_connection(("127.0.0.1", self.s.blackhole_port), timeout=0.2) as sk:
                sk.recv(10)

        self.case(
            "builtins",
            TRANSIENT,
            "TimeoutError from socket.recv",
            recv_blackhole,
            TimeoutError,
            key="timeout",
        )
        self.case(
            "builtins",
            TRANSIENT,
            "ConnectionRefusedError from socket.create_connection",
            lambda: socket.create_connection(("127.0.0.1", self.s.closed_port), timeout=2),
            ConnectionRefusedError,
            key="refused",
        )

        def reset() -> None:
            with socket.create_connection(("127.0.0.1", self.s.http.port), timeout=2) as sk:
                sk.sendall(b"GET /s/reset HTTP/1.0\r\n\r\n")
                sk.recv(10)

        self.case(
            "builtins",
            TRANSIENT,
            "ConnectionResetError from socket.recv after RST",
            reset,
            ConnectionResetError,
        )

        def broken_pipe() -> None:
            a, b = socket.socketpair()
            b.close()
            try:
                a.sendall(b"x")
            finally:
                a.close()

        self.case("builtins", TRANSIENT, "BrokenPipeError: peer closed", broken_pipe, BrokenPipeError)
        self.case(
            "builtins",
            PERMANENT,
            "socket.gaierror EAI_NONAME: name is not a host (offline, numeric-only)",
            lambda: socket.getaddrinfo("no-such-host.invalid", 80, flags=socket.AI_NUMERICHOST),
            socket.gaierror,
        )
        self.case(
            "builtins",
            PERMANENT,
            "socket.gaierror EAI_SERVICE: unknown service name",
            lambda: socket.getaddrinfo("127.0.0.1", "no-such-service-corpus"),
            socket.gaierror,
        )
        # EAI_AGAIN needs an unreachable resolver; it cannot be triggered offline without changing
        # the system's resolv.conf, so this one exception is constructed the way the resolver
        # module raises it (errno, strerror).
        eai_again = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        self.add(
            "builtins",
            TRANSIENT,
            "socket.gaierror EAI_AGAIN (constructed: cannot trigger offline)",
            eai_again,
        )
        self.case(
            "builtins",
            TRANSIENT,
            "subprocess.TimeoutExpired (tool command over its timeout)",
            lambda: subprocess.run(["sleep", "5"], timeout=0.1),
            subprocess.TimeoutExpired,
        )

    def _permission_error(self) -> None:
        if os.geteuid() == 0:
            # root bypasses file modes; sysctl files still refuse writes to read-only entries.
            os.open("/proc/sys/kernel/osrelease", os.O_WRONLY)
        else:
            p = self.tmp / "locked.txt"
            p.write_text("secret")
            p.chmod(0)
            os.open(p, os.O_RDONLY)

    @staticmethod
    def _not_implemented() -> None:
        class Tool:
            def run(self) -> None:
                raise NotImplementedError("Tool.run must be implemented by subclasses")

        Tool().run()

    # ======================================================================= urllib
    def urllib_lib(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def open_(url: str, timeout: float = 5.0) -> Callable[[], Any]:
            return lambda: opener.open(url, timeout=timeout).read()

        for code in (401, 403, 404, 429, 500, 503):
            self.case(
                "urllib",
                self.STATUS_LABELS[code],
                f"urllib HTTPError {code}",
                open_(self.url(f"h{code}")),
                urllib.error.HTTPError,
                key=f"urllib_{code}",
            )
        self.case(
            "urllib",
            TRANSIENT,
            "urllib HTTPError 429 with Retry-After: 3",
            open_(self.url("h429_retry")),
            urllib.error.HTTPError,
            retry_after=3.0,
        )
        self.case(
            "urllib",
            TRANSIENT,
            "urllib URLError: connection refused",
            open_(self.closed_url),
            urllib.error.URLError,
        )
        self.case(
            "urllib",
            TRANSIENT,
            "urllib read timeout -> TimeoutError",
            open_(self.blackhole_url, 0.2),
            TimeoutError,
        )
        self.case(
            "urllib",
            TRANSIENT,
            "urllib URLError(timed out) on connect",
            open_(self.backlog_url, 0.2),
            urllib.error.URLError,
        )
        self.case("urllib", TRANSIENT, "urllib RemoteDisconnected", open_(self.url("close")), ConnectionError)
        self.case(
            "urllib",
            PERMANENT,
            "urllib URLError: unknown url type",
            open_("gopher2://127.0.0.1/x"),
            urllib.error.URLError,
        )

    # ======================================================================= asyncio
    async def asyncio_lib(self) -> None:
        async def read_blackhole() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.s.blackhole_port)
            try:
                await asyncio.wait_for(reader.read(10), 0.1)
            finally:
                writer.close()

        await self.acase(
            "asyncio",
            TRANSIENT,
            "asyncio.wait_for timeout on a silent peer",
            read_blackhole,
            TimeoutError,
            key="async_timeout",
        )

        if sys.version_info >= (3, 11):  # asyncio.timeout() is new in 3.11

            async def connect_backlog() -> None:
                async with asyncio.timeout(0.2):
                    await asyncio.open_connection("127.0.0.1", self.s.full_backlog_port)

            await self.acase(
                "asyncio",
                TRANSIENT,
                "asyncio.timeout() around a connect that never completes",
                connect_backlog,
                TimeoutError,
            )
        await self.acase(
            "asyncio",
            TRANSIENT,
            "asyncio.open_connection refused",
            lambda: asyncio.open_connection("127.0.0.1", self.s.closed_port),
            ConnectionRefusedError,
        )

        async def incomplete() -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.s.http.port)
            writer.write(b"GET /s/close HTTP/1.0\r\n\r\n")
            try:
                await reader.readexactly(100)
            finally:
                writer.close()

        await self.acase(
            "asyncio",
            TRANSIENT,
            "asyncio.IncompleteReadError: peer closed mid-read",
            incomplete,
            asyncio.IncompleteReadError,
        )

    # ======================================================================= tenacity
    def tenacity_lib(self) -> None:
        import requests
        import tenacity

        sess = requests.Session()
        sess.trust_env = False
        self._closers.append(sess.close)

        def retrying(fn: Callable[[], Any]) -> Callable[[], Any]:
            return lambda: tenacity.Retrying(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())(fn)

        self.case(
            "tenacity",
            TRANSIENT,
            "tenacity RetryError over requests ConnectionError (refused)",
            retrying(lambda: sess.get(self.closed_url, timeout=2)),
            tenacity.RetryError,
        )
        self.case(
            "tenacity",
            PERMANENT,
            "tenacity RetryError over requests 404",
            retrying(lambda: sess.get(self.url("h404"), timeout=2).raise_for_status()),
            tenacity.RetryError,
        )
        self.case(
            "tenacity",
            FATAL,
            "tenacity RetryError over requests 401",
            retrying(lambda: sess.get(self.url("h401"), timeout=2).raise_for_status()),
            tenacity.RetryError,
        )
        self.case(
            "tenacity",
            TRANSIENT,
            "tenacity RetryError over 503s",
            retrying(lambda: sess.get(self.url("h503"), timeout=2).raise_for_status()),
            tenacity.RetryError,
        )

    # ======================================================================= wrapped
    def wrapped(self) -> None:
        k = self.by_key

        class ToolException(Exception):  # shaped like langchain_core.tools.ToolException
            pass

        class ToolExecutionError(RuntimeError):  # a framework's generic "tool failed" wrapper
            def __init__(self, tool: str, original: BaseException) -> None:
                super().__init__(f"Tool {tool!r} failed")
                self.tool = tool
                self.original = original

        def explicit(wrapper: Callable[[], BaseException], inner: BaseException) -> Callable[[], Any]:
            def go() -> None:
                raise wrapper() from inner

            return go

        def implicit(wrapper: Callable[[], BaseException], inner: BaseException) -> Callable[[], Any]:
            def go() -> None:
                try:
                    raise inner
                except BaseException:
                    raise wrapper()  # noqa: B904 - the implicit __context__ is the point

            return go

        cases: list[tuple[str, str, Callable[[], Any], ExcSpec]] = [
            (
                "RuntimeError('tool failed') from openai insufficient_quota",
                FATAL,
                explicit(lambda: RuntimeError("tool failed"), k["oa_quota"]),
                RuntimeError,
            ),
            (
                "RuntimeError('tool failed') from httpx ReadTimeout",
                TRANSIENT,
                explicit(lambda: RuntimeError("tool failed"), k["httpx_read_timeout"]),
                RuntimeError,
            ),
            (
                "ToolException from FileNotFoundError",
                PERMANENT,
                explicit(lambda: ToolException("read_file failed"), k["fnf"]),
                ToolException,
            ),
            (
                "ToolException from redis NOAUTH",
                FATAL,
                explicit(lambda: ToolException("cache lookup failed"), k["redis_noauth"]),
                ToolException,
            ),
            (
                "ToolException from botocore ThrottlingException",
                TRANSIENT,
                explicit(lambda: ToolException("dynamodb query failed"), k["ddb_throttling"]),
                ToolException,
            ),
            (
                "RuntimeError('tool failed') from KeyError",
                PERMANENT,
                explicit(lambda: RuntimeError("tool failed"), k["keyerr"]),
                RuntimeError,
            ),
            (
                "ToolExecutionError wrapper (cause) over grpc UNAUTHENTICATED",
                FATAL,
                explicit(
                    lambda: ToolExecutionError("vector_search", k["grpc_Unauthenticated"]),
                    k["grpc_Unauthenticated"],
                ),
                ToolExecutionError,
            ),
            (
                "implicit __context__: Exception('search_docs failed') raised while handling requests 503",
                TRANSIENT,
                implicit(lambda: Exception("search_docs failed"), k["requests_503"]),
                Exception,
            ),
            (
                "implicit __context__: RuntimeError('upload failed') while handling botocore ExpiredToken",
                FATAL,
                implicit(lambda: RuntimeError("upload failed"), k["s3_expired"]),
                RuntimeError,
            ),
            (
                "implicit __context__: ToolException while handling psycopg UniqueViolation",
                PERMANENT,
                implicit(lambda: ToolException("insert failed"), k["pg_unique"]),
                ToolException,
            ),
            (
                "implicit __context__: RuntimeError while handling anthropic 529 overloaded",
                TRANSIENT,
                implicit(lambda: RuntimeError("llm call failed"), k["an_overloaded"]),
                RuntimeError,
            ),
            (
                "two levels: RuntimeError from ToolException from google-api-core Unauthenticated",
                FATAL,
                self._two_levels(ToolException, k["g_grpc_Unauthenticated"]),
                RuntimeError,
            ),
        ]
        for desc, label, fn, expect in cases:
            self.case("wrapped", label, f"wrapped: {desc}", fn, expect, key=f"wrapped:{desc[:30]}")
        # Text-only wrappers: the cause did not survive (e.g. an error string that crossed an MCP or
        # process boundary and was re-raised), only the provider's message text carries the class.
        self.add(
            "wrapped",
            FATAL,
            "wrapped text-only: ToolException(str(openai insufficient_quota)), no cause",
            ToolException(f"Error: {k['oa_quota']}"),
        )
        self.add(
            "wrapped",
            TRANSIENT,
            "wrapped text-only: ToolException(str(anthropic 529 overloaded)), no cause",
            ToolException(f"Error: {k['an_overloaded']}"),
        )

    @staticmethod
    def _two_levels(tool_exc: type[Exception], inner: BaseException) -> Callable[[], Any]:
        def go() -> None:
            try:
                raise tool_exc("vector store call failed") from inner
            except tool_exc as mid:
                raise RuntimeError("agent step failed") from mid

        return go

    # ======================================================================= grouped
    def grouped(self) -> None:
        k = self.by_key
        groups: list[tuple[str, str, list[BaseException]]] = [
            ("ConnectError + FileNotFoundError", PERMANENT, [k["httpx_connect"], k["fnf"]]),
            ("requests 503 + openai insufficient_quota", FATAL, [k["requests_503"], k["oa_quota"]]),
            ("ReadTimeout + redis ConnectionError", TRANSIENT, [k["httpx_read_timeout"], k["redis_conn"]]),
            (
                "grpc UNAVAILABLE + pydantic ValidationError",
                PERMANENT,
                [k["grpc_Unavailable"], k["pyd_missing"]],
            ),
            (
                "botocore throttling + sts InvalidClientTokenId + KeyError",
                FATAL,
                [k["ddb_throttling"], k["sts_invalid_token"], k["keyerr"]],
            ),
            ("urllib 429 + asyncio timeout", TRANSIENT, [k["urllib_429"], k["async_timeout"]]),
        ]
        for desc, label, members in groups:
            self.add("grouped", label, f"ExceptionGroup: {desc}", ExceptionGroup("parallel tools failed", members))
        nested = ExceptionGroup("outer", [ExceptionGroup("inner", [k["grpc_Unavailable"], k["timeout"]]), k["json"]])
        self.add(
            "grouped",
            PERMANENT,
            "nested ExceptionGroup: (UNAVAILABLE + TimeoutError) + JSONDecodeError",
            nested,
        )

        def group_with_wrapped() -> None:
            try:
                raise RuntimeError("s3 tool failed") from k["s3_bad_key_id"]
            except RuntimeError as wrapped:
                raise ExceptionGroup("tools", [wrapped, k["httpx_500"]]) from None

        self.case(
            "grouped",
            FATAL,
            "ExceptionGroup: wrapped InvalidAccessKeyId + httpx 500",
            group_with_wrapped,
            ExceptionGroup,
        )

    async def grouped_async(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as sess:

            async def fetch(url: str, timeout: float) -> None:
                async with sess.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    r.raise_for_status()

            async def gather_all(*urls: str, timeout: float = 5.0) -> None:
                # The usual parallel-tools pattern: run all, then raise every failure together.
                # (asyncio.TaskGroup would cancel the slower siblings, making members racy.)
                results = await asyncio.gather(*(fetch(u, timeout) for u in urls), return_exceptions=True)
                errors = [r for r in results if isinstance(r, Exception)]
                if len(errors) != len(urls):
                    raise CorpusBuildError(f"expected {len(urls)} failures, got {results!r}")
                raise ExceptionGroup("parallel tool calls failed", errors)

            async def task_group(*urls: str, timeout: float) -> None:
                async with asyncio.TaskGroup() as tg:
                    for u in urls:
                        tg.create_task(fetch(u, timeout))

            await self.acase(
                "grouped",
                FATAL,
                "asyncio.gather group: aiohttp refused + aiohttp 401",
                lambda: gather_all(self.closed_url, self.url("h401")),
                ExceptionGroup,
            )
            await self.acase(
                "grouped",
                PERMANENT,
                "asyncio.gather group: aiohttp 503 + aiohttp 404",
                lambda: gather_all(self.url("h503"), self.url("h404")),
                ExceptionGroup,
            )
            # Every member is a timeout, so whichever subset the TaskGroup keeps, the label holds.
            if sys.version_info >= (3, 11):  # asyncio.TaskGroup is new in 3.11
                await self.acase(
                    "grouped",
                    TRANSIENT,
                    "asyncio.TaskGroup: two aiohttp timeouts",
                    lambda: task_group(self.blackhole_url, self.blackhole_url + "/b", timeout=0.2),
                    ExceptionGroup,
                )

    # ======================================================================= driver
    _closers: list[Callable[[], Any]]

    async def run_async(self) -> None:
        await self.openai_async()
        await self.anthropic_async()
        await self.httpx_async()
        await self.aiohttp_lib()
        await self.grpc_aio()
        await self.redis_async()
        await self.asyncio_lib()
        await self.grouped_async()

    def build(self) -> list[Case]:
        self._closers = []
        try:
            self.openai()
            self.anthropic()
            self.httpx_sync()
            self.requests_lib()
            self.botocore_lib()
            self.grpc_lib()
            self.google_lib()
            self.redis_lib()
            self.sql_lib()
            self.data_libs()
            self.builtins_lib()
            self.urllib_lib()
            self.tenacity_lib()
            asyncio.run(self.run_async())
            self.wrapped()
            self.grouped()
        finally:
            for close in self._closers:
                close()
        return self.cases


@contextmanager
def _aws_env(tmp: Path) -> Iterator[None]:
    """No ambient AWS credentials/config and no metadata-service lookups while building."""
    (tmp / "aws_config").write_text("")
    (tmp / "aws_credentials").write_text("")
    overrides = {
        "AWS_CONFIG_FILE": str(tmp / "aws_config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "aws_credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "BOTO_CONFIG": str(tmp / "aws_config"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    removed = [k for k in os.environ if k.startswith("AWS_") and k not in overrides and k != "AWS_CA_BUNDLE"]
    removed += [
        k
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
        if k in os.environ
    ]
    saved = {k: os.environ.get(k) for k in [*overrides, *removed]}
    os.environ.update(overrides)
    for k in removed:
        del os.environ[k]
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_corpus() -> list[Case]:
    """Start the local peers, provoke every failure for real, return the labelled cases."""
    with tempfile.TemporaryDirectory(prefix="lg-corpus-") as d:
        tmp = Path(d)
        with _aws_env(tmp), running_servers(ROUTES) as servers:
            return Builder(servers, tmp).build()


if __name__ == "__main__":  # quick look: python tests/classification/classification_corpus.py
    import collections
    import time

    t0 = time.perf_counter()
    built = build_corpus()
    print(f"{len(built)} cases in {time.perf_counter() - t0:.1f}s")
    print(collections.Counter(c.library for c in built))
    print(collections.Counter(c.expected for c in built))
    if "-v" in sys.argv:
        for c in built:
            print(f"{c.expected:9} {c.library:16} {c.description}\n{'':27}{c.exc!r:.200}")
