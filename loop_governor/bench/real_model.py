"""A real chat model in place of the scripted policy (``loop-governor bench --model``).

Both frameworks talk to any OpenAI-compatible endpoint through the clients their users
have: langchain-openai's ``ChatOpenAI`` for the LangChain arms, crewAI's
``LLM(model="openai/...", base_url=...)`` (its native ``OpenAICompletion``) for the crewAI
arms. The governed arms govern those very clients (the adapters switch their SDK retries
off, as they do in production).

Every HTTP request the model client sends passes through two httpx event hooks on the
client it is given ([`Meter`][loop_governor.bench.real_model.Meter]). They are the benchmark's view of the model, the
counterpart of the simulated provider's request log:

* before a request: the task's caps. A task may send at most ``max_model_calls``
  requests and run ``task_seconds`` of real time from its first one; past either the
  request is not sent and the task stops ([`ModelBudgetExceeded`][loop_governor.bench.real_model.ModelBudgetExceeded],
  reason ``model_call_cap`` / ``model_time_cap``), so a run always ends whatever the model does.
  The request's read timeout is cut to the time left; a request that gets no response
  (a timeout, a refused connection) is a failed model call.
* after a response: one model call in the task's log (``Provider.requests``), with its
  real latency, billed prompt tokens (the reply's ``usage``) and what the reply was
  (``tool_calls``, ``text``, ``empty``, ``malformed``). Then the world's *virtual* clock
  advances by the scripted model's turn time, so every arm and every model meets the
  scenario's faults (a 40-minute rate limit, a 30-minute outage) at the same point of
  its work; the model's own latency is real and reported apart (``model_wall_s``).

An empty reply or a malformed tool call is not retried or repaired here: it is a model
turn like any other, and the framework ends the task as it ends it (LangChain's agent
stops on a reply without tool calls; crewAI raises and re-runs the task, then fails it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from loop_governor.bench.clock import DeadlineExceeded
from loop_governor.bench.policy import model_latency
from loop_governor.bench.provider import PROVIDER_ERROR_LATENCY_S, ModelRequest

DUMMY_API_KEY = "not-needed"  # local servers ignore the key; the SDKs insist on one
DEFAULT_MAX_MODEL_CALLS = 80  # the 30-item batch needs 31 turns, and about 18 more after its crash
DEFAULT_TASK_SECONDS = 300.0
DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_TEMPERATURE = 0.7  # several runs are several samples only if the model samples

LOCAL_BASE_URLS: dict[str, str] = {
    "ollama": "http://127.0.0.1:11434/v1",
    "llamacpp": "http://127.0.0.1:8080/v1",
    "vllm": "http://127.0.0.1:8000/v1",
}
"""The local servers' default OpenAI-compatible endpoints: ``--model ollama:qwen2.5:1.5b``
needs no ``--base-url``."""

PROVIDERS: tuple[str, ...] = ("openai", *LOCAL_BASE_URLS)


class ModelBudgetExceeded(DeadlineExceeded):
    """A task reached its cap on model calls or on real model time: the harness stops it
    (a ``BaseException``, like the deadline, so no framework turns it into model text)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def redact_url(url: str | None) -> str | None:
    """``url`` without credentials: user-info and query string go (a key in either is common)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    if parts.username or parts.password:
        netloc = "***@" + netloc
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


@dataclass(frozen=True)
class ModelSettings:
    """Which model, where, how it samples, and the caps that bound a task.

    ``max_model_calls`` / ``task_seconds`` left ``None`` take the tier's caps
    ([`for_tier`][loop_governor.bench.real_model.ModelSettings.for_tier]); ``seed`` is the sampling seed of one run
    ([`for_run`][loop_governor.bench.real_model.ModelSettings.for_run]).
    """

    provider: str
    name: str
    base_url: str | None = None
    api_key_env: str | None = None
    max_model_calls: int | None = None
    task_seconds: float | None = None
    temperature: float = DEFAULT_TEMPERATURE
    seed: int | None = None

    @classmethod
    def parse(
        cls,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        max_model_calls: int | None = None,
        task_seconds: float | None = None,
        temperature: float = DEFAULT_TEMPERATURE,
    ) -> ModelSettings:
        """``PROVIDER:NAME`` (``openai:gpt-4o-mini``, ``ollama:qwen2.5:1.5b``); errors name the option."""
        provider, sep, name = model.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--model must be PROVIDER:NAME (e.g. ollama:qwen2.5:1.5b), got {model!r}")
        provider = provider.strip().lower()
        if provider not in PROVIDERS:
            raise ValueError(f"--model: unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")
        if base_url is not None and urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"--base-url must be an http(s) URL, got {redact_url(base_url)!r}")
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise ValueError(f"--api-key-env: the environment variable {api_key_env} is not set")
        if max_model_calls is not None and max_model_calls < 1:
            raise ValueError("--max-model-calls must be at least 1")
        if task_seconds is not None and task_seconds <= 0:
            raise ValueError("--task-seconds must be positive")
        if not 0 <= temperature <= 2:
            raise ValueError(f"--temperature must be between 0 and 2, got {temperature:g}")
        return cls(
            provider,
            name.strip(),
            base_url or LOCAL_BASE_URLS.get(provider),
            api_key_env,
            max_model_calls,
            None if task_seconds is None else float(task_seconds),
            float(temperature),
        )

    @property
    def label(self) -> str:
        return f"{self.provider}:{self.name}"

    @property
    def calls_cap(self) -> int:
        return self.max_model_calls if self.max_model_calls is not None else DEFAULT_MAX_MODEL_CALLS

    @property
    def seconds_cap(self) -> float:
        return self.task_seconds if self.task_seconds is not None else DEFAULT_TASK_SECONDS

    @property
    def call_timeout_s(self) -> float:
        return min(DEFAULT_CALL_TIMEOUT_S, self.seconds_cap)

    def for_tier(self, max_model_calls: int, task_seconds: float) -> ModelSettings:
        """These settings with the tier's caps where none was chosen."""
        return replace(
            self,
            max_model_calls=max_model_calls if self.max_model_calls is None else self.max_model_calls,
            task_seconds=task_seconds if self.task_seconds is None else self.task_seconds,
        )

    def for_run(self, seed: int) -> ModelSettings:
        return replace(self, seed=seed)

    def api_key(self) -> str:
        """The key from ``api_key_env``, else a dummy one (local servers need none)."""
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or DUMMY_API_KEY
        return DUMMY_API_KEY

    def describe(self) -> dict[str, Any]:
        """What the JSON says about the model: never the key, never credentials in the URL."""
        return {
            "model": self.label,
            "provider": self.provider,
            "name": self.name,
            "endpoint": redact_url(self.base_url) or "the provider's default (api.openai.com)",
            "api_key": f"from ${self.api_key_env}" if self.api_key_env else "none (a dummy key)",
            "max_model_calls_per_task": self.max_model_calls if self.max_model_calls is not None else "the tier's",
            "real_seconds_per_task": self.task_seconds if self.task_seconds is not None else "the tier's",
            "call_timeout_s": self.call_timeout_s,
            "temperature": self.temperature,
            "clients": {
                "langchain": "langchain_openai.ChatOpenAI",
                "crewai": f"crewai.LLM(model='openai/{self.name}') (native OpenAICompletion)",
            },
        }


