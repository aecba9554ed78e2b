"""Turn any exception into a decision: transient, permanent or fatal.

Agent tools raise whatever their SDK raises: ``openai.RateLimitError``, botocore's
``ClientError``, a grpc ``_InactiveRpcError``, a ``RuntimeError`` wrapping an
``httpx.ConnectError``, an ``ExceptionGroup`` from a TaskGroup. No library normalizes
these across SDKs without importing them, so this module reads them structurally
(attributes, class names, status codes, provider error codes, headers, message text)
and never imports an SDK.

Evidence is ranked; the strongest piece anywhere in the exception chain wins:

1. user rules (``Rule``) -- the operator knows their tools best;
2. provider error codes and billing/credential signals (``insufficient_quota`` is fatal
   even when it arrives as a 429);
3. HTTP status, gRPC status, SQLSTATE, botocore error codes;
4. specific exception classes and errno values (timeouts, refused connections, files);
5. message patterns;
6. generic builtins (``ValueError``, ``KeyError``...) -- permanent, but a weak witness
   when they merely wrap a more specific cause.

Nothing here raises: every probe of a foreign object is guarded, and the worst case is
the configured ``unknown`` class.
"""

from __future__ import annotations

import errno as _errno
import json
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from loop_governor.errors import SEVERITY, ErrorType, truncate
from loop_governor.redaction import redact

__all__ = ["ErrorInfo", "Rule", "classify", "normalize_message"]

_T, _P, _F = ErrorType.TRANSIENT, ErrorType.PERMANENT, ErrorType.FATAL
_R = TypeVar("_R")

# Evidence strengths (higher wins).
_S_RULE, _S_PROVIDER, _S_STATUS, _S_TYPE, _S_TEXT_STATUS, _S_MESSAGE, _S_GENERIC = 7, 6, 5, 4, 3, 2, 1

_MAX_LINKS = 32
_STATUS_ATTRS = ("status_code", "status", "http_status", "code", "status_int")
_MAX_TEXT = 4000


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The classifier's verdict on one exception."""

    error_type: ErrorType
    retryable: bool
    status: int | None = None
    code: str | None = None
    signature: str = ""
    retry_after: float | None = None
    message: str = ""
    #: "the same error again", for the loop guards: the message with only what varies between
    #: occurrences of one fault masked (numbers, ids, timestamps), names and quoted values
    #: kept -- "No module named 'numpy'" after "No module named 'scipy'" is another error.
    identity: str = ""
    exception_type: str = ""
    evidence: str = "default"
    #: A transient failure that paces the caller rather than reporting a fault: HTTP 429,
    #: a provider's rate-limit / throttling code. The service answered; waiting for a turn
    #: is the remedy, so breakers do not count it and a model call waits instead of
    #: spending its attempts (see :mod:`loop_governor.retry`).
    throttled: bool = False
    #: A transient failure that says the service is shedding load (529 ``overloaded_error``,
    #: a 503 "overloaded" / "slow down"): a fault the breaker counts, but like a throttle
    #: one that waiting ends, so a model call waits it out too.
    overloaded: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    """A user classification rule; any rule that matches beats every built-in heuristic.

    All given conditions must hold: ``exc_type`` (class or tuple, isinstance),
    ``status`` (int or collection of ints), ``code`` (provider/gRPC code, case-insensitive),
    ``pattern`` (regex searched in the message), ``predicate`` (callable on the exception).
    """

    error_type: ErrorType | str
    exc_type: type[BaseException] | tuple[type[BaseException], ...] | None = None
    status: int | Iterable[int] | None = None
    code: str | None = None
    pattern: str | re.Pattern[str] | None = None
    predicate: Callable[[BaseException], bool] | None = None
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "error_type", ErrorType(self.error_type))
        if self.pattern is not None:
            regex = self.pattern if isinstance(self.pattern, re.Pattern) else re.compile(self.pattern, re.I)
            object.__setattr__(self, "_regex", regex)
        if self.status is not None and not isinstance(self.status, int):
            object.__setattr__(self, "status", frozenset(self.status))

    def matches(self, exc: BaseException, status: int | None, codes: Sequence[str], text: str) -> bool:
        if self.exc_type is not None and not isinstance(exc, self.exc_type):
            return False
        if self.status is not None:
            if isinstance(self.status, int):
                if status != self.status:
                    return False
            elif status not in self.status:  # type: ignore[operator]
                return False
        if self.code is not None and self.code.lower() not in {c.lower() for c in codes}:
            return False
        if self._regex is not None and not self._regex.search(text):
            return False
        return self.predicate is None or bool(self.predicate(exc))


# --- tables ----------------------------------------------------------------------------

# Billing, plan and credential signals: fatal whatever status they arrive with.
_FATAL_TEXT = re.compile(
    r"insufficient[_ ]quota|billing[_ ]hard[_ ]limit|billing_not_active"
    r"|credit balance (?:is )?too low|insufficient[_ ](?:credits?|funds|balance)"
    r"|out of credits|payment required|account[_ ](?:is |has been )?(?:suspended|deactivated|disabled)"
    r"|account_deactivated|access_terminated|organization (?:has been |is )?(?:suspended|disabled|deactivated)"
    r"|invalid[_ ]api[_ ]key|incorrect api key|api[_ ]key (?:is )?(?:invalid|expired|revoked|not valid|missing)"
    r"|invalid x-api-key|invalid_authentication|expired[_ ]?token|token (?:has )?expired"
    r"|security token included in the request is (?:invalid|expired)|invalidclienttokenid"
    r"|unrecognizedclientexception|signaturedoesnotmatch|password authentication failed"
    r"|\bwrongpass\b|\bnoauth\b|authentication required|no api key provided"
    # Anthropic's spend and usage limits (a 429 rate_limit_error or a 400): no wait lifts them
    r"|spend(?:ing)? limit|(?:specified|monthly) (?:api )?usage limits?|regain access on"
    r"|(?:extra usage|usage credits) (?:is|are) required",
    re.I | re.S,
)

