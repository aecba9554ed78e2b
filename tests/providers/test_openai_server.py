"""The local OpenAI-compatible server against real clients, no governor.

Two things are proved here. First, the harness is faithful: the openai SDK, langchain-openai's
ChatOpenAI (invoke, ainvoke, streaming, tool calls, ``create_agent``) and crewAI's native
OpenAI provider (``LLM.call``, a one-agent crew) parse what it sends, and each fault comes
out as the exception production raises, which ``lg.classify`` reads as production's.
Second, the client behaviours issue 15 relies on are measured and pinned: how many requests
one fault sends through each client's hidden retries, where usage and cached tokens surface,
and how to get a copy of a ChatOpenAI / crewAI LLM with the SDK's retries off (the helpers
below are the snippets for the adapters).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRetryMiddleware
from langchain_core.exceptions import ContextOverflowError, ModelRateLimitError
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from lg_openai_server import (
    CACHE_MIN_TOKENS,
    CACHE_STEP_TOKENS,
    FAST_RETRY,
    Fault,
    OpenAIServer,
    RecordedRequest,
    Reply,
    Slow,
    ToolCall,
    context_length_exceeded,
    estimate_tokens,
    insufficient_quota,
    invalid_api_key,
    overloaded,
    prompt_text,
    queue,
    rate_limit,
    server_error,
    tool_reply,
)

import loop_governor as lg

KEY = "sk-test-provider-0000abcd"
MODEL = "gpt-4o-mini"
LONG_SYSTEM = "You are a careful assistant who answers briefly. " * 120  # ~1,450 tokens: cacheable
USER = [{"role": "user", "content": "What is 1 + 2?"}]


def sdk_client(server: OpenAIServer, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=KEY, **kwargs)


def chat(server: OpenAIServer, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=server.url, api_key=KEY, **kwargs)


# ====================================================================== snippets for the adapters


def chat_openai_without_sdk_retries(model: ChatOpenAI) -> ChatOpenAI:
    """A copy of ``model`` whose openai clients never retry (``max_retries=0``).

    ``model_copy(update={"max_retries": 0})`` alone is not enough: ChatOpenAI reads
    ``max_retries`` only when its validator builds the clients, and ``model_copy`` does not
    run validators, so the copy keeps the original clients and their 2 retries.
    ``with_options`` copies each openai client with the new setting and keeps everything
    else, including a user-supplied ``http_client`` (connection pool shared)."""
    update: dict[str, Any] = {"max_retries": 0}
    if model.root_client is not None:
        update["root_client"] = model.root_client.with_options(max_retries=0)
        update["client"] = update["root_client"].chat.completions
    if model.root_async_client is not None:
        update["root_async_client"] = model.root_async_client.with_options(max_retries=0)
        update["async_client"] = update["root_async_client"].chat.completions
    return model.model_copy(update=update)


def chat_openai_with_stream_usage(model: ChatOpenAI) -> ChatOpenAI:
    """A copy of ``model`` that asks for usage when streaming (``stream_options.include_usage``):
    ``stream_usage`` is read on every call, so a plain ``model_copy`` works."""
    return model.model_copy(update={"stream_usage": True})


def crewai_llm_without_sdk_retries(llm: Any) -> Any:
    """A copy of a crewAI ``OpenAICompletion`` whose openai clients never retry.

    Same trap as ChatOpenAI: the clients are built once (``_init_clients``), so the copy gets
    ``with_options(max_retries=0)`` copies of them (private attributes: crewAI 1.15 has no
    public way). The copy shares the original's ``_token_usage`` dict (pydantic copies private
    attributes shallowly), so ``get_token_usage_summary()`` on the user's LLM keeps counting."""
    copy = llm.model_copy(update={"max_retries": 0})
    copy._client = llm._get_sync_client().with_options(max_retries=0)
    copy._async_client = llm._get_async_client().with_options(max_retries=0)
    return copy


def crewai_call_without_crewai_retry(llm: Any, *args: Any, **kwargs: Any) -> Any:
    """``llm.call`` without crewAI's own rate-limit retry around it: ``BaseLLM.__init_subclass__``
    wraps each provider's ``call`` with ``functools.wraps``, so ``__wrapped__`` is the call itself."""
    return type(llm).call.__wrapped__(llm, *args, **kwargs)


# ====================================================================== the server, raw SDK