@dataclass
class RealModel:
    """The "model policy" of a real-model run: the harness scores it from what its calls
    did at the services (``observed``), the runners build real clients from ``settings``."""

    settings: ModelSettings
    observed: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.settings.label

    def react(self, *args: Any) -> Any:  # the Behaviour protocol; a real model decides for itself
        raise TypeError("a real model is not a scripted policy")


@dataclass
class Meter:
    """The httpx event hooks of one task's model client (see the module docstring)."""

    settings: ModelSettings
    world: Any
    task_id: str
    _pending: tuple[Any, float] | None = None

    def _log(self) -> list[ModelRequest]:
        return [r for r in self.world.provider.requests if r.task == self.task_id]

    def _started(self) -> float:
        """Real time of the task's first model request (kept across a restarted attempt)."""
        return float(self.world.real_started.setdefault(self.task_id, time.monotonic()))

    def on_request(self, request: Any) -> None:
        self.close()  # the previous request got no response (a timeout, a refused connection)
        if len(self._log()) >= self.settings.calls_cap:
            raise ModelBudgetExceeded(
                "model_call_cap", f"{self.task_id}: {self.settings.calls_cap} model calls, the task's cap"
            )
        left = self.settings.seconds_cap - (time.monotonic() - self._started())
        if left <= 0:
            raise ModelBudgetExceeded(
                "model_time_cap", f"{self.task_id}: {self.settings.seconds_cap:g} s of real time, the task's cap"
            )
        read = min(left, self.settings.call_timeout_s)
        timeout = dict(request.extensions.get("timeout") or {})
        timeout["read"] = read if timeout.get("read") is None else min(float(timeout["read"]), read)
        request.extensions["timeout"] = timeout
        self._pending = (request, time.monotonic())

    def on_response(self, response: Any, request: Any = None) -> None:
        request = request if request is not None else response.request
        sent = self._pending[1] if self._pending is not None else time.monotonic()
        self._pending = None
        response.read()
        wall = time.monotonic() - sent
        reply, prompt_tokens, messages = _read_exchange(request, response)
        clock = self.world.clock
        start = clock()
        turn = len(self._log())
        ok = response.status_code < 400
        self.world.provider.requests.append(
            ModelRequest(
                self.task_id,  # not CURRENT_TASK: a framework may call from another context
                start,
                start,
                ok,
                prompt_tokens,
                None if ok else response.status_code,
                reply,
                round(wall, 3),
            )
        )
        # the scenario's time moves by the scripted model's turn, whatever this model's speed
        clock.sleep(model_latency(self.world.seed, self.task_id, turn, messages) if ok else PROVIDER_ERROR_LATENCY_S)

    def close(self) -> None:
        """Record a request still waiting for its response as a failed call (no response)."""
        if self._pending is None:
            return
        _, sent = self._pending
        self._pending = None
        now = self.world.clock()
        self.world.provider.requests.append(
            ModelRequest(self.task_id, now, now, False, 0, None, "no_response", round(time.monotonic() - sent, 3))
        )


