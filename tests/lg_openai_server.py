"""An OpenAI-compatible chat-completions server on 127.0.0.1 for tests with real SDK clients.

Tests point real provider clients (``openai``, langchain-openai's ``ChatOpenAI``, crewAI's
native ``OpenAICompletion``) at it, so the governor meets the exceptions, retries, usage and
stream framing production meets, with no network and no API key. Standard library only; no
pytest here (child processes may import it). Start it with ``with OpenAIServer(script) as
server:`` or :func:`openai_server`; ``server.url`` is the ``base_url`` (``.../v1``).

What it does
------------
* ``POST /v1/chat/completions`` (also ``/chat/completions``): replies from a script; JSON or,
  with ``"stream": true``, SSE ``data: {chat.completion.chunk}`` lines ending in
  ``data: [DONE]`` (content deltas; tool-call deltas with ``index``, ``id``/``name`` in the
  first delta of each call and the JSON arguments in pieces; a final chunk with
  ``finish_reason``; a usage chunk with ``choices: []`` only when the request asked
  ``stream_options: {"include_usage": true}``, and then ``"usage": null`` on every other
  chunk, as OpenAI does). Other paths get OpenAI's 404 ``Invalid URL`` body.
* A script is a sequence of replies chosen by the conversation's turn (see
  :attr:`RecordedRequest.turn`: assistant messages so far, or one past the newest ``call_<turn>_``
  tool-call id, so a replay after a crash or a compaction gets the same answer; the last
  reply repeats), :func:`queue` (one reply per request, in order), or any function of the
  :class:`RecordedRequest` returning a :class:`Reply`, a ``str``, a :class:`Fault` or :class:`Slow`.
* Usage, computed from the request (documented, deterministic): ``prompt_tokens`` =
  ceil(len(prompt text) / 4) where the prompt text is the compact JSON of ``tools`` followed by
  each message (keys sorted); ``completion_tokens`` = ceil(len(answer text + tool-call names and
  arguments) / 4), at least 1; ``prompt_tokens_details.cached_tokens`` follows OpenAI's prompt
  caching rule: the longest prefix (in whole tokens of 4 chars) the prompt shares with one of
  the last 32 prompts answered, counted only from 1024 tokens and in 128-token steps (0 below
  1024; both numbers are settings). ``Reply(usage=...)`` overrides any field.
* Faults on demand, with the bodies and headers the real API sends (see the constructors):
  :func:`rate_limit` (429 ``rate_limit_exceeded`` + ``retry-after``/``retry-after-ms`` +
  ``x-ratelimit-*``), :func:`insufficient_quota` (429), :func:`invalid_api_key` (401),
  :func:`context_length_exceeded` (400, ``param: messages``), :func:`server_error` (500),
  :func:`overloaded` (529, Anthropic's body), :class:`Slow` (delay, then reply). Scheduled with
  :meth:`OpenAIServer.fail_next` (next N requests or forever), :meth:`~OpenAIServer.fail_at`
  (by request number), :meth:`~OpenAIServer.fail_when_prompt_over` (prompt above N tokens),
  :meth:`~OpenAIServer.limit_rate` (a token bucket answering 429 with the wait), or
  :meth:`~OpenAIServer.add_rule`. Rules are tried in the order added; the first that fires wins.
* Providers' history rules on demand (``OpenAIServer(history_rules=...)``, or
  :attr:`~OpenAIServer.history_rules` set later), checked before any fault or script: see
  :func:`history_violation`. ``"openai"``: an assistant message's ``tool_calls`` must be
  followed by tool messages answering each id, and a tool message must answer a call of the
  assistant message before it (400 ``invalid_request_error``, OpenAI's wording).
  ``"anthropic"`` and ``"bedrock"``: the same, and a request whose messages hold tool calls or
  results must define ``tools`` (Anthropic's and Bedrock's 400 wording). A refused request is
  recorded with outcome ``history_rejected``.
* Every request is recorded (:class:`RecordedRequest`: number, path, lower-cased headers with
  the API key masked, parsed body, ``time.monotonic()`` arrival, response status and outcome,
  prompt/cached token figures), for assertions such as "exactly one request reached the
  server", arrival rates (:meth:`~OpenAIServer.max_in_window`), or "the retry was shorter".
  Thread-safe: a ThreadingHTTPServer with HTTP/1.1 keep-alive; decisions are taken under one
  lock, delays and writes outside it.

Client facts measured against this server
-----------------------------------------
Pinned by tests/providers/test_openai_server.py (openai 2.54, langchain-openai 1.7.0 and 1.7.4,
langchain 1.5.2, langchain-core 1.8.3, crewai 1.15.30), which also holds the copy helpers
quoted below. Requests that reach the server for one call against a fault that never clears:

=========================================================  =====  ===  ===  ===  =======
client / configuration                                     quota  429  401  400  500/529
=========================================================  =====  ===  ===  ===  =======
openai SDK or ChatOpenAI, default ``max_retries`` (2)          3    3    1    1     3
the same with ``max_retries=0``                                1    1    1    1     1
create_agent + ModelRetryMiddleware (defaults), SDK 2          9
create_agent + ModelRetryMiddleware, copy with SDK retries 0   3
crewAI ``LLM.call``, defaults                                  9    9    1         3
crewAI ``LLM.call``, copy with SDK retries 0                   3                   1
crewAI, SDK retries 0 and crewAI's wrapper bypassed            1
crewAI one-agent ``Crew.kickoff``, defaults                   27
the same crew on the copy with SDK retries 0                   9
the same, crewAI's LLM retry off too (its contextvar)          3
=========================================================  =====  ===  ===  ===  =======

(400 is ``context_length_exceeded``; crewAI's 500 column is 500 only.)

* openai SDK: retries 408/409/429 (any code, ``insufficient_quota`` included), >= 500 and
  connection errors ``max_retries`` times; never 400/401. Its wait honours ``retry-after-ms``,
  then ``retry-after``, when 0 < value <= 60 s, else 0.5 s * 2^n (max 8 s) less up to 25% jitter
  (so ``retry-after: 0`` means 0.5 s; fast tests add :data:`FAST_RETRY`). Exceptions: 429
  ``RateLimitError``, 401 ``AuthenticationError``, 400 ``BadRequestError`` (``.code ==
  "context_length_exceeded"``, ``.param == "messages"``), 500/529 ``InternalServerError``;
  ``.body`` is the inner ``error`` object, ``.response.headers`` the headers. ``lg.classify``:
  quota and 401 fatal, 429 rate limit transient with ``retry_after`` from the headers, 500/529
  transient (code = the body's ``type``, ``server_error``/``overloaded_error``, as ``code`` is
  null), context_length_exceeded permanent.
* ChatOpenAI: ``max_retries`` (constructor field, default None = the SDK's 2) is read only when
  its validator builds the clients; ``model_copy(update={"max_retries": 0})`` keeps the old
  clients and still sends 3 requests. ``chat_openai_without_sdk_retries`` (``with_options(
  max_retries=0)`` on ``root_client``/``root_async_client``, ``client``/``async_client`` taken
  from them, via ``model_copy``) sends 1 and keeps a user's ``http_client``; a middleware can
  hand it to the handler with ``request.override(model=copy)`` and tools are bound to the
  copy. Errors are re-raised as subclasses of both the SDK's and ``langchain_core.exceptions``'
  (``OpenAIRateLimitError(openai.RateLimitError, ModelRateLimitError)``,
  ``OpenAIContextOverflowError(openai.BadRequestError, ContextOverflowError)``, ...), the SDK
  error as ``__cause__``; ``ModelRateLimitError.is_retryable`` is True, so ModelRetryMiddleware
  retries a quota error. Usage: ``AIMessage.usage_metadata`` (``input_tokens``,
  ``output_tokens``, ``total_tokens``, ``input_token_details.cache_read`` = ``cached_tokens``);
  raw in ``response_metadata["token_usage"]``. With a ``base_url`` ``stream_usage`` stays None,
  so streaming (``stream()`` or ``streaming=True``) sends no ``stream_options`` and
  ``usage_metadata`` is None; ``stream_usage`` is read per call, so ``model_copy(update=
  {"stream_usage": True})`` turns usage on.
* crewAI ``LLM(model="openai/...", base_url=..., api_key=...)`` is its native
  ``OpenAICompletion`` on ``/v1/chat/completions`` (no litellm needed or installed). Its
  ``max_retries`` field (default 2) goes to the SDK clients built at construction (same copy
  trap; ``crewai_llm_without_sdk_retries`` replaces ``_client``/``_async_client`` with
  ``with_options(max_retries=0)`` copies). Every provider ``call``/``acall`` is also wrapped by
  crewAI's rate-limit retry (``crewai.llms.retry``: any 429, 3 attempts, waits ~1 s and ~2 s
  +-20%, Retry-After unread since the SDK error has no ``headers`` dict); ``type(llm).call.
  __wrapped__`` is the unwrapped call, and setting ``crewai.llms.retry.
  _active_llm_rate_limit_retry`` to True around a kickoff turns the retry off for the whole crew
  (it skips nested retries). The agent re-runs a task that raised (``max_retry_limit`` 2: 3
  attempts), whatever the error. Each failed attempt emits two ``LLMCallFailedEvent``.
  Usage: ``LLMCallCompletedEvent.usage`` for every call, tool-call replies included, already
  normalised (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
  ``cached_prompt_tokens``, ``reasoning_tokens``), and ``llm.get_token_usage_summary()``
  (cumulative ``UsageMetrics``); ``LLM(stream=True)`` sends ``include_usage``. A tool-call reply
  without ``available_functions`` comes back as the SDK's tool-call objects.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOCALHOST = "127.0.0.1"
DEFAULT_MODEL = "gpt-4o-mini"
CHARS_PER_TOKEN = 4
CACHE_MIN_TOKENS = 1024  # OpenAI caches prompts of 1024 tokens or more ...
CACHE_STEP_TOKENS = 128  # ... in increments of 128 tokens
_CACHE_HISTORY = 32
_COMPLETIONS_PATHS = ("/v1/chat/completions", "/chat/completions")
_CALL_ID = re.compile(r"^call_(\d+)_")

# Not what OpenAI sends with quota or server errors: added to a fault so the SDK's own retries
# (which honour retry-after-ms) wait 1 ms instead of 0.5 s, 1 s, ... in fast tests.
FAST_RETRY = {"retry-after-ms": "1"}


# =============================================================================== replies


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asks for; ``id`` defaults to ``call_<turn>_<index>``."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None
    raw_arguments: str | None = None  # sent instead of the JSON of ``args`` (a malformed call on purpose)


@dataclass(frozen=True)
class Reply:
    """A successful completion: text, tool calls, or both.

    ``usage`` replaces the computed usage fields it names (``total_tokens`` follows
    ``prompt_tokens``/``completion_tokens`` unless given); ``finish_reason`` defaults to
    ``tool_calls`` when there are tool calls, else ``stop``.
    """

    text: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    usage: Mapping[str, Any] | None = None
    finish_reason: str | None = None


def tool_reply(name: str, args: Mapping[str, Any] | None = None, *, text: str | None = None) -> Reply:
    """A reply asking for one tool call."""
    return Reply(text=text, tool_calls=(ToolCall(name, dict(args or {})),))


@dataclass(frozen=True)
class Fault:
    """An error response: status, headers and OpenAI-shaped body (or a function of the request)."""

    name: str
    status: int
    body: Mapping[str, Any] | Callable[[RecordedRequest], Mapping[str, Any]]
    headers: Mapping[str, str] = field(default_factory=dict)

    def body_for(self, request: RecordedRequest) -> Mapping[str, Any]:
        return self.body(request) if callable(self.body) else self.body

    def with_headers(self, headers: Mapping[str, str]) -> Fault:
        """The same fault with extra response headers (e.g. :data:`FAST_RETRY`)."""
        return replace(self, headers={**self.headers, **headers})


@dataclass(frozen=True)
class Slow:
    """Wait ``seconds`` (interrupted when the server stops), then answer ``then`` (default: the
    script's reply). The client may time out and hang up meanwhile (the outcome gets
    ``+client_gone`` when writing the answer fails)."""

    seconds: float
    then: Reply | Fault | None = None


Action = Reply | Fault | Slow
Script = Sequence[Reply | str | Fault] | Callable[["RecordedRequest"], "Action | str"]


def _oa_error(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") or "0"


def rate_limit(
    retry_after: float = 0.001,
    *,
    limit: str = "requests",
    model: str = DEFAULT_MODEL,
    limit_value: int = 500,
) -> Fault:
    """429 ``rate_limit_exceeded`` as OpenAI sends it for an RPM (``limit="requests"``) or TPM
    (``limit="tokens"``) limit: ``retry-after`` (seconds, a float when below 1 s),
    ``retry-after-ms`` and ``x-ratelimit-*`` headers. The default wait is 1 ms so SDK retries
    (which honour it) stay fast; the classifier reads the same headers."""
    unit = "requests per min (RPM)" if limit == "requests" else "tokens per min (TPM)"
    wait_ms = math.ceil(max(0.0, retry_after) * 1000)  # never rounds a positive wait down to 0
    wait = _seconds_text(wait_ms / 1000)
    message = (
        f"Rate limit reached for {model} in organization org-lgtest on {unit}: Limit {limit_value}, "
        f"Used {limit_value}, Requested 1. Please try again in {wait}s. "
        "Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    headers = {
        "retry-after": wait,
        "retry-after-ms": str(wait_ms),
        "x-ratelimit-limit-requests": str(limit_value if limit == "requests" else 10_000),
        "x-ratelimit-remaining-requests": "0" if limit == "requests" else "9999",
        "x-ratelimit-reset-requests": f"{wait}s",
        "x-ratelimit-limit-tokens": str(limit_value if limit == "tokens" else 200_000),
        "x-ratelimit-remaining-tokens": "0" if limit == "tokens" else "199000",
        "x-ratelimit-reset-tokens": f"{wait}s",
    }
    return Fault("rate_limit", 429, _oa_error(message, limit, "rate_limit_exceeded"), headers)


def insufficient_quota() -> Fault:
    """429 ``insufficient_quota`` (billing: fatal). OpenAI sends no Retry-After with it; the
    openai SDK retries it anyway, after 0.5 s and 1 s (``.with_headers(FAST_RETRY)``: 1 ms)."""
    message = (
        "You exceeded your current quota, please check your plan and billing details. For more "
        "information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
    )
    return Fault("insufficient_quota", 429, _oa_error(message, "insufficient_quota", "insufficient_quota"))


def mask_key(key: str) -> str:
    """The key as OpenAI prints it back: first 4 and last 4 characters (all masked if short)."""
    return "****" if len(key) <= 8 else f"{key[:4]}****{key[-4:]}"


def invalid_api_key() -> Fault:
    """401 ``invalid_api_key``; the message quotes the masked key the request carried."""

    def body(request: RecordedRequest) -> Mapping[str, Any]:
        message = (
            f"Incorrect API key provided: {request.api_key or '<none>'}. "
            "You can find your API key at https://platform.openai.com/account/api-keys."
        )
        return _oa_error(message, "invalid_request_error", "invalid_api_key")

    return Fault("invalid_api_key", 401, body)


def context_length_exceeded(max_context: int = 128_000) -> Fault:
    """400 ``context_length_exceeded`` with OpenAI's message (the request's own token count)."""

    def body(request: RecordedRequest) -> Mapping[str, Any]:
        tokens = max(request.prompt_tokens, max_context + 1)
        message = (
            f"This model's maximum context length is {max_context} tokens. However, your messages "
            f"resulted in {tokens} tokens. Please reduce the length of the messages."
        )
        return _oa_error(message, "invalid_request_error", "context_length_exceeded", "messages")

    return Fault("context_length_exceeded", 400, body)


def server_error() -> Fault:
    """500 ``server_error`` as OpenAI sends it."""
    message = "The server had an error while processing your request. Sorry about that!"
    return Fault("server_error", 500, _oa_error(message, "server_error", None))


def overloaded() -> Fault:
    """529 ``overloaded_error``, Anthropic's body (for benchmarks of other providers' outages)."""
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return Fault("overloaded", 529, body)


def _not_found(method: str, path: str) -> Fault:
    return Fault("not_found", 404, _oa_error(f"Invalid URL ({method} {path})", "invalid_request_error", None))


def _bad_request(message: str, code: str | None, param: str | None = None) -> Fault:
    return Fault("bad_request", 400, _oa_error(message, "invalid_request_error", code, param))


# =============================================================================== history rules
#
# What the providers check in a conversation before they read it (requests they answer 400):
#
# * OpenAI Chat Completions: "An assistant message with 'tool_calls' must be followed by tool
#   messages responding to each 'tool_call_id'. The following tool_call_ids did not have
#   response messages: ..." (param ``messages.[i].role``), and "Invalid parameter: messages
#   with role 'tool' must be a response to a preceeding message with 'tool_calls'." A tool
#   history sent without ``tools`` is accepted (issue 33, measured against the API).
#   Reports of the first message: github.com/agno-agi/agno/issues/3105,
#   github.com/langchain-ai/open_deep_research/issues/164, github.com/BerriAI/litellm/issues/10083.
# * Anthropic Messages: "messages.N: `tool_use` ids were found without `tool_result` blocks
#   immediately after: ... Each `tool_use` block must have a corresponding `tool_result` block
#   in the next message." (github.com/anthropics/claude-code/issues/3512), and "Requests which
#   include `tool_use` or `tool_result` blocks must define tools." Its ``tool_choice`` has a
#   ``{"type": "none"}`` form that forbids tool calls with the tools still defined.
# * Bedrock Converse: "The toolConfig field must be defined when using toolUse and toolResult
#   content blocks." (ValidationException; github.com/aws-samples/bedrock-access-gateway/pull/239,
#   github.com/langgenius/dify/issues/17545); its ``toolChoice`` is ``auto``/``any``/``tool`` only,
#   no "none" (docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ToolChoice.html).
#
# The server speaks OpenAI's wire format in every mode; the modes add the other providers'
# rules, so a request shape a client would send to them can be checked here.

HISTORY_RULES = ("openai", "anthropic", "bedrock")


def history_violation(body: Mapping[str, Any], rules: str) -> Fault | None:
    """The 400 a provider with ``rules`` answers to this request's history, or None."""
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    waiting: list[str] = []  # tool_call ids of the last assistant message not answered yet
    waiting_at = -1
    has_tool_blocks = False
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            has_tool_blocks = True
            call_id = m.get("tool_call_id")
            if waiting_at < 0 or call_id not in waiting:
                message = (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                    "message with 'tool_calls'."
                )
                return Fault(
                    "history_rejected", 400, _oa_error(message, "invalid_request_error", None, f"messages.[{i}].role")
                )
            waiting.remove(call_id)
            continue
        if waiting:
            return _unanswered(rules, waiting_at, waiting)
        waiting_at = -1
        calls = [c for c in m.get("tool_calls") or () if isinstance(c, dict)] if role == "assistant" else []
        if calls:
            has_tool_blocks = True
            waiting, waiting_at = [str(c.get("id")) for c in calls], i
    if waiting:
        return _unanswered(rules, waiting_at, waiting)
    if rules != "openai" and has_tool_blocks and not body.get("tools"):
        if rules == "bedrock":
            message = "The toolConfig field must be defined when using toolUse and toolResult content blocks."
            return Fault("history_rejected", 400, {"message": message, "__type": "ValidationException"})
        message = "Requests which include `tool_use` or `tool_result` blocks must define tools."
        return Fault("history_rejected", 400, _anthropic_error(message))
    return None