# A session the agent can renew itself ("not authenticated, please log in", "session
# expired"): the call fails until the agent logs in with its own tool, then it works --
# permanent for that call, not fatal for the run. A key, a quota or billing the agent
# cannot renew stays fatal (below): these texts name none of them.
_SESSION = re.compile(
    r"\bnot (?:yet )?(?:authenticated|logged in|signed in)\b|\bplease (?:log|sign) ?(?:in|on)\b"
    r"|\b(?:log|sign) ?in (?:first|again|required|to continue)\b|\blogin (?:is )?required\b"
    r"|\bsession (?:has )?(?:expired|timed out|ended|is (?:invalid|expired|closed))\b|\bsession expired\b"
    r"|\bno (?:active |valid )?session\b|\bre-?authenticate\b|\bmust (?:be )?(?:logged|signed) in\b",
    re.I,
)
_NOT_RENEWABLE = re.compile(
    r"api[ _-]?key|x-api-key|access[ _-]?key|billing|quota|credit|payment|revoked|suspended|deactivated"
    r"|invalid credentials|secret",
    re.I,
)

# "You exceeded your current quota": fatal when it is the plan's (exhausted until someone
# pays: OpenAI's insufficient_quota, caught above by its code and text), a throttle when
# the quota refills -- per minute or per day (Gemini's free tier, Vertex's
# ``..._requests_per_minute_...`` quota ids), a retry delay the provider names ("Please
# retry in 20.04s", Retry-After, RetryInfo), or a rate-limit code next to it.
_QUOTA_TEXT = re.compile(
    r"exceeded your current quota|check your plan and billing|quota (?:exceeded|exhausted)"
    r"|exceeded (?:the |your )?quota",
    re.I,
)
_QUOTA_REFILLS = re.compile(
    r"per[\s_-]?(?:second|minute|hour|day)|\b(?:rpm|tpm|rpd|tpd)\b|(?:try again|retry) (?:in|after)"
    r"|retry_?delay|\bretryinfo\b|free[_ -]?tier",
    re.I,
)
_QUOTA_THROTTLE_CODES = frozenset(
    "rate_limit_exceeded ratelimitexceeded ratelimited rate_limited throttling throttlingexception "
    "throttled too_many_requests requestlimitexceeded".split()
)


def _quota_kind(exc: BaseException, text: str, codes: Sequence[str]) -> ErrorType | None:
    """A quota text's verdict (see _QUOTA_TEXT): fatal when no wait lifts it, transient
    (a throttle, whatever the status: Google sends per-minute quotas as 403s too) when it
    refills; None without one."""
    if not _QUOTA_TEXT.search(text):
        return None
    if _QUOTA_REFILLS.search(text) or any(code.lower() in _QUOTA_THROTTLE_CODES for code in codes):
        return _T
    return _F if _raw_retry_after(exc, text) is None else _T


# Provider / service error codes (lower-cased), as found in ``.code``, ``.type``, bodies,
# botocore ``Error.Code``, gRPC status names and redis reply prefixes.
_CODES: dict[str, ErrorType] = {}
for _names, _kind in (
    (
        "rate_limit_exceeded rate_limit_error ratelimitexceeded ratelimited rate_limited overloaded_error "
        "overloaded server_error api_error internal_error internalerror internalfailure internalservererror "
        "internal_server_error serviceunavailable serviceunavailableexception service_unavailable "
        "throttling throttlingexception throttled toomanyrequestsexception too_many_requests "
        "requestlimitexceeded slowdown provisionedthroughputexceededexception requesttimeout "
        "requesttimeoutexception timeout priorrequestnotcomplete bandwidthlimitexceeded "
        "ec2throttledexception limitexceededexception requestthrottled requestthrottledexception "
        "unavailable deadline_exceeded resource_exhausted aborted internal cancelled "
        "loading busy tryagain masterdown clusterdown readonly transactionconflictexception "
        "temporarily_unavailable engine_overloaded",
        _T,
    ),
    (
        "insufficient_quota billing_hard_limit_reached billing_not_active account_deactivated "
        "access_terminated invalid_api_key invalid_authentication authentication_error expiredtoken "
        "expiredtokenexception invalidclienttokenid unrecognizedclientexception signaturedoesnotmatch "
        "invalidsignatureexception authfailure missingauthenticationtoken "
        "missingauthenticationtokenexception notauthorizedexception optinrequired accountproblem "
        "unauthenticated noauth wrongpass invalidaccesskeyid incompletesignature "
        "credit_balance_too_low payment_required billing_error",
        _F,
    ),
    (
        "invalid_request_error not_found_error not_found invalid_argument invalid_parameter "
        "context_length_exceeded model_not_found validationexception validationerror "
        "resourcenotfoundexception nosuchkey nosuchbucket nosuchentity notfound accessdenied "
        "accessdeniedexception forbidden permission_error permission_denied invalidparametervalue "
        "invalidparametervalueexception invalidparameterexception invalidrequestexception "
        "conditionalcheckfailedexception conflictexception resourceinuseexception badrequest "
        "badrequestexception already_exists failed_precondition out_of_range unimplemented data_loss "
        "wrongtype noscript execabort noperm unsupported_country_region_territory "
        "invalidinput malformedpolicydocument entitytoolarge invalid_prompt",
        _P,
    ),
):
    for _name in _names.split():
        _CODES[_name] = _kind