def _read_exchange(request: Any, response: Any) -> tuple[str, int, int]:
    """(what the reply was, billed prompt tokens, messages in the prompt)."""
    try:
        sent = json.loads(request.content or b"{}")
    except ValueError:
        sent = {}
    messages = len(sent.get("messages") or ()) if isinstance(sent, dict) else 0
    offered = (
        {(t.get("function") or {}).get("name") for t in (sent.get("tools") or ()) if isinstance(t, dict)}
        if isinstance(sent, dict)
        else set()
    )
    if response.status_code >= 400:
        return "error", 0, messages
    try:
        body = json.loads(response.content)
    except ValueError:
        return "malformed", 0, messages
    if not isinstance(body, dict):
        return "malformed", 0, messages
    usage = body.get("usage")
    prompt_tokens = int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "malformed", prompt_tokens, messages
    message = choices[0].get("message") or {}
    calls = message.get("tool_calls") or []
    if calls:
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or (offered and function.get("name") not in offered):
                return "malformed", prompt_tokens, messages
            try:
                args = json.loads(function.get("arguments") or "{}")
            except ValueError:
                return "malformed", prompt_tokens, messages
            if not isinstance(args, dict):
                return "malformed", prompt_tokens, messages
        return "tool_calls", prompt_tokens, messages
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content) if content else ""
    return ("text" if text.strip() else "empty"), prompt_tokens, messages


def http_client(meter: Meter) -> Any:
    """An ``httpx.Client`` with the meter's hooks, for the SDK client of one task."""
    import httpx

    return httpx.Client(
        event_hooks={"request": [meter.on_request], "response": [meter.on_response]},
        timeout=httpx.Timeout(meter.settings.call_timeout_s, connect=10.0),
    )


def check_endpoint(settings: ModelSettings) -> None:
    """Fail before the run, not in every task, when nothing answers at the endpoint (a local
    server not started, a wrong port). Any HTTP answer will do: not every server lists
    its models, and an auth error is the model call's to report."""
    import httpx

    url = (settings.base_url or "https://api.openai.com/v1").rstrip("/") + "/models"
    try:
        httpx.get(url, headers={"Authorization": f"Bearer {settings.api_key()}"}, timeout=10.0)
    except httpx.HTTPError as exc:
        raise ValueError(
            f"cannot reach the model endpoint {redact_url(settings.base_url) or url}: {type(exc).__name__}. "
            "Is the server running (see docs/real-model-bench.md)?"
        ) from None


def chat_openai(settings: ModelSettings, client: Any) -> Any:
    """langchain-openai's ``ChatOpenAI`` on the endpoint, through ``client``."""
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "--model with LangChain needs langchain-openai: pip install 'loop-governor[langchain,bench-model]'"
        ) from exc
    return ChatOpenAI(
        model=settings.name,
        base_url=settings.base_url,
        api_key=settings.api_key(),  # type: ignore[arg-type]
        http_client=client,
        timeout=settings.call_timeout_s,
        temperature=settings.temperature,
        seed=settings.seed,
    )


def crewai_llm(settings: ModelSettings, meter: Meter) -> Any:
    """crewAI's native OpenAI LLM on the endpoint, metered through crewAI's own transport
    interceptor (its ``client_params`` would hand one httpx client to both its sync and
    async OpenAI clients, which refuse that)."""
    import httpx
    from crewai import LLM
    from crewai.llms.hooks.base import BaseInterceptor

    class MeterInterceptor(BaseInterceptor[httpx.Request, httpx.Response]):
        def __init__(self) -> None:
            self.sent: httpx.Request | None = None

        def on_outbound(self, message: httpx.Request) -> httpx.Request:
            meter.on_request(message)
            self.sent = message
            return message

        def on_inbound(self, message: httpx.Response) -> httpx.Response:
            meter.on_response(message, self.sent)
            return message

    return LLM(
        model=f"openai/{settings.name}",
        base_url=settings.base_url,
        api_key=settings.api_key(),
        timeout=settings.call_timeout_s,
        temperature=settings.temperature,
        seed=settings.seed,
        interceptor=MeterInterceptor(),
    )