def test_text_reply_usage_and_recorded_request(openai_server: OpenAIServer) -> None:
    openai_server.set_script(["Three."])
    done = sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER)

    assert done.choices[0].message.content == "Three."
    assert done.choices[0].finish_reason == "stop"
    [request] = openai_server.requests
    body = {"model": MODEL, "messages": USER}
    assert done.usage is not None
    assert done.usage.prompt_tokens == math.ceil(len(prompt_text(body)) / 4) == request.prompt_tokens
    assert done.usage.completion_tokens == math.ceil(len("Three.") / 4)
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    assert done.usage.prompt_tokens_details is not None and done.usage.prompt_tokens_details.cached_tokens == 0
    assert done._request_id == "req_lg000001"
    assert (request.number, request.method, request.path, request.status) == (1, "POST", "/v1/chat/completions", 200)
    assert request.body == body
    assert request.headers["authorization"] == "Bearer sk-t****abcd"  # never the key itself
    assert KEY not in json.dumps(request.headers)
    assert request.api_key == "sk-t****abcd"
    assert openai_server.wait_for(1)  # stamped after the reply is written: the client may be first
    assert request.done_at is not None and request.done_at >= request.at


def test_reply_usage_overrides_the_computed_figures(openai_server: OpenAIServer) -> None:
    openai_server.set_script([Reply("big", usage={"prompt_tokens": 4000, "completion_tokens": 1000})])
    usage = sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER).usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (4000, 1000, 5000)


def test_cached_tokens_follow_openai_prompt_caching(openai_server: OpenAIServer) -> None:
    client = sdk_client(openai_server)
    long_prompt = [{"role": "system", "content": LONG_SYSTEM}, *USER]
    first = client.chat.completions.create(model=MODEL, messages=long_prompt)
    second = client.chat.completions.create(model=MODEL, messages=[*long_prompt, {"role": "user", "content": "again"}])
    short = client.chat.completions.create(model=MODEL, messages=USER)
    short_again = client.chat.completions.create(model=MODEL, messages=USER)

    assert first.usage and second.usage and short.usage and short_again.usage
    assert first.usage.prompt_tokens_details and first.usage.prompt_tokens_details.cached_tokens == 0  # nothing before
    cached = second.usage.prompt_tokens_details and second.usage.prompt_tokens_details.cached_tokens
    shared = len(prompt_text({"messages": long_prompt})) // 4  # the whole first prompt is a prefix of the second
    assert cached == CACHE_MIN_TOKENS + (shared - CACHE_MIN_TOKENS) // CACHE_STEP_TOKENS * CACHE_STEP_TOKENS
    assert isinstance(cached, int) and cached % CACHE_STEP_TOKENS == 0 and cached <= second.usage.prompt_tokens
    # below 1024 tokens nothing is cached, however much is shared
    assert short_again.usage.prompt_tokens_details and short_again.usage.prompt_tokens_details.cached_tokens == 0