# Exception class names (lower-cased, checked along the MRO, most specific first).
_TYPES: dict[str, ErrorType] = {}
for _names, _kind in (
    (
        "timeouterror timeout readtimeout connecttimeout writetimeout pooltimeout timeoutexception "
        "apitimeouterror servertimeouterror readtimeouterror connecttimeouterror sockettimeouterror "
        "connectionrefusederror connectionreseterror connectionabortederror brokenpipeerror "
        "apiconnectionerror connecterror networkerror remoteprotocolerror readerror writeerror "
        "protocolerror newconnectionerror maxretryerror serverdisconnectederror clientconnectorerror "
        "clientconnectionerror clientoserror serverconnectionerror clientpayloaderror "
        "endpointconnectionerror connectionclosederror incompleteread remotedisconnected "
        "chunkedencodingerror deadlineexceeded serviceunavailable toomanyrequests internalservererror "
        "badgateway gatewaytimeout ratelimiterror overloadederror busyloadingerror tryagainerror "
        "clusterdownerror masterdownerror connectionerror cancellederror aborted resourceexhausted "
        "internalservererror serviceunavailableerror retryerror incompletereaderror eoferror "
        "transferencodingerror contentlengtherror",
        _T,
    ),
    (
        "authenticationerror authenticationrequirederror nocredentialserror partialcredentialserror "
        "credentialretrievalerror unauthorizedssotokenerror tokenretrievalerror unauthenticated "
        "unauthorized noregionerror memoryerror keyboardinterrupt systemexit paymentrequired "
        "credentialserror defaultcredentialserror",
        _F,
    ),
    (
        "filenotfounderror isadirectoryerror notadirectoryerror fileexistserror permissionerror "
        "jsondecodeerror decodeerror unicodeerror unicodedecodeerror unicodeencodeerror validationerror "
        "paramvalidationerror notfounderror notfound badrequesterror badrequest unprocessableentityerror "
        "conflicterror invalidargument failedprecondition alreadyexists outofrange methodnotimplemented "
        "permissiondeniederror permissiondenied forbidden integrityerror programmingerror dataerror "
        "notsupportederror noresultfound multipleresultsfound argumenterror invalidurl missingschema "
        "invalidschema unsupportedprotocol toomanyredirects localprotocolerror invalidheader "
        "contenttypeerror zerodivisionerror notimplementederror recursionerror unimplemented "
        "certificateerror sslcertverificationerror invalidjsonerror urlrequired noresulterror "
        "responseerror",
        _P,
    ),
):
    for _name in _names.split():
        _TYPES[_name] = _kind

# Generic builtins: permanent, but a weak witness (they often wrap the real cause).
_GENERIC_PERMANENT = frozenset(
    "valueerror typeerror keyerror indexerror lookuperror attributeerror assertionerror operationalerror".split()
)
_GENERIC_TRANSIENT = frozenset({"operationalerror"})

_ERRNO: dict[int, ErrorType] = {}
for _names, _kind in (
    (
        "ECONNREFUSED ECONNRESET ECONNABORTED ETIMEDOUT EHOSTUNREACH ENETUNREACH ENETDOWN EPIPE "
        "EAGAIN EINTR EMFILE ENFILE EBUSY EADDRNOTAVAIL EHOSTDOWN",
        _T,
    ),
    ("ENOENT EACCES EPERM EISDIR ENOTDIR EEXIST EINVAL ENOTEMPTY EROFS ENAMETOOLONG ELOOP", _P),
    ("ENOSPC EDQUOT", _F),
):
    for _name in _names.split():
        if hasattr(_errno, _name):
            _ERRNO[getattr(_errno, _name)] = _kind

_GAI: dict[int, ErrorType] = {}
for _name, _kind in (
    ("EAI_AGAIN", _T),
    ("EAI_NONAME", _P),
    ("EAI_NODATA", _P),
    ("EAI_SERVICE", _P),
    ("EAI_FAIL", _P),
):
    if hasattr(socket, _name):
        _GAI[getattr(socket, _name)] = _kind

# SQLSTATE classes (PostgreSQL and the SQL standard).
_SQLSTATE_PREFIX: tuple[tuple[str, ErrorType], ...] = (
    ("40001", _T),
    ("40P01", _T),
    ("55P03", _T),
    ("57P0", _T),
    ("08", _T),
    ("53", _T),
    ("28", _F),
    ("42", _P),
    ("23", _P),
    ("22", _P),
)