def _anthropic_error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def _unanswered(rules: str, index: int, ids: Sequence[str]) -> Fault:
    if rules == "openai":
        message = (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(ids)}"
        )
        return Fault(
            "history_rejected", 400, _oa_error(message, "invalid_request_error", None, f"messages.[{index}].role")
        )
    if rules == "bedrock":
        message = f"Expected toolResult blocks at messages.{index + 1}.content for the following Ids: {', '.join(ids)}"
        return Fault("history_rejected", 400, {"message": message, "__type": "ValidationException"})
    message = (
        f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    )
    return Fault("history_rejected", 400, _anthropic_error(message))


# =============================================================================== requests


_SECRET_HEADERS = ("authorization", "api-key", "x-api-key")


@dataclass
class RecordedRequest:
    """One request as the server received it (API keys masked) and what it answered."""

    number: int  # 1-based, in arrival order, over every path
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    at: float  # time.monotonic() on arrival
    prompt_tokens: int = 0
    cached_tokens: int = 0  # what the usage will report if this request is answered
    status: int | None = None  # response status, set before the response is written
    outcome: str = ""  # "reply", "tool_calls", a fault name; "+client_gone" if the client hung up
    done_at: float | None = None  # time.monotonic() when the response was written
    prompt: str = field(default="", repr=False)  # prompt_text(body), what the token figures count

    @property
    def api_key(self) -> str | None:
        """The masked key from ``Authorization: Bearer`` (or ``api-key``/``x-api-key``)."""
        auth = self.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:]
        return self.headers.get("api-key") or self.headers.get("x-api-key")

    @property
    def is_completion(self) -> bool:
        return self.path.split("?", 1)[0] in _COMPLETIONS_PATHS

    @property
    def messages(self) -> list[dict[str, Any]]:
        msgs = self.body.get("messages") if isinstance(self.body, dict) else None
        return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else []

    @property
    def tools(self) -> list[dict[str, Any]]:
        tools = self.body.get("tools") if isinstance(self.body, dict) else None
        return list(tools) if isinstance(tools, list) else []

    @property
    def model(self) -> str:
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) and model else DEFAULT_MODEL

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        options = self.body.get("stream_options") if isinstance(self.body, dict) else None
        return isinstance(options, dict) and options.get("include_usage") is True

    @property
    def message_count(self) -> int:
        return len(self.messages)

    @property
    def content_chars(self) -> int:
        """Characters of text content over all messages (the figure a compaction shrinks)."""
        return sum(len(_text_of(m.get("content"))) for m in self.messages)

    @property
    def turn(self) -> int:
        """Which reply a turn-based script gives: the number of assistant messages, or one past
        the newest ``call_<turn>_...`` tool-call id still in the conversation if that is more
        (so a replay, or a compaction that dropped old turns, gets the same reply)."""
        turn = sum(1 for m in self.messages if m.get("role") == "assistant")
        for m in self.messages:
            ids = [str(m.get("tool_call_id") or "")]
            ids += [str(c.get("id") or "") for c in m.get("tool_calls") or () if isinstance(c, dict)]
            for call_id in ids:
                match = _CALL_ID.match(call_id)
                if match:
                    turn = max(turn, int(match.group(1)) + 1)
        return turn

    def text(self) -> str:
        """All text content of the conversation, newline-joined."""
        return "\n".join(_text_of(m.get("content")) for m in self.messages)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def prompt_text(body: Any) -> str:
    """The text the token figures are computed from: compact sorted JSON of the tools, then of
    each message (tools first, as they lead the prompt the provider caches)."""
    if not isinstance(body, dict):
        return ""
    dump = json.dumps  # one canonical form, so equal prefixes give equal text
    parts = [dump(body.get("tools") or [], sort_keys=True, separators=(",", ":"), ensure_ascii=False)]
    for m in body.get("messages") or []:
        parts.append(dump(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    return "".join(parts)


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _common_prefix_len(a: str, b: str) -> int:
    # Binary search on slice equality: C-speed comparisons instead of a per-character loop.
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def mask_headers(headers: Mapping[str, str]) -> dict[str, str]:
    masked: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if key in _SECRET_HEADERS:
            scheme, _, secret = value.partition(" ") if key == "authorization" else ("", "", value)
            value = f"{scheme} {mask_key(secret)}" if scheme else mask_key(secret)
        masked[key] = value
    return masked


# =============================================================================== scripts


def by_turn(replies: Sequence[Reply | str | Fault]) -> Callable[[RecordedRequest], Reply | str | Fault]:
    """Reply ``replies[request.turn]`` (the last one repeating): replay-safe."""
    if not replies:
        raise ValueError("a script needs at least one reply")
    items = list(replies)
    return lambda request: items[min(request.turn, len(items) - 1)]


def queue(replies: Sequence[Reply | str | Fault]) -> Callable[[RecordedRequest], Reply | str | Fault]:
    """Reply with the next item for each completion request the script is asked for (the last
    one repeating). Faults injected by rules do not consume items."""
    if not replies:
        raise ValueError("a script needs at least one reply")
    items = list(replies)
    taken = iter(range(len(items)))  # consumed under the server lock
    return lambda request: items[next(taken, len(items) - 1)]


@dataclass
class _Rule:
    decide: Callable[[RecordedRequest], Action | None]
    remaining: int | None  # None: forever


class _TokenBucket:
    """Server-side RPM-style limit: ``rate`` requests/s, ``burst`` capacity."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.stamp = burst, clock()

    def __call__(self, request: RecordedRequest) -> Action | None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return None
        return rate_limit((1 - self.tokens) / self.rate, limit_value=round(self.rate * 60))


# =============================================================================== server


class OpenAIServer:
    """The server; see the module docstring. ``script`` defaults to one text answer ("ok")."""

    def __init__(
        self,
        script: Script | None = None,
        *,
        cache_min_tokens: int = CACHE_MIN_TOKENS,
        cache_step_tokens: int = CACHE_STEP_TOKENS,
        stream_piece_chars: int = 12,
        history_rules: str | None = None,
    ) -> None:
        if history_rules is not None and history_rules not in HISTORY_RULES:
            raise ValueError(f"history_rules must be one of {HISTORY_RULES} or None, not {history_rules!r}")
        self.history_rules = history_rules
        self.cache_min_tokens = cache_min_tokens
        self.cache_step_tokens = cache_step_tokens
        self.stream_piece_chars = stream_piece_chars
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._requests: list[RecordedRequest] = []
        self.errors: list[Exception] = []  # raised by scripts, rules, reply rendering (answered 400 harness_error)
        self._rules: list[_Rule] = []
        self._answered: deque[str] = deque(maxlen=_CACHE_HISTORY)
        self._script: Callable[[RecordedRequest], Action | str] = by_turn(["ok"])
        self.set_script(script if script is not None else ["ok"])
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> OpenAIServer:
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._stop.clear()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="lg-openai-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stop.set()  # wakes Slow waits
        httpd.shutdown()
        httpd.close_connections()  # idle keep-alive connections would hold their threads
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def root_url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def url(self) -> str:
        """The ``base_url`` for OpenAI clients."""
        return f"{self.root_url}/v1"

    # -- scripting ----------------------------------------------------------------------
    def set_script(self, script: Script) -> None:
        """Replace the reply script (a sequence is played by turn, see :func:`by_turn`)."""
        with self._lock:
            self._script = script if callable(script) else by_turn(script)

    def add_rule(self, decide: Callable[[RecordedRequest], Action | None], *, times: int | None = None) -> None:
        """Before the script, ask ``decide(request)``; an action it returns is answered instead,
        at most ``times`` times (None: forever). Runs under the server lock: keep it quick."""
        if times is not None and times < 1:
            raise ValueError("times must be >= 1 or None")
        with self._lock:
            self._rules.append(_Rule(decide, times))

    def fail_next(self, fault: Action, times: int | None = 1) -> None:
        """Answer the next ``times`` completion requests with ``fault`` (None: forever)."""
        self.add_rule(lambda request: fault, times=times)

    def fail_forever(self, fault: Action) -> None:
        self.fail_next(fault, times=None)

    def fail_at(self, *numbers: int, fault: Action) -> None:
        """Answer the requests with these (1-based, see :attr:`RecordedRequest.number`) numbers."""
        wanted = frozenset(numbers)
        self.add_rule(lambda request: fault if request.number in wanted else None)

    def fail_when_prompt_over(self, tokens: int, fault: Action | None = None, *, times: int | None = None) -> None:
        """Answer requests whose prompt exceeds ``tokens`` with ``fault`` (default: 400
        context_length_exceeded naming ``tokens`` as the maximum)."""
        action = fault if fault is not None else context_length_exceeded(tokens)
        self.add_rule(lambda request: action if request.prompt_tokens > tokens else None, times=times)

    def limit_rate(self, requests_per_second: float, burst: float | None = None) -> None:
        """Enforce a provider-style request rate: over it, 429 rate_limit_exceeded with the
        wait until the next slot in ``retry-after``."""
        self.add_rule(_TokenBucket(requests_per_second, burst or requests_per_second, time.monotonic))

    def clear_faults(self) -> None:
        with self._lock:
            self._rules.clear()

    def reset(self) -> None:
        """Forget requests (numbering restarts at 1), rules, errors and the prompt cache; the
        script stays."""
        with self._lock:
            self._requests.clear()
            self._rules.clear()
            self._answered.clear()
            self.errors.clear()

    # -- observing ----------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request so far (a copy of the list), in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def completions(self) -> list[RecordedRequest]:
        """The chat-completion requests so far."""
        return [r for r in self.requests if r.is_completion]

    def count(self) -> int:
        return len(self.completions)

    def wait_for(self, n: int, timeout: float = 5.0) -> bool:
        """Block until ``n`` requests have been answered (or timeout); True when they have."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while sum(1 for r in self._requests if r.done_at is not None) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def max_in_window(self, window: float = 1.0, requests: Iterable[RecordedRequest] | None = None) -> int:
        """The most completion requests that arrived within any ``window`` seconds."""
        times = sorted(r.at for r in (requests if requests is not None else self.completions))
        best, start = 0, 0
        for end, t in enumerate(times):
            while t - times[start] >= window:
                start += 1
            best = max(best, end - start + 1)
        return best

    # -- answering (called by the handler) ----------------------------------------------
    def _record(self, method: str, path: str, headers: Mapping[str, str], body: Any) -> RecordedRequest:
        text = prompt_text(body)
        with self._lock:
            request = RecordedRequest(
                number=len(self._requests) + 1,
                method=method,
                path=path,
                headers=mask_headers(headers),
                body=body,
                at=time.monotonic(),
                prompt_tokens=estimate_tokens(text),
                cached_tokens=self._cached_tokens(text),
                prompt=text,
            )
            self._requests.append(request)
        return request

    def _cached_tokens(self, text: str) -> int:
        prefix = max((_common_prefix_len(text, old) for old in self._answered), default=0) // CHARS_PER_TOKEN
        if prefix < self.cache_min_tokens:
            return 0
        return (
            self.cache_min_tokens + (prefix - self.cache_min_tokens) // self.cache_step_tokens * self.cache_step_tokens
        )

    def _decide(self, request: RecordedRequest) -> Action:
        if not request.is_completion or request.method != "POST":
            return _not_found(request.method, request.path.split("?", 1)[0])
        if not isinstance(request.body, dict):
            return _bad_request(
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                "using your HTTP library correctly. The OpenAI API expects a JSON payload...)",
                None,
            )
        if not request.messages:
            return _bad_request("Missing required parameter: 'messages'.", "missing_required_parameter", "messages")
        if self.history_rules is not None:
            rejected = history_violation(request.body, self.history_rules)
            if rejected is not None:
                return rejected
        with self._lock:
            for rule in self._rules:
                if rule.remaining == 0:
                    continue
                action = rule.decide(request)
                if action is not None:
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return action
            scripted = self._script(request)
        return Reply(text=scripted) if isinstance(scripted, str) else scripted

    def _resolve(self, request: RecordedRequest, action: Action) -> Reply | Fault | None:
        """Apply delays; None when the server stopped meanwhile."""
        while isinstance(action, Slow):
            if self._stop.wait(action.seconds):
                return None
            if action.then is None:
                with self._lock:
                    scripted = self._script(request)
                action = Reply(text=scripted) if isinstance(scripted, str) else scripted
            else:
                action = action.then
        return action

    def _script_failed(self, exc: Exception) -> None:
        with self._lock:
            self.errors.append(exc)

    def _answered_ok(self, request: RecordedRequest) -> None:
        with self._lock:
            self._answered.append(request.prompt)

    def _finish(self, request: RecordedRequest, status: int, outcome: str) -> None:
        with self._lock:
            request.status, request.outcome = status, outcome

    def _done(self, request: RecordedRequest, gone: bool) -> None:
        with self._lock:
            if gone:
                request.outcome += "+client_gone"
            request.done_at = time.monotonic()
            self._lock.notify_all()

    # -- bodies -------------------------------------------------------------------------
    def usage_for(self, request: RecordedRequest, reply: Reply) -> dict[str, Any]:
        completion = (reply.text or "") + "".join(c.name + json.dumps(dict(c.args)) for c in reply.tool_calls)
        usage: dict[str, Any] = {
            "prompt_tokens": request.prompt_tokens,
            "completion_tokens": max(1, estimate_tokens(completion)),
            "total_tokens": 0,
            "prompt_tokens_details": {"cached_tokens": request.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
        usage.update(reply.usage or {})
        if not (reply.usage and "total_tokens" in reply.usage):
            usage["total_tokens"] = int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
        return usage

    @staticmethod
    def tool_calls_for(request: RecordedRequest, reply: Reply) -> list[dict[str, Any]]:
        turn = request.turn
        return [
            {
                "id": call.id or f"call_{turn}_{i}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.raw_arguments if call.raw_arguments is not None else json.dumps(dict(call.args)),
                },
            }
            for i, call in enumerate(reply.tool_calls)
        ]

    def completion_body(self, request: RecordedRequest, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None, "annotations": []}
        calls = self.tool_calls_for(request, reply)
        if calls:
            message["tool_calls"] = calls
        return {
            **_envelope(request, "chat.completion"),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}],
            "usage": self.usage_for(request, reply),
        }

    def stream_chunks(self, request: RecordedRequest, reply: Reply) -> Iterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects OpenAI streams for ``reply``."""
        envelope = _envelope(request, "chat.completion.chunk")
        with_usage = request.include_usage

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out = {**envelope, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if with_usage:
                out["usage"] = None
            return out

        calls = self.tool_calls_for(request, reply)
        # The first delta carries the role; a tool-call-only reply opens with the first call's head.
        opener: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if reply.text is not None or not calls:
            yield chunk({**opener, "content": ""})
            opener = {}
            for piece in _pieces(reply.text or "", self.stream_piece_chars):
                yield chunk({"content": piece})
        for index, call in enumerate(calls):
            function = {"name": call["function"]["name"], "arguments": ""}
            yield chunk(
                {**opener, "tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": function}]}
            )
            opener = {}
            for piece in _pieces(call["function"]["arguments"], self.stream_piece_chars):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, _finish_reason(reply))
        if with_usage:
            yield {**envelope, "choices": [], "usage": self.usage_for(request, reply)}


def _envelope(request: RecordedRequest, object_: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-lg{request.number:06d}",
        "object": object_,
        "created": int(time.time()),
        "model": request.model,
        "service_tier": "default",
        "system_fingerprint": "fp_lgtest",
    }


def _finish_reason(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), max(1, size)):
        yield text[start : start + size]


@contextmanager
def openai_server(script: Script | None = None, **settings: Any) -> Iterator[OpenAIServer]:
    """Start an :class:`OpenAIServer` for the ``with`` block."""
    with OpenAIServer(script, **settings) as server:
        yield server


# =============================================================================== HTTP


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, owner: OpenAIServer) -> None:
        super().__init__((LOCALHOST, 0), _Handler)
        self.owner = owner
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients that time out or cancel hang up on purpose

    def track(self, conn: socket.socket, add: bool) -> None:
        with self._conn_lock:
            (self._connections.add if add else self._connections.discard)(conn)

    def close_connections(self) -> None:
        with self._conn_lock:
            conns = list(self._connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive, chunked SSE, as the real API
    disable_nagle_algorithm = True  # headers and body go out in separate writes: no 40 ms stalls

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _handle(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        request = owner._record(self.command, self.path, dict(self.headers.items()), body)
        gone = False
        try:
            try:
                action = owner._resolve(request, owner._decide(request))
                if action is None:  # server stopping
                    owner._finish(request, 0, "server_stopped")
                    self.close_connection = True
                    return
                if isinstance(action, Fault):
                    status, outcome, headers = action.status, action.name, {**action.headers, **_request_id(request)}
                    payload: Any = action.body_for(request)
                else:
                    status, outcome, headers = 200, "tool_calls" if action.tool_calls else "reply", _request_id(request)
                    if request.stream:
                        payload = list(owner.stream_chunks(request, action))
                    else:
                        payload = owner.completion_body(request, action)
            except Exception as exc:  # a broken script or rule: fail the call loudly, without SDK retries
                owner._script_failed(exc)
                fault = _bad_request(f"lg_openai_server script raised {exc!r}", "harness_error")
                status, outcome, headers, payload = fault.status, "harness_error", _request_id(request), fault.body
            owner._finish(request, status, outcome)
            if status == 200:
                owner._answered_ok(request)
            if isinstance(payload, list):
                self._send_stream(payload, headers)
            else:
                self._send_json(status, payload, headers)
        except (BrokenPipeError, ConnectionResetError):
            gone = True
            self.close_connection = True
        finally:
            owner._done(request, gone)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def _send_json(self, status: int, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: list[dict[str, Any]], headers: Mapping[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        for event in [*(f"data: {json.dumps(c)}\n\n" for c in chunks), "data: [DONE]\n\n"]:
            data = event.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")


def _request_id(request: RecordedRequest) -> dict[str, str]:
    return {"x-request-id": f"req_lg{request.number:06d}", "openai-processing-ms": "1"}


# =============================================================================== no network


class RemoteConnectionError(OSError):
    """A test tried to reach a non-loopback address."""


def _is_loopback(host: Any) -> bool:
    if host is None:
        return True
    if not isinstance(host, str):
        return False
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@contextmanager
def deny_remote_connections() -> Iterator[list[str]]:
    """Refuse (with :class:`RemoteConnectionError`) name lookups and connects to anything but
    loopback and Unix sockets, and yield the list of attempts. Clients retry connection errors,
    so callers should assert the list is empty rather than rely on the exception."""
    attempts: list[str] = []
    real_getaddrinfo = socket.getaddrinfo
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: Any, what: str) -> None:
        if not isinstance(address, tuple):
            return  # a Unix socket path
        if isinstance(address[0], bytes):  # anyio looks names up as IDNA bytes
            address = (address[0].decode("ascii", "replace"), *address[1:])
        if not _is_loopback(address[0]):
            attempts.append(f"{what} {address!r}")
            raise RemoteConnectionError(f"test tried to reach {address!r}: only 127.0.0.1 is allowed")

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        check((host, port), "getaddrinfo")
        return real_getaddrinfo(host, port, *args, **kwargs)

    def connect(self: Any, address: Any) -> None:
        check(address, "connect")
        return real_connect(self, address)

    def connect_ex(self: Any, address: Any) -> int:
        check(address, "connect_ex")
        return real_connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    try:
        yield attempts
    finally:
        socket.getaddrinfo = real_getaddrinfo
        socket.socket.connect = real_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