def test_tool_call_reply_in_openai_format(openai_server: OpenAIServer) -> None:
    openai_server.set_script([Reply(tool_calls=(ToolCall("add", {"a": 1, "b": 2}), ToolCall("log", {"x": "y"})))])
    done = sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER)

    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert message.tool_calls is not None
    assert [(c.id, c.type, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("call_0_0", "function", "add", {"a": 1, "b": 2}),
        ("call_0_1", "function", "log", {"x": "y"}),
    ]


def _raw_stream(server: OpenAIServer, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, headers={"authorization": "Bearer x"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_framing_is_openais(openai_server: OpenAIServer, include_usage: bool) -> None:
    openai_server.set_script(["A streamed answer that takes several chunks."])
    body: dict[str, Any] = {"model": MODEL, "messages": USER, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    lines = _raw_stream(openai_server, body)

    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    with_choices = [c for c in chunks if c["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
    assert text == "A streamed answer that takes several chunks."
    assert [c["choices"][0]["finish_reason"] for c in with_choices][-1] == "stop"
    if include_usage:  # a last chunk with empty choices carries usage; every other chunk has usage null
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
        assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    else:
        assert all(c["choices"] and "usage" not in c for c in chunks)


def test_streamed_tool_calls_arrive_as_indexed_deltas(openai_server: OpenAIServer) -> None:
    openai_server.set_script(
        [Reply(tool_calls=(ToolCall("add", {"a": 1, "b": 2}), ToolCall("log", {"text": "x" * 30})))]
    )
    stream = sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER, stream=True)

    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                call["name"] += (delta.function and delta.function.name) or ""
                call["arguments"] += (delta.function and delta.function.arguments) or ""
    assert finish == "tool_calls"
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("call_0_0", "add", {"a": 1, "b": 2}),
        ("call_0_1", "log", {"text": "x" * 30}),
    ]


def test_paths_without_v1_and_unknown_paths(openai_server: OpenAIServer) -> None:
    bare = openai.OpenAI(base_url=openai_server.root_url, api_key=KEY, max_retries=0)
    assert bare.chat.completions.create(model=MODEL, messages=USER).choices[0].message.content == "ok"
    with pytest.raises(openai.NotFoundError) as caught:
        sdk_client(openai_server, max_retries=0).embeddings.create(model="text-embedding-3-small", input="x")
    assert caught.value.body == {
        "message": "Invalid URL (POST /v1/embeddings)",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert [r.path for r in openai_server.requests] == ["/chat/completions", "/v1/embeddings"]
    assert openai_server.count() == 1  # only completions count


def test_replies_by_turn_replay_and_queue(openai_server: OpenAIServer) -> None:
    client = sdk_client(openai_server)
    openai_server.set_script([tool_reply("add", {"a": 1, "b": 2}), "Three."])
    first = client.chat.completions.create(model=MODEL, messages=USER)
    assert first.choices[0].message.tool_calls is not None
    call = first.choices[0].message.tool_calls[0]
    after_tool = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
    ]
    assert client.chat.completions.create(model=MODEL, messages=after_tool).choices[0].message.content == "Three."
    # a replay of the first request (a crash before its result was saved) gets the same call id
    replay = client.chat.completions.create(model=MODEL, messages=USER).choices[0].message.tool_calls
    assert replay is not None and replay[0].id == call.id
    # a compaction that drops the assistant turn but keeps the tool result still reads as turn 1
    compacted = {"messages": [*USER, after_tool[-1]]}
    assert RecordedRequest(0, "POST", "/v1/chat/completions", {}, compacted, 0.0).turn == 1

    openai_server.set_script(queue(["one", "two"]))
    answers = [client.chat.completions.create(model=MODEL, messages=USER).choices[0].message.content for _ in range(3)]
    assert answers == ["one", "two", "two"]


def test_fault_schedules(openai_server: OpenAIServer) -> None:
    client = sdk_client(openai_server, max_retries=0)

    def outcome() -> str:
        try:
            client.chat.completions.create(model=MODEL, messages=USER)
        except openai.APIStatusError as exc:
            return str(exc.status_code)
        return "200"

    openai_server.fail_at(2, 5, fault=server_error())
    openai_server.fail_next(rate_limit(), times=2)
    assert [outcome() for _ in range(6)] == ["429", "500", "429", "200", "500", "200"]  # first matching rule wins
    openai_server.clear_faults()
    openai_server.fail_forever(invalid_api_key())
    assert [outcome() for _ in range(3)] == ["401"] * 3
    openai_server.clear_faults()
    assert outcome() == "200"
    assert [r.outcome for r in openai_server.completions][-4:] == ["invalid_api_key"] * 3 + ["reply"]


def test_rules_and_scripts_can_tell_models_apart(openai_server: OpenAIServer) -> None:
    """A primary model failing while a fallback model answers."""
    client = sdk_client(openai_server, max_retries=0)
    openai_server.add_rule(lambda request: server_error() if request.model == "gpt-4o" else None)
    openai_server.set_script(lambda request: f"answered by {request.model}")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o", messages=USER)
    done = client.chat.completions.create(model="gpt-4o-mini", messages=USER)
    assert done.choices[0].message.content == "answered by gpt-4o-mini" and done.model == "gpt-4o-mini"
    assert [(r.model, r.status) for r in openai_server.completions] == [("gpt-4o", 500), ("gpt-4o-mini", 200)]


def test_prompt_size_rule_answers_context_length_exceeded(openai_server: OpenAIServer) -> None:
    client = sdk_client(openai_server, max_retries=0)
    openai_server.fail_when_prompt_over(200)
    long = [{"role": "user", "content": "x" * 2000}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=long)
    assert client.chat.completions.create(model=MODEL, messages=USER).choices[0].message.content == "ok"

    tokens = estimate_tokens(prompt_text({"messages": long}))
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert caught.value.body == {
        "message": f"This model's maximum context length is 200 tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    first, second = openai_server.completions
    assert second.content_chars < first.content_chars and second.prompt_tokens < first.prompt_tokens


def test_server_side_rate_limit_answers_429_with_the_wait(openai_server: OpenAIServer) -> None:
    client = sdk_client(openai_server, max_retries=0)
    openai_server.limit_rate(requests_per_second=1, burst=2)
    statuses = []
    for _ in range(4):
        try:
            client.chat.completions.create(model=MODEL, messages=USER)
            statuses.append(200)
        except openai.RateLimitError as exc:
            statuses.append(429)
            wait = float(exc.response.headers["retry-after"])
            assert 0 < wait <= 1.0 and exc.code == "rate_limit_exceeded"
    assert statuses == [200, 200, 429, 429]


def test_concurrent_requests_are_all_recorded(openai_server: OpenAIServer) -> None:
    client = sdk_client(openai_server)
    barrier = threading.Barrier(8)

    failures: list[BaseException] = []

    def send() -> None:
        barrier.wait()
        try:
            for _ in range(3):
                client.chat.completions.create(model=MODEL, messages=USER)
        except BaseException as exc:  # a thread's exception would vanish: the test reports it
            failures.append(exc)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    # the server stamps done_at after the client may already have read the reply
    assert openai_server.wait_for(24, timeout=30)
    requests = openai_server.completions
    assert sorted(r.number for r in requests) == list(range(1, 25))
    assert all(r.status == 200 and r.done_at is not None for r in requests)
    assert openai_server.max_in_window(3600.0) == 24


def test_max_in_window_counts_a_sliding_window() -> None:
    def at(t: float) -> RecordedRequest:
        return RecordedRequest(0, "POST", "/v1/chat/completions", {}, {}, t)

    server = OpenAIServer()
    requests = [at(t) for t in (0.0, 0.1, 0.95, 1.0, 1.05, 1.9, 3.5)]
    assert server.max_in_window(1.0, requests) == 4  # 0.1, 0.95, 1.0, 1.05 (and 0.95 .. 1.9)
    assert server.max_in_window(0.2, requests) == 3
    assert server.max_in_window(1.0, []) == 0


def test_slow_reply_times_the_client_out(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(Slow(2.0))
    client = sdk_client(openai_server, max_retries=0, timeout=0.2)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model=MODEL, messages=USER)
    assert openai_server.count() == 1
    openai_server.set_script(["late"])
    openai_server.fail_next(Slow(0.01))
    assert sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER).choices[0].message.content == (
        "late"
    )


def test_a_broken_script_fails_the_call_once_and_is_kept(openai_server: OpenAIServer) -> None:
    def script(request: RecordedRequest) -> str:
        raise KeyError("no such turn")

    openai_server.set_script(script)
    with pytest.raises(openai.BadRequestError, match="harness_error"):
        sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER)
    assert openai_server.count() == 1  # not retried by the SDK
    assert [type(e) for e in openai_server.errors] == [KeyError]
    # a reply that cannot be rendered (arguments that are not JSON) fails the same way, streamed too
    openai_server.set_script([tool_reply("add", {"a": object()})])
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="harness_error"):
            sdk_client(openai_server).chat.completions.create(model=MODEL, messages=USER, stream=stream)
    assert [type(e) for e in openai_server.errors] == [KeyError, TypeError, TypeError]
    assert [r.outcome for r in openai_server.completions] == ["harness_error"] * 3


# ====================================================================== openai SDK: retries, errors, classify

# (fault, SDK exception, requests with default max_retries=2, verdict, classifier code)
FAULTS: dict[str, tuple[Callable[[], Fault], type[Exception], int, lg.ErrorType, str | None]] = {
    "insufficient_quota": (
        lambda: insufficient_quota().with_headers(FAST_RETRY),
        openai.RateLimitError,
        3,
        lg.ErrorType.FATAL,
        "insufficient_quota",
    ),
    "rate_limit": (lambda: rate_limit(0.004), openai.RateLimitError, 3, lg.ErrorType.TRANSIENT, "rate_limit_exceeded"),
    "invalid_api_key": (invalid_api_key, openai.AuthenticationError, 1, lg.ErrorType.FATAL, "invalid_api_key"),
    "context_length_exceeded": (
        context_length_exceeded,
        openai.BadRequestError,
        1,
        lg.ErrorType.PERMANENT,
        "context_length_exceeded",
    ),
    "server_error": (
        lambda: server_error().with_headers(FAST_RETRY),
        openai.InternalServerError,
        3,
        lg.ErrorType.TRANSIENT,
        "server_error",  # the body's type: its code is null
    ),
    "overloaded_529": (
        lambda: overloaded().with_headers(FAST_RETRY),
        openai.InternalServerError,
        3,
        lg.ErrorType.TRANSIENT,
        "overloaded_error",
    ),
}


@pytest.mark.parametrize("max_retries", [None, 0])
@pytest.mark.parametrize("name", list(FAULTS))
def test_sdk_retries_and_exceptions_per_fault(openai_server: OpenAIServer, name: str, max_retries: int | None) -> None:
    make_fault, exc_type, default_requests, verdict, code = FAULTS[name]
    openai_server.fail_forever(make_fault())
    client = sdk_client(openai_server) if max_retries is None else sdk_client(openai_server, max_retries=max_retries)
    with pytest.raises(exc_type) as caught:
        client.chat.completions.create(model=MODEL, messages=USER)

    assert openai_server.count() == (default_requests if max_retries is None else 1)
    info = lg.classify(caught.value)
    assert info.error_type is verdict
    assert info.code == code
    assert info.status == caught.value.status_code
    if name == "rate_limit":
        assert info.retry_after == pytest.approx(0.004)  # from retry-after-ms, as the SDK reads it
    if name == "context_length_exceeded":
        assert caught.value.code == "context_length_exceeded"


def test_rate_limit_error_body_and_headers(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(rate_limit(2.0))
    with pytest.raises(openai.RateLimitError) as caught:
        sdk_client(openai_server, max_retries=0).chat.completions.create(model=MODEL, messages=USER)
    headers = caught.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("2", "2000")
    assert headers["x-ratelimit-remaining-requests"] == "0" and headers["x-ratelimit-reset-requests"] == "2s"
    assert caught.value.body == {
        "message": f"Rate limit reached for {MODEL} in organization org-lgtest on requests per min (RPM): Limit 500, "
        "Used 500, Requested 1. Please try again in 2s. Visit https://platform.openai.com/account/rate-limits to "
        "learn more.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert lg.classify(caught.value).retry_after == 2.0


# ====================================================================== ChatOpenAI


def test_chat_openai_invoke_and_ainvoke(openai_server: OpenAIServer) -> None:
    openai_server.set_script(["Three."])
    model = chat(openai_server)
    messages = [SystemMessage(LONG_SYSTEM), HumanMessage("What is 1 + 2?")]

    first = model.invoke(messages)
    second = asyncio.run(model.ainvoke(messages))

    assert first.content == second.content == "Three."
    assert first.usage_metadata is not None and second.usage_metadata is not None
    prompt_tokens = openai_server.completions[0].prompt_tokens
    assert first.usage_metadata["input_tokens"] == prompt_tokens
    assert first.usage_metadata["output_tokens"] == 2
    assert first.usage_metadata["total_tokens"] == prompt_tokens + 2
    assert first.usage_metadata.get("input_token_details", {}).get("cache_read") == 0
    # the second sends the same prompt: cached_tokens -> input_token_details.cache_read
    cached = openai_server.completions[1].cached_tokens
    assert cached >= CACHE_MIN_TOKENS
    assert second.usage_metadata.get("input_token_details", {}).get("cache_read") == cached
    assert first.response_metadata["token_usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def _streamed(model: Any, messages: Any) -> AIMessageChunk:
    chunks = list(model.stream(messages))
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    return full


def test_chat_openai_streaming_usage_only_with_stream_usage(openai_server: OpenAIServer) -> None:
    messages = [SystemMessage(LONG_SYSTEM), HumanMessage("What is 1 + 2?")]
    plain = chat(openai_server)
    assert plain.stream_usage is None  # a base_url turns off langchain-openai's default

    no_usage = _streamed(plain, messages)
    assert no_usage.content == "ok" and no_usage.usage_metadata is None
    assert "stream_options" not in openai_server.completions[-1].body

    with_usage = _streamed(chat_openai_with_stream_usage(plain), messages)
    request = openai_server.completions[-1]
    assert request.body["stream_options"] == {"include_usage": True}
    assert with_usage.usage_metadata is not None
    assert with_usage.usage_metadata["input_tokens"] == request.prompt_tokens
    assert with_usage.usage_metadata.get("input_token_details", {}).get("cache_read") == request.cached_tokens > 0

    # streaming=True makes invoke stream too: the same blindness, the same cure
    assert chat(openai_server, streaming=True).invoke(messages).usage_metadata is None
    assert openai_server.completions[-1].stream
    assert chat(openai_server, streaming=True, stream_usage=True).invoke(messages).usage_metadata is not None


@pytest.mark.parametrize("streaming", [False, True])
def test_chat_openai_parses_tool_calls(openai_server: OpenAIServer, streaming: bool) -> None:
    openai_server.set_script([Reply(text=None, tool_calls=(ToolCall("add", {"a": 1, "b": 2}),))])
    model = chat(openai_server, streaming=streaming).bind_tools([add])
    reply = model.invoke([HumanMessage("What is 1 + 2?")])

    assert isinstance(reply, AIMessage)
    assert reply.tool_calls == [{"name": "add", "args": {"a": 1, "b": 2}, "id": "call_0_0", "type": "tool_call"}]
    assert openai_server.completions[0].tools[0]["function"]["name"] == "add"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_create_agent_with_one_tool_completes(openai_server: OpenAIServer) -> None:
    openai_server.set_script([tool_reply("add", {"a": 1, "b": 2}), "1 + 2 = 3."])
    agent = create_agent(chat(openai_server), [add], system_prompt="Use the tools.")
    result = agent.invoke({"messages": [HumanMessage("What is 1 + 2?")]})

    assert result["messages"][-1].content == "1 + 2 = 3."
    tool_result = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert (tool_result.content, tool_result.tool_call_id) == ("3", "call_0_0")
    first, second = openai_server.completions
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "3"}
    assert second.turn == 1 and first.turn == 0


@pytest.mark.parametrize("max_retries", [None, 0])
@pytest.mark.parametrize("name", list(FAULTS))
def test_chat_openai_errors_classify_as_the_sdks(
    openai_server: OpenAIServer, name: str, max_retries: int | None
) -> None:
    make_fault, exc_type, default_requests, verdict, code = FAULTS[name]
    openai_server.fail_forever(make_fault())
    model = chat(openai_server) if max_retries is None else chat(openai_server, max_retries=max_retries)
    with pytest.raises(exc_type) as caught:
        model.invoke("hi")

    assert openai_server.count() == (default_requests if max_retries is None else 1)
    info = lg.classify(caught.value)
    assert (info.error_type, info.code) == (verdict, code)
    # langchain-openai re-raises its own subclasses, the SDK error as the cause
    assert type(caught.value).__module__ == "langchain_openai.chat_models.base"
    assert isinstance(caught.value.__cause__, exc_type)
    if name in ("insufficient_quota", "rate_limit"):
        assert isinstance(caught.value, ModelRateLimitError) and ModelRateLimitError.is_retryable
    if name == "context_length_exceeded":
        assert isinstance(caught.value, ContextOverflowError)
    if name == "rate_limit":
        assert info.retry_after == pytest.approx(0.004)


def test_model_copy_keeps_the_sdk_retries(openai_server: OpenAIServer) -> None:
    openai_server.fail_forever(insufficient_quota().with_headers(FAST_RETRY))
    naive = chat(openai_server).model_copy(update={"max_retries": 0})
    assert naive.max_retries == 0 and naive.root_client.max_retries == 2
    with pytest.raises(openai.RateLimitError):
        naive.invoke("hi")
    assert openai_server.count() == 3  # the trap: the old client still retries twice


def test_copy_without_sdk_retries_reaches_the_server_once(openai_server: OpenAIServer) -> None:
    with httpx.Client(headers={"x-tenant": "t1"}) as http_client:
        original = chat(openai_server, http_client=http_client, temperature=0.3)
        quiet = chat_openai_without_sdk_retries(original)
        openai_server.fail_forever(insufficient_quota().with_headers(FAST_RETRY))

        with pytest.raises(openai.RateLimitError):
            quiet.invoke("hi")
        assert openai_server.count() == 1
        with pytest.raises(openai.RateLimitError):
            asyncio.run(quiet.ainvoke("hi"))
        assert openai_server.count() == 2
        with pytest.raises(openai.RateLimitError):
            original.invoke("hi")
        assert openai_server.count() == 5  # the original keeps its retries

        first = openai_server.completions[0]
        assert first.headers["x-tenant"] == "t1"  # the user's http client is still the one used
        assert first.body["temperature"] == 0.3
        assert quiet.root_client._client is http_client


def test_copies_compose_and_stream_usage(openai_server: OpenAIServer) -> None:
    model = chat_openai_with_stream_usage(chat_openai_without_sdk_retries(chat(openai_server, streaming=True)))
    assert model.invoke("hi").usage_metadata is not None
    openai_server.fail_forever(server_error().with_headers(FAST_RETRY))
    with pytest.raises(openai.InternalServerError):
        model.invoke("hi")
    assert openai_server.count() == 2


class _SwapModel(AgentMiddleware):
    """Calls each model request on another model (how an adapter installs its bound copy)."""

    def __init__(self, swap: Callable[[Any], Any]) -> None:
        super().__init__()
        self.swap = swap

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request.override(model=self.swap(request.model)))


@pytest.mark.parametrize(
    ("swap", "retry_middleware", "requests"),
    [
        (None, False, 3),  # the SDK's 2 retries
        (None, True, 9),  # ModelRetryMiddleware's 3 attempts x the SDK's 3
        (chat_openai_without_sdk_retries, False, 1),
        (chat_openai_without_sdk_retries, True, 3),
    ],
    ids=["sdk", "sdk+ModelRetryMiddleware", "copy", "copy+ModelRetryMiddleware"],
)
def test_requests_per_fatal_quota_error_in_create_agent(
    openai_server: OpenAIServer, swap: Callable[[Any], Any] | None, retry_middleware: bool, requests: int
) -> None:
    middleware: list[AgentMiddleware] = []
    if retry_middleware:  # defaults but no waits: max_retries=2, retries ModelRateLimitError
        middleware.append(ModelRetryMiddleware(initial_delay=0.0, jitter=False, on_failure="error"))
    if swap is not None:
        middleware.append(_SwapModel(swap))
    openai_server.fail_forever(insufficient_quota().with_headers(FAST_RETRY))
    agent = create_agent(chat(openai_server), [add], middleware=middleware)
    with pytest.raises(openai.RateLimitError):
        agent.invoke({"messages": [HumanMessage("What is 1 + 2?")]})
    assert openai_server.count() == requests
    assert all(r.tools for r in openai_server.completions)  # tools were bound to the copy too


# ====================================================================== crewAI's native OpenAI provider


@pytest.fixture
def crewai_llm(openai_server: OpenAIServer) -> Iterator[Any]:
    import crewai

    yield crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY)


@pytest.fixture
def llm_events() -> Iterator[list[Any]]:
    """crewAI's LLM events for the test, in order (the bus is flushed before reading)."""
    from crewai.events import LLMCallCompletedEvent, LLMCallFailedEvent, crewai_event_bus

    seen: list[Any] = []
    lock = threading.Lock()
    with crewai_event_bus.scoped_handlers():

        @crewai_event_bus.on(LLMCallCompletedEvent)
        def completed(source: Any, event: Any) -> None:
            with lock:
                seen.append(event)

        @crewai_event_bus.on(LLMCallFailedEvent)
        def failed(source: Any, event: Any) -> None:
            with lock:
                seen.append(event)

        yield seen
        crewai_event_bus.flush()


ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def test_crewai_llm_is_the_native_provider_on_chat_completions(openai_server: OpenAIServer, crewai_llm: Any) -> None:
    from crewai.llms.providers.openai.completion import OpenAICompletion

    openai_server.set_script(["Three."])
    assert isinstance(crewai_llm, OpenAICompletion)
    assert crewai_llm.max_retries == 2 and crewai_llm._client.max_retries == 2
    assert crewai_llm.call("What is 1 + 2?") == "Three."
    [request] = openai_server.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == [{"role": "user", "content": "What is 1 + 2?"}]
    assert request.api_key == "sk-t****abcd"


def test_crewai_usage_for_text_and_tool_call_replies(
    openai_server: OpenAIServer, crewai_llm: Any, llm_events: list[Any]
) -> None:
    from crewai.events import LLMCallCompletedEvent
    from crewai.events.types.llm_events import LLMCallType

    openai_server.set_script(queue(["Three.", tool_reply("add", {"a": 1, "b": 2})]))
    messages = [{"role": "system", "content": LONG_SYSTEM}, *USER]
    assert crewai_llm.call(messages, tools=[ADD_SCHEMA]) == "Three."
    calls = crewai_llm.call(messages, tools=[ADD_SCHEMA])  # the same prompt: cached

    # without available_functions, tool-call replies come back as the SDK's tool-call objects
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_0_0", "add", {"a": 1, "b": 2})
    ]
    from crewai.events import crewai_event_bus

    crewai_event_bus.flush()
    done = [e for e in llm_events if isinstance(e, LLMCallCompletedEvent)]
    assert [e.call_type for e in done] == [LLMCallType.LLM_CALL, LLMCallType.TOOL_CALL]
    first, second = openai_server.completions
    # the event carries crewAI's normalised usage, cached tokens included, for both kinds of reply
    assert [e.usage for e in done] == [
        {
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": c,
            "total_tokens": r.prompt_tokens + c,
            "cached_prompt_tokens": r.cached_tokens,
            "reasoning_tokens": 0,
        }
        for r, c in ((first, 2), (second, math.ceil(len('add{"a": 1, "b": 2}') / 4)))
    ]
    assert second.cached_tokens >= CACHE_MIN_TOKENS
    summary = crewai_llm.get_token_usage_summary()
    assert summary.prompt_tokens == first.prompt_tokens + second.prompt_tokens
    assert summary.cached_prompt_tokens == second.cached_tokens
    assert summary.successful_requests == 2


def test_crewai_streaming_asks_for_usage(openai_server: OpenAIServer, llm_events: list[Any]) -> None:
    import crewai
    from crewai.events import LLMCallCompletedEvent, crewai_event_bus

    llm = crewai.LLM(model=f"openai/{MODEL}", base_url=openai_server.url, api_key=KEY, stream=True)
    openai_server.set_script(["A streamed answer."])
    assert llm.call("hi") == "A streamed answer."
    crewai_event_bus.flush()
    [request] = openai_server.completions
    assert request.stream and request.include_usage
    [done] = [e for e in llm_events if isinstance(e, LLMCallCompletedEvent)]
    assert done.usage is not None and done.usage["prompt_tokens"] == request.prompt_tokens


# (fault, how the LLM is called, requests one call sends): crewAI's rate-limit retry (3 attempts
# on any 429) multiplies the SDK's (3 requests); 401 is retried by neither, 500 only by the SDK.
CREWAI_CALLS: list[tuple[str, Callable[[], Fault], str, int]] = [
    ("quota, defaults", lambda: insufficient_quota().with_headers(FAST_RETRY), "plain", 9),
    ("quota, SDK retries off", lambda: insufficient_quota().with_headers(FAST_RETRY), "sdk_off", 3),
    ("quota, both off", lambda: insufficient_quota().with_headers(FAST_RETRY), "both_off", 1),
    ("rate limit, defaults", lambda: rate_limit(0.001), "plain", 9),
    ("401, defaults", invalid_api_key, "plain", 1),
    ("500, defaults", lambda: server_error().with_headers(FAST_RETRY), "plain", 3),
    ("500, SDK retries off", lambda: server_error().with_headers(FAST_RETRY), "sdk_off", 1),
]


@pytest.mark.parametrize(("fault", "how", "requests"), [c[1:] for c in CREWAI_CALLS], ids=[c[0] for c in CREWAI_CALLS])
def test_crewai_requests_per_failed_call(
    openai_server: OpenAIServer,
    crewai_llm: Any,
    crewai_retry_waits: list[float],
    llm_events: list[Any],
    fault: Callable[[], Fault],
    how: str,
    requests: int,
) -> None:
    from crewai.events import LLMCallFailedEvent, crewai_event_bus

    made = fault()
    openai_server.fail_forever(made)
    llm = crewai_llm if how == "plain" else crewai_llm_without_sdk_retries(crewai_llm)
    with pytest.raises(openai.APIStatusError) as caught:
        if how == "both_off":
            crewai_call_without_crewai_retry(llm, "hi")
        else:
            llm.call("hi")

    assert caught.value.status_code == made.status
    assert openai_server.count() == requests
    crewai_attempts = 3 if made.status == 429 and how != "both_off" else 1
    assert len(crewai_retry_waits) == crewai_attempts - 1
    assert all(0.8 <= w <= 2.4 for w in crewai_retry_waits)  # 1 s, 2 s +-20%: the Retry-After is not read
    crewai_event_bus.flush()
    failed = [e for e in llm_events if isinstance(e, LLMCallFailedEvent)]
    assert len(failed) == 2 * crewai_attempts  # two LLMCallFailedEvents per failed attempt
    assert crewai_llm.max_retries == 2 and crewai_llm._client.max_retries == 2  # the original is untouched


def test_crewai_copy_without_sdk_retries_keeps_counting_usage(openai_server: OpenAIServer, crewai_llm: Any) -> None:
    quiet = crewai_llm_without_sdk_retries(crewai_llm)
    assert quiet.call("hi") == "ok"
    assert crewai_llm.get_token_usage_summary().successful_requests == 1  # shared _token_usage
    assert quiet._client.max_retries == 0 and quiet._async_client.max_retries == 0
    assert quiet.api_key == crewai_llm.api_key and quiet.base_url == crewai_llm.base_url


def _crew(llm: Any) -> Any:
    from crewai.tools import BaseTool
    from lg_crewai import make_crew
    from pydantic import BaseModel

    class AddArgs(BaseModel):
        a: int
        b: int

    class AddTool(BaseTool):
        name: str = "add"
        description: str = "Add two integers."
        args_schema: type[BaseModel] = AddArgs

        def _run(self, a: int, b: int) -> str:
            return str(a + b)

    return make_crew(
        llm, [AddTool()], role="calculator", goal="add numbers", tasks=[("Add 1 and 2.", "the sum")], max_iter=4
    )


def test_crewai_crew_with_a_tool_completes(openai_server: OpenAIServer, crewai_llm: Any) -> None:
    openai_server.set_script([tool_reply("add", {"a": 1, "b": 2}), "The sum is 3."])
    result = _crew(crewai_llm).kickoff()

    assert result.raw == "The sum is 3."
    first, second = openai_server.completions
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[-1]["content"] == "3" and second.messages[-1]["tool_call_id"] == "call_0_0"
    assert result.token_usage.prompt_tokens == first.prompt_tokens + second.prompt_tokens


@pytest.mark.parametrize(
    ("quiet_sdk", "quiet_crewai", "requests"),
    [
        (False, False, 27),  # 3 task attempts (max_retry_limit 2) x crewAI's 3 LLM-call attempts x the SDK's 3
        (True, False, 9),  # the copy survives Agent/Crew construction: SDK retries off
        (True, True, 3),  # crewAI's LLM retry off too: only the agent's task attempts remain
    ],
    ids=["defaults", "copy", "copy+no-crewai-retry"],
)
def test_crewai_crew_requests_for_one_fatal_quota_error(
    openai_server: OpenAIServer,
    crewai_llm: Any,
    crewai_retry_waits: list[float],
    quiet_sdk: bool,
    quiet_crewai: bool,
    requests: int,
) -> None:
    import crewai.llms.retry as crewai_retry

    openai_server.fail_forever(insufficient_quota().with_headers(FAST_RETRY))
    crew = _crew(crewai_llm_without_sdk_retries(crewai_llm) if quiet_sdk else crewai_llm)
    # crewAI skips its retry inside an active one (a contextvar): setting it around the kickoff
    # turns the retry off for every LLM call of the crew (private, but the only switch there is)
    token = crewai_retry._active_llm_rate_limit_retry.set(quiet_crewai)
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            crew.kickoff()
    finally:
        crewai_retry._active_llm_rate_limit_retry.reset(token)
    assert openai_server.count() == requests
    assert len(crewai_retry_waits) == (0 if quiet_crewai else 6)
    assert lg.classify(caught.value).error_type is lg.ErrorType.FATAL