_MSG_FATAL = re.compile(
    r"\bunauthori[sz]ed\b|authentication (?:failed|error)|invalid credentials|not authenticated"
    r"|credentials (?:have )?(?:expired|are invalid)|unable to locate credentials",
    re.I,
)
_MSG_TRANSIENT = re.compile(
    r"timed? ?out|timeout (?:error|exceeded|occurred|expired)|temporar(?:il)?y (?:unavailable|failure|error)"
    r"|try again|rate.?limit|too many requests|throttl|connection (?:refused|reset|aborted|closed|error|failed|lost)"
    r"|server disconnected|remote end closed|broken pipe|service unavailable|bad gateway|gateway time"
    r"|overloaded|server (?:is )?busy|econnreset|econnrefused|eai_again|network is unreachable|no route to host"
    r"|database is locked|deadlock|could not connect|failed to connect|\bunavailable\b|upstream",
    re.I,
)
_MSG_PERMANENT = re.compile(
    r"not found|no such|does not exist|doesn't exist|\binvalid\b|malformed|unsupported|bad request|forbidden"
    r"|permission denied|access denied|already exists|not allowed|unprocessable|syntax error|missing required"
    r"|not permitted|cannot parse|could not parse|unknown (?:command|field|parameter|argument)",
    re.I,
)
_MSG_TOO_LARGE = re.compile(r"larger than max|too large|exceeds (?:the )?(?:maximum|max|limit)", re.I)
# Checked before the transient patterns: "connection failed: FATAL: database x does not
# exist" is about the database, not the connection.
_MSG_PERMANENT_FIRST = re.compile(
    r"does not exist|no such (?:file|table|column|key|bucket|index|database)|unable to open database file",
    re.I,
)
_MSG_STATUS = re.compile(
    r"\b(?:status(?:[ _]code)?|error code|http(?:/\d(?:\.\d)?)?|response code|returned)\s*[:=]?\s*\(?([1-5]\d\d)\b",
    re.I,
)
# "Please try again in 20s" / "in 120ms" / "in 7m12s" (OpenAI's per-day limits) / "in 2 minutes" /
# "in 1 hour and 30 minutes": every part is added up (not across a comma: "in 10 s, 5 m
# tokens left" is 10 s)
_RETRY_UNIT = r"(ms|milliseconds?|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h)(?![a-z])"
_MSG_RETRY_IN = re.compile(
    r"(?:try again|retry) in (\d+(?:\.\d+)?\s*"
    + _RETRY_UNIT
    + r"(?:(?:\s+and\s+|\s*)\d+(?:\.\d+)?\s*"
    + _RETRY_UNIT
    + r")*)",
    re.I,
)
_RETRY_PART = re.compile(r"(\d+(?:\.\d+)?)\s*" + _RETRY_UNIT, re.I)


def _unit_seconds(unit: str) -> float:
    u = unit.lower()
    if u.startswith(("ms", "milli")):
        return 0.001
    if u.startswith("h"):
        return 3600.0
    return 60.0 if u.startswith("m") else 1.0


_PERMISSION_CODES = frozenset({"permission_error", "permission_denied"})

# Transient codes and exception types that mean "slow down" (a throttle), not "broken".
# Overload (529 overloaded_error, 503) is a fault of the service and stays out.
_THROTTLE_CODES = frozenset(
    (
        "rate_limit_exceeded rate_limit_error ratelimitexceeded ratelimited rate_limited throttling "
        "throttlingexception throttled toomanyrequestsexception too_many_requests requestlimitexceeded "
        "slowdown provisionedthroughputexceededexception bandwidthlimitexceeded ec2throttledexception "
        "limitexceededexception requestthrottled requestthrottledexception resource_exhausted"
    ).split()
)
_THROTTLE_TYPES = frozenset({"ratelimiterror", "toomanyrequests", "resourceexhausted", "throttlingexception"})
_OVERLOAD_CODES = frozenset({"overloaded_error", "overloaded", "engine_overloaded"})
_OVERLOAD_TEXT = re.compile(r"overload|over capacity|slow down|server is busy", re.I)

# Chain attributes beyond __cause__/__context__: tenacity, google-api-core, urllib,
# urllib3, SQLAlchemy and aiohttp keep the underlying error under these names.
_LINK_ATTRS = ("orig", "reason", "cause", "os_error", "original_exception", "inner_exception", "last_exception")


# --- guarded probes ---------------------------------------------------------------------


def _get(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _as_status(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 100 <= value <= 599:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) == 3:
        as_int = int(value)
        return as_int if 100 <= as_int <= 599 else None
    return None


def _mapping_get(obj: Any, *path: str) -> Any:
    cur = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        try:
            cur = cur.get(key)
        except Exception:
            return None
    return cur


def _safe_str(exc: Any) -> str:
    try:
        text = str(exc)
    except Exception:
        try:
            text = repr(exc)
        except Exception:
            text = ""
    return text[:_MAX_TEXT]


def _is_parser_error(exc: BaseException) -> bool:
    """aiohttp's HTTP parser errors carry ``code=400`` while *reading a response*."""
    try:
        return any(c.__name__ == "HttpProcessingError" for c in type(exc).__mro__)
    except Exception:
        return False


def _status_of(exc: BaseException) -> int | None:
    # aiohttp: ``.code`` is a deprecated alias of ``.status`` (warns on access) and its
    # parser errors carry ``code=400`` while reading a *response*: read ``.status`` only.
    skip_code = _is_parser_error(exc) or isinstance(_get(exc, "status"), int)
    names = ("status_code", "status", "http_status") if skip_code else _STATUS_ATTRS
    for name in names:
        status = _as_status(_get(exc, name))
        if status is not None:
            return status
    response = _get(exc, "response")
    if response is not None:
        if isinstance(response, Mapping):
            status = _as_status(_mapping_get(response, "ResponseMetadata", "HTTPStatusCode"))
            if status is not None:
                return status
        else:
            for name in ("status_code", "status"):
                status = _as_status(_get(response, name))
                if status is not None:
                    return status
    return None


def _enum_name(value: Any) -> str | None:
    name = _get(value, "name")
    if isinstance(name, str):
        return name
    return None


def _codes_of(exc: BaseException) -> list[str]:
    """Every string error code the exception exposes, most specific first."""
    codes: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and 0 < len(value) <= 80 and not value.isdigit():
            codes.append(value)

    # aiohttp's ``.code`` is a deprecated alias of ``.status`` (warns on access): skip it.
    skip_code = isinstance(_get(exc, "status"), int)
    for name in ("code", "error_code", "type", "sqlstate", "pgcode"):
        if skip_code and name == "code":
            continue
        value = _get(exc, name)
        if callable(value) and name == "code":
            # grpc.RpcError.code() returns a grpc.StatusCode enum member.
            try:
                value = value()
            except Exception:
                value = None
        if value is not None and not isinstance(value, (str, int)):
            value = _enum_name(value)
        add(value)
    add(_enum_name(_get(exc, "grpc_status_code")))
    diag = _get(exc, "diag")
    add(_get(diag, "sqlstate") if diag is not None else None)
    response = _get(exc, "response")
    if isinstance(response, Mapping):
        add(_mapping_get(response, "Error", "Code"))
    body = _get(exc, "body")
    if isinstance(body, Mapping):
        add(_mapping_get(body, "code"))
        add(_mapping_get(body, "type") if _mapping_get(body, "type") != "error" else None)
        add(_mapping_get(body, "error", "code"))
        add(_mapping_get(body, "error", "type"))
        add(_mapping_get(body, "error", "status"))
    return codes


def _body_text(exc: BaseException) -> str:
    parts: list[str] = []
    body = _get(exc, "body")
    if body is not None:
        if isinstance(body, (Mapping, list)):
            try:
                parts.append(json.dumps(body, default=str)[:_MAX_TEXT])
            except Exception:
                pass
        elif isinstance(body, (str, bytes)):
            parts.append(body[:_MAX_TEXT] if isinstance(body, str) else body[:_MAX_TEXT].decode("utf-8", "replace"))
    response = _get(exc, "response")
    if response is not None and not isinstance(response, Mapping):
        # httpx raises ResponseNotRead for unread streaming bodies: guarded by _get.
        text = _get(response, "text")
        if isinstance(text, str):
            parts.append(text[:_MAX_TEXT])
    elif isinstance(response, Mapping):
        message = _mapping_get(response, "Error", "Message")
        if isinstance(message, str):
            parts.append(message)
    details = _get(exc, "details")
    if callable(details):
        try:
            details = details()
        except Exception:
            details = None
    if isinstance(details, str):
        parts.append(details)
    return " ".join(parts)


def _headers_of(exc: BaseException) -> Any:
    headers = _get(exc, "headers")
    if headers is None:
        response = _get(exc, "response")
        if isinstance(response, Mapping):
            headers = _mapping_get(response, "ResponseMetadata", "HTTPHeaders")
        elif response is not None:
            headers = _get(response, "headers")
    return headers


_MAX_RETRY_AFTER = 86_400.0  # a day: longer is not a pause, and "inf" must not reach JSON


def _retry_after_of(exc: BaseException, text: str) -> float | None:
    value = _raw_retry_after(exc, text)
    if value is None or value != value:  # NaN
        return None
    return min(max(0.0, value), _MAX_RETRY_AFTER)


def _raw_retry_after(exc: BaseException, text: str) -> float | None:
    headers = _headers_of(exc)
    if headers is not None:
        for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                raw = headers.get(name)
                if raw is None:
                    raw = headers.get(name.title())
            except Exception:
                raw = None
            if raw is None:
                continue
            raw = str(raw).strip()
            try:
                return float(raw) * scale
            except ValueError:
                pass
            try:
                when = parsedate_to_datetime(raw)
                return max(0.0, when.timestamp() - time.time())
            except Exception:
                continue
    match = _MSG_RETRY_IN.search(text)
    if match:
        return sum(float(value) * _unit_seconds(unit) for value, unit in _RETRY_PART.findall(match.group(1)))
    return None


_ACCOUNT_403 = re.compile(r"billing|suspend|credit|deactivat|payment|quota", re.I)
_KEY_403 = re.compile(r"api[ _-]?key", re.I)


def _status_kind(status: int, text: str, key_is_fatal: bool = True) -> ErrorType:
    if status in (408, 425, 429) or status >= 500:
        return _T
    if status in (401, 402, 407):
        return _F
    if status == 403:
        # A 403 about the account (billing, suspension) stops the run; one naming the API
        # key too, unless the provider said it is a permission on a resource.
        if _ACCOUNT_403.search(text) or (key_is_fatal and _KEY_403.search(text)):
            return _F
        return _P
    if 400 <= status < 500:
        return _P
    return _P


def _sqlstate_kind(code: str) -> ErrorType | None:
    if len(code) != 5 or not code[:2].isalnum():
        return None
    upper = code.upper()
    for prefix, kind in _SQLSTATE_PREFIX:
        if upper.startswith(prefix):
            return kind
    return None


def _type_kind(exc: BaseException) -> tuple[ErrorType, int] | None:
    try:
        mro = type(exc).__mro__
    except Exception:
        return None
    for cls in mro:
        name = cls.__name__.lower()
        if name in ("exception", "baseexception", "object"):
            break
        kind = _TYPES.get(name)
        if kind is not None:
            return kind, _S_TYPE
        if name.endswith(("timeout", "timeouterror")):
            return _T, _S_TYPE
        if name.endswith(("notfound", "notfounderror", "notfoundexception")):
            return _P, _S_TYPE
        if name in _GENERIC_PERMANENT:
            return (_T if name in _GENERIC_TRANSIENT else _P), _S_GENERIC
    return None


def _errno_kind(exc: BaseException) -> ErrorType | None:
    if not isinstance(exc, OSError):
        return None
    code = _get(exc, "errno")
    if not isinstance(code, int):
        return None
    if isinstance(exc, socket.gaierror):
        return _GAI.get(code, _P)
    return _ERRNO.get(code)


def _guarded(probe: Callable[[BaseException], _R], exc: BaseException, default: _R) -> _R:
    """One structural probe of a foreign object; whatever it does, the others still run."""
    try:
        return probe(exc)
    except Exception:
        return default


# --- evidence per link -----------------------------------------------------------------


@dataclass(slots=True)
class _Evidence:
    kind: ErrorType
    strength: int
    source: str
    status: int | None
    code: str | None


def _link_evidence(exc: BaseException, rules: Sequence[Rule]) -> tuple[_Evidence | None, int | None, str]:
    """Classify one exception on its own; returns (evidence, status, text)."""
    message = _safe_str(exc)
    body = _guarded(_body_text, exc, "")
    text = f"{message} {body}" if body else message
    status = _guarded(_status_of, exc, None)
    codes: list[str] = _guarded(_codes_of, exc, [])

    for rule in rules:
        try:
            if rule.matches(exc, status, codes, text):
                return (
                    _Evidence(ErrorType(rule.error_type), _S_RULE, "rule", status, codes[0] if codes else None),
                    status,
                    text,
                )
        except Exception:
            continue

    # A session the agent renews itself (it logs in with a tool of its own): permanent.
    if _SESSION.search(text) and not _NOT_RENEWABLE.search(text):
        return _Evidence(_P, _S_PROVIDER, "session", status, codes[0] if codes else None), status, text

    # Billing / credential signals in codes or text: fatal whatever the status says.
    for code in codes:
        if _CODES.get(code.lower()) is _F:
            return _Evidence(_F, _S_PROVIDER, "code", status, code), status, text
    if _FATAL_TEXT.search(text):
        return _Evidence(_F, _S_PROVIDER, "text", status, codes[0] if codes else None), status, text
    quota = _quota_kind(exc, text, codes)
    if quota is not None:
        return _Evidence(quota, _S_PROVIDER, "quota", status, codes[0] if codes else None), status, text

    for code in codes:
        low = code.lower()
        kind = _CODES.get(low)
        if kind is None and low.startswith(("statuscode.", "status_code.")):
            kind = _CODES.get(low.split(".", 1)[1])
        if kind is not None:
            # An overloaded / rate-limit code is transient even on a 4xx. A generic
            # permanent code ("invalid_request_error", "permission_error") yields to a
            # status that says more: 401 is fatal, 403 naming the API key is fatal, 5xx
            # is transient.
            if kind is _P and status is not None:
                # Anthropic's permission_error ("Your API key does not have permission to use
                # the specified resource"): that resource is out of reach, the key is fine.
                by_status = _status_kind(status, text, key_is_fatal=low not in _PERMISSION_CODES)
                if by_status is not _P:
                    return _Evidence(by_status, _S_STATUS, "status", status, code), status, text
            if kind is _T and low == "resource_exhausted" and _MSG_TOO_LARGE.search(text):
                # gRPC reports an oversized message as RESOURCE_EXHAUSTED: no retry helps.
                return _Evidence(_P, _S_PROVIDER, "code", status, code), status, text
            return _Evidence(kind, _S_PROVIDER, "code", status, code), status, text
        sql = _sqlstate_kind(code) if (_get(exc, "sqlstate") == code or _get(exc, "pgcode") == code) else None
        if sql is not None:
            return _Evidence(sql, _S_STATUS, "sqlstate", status, code), status, text

    # Redis replies carry their error code as the first word of the message.
    first = message.split(" ", 1)[0].strip(":").lower() if message else ""
    if first and first.isalpha() and first.upper() == message.split(" ", 1)[0].strip(":") and first in _CODES:
        return _Evidence(_CODES[first], _S_STATUS, "code", status, first.upper()), status, text

    if status is not None and status >= 400:
        return (
            _Evidence(_status_kind(status, text), _S_STATUS, "status", status, codes[0] if codes else None),
            status,
            text,
        )

    kind_errno = _errno_kind(exc)
    if kind_errno is not None:
        return _Evidence(kind_errno, _S_TYPE, "errno", status, None), status, text

    typed = _type_kind(exc)
    if typed is not None and typed[1] >= _S_TYPE:
        return _Evidence(typed[0], typed[1], "type", status, codes[0] if codes else None), status, text

    match = _MSG_STATUS.search(text)
    if match:
        text_status = int(match.group(1))
        if text_status >= 400:
            return (
                _Evidence(_status_kind(text_status, text), _S_TEXT_STATUS, "message", text_status, None),
                text_status,
                text,
            )

    if _MSG_FATAL.search(text):
        return _Evidence(_F, _S_MESSAGE, "message", status, None), status, text
    if _MSG_PERMANENT_FIRST.search(text):
        return _Evidence(_P, _S_MESSAGE, "message", status, None), status, text
    if _MSG_TRANSIENT.search(text):
        return _Evidence(_T, _S_MESSAGE, "message", status, None), status, text
    if _MSG_PERMANENT.search(text):
        return _Evidence(_P, _S_MESSAGE, "message", status, None), status, text

    if typed is not None:
        return _Evidence(typed[0], typed[1], "type", status, None), status, text
    return None, status, text


def _links(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps, outermost first, each once."""
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue and len(seen) < _MAX_LINKS:
        cur = queue.pop(0)
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        nxt: list[Any] = [_get(cur, "__cause__")]
        if not _get(cur, "__suppress_context__"):
            nxt.append(_get(cur, "__context__"))
        last_attempt = _get(cur, "last_attempt")
        if last_attempt is not None:
            try:
                nxt.append(last_attempt.exception(timeout=0))
            except Exception:
                pass
        for name in _LINK_ATTRS:
            nxt.append(_get(cur, name))
        args = _get(cur, "args")
        if isinstance(args, tuple):
            nxt.extend(a for a in args[:4] if isinstance(a, BaseException))
        queue.extend(n for n in nxt if isinstance(n, BaseException) and id(n) not in seen)


def _group_members(exc: BaseException) -> list[BaseException] | None:
    members = _get(exc, "exceptions")
    if isinstance(members, (list, tuple)) and members and all(isinstance(m, BaseException) for m in members):
        return list(members)
    return None


# --- signatures ------------------------------------------------------------------------

_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[a-z][a-z0-9+.\-]*://\S+", re.I), "<url>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b"), "<ts>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<ts>"),
    (re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`[^`\n]{0,200}`"), "<q>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-~@]+){2,}[\\/]?"), "<path>"),
    (re.compile(r"\b0x[0-9a-f]+\b", re.I), "<id>"),
    (re.compile(r"\b(?=[0-9A-Za-z_\-]*[A-Za-z])(?=[A-Za-z_\-]*\d)[A-Za-z0-9_\-]{8,}\b"), "<id>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    # identifiers built around a number (host-12, t7, v2beta) vary like the number does
    (re.compile(r"\b[A-Za-z_\-]+<n>[\w\-<>]*|<n>[A-Za-z_\-]+[\w\-<>]*"), "<id>"),
    (re.compile(r"\s+"), " "),
)


# The normalizers that mask what varies in one fault, not what tells two faults apart:
# quoted values and paths stay (they name the module, the file, the column that failed).
_QUOTED = re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`[^`\n]{0,200}`")
_IDENTITY_NORMALIZERS = tuple((p, r) for p, r in _NORMALIZERS if r not in ("<q>", "<path>"))


def _normalized(text: str, normalizers: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    for pattern, repl in normalizers:
        text = pattern.sub(repl, text)
    return text.strip()


def normalize_message(message: str, limit: int | None = 1000, *, keep_names: bool = False) -> str:
    """Replace the parts of an error message that vary between occurrences of one fault.

    Two failures that differ only in a request id, a timestamp, a path or a number get
    the same text, so "same tool, same error, again" is recognizable. ``limit``: the
    characters looked at (signatures need only the head; the loop guards pass None).
    ``keep_names``: keep quoted values and paths (only numbers, ids and timestamps vary).
    """
    text = message if limit is None else message[:limit]
    if not keep_names:
        return _normalized(text, _NORMALIZERS)
    # quoted values kept verbatim (they name what the answer is about), the rest normalized
    parts, last = [], 0
    for quoted in _QUOTED.finditer(text):
        parts += [_normalized(text[last : quoted.start()], _IDENTITY_NORMALIZERS), quoted.group()]
        last = quoted.end()
    parts.append(_normalized(text[last:], _IDENTITY_NORMALIZERS))
    return " ".join(p for p in parts if p)


def _with_type(exc_type: str, message: str) -> str:
    """``KeyError: 'foo'`` rather than ``'foo'``: the model reads the message alone, and for
    many exceptions (KeyError, IndexError, a bare TimeoutError) the text means nothing without
    the type. As Python prints the last line of a traceback."""
    if message == exc_type or message.startswith(f"{exc_type}:"):
        return message
    return f"{exc_type}: {message}"


_MARKUP_LINE = re.compile(r"^\s*(?:</?[A-Za-z_][\w\-]{0,40}/?>\s*)*$")


def _identity(exc_type: str, message: str) -> str:
    """What makes a failure "the same error again" for the loop guards (see
    ``ErrorInfo.identity``): the type and the whole message (a long one: its head and tail),
    lightly normalized. The whole text, not its first and last lines: a test run's output
    opens and closes alike whichever test failed and why."""
    text = message if len(message) <= 4000 else f"{message[:2000]}\x00{message[-2000:]}"
    return f"{exc_type}:{_normalized(text, _IDENTITY_NORMALIZERS)}"


def _signature(tool: str | None, exc_type: str, message: str) -> str:
    """``tool:ExceptionType:normalized message``. A message of several lines is signed on
    its first and last lines with text (a Python traceback, a command's output wrapped in
    markup): its head alone is the same for every traceback."""
    lines = [line for line in message[:4000].splitlines() if not _MARKUP_LINE.match(line)]
    if len(lines) > 1:
        text = f"{normalize_message(lines[0])[:60]} | {normalize_message(lines[-1])[:60]}"
    else:
        text = normalize_message(message)[:100]
    return f"{tool or '-'}:{exc_type}:{text}"


# --- entry point ------------------------------------------------------------------------


def _classify(exc: BaseException, tool: str | None, rules: Sequence[Rule], unknown: ErrorType, depth: int) -> ErrorInfo:
    members = _group_members(exc) if depth < 4 else None
    if members is not None:
        verdicts = [_classify(m, tool, rules, unknown, depth + 1) for m in members[:64]]
        return max(verdicts, key=lambda v: SEVERITY[v.error_type])

    best: _Evidence | None = None
    best_exc: BaseException = exc
    best_text = ""
    first_status: int | None = None
    retry_after: float | None = None
    for position, link in enumerate(_links(exc)):
        if position > 0:
            nested = _group_members(link) if depth < 4 else None
            if nested is not None:
                inner = _classify(link, tool, rules, unknown, depth + 1)
                ev: _Evidence | None = _Evidence(inner.error_type, _S_TYPE, "group", inner.status, inner.code)
                status, text = inner.status, inner.message
            else:
                ev, status, text = _link_evidence(link, rules)
        else:
            ev, status, text = _link_evidence(link, rules)
        if first_status is None and status is not None and status >= 400:
            first_status = status
        if retry_after is None:
            retry_after = _retry_after_of(link, text)
        if ev is not None and (best is None or ev.strength > best.strength):
            best, best_exc, best_text = ev, link, text
    if best is None:
        kind, source, status_out, code = unknown, "default", first_status, None
    else:
        kind, source, status_out, code = best.kind, best.source, best.status or first_status, best.code
    exc_type = type(best_exc).__name__
    raw = _safe_str(best_exc)
    message = redact(raw or best_text or exc_type)
    if kind is ErrorType.FATAL and not code:
        code = _fatal_code(status_out, message, exc_type)
    transient = kind is ErrorType.TRANSIENT
    low_code = (code or "").lower()
    throttled = transient and (
        status_out == 429 or low_code in _THROTTLE_CODES or source == "quota" or _throttle_type(best_exc)
    )
    overloaded = (
        transient
        and not throttled
        and (
            status_out == 529
            or low_code in _OVERLOAD_CODES
            or (status_out == 503 and _OVERLOAD_TEXT.search(message) is not None)
            or type(best_exc).__name__.lower() == "overloadederror"
        )
    )
    return ErrorInfo(
        error_type=kind,
        retryable=kind is ErrorType.TRANSIENT,
        status=status_out,
        code=code,
        # from the text alone (the type is a field of its own): the same as before the type
        # joined the message, so stored known-bad signatures keep matching
        signature=_signature(tool, exc_type, message),
        retry_after=retry_after if kind is ErrorType.TRANSIENT else None,
        message=truncate(_with_type(exc_type, message)),
        identity=_identity(exc_type, message),
        exception_type=exc_type,
        evidence=source,
        throttled=throttled,
        overloaded=overloaded,
    )


# A fatal failure without a code of its own gets one from its status, so every stop has a
# ``.code`` to branch on (``stop.info.code == "unauthorized"``), whatever the tool raised.
_FATAL_STATUS_CODES = {
    401: "unauthorized",
    402: "payment_required",
    403: "forbidden",
    407: "proxy_authentication_required",
}
_FATAL_TEXT_CODES = (
    (re.compile(r"quota|billing|credit|payment|plan", re.I), "insufficient_quota"),
    (re.compile(r"api[ _-]?key|token|credential|unauthori[sz]ed|unauthenticated|auth", re.I), "unauthorized"),
)


def _fatal_code(status: int | None, message: str, exc_type: str) -> str:
    """The code of a fatal failure that brought none: by its status, else by its words,
    else its exception's class (``MemoryError`` -> ``memory_error``)."""
    if status in _FATAL_STATUS_CODES:
        return _FATAL_STATUS_CODES[status]
    for pattern, code in _FATAL_TEXT_CODES:
        if pattern.search(message):
            return code
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", exc_type).lower() or "fatal"


def _throttle_type(exc: BaseException) -> bool:
    try:
        return any(klass.__name__.lower() in _THROTTLE_TYPES for klass in type(exc).__mro__)
    except Exception:
        return False


def classify(
    exc: BaseException,
    tool: str | None = None,
    *,
    rules: Sequence[Rule] = (),
    unknown: ErrorType | str = ErrorType.PERMANENT,
) -> ErrorInfo:
    """Classify ``exc`` (any object; never raises).

    ``unknown`` is the class for failures nothing recognizes: permanent by default,
    because silently retrying an error nobody understands is how loops start.
    """
    try:
        unknown_type = ErrorType(unknown)
    except Exception:
        unknown_type = ErrorType.PERMANENT
    try:
        if isinstance(exc, BaseException) and not isinstance(exc, Exception):
            # Cancellation and interpreter exits (CancelledError, KeyboardInterrupt,
            # SystemExit, GeneratorExit): not a failure of the call, and never to be
            # retried. The governor lets them propagate without classifying them; for any
            # other caller the answer is "the run stops".
            name = type(exc).__name__
            return ErrorInfo(
                ErrorType.FATAL,
                False,
                code="cancelled",
                signature=f"{tool or '-'}:{name}:cancelled",
                message=name,
                exception_type=name,
                evidence="type",
            )
        if not isinstance(exc, BaseException):
            text = truncate(redact(_safe_str(exc)))
            return ErrorInfo(
                unknown_type,
                unknown_type is ErrorType.TRANSIENT,
                signature=_signature(tool, type(exc).__name__, text),
                message=text,
                exception_type=type(exc).__name__,
            )
        return _classify(exc, tool, tuple(rules), unknown_type, 0)
    except Exception:  # pragma: no cover - defensive: a classifier must never crash the loop
        name = type(exc).__name__
        return ErrorInfo(
            unknown_type, unknown_type is ErrorType.TRANSIENT, signature=f"{tool or '-'}:{name}:", exception_type=name
        )


def retried_by_class(exc: BaseException) -> bool:
    """Whether ``exc``'s *class* is one that client code retries by class -- a rate limit,
    a timeout, a lost connection, a server error (``except openai.RateLimitError: retry``,
    LangChain's ``ModelError.is_retryable``) -- whatever this instance means: an exhausted
    quota is an ``openai.RateLimitError`` too. A governor stop must never be an instance
    of such a class, or that code retries a run that was stopped on purpose."""
    if getattr(exc, "is_retryable", None) is True:
        return True
    status = _guarded(_status_of, exc, None)
    if status is not None and (status in (408, 409, 425, 429) or status >= 500):
        return True
    kind = _guarded(_type_kind, exc, None)
    return (kind is not None and kind[0] is _T) or _guarded(_throttle_type, exc, False)
