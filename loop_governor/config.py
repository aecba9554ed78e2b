"""Governor configuration: defaults from the seeds, overridable per tool, from env or TOML.

Sources, strongest first: constructor arguments, environment (``LOOP_GOVERNOR_*``, nested
with ``__``, e.g. ``LOOP_GOVERNOR_TOOLS__send_email__RETRY_MAX_ATTEMPTS=1``), a TOML file
(``GovernorConfig.from_toml(path)`` or ``LOOP_GOVERNOR_CONFIG_FILE``). Invalid values fail
at construction with pydantic's message naming the field.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from loop_governor.errors import ErrorFormat
from loop_governor.state.breaker import BreakerPolicy

ErrorClass = Literal["transient", "permanent", "fatal"]

# The default ceiling on model calls per task. The longest successful recorded run of our
# corpora (a coding agent, ../shared/corpus/swe-dev) made 188 model calls; Google ADK's own
# default is 500 LLM calls. A loop the guards do not recognize costs at most this many.
MAX_MODEL_CALLS = 500

# A poll is bounded by construction: these apply when ToolPolicy(poll=True) sets no bound.
# A job of up to an hour fits: polled once a minute it makes 60 calls in 60 minutes. A poll
# made more often than that reaches the call bound first -- each poll is a model call too;
# a wait tool between polls (or a larger max_calls) suits a faster cadence.
POLL_MAX_CALLS = 60
POLL_MAX_WALL_S = 3600.0
# Tools that only let time pass: repeating them is what they are for (never a loop).
# Only a name whose verb is the wait (``wait``, ``sleep_seconds``, ``wait_for_job``), not one
# that acts on a thing (``pause_subscription``, ``delay_shipment``, ``get_flight_delay``).
WAIT_TOOL = re.compile(
    r"\A(?:wait|sleep|pause|delay)(?:\Z|[_\-.](?:for|seconds?|secs?|ms|millis|minutes?|mins?|time|a_bit|until|s)\b)",
    re.I,
)


class _CallOverrides(BaseModel):
    """The overrides a tool and a model endpoint share: retries, breaker, unknown errors.
    ``None`` means "use the governor-wide value"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    retry_max_attempts: int | None = Field(default=None, ge=1, le=100)
    retry_base_delay: float | None = Field(default=None, ge=0)
    retry_max_delay: float | None = Field(default=None, ge=0)
    breaker_failure_threshold: int | None = Field(default=None, ge=1)
    breaker_cooldown_s: float | None = Field(default=None, gt=0)
    unknown_error: ErrorClass | None = None


class ToolPolicy(_CallOverrides):
    """Per-tool overrides; ``None`` means "use the governor-wide value".

    ``retry=False`` is for tools with side effects (send an email, charge a card): such a
    call is never repeated by the governor, whatever the error.
    """

    retry: bool = True
    rate_limit_per_s: float | None = Field(default=None, gt=0)
    rate_burst: int | None = Field(default=None, ge=1)
    max_wait_s: float | None = Field(
        default=None, ge=0, description="as GovernorConfig.model_max_wait_s, for this tool (default: no such wait)"
    )
    max_calls: int | None = Field(default=None, ge=1, description="calls of this tool per task (hard stop)")
    escalation_repeats: int | None = Field(
        default=None, ge=1, description="after the model was told to stop repeating, this many more end the task"
    )
    stateless: bool = Field(
        default=False,
        description="the tool's answer depends on its arguments alone: a known-bad call stays known-bad for "
        "the whole task (by default a success of any tool that may change state retires it: the agent may "
        "have fixed the cause, e.g. pressed the brake pedal before starting the engine again)",
    )
    read_only: bool = Field(
        default=False,
        description="a lookup: its success changes nothing, so it does not retire other calls' failures "
        "(by default any tool's success may have changed the world the failed call depends on)",
    )
    poll: bool = Field(
        default=False,
        description="a status poll (read-only): identical calls with identical answers are expected and never "
        f"count as a loop; bounded instead by max_calls (default {POLL_MAX_CALLS}) and max_wall_s (default "
        f"{POLL_MAX_WALL_S:g} s) per polled job (its id-like arguments; a changing attempt counter or "
        "timestamp is the same job): the model is warned near a bound, the poll is withdrawn at it, and "
        "only a poll of it after that ends the run",
    )
    max_wall_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds from this tool's first call in the task (for a poll: its first call with these "
        "arguments) after which its calls are refused (hard stop)",
    )


class ModelPolicy(_CallOverrides):
    """Per model endpoint (``"openai:gpt-4o"``) or provider (``"openai"``) overrides.

    ``rpm`` / ``tpm`` are the provider's request and token limits for the key the
    endpoint calls with, shared by every process on the same store (a fleet waits its
    turn instead of collecting 429s). Every endpoint matched by one entry shares its
    buckets, unless ``rate_key`` names another bucket.
    """

    rpm: float | None = Field(default=None, gt=0, description="requests per minute")
    tpm: float | None = Field(default=None, gt=0, description="tokens (prompt + completion) per minute")
    rpm_burst: int | None = Field(default=None, ge=1, description="requests at once; default one second's worth")
    tpm_burst: int | None = Field(default=None, ge=1, description="tokens at once; default ten seconds' worth")
    rate_key: str | None = Field(default=None, min_length=1, description="bucket shared with other entries")
    max_wait_s: float | None = Field(default=None, ge=0, description="overrides GovernorConfig.model_max_wait_s")


class ModelPrice(BaseModel):
    """Prices in currency units per million tokens (for ``max_cost``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(default=None, ge=0, description="defaults to the input price")
    cache_write: float | None = Field(default=None, ge=0, description="defaults to the input price")

    def cost(self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float:
        """``input_tokens`` includes cached ones (as providers report them)."""
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        plain = max(0, input_tokens - cache_read - cache_write)
        return (plain * self.input + cache_read * read + cache_write * write + output_tokens * self.output) / 1e6


class ResolvedPolicy:
    """A tool's or model endpoint's effective settings, computed once and cached (hot path).

    ``rate_per_s`` / ``burst`` limit requests, ``tokens_per_s`` / ``token_burst`` limit
    tokens (models only), both in the bucket named ``rate_key``.
    """

    __slots__ = (
        "base_delay",
        "breaker",
        "burst",
        "escalation_repeats",
        "jitter",
        "max_attempts",
        "max_calls",
        "max_delay",
        "max_wait",
        "max_wall",
        "model",
        "poll",
        "poll_calls",
        "poll_wall",
        "rate_key",
        "rate_per_s",
        "rated",
        "read_only",
        "stateless",
        "token_burst",
        "tokens_per_s",
        "unknown_error",
        "wait",
    )

    def __init__(
        self, config: GovernorConfig, override: ToolPolicy | ModelPolicy | None, rate_key: str, *, model: bool = False
    ) -> None:
        o = override or (ModelPolicy() if model else ToolPolicy())
        self.model: bool = model  # a model endpoint's settings (else a tool's)
        retry = o.retry if isinstance(o, ToolPolicy) else True
        self.max_attempts: int = 1 if not retry else (o.retry_max_attempts or config.retry_max_attempts)
        self.base_delay: float = config.retry_base_delay if o.retry_base_delay is None else o.retry_base_delay
        self.max_delay: float = config.retry_max_delay if o.retry_max_delay is None else o.retry_max_delay
        self.jitter: float = config.retry_jitter
        # Seconds the call may wait for its turn in all (0: a wait longer than max_delay
        # hands back at once); never for a call that must not be repeated.
        wait = o.max_wait_s if o.max_wait_s is not None else (config.model_max_wait_s if model else 0.0)
        self.max_wait: float = wait if self.max_attempts > 1 else 0.0
        self.breaker = BreakerPolicy(
            o.breaker_failure_threshold or config.breaker_failure_threshold,
            o.breaker_cooldown_s or config.breaker_cooldown_s,
        )
        self.unknown_error: ErrorClass = o.unknown_error or config.unknown_error
        tool = o if isinstance(o, ToolPolicy) else None
        self.poll: bool = tool is not None and tool.poll
        self.max_calls: int | None = None if tool is None else tool.max_calls
        self.max_wall: float | None = None if tool is None else tool.max_wall_s
        # a poll's bounds hold per job (loop_governor.policies.polls), not per tool
        self.poll_calls: int = POLL_MAX_CALLS
        self.poll_wall: float = POLL_MAX_WALL_S
        if self.poll:
            self.poll_calls, self.poll_wall = self.max_calls or POLL_MAX_CALLS, self.max_wall or POLL_MAX_WALL_S
            self.max_calls = self.max_wall = None
        # a tool that only lets time pass (wait, sleep): repeated by design, like a poll
        self.wait: bool = not model and not self.poll and WAIT_TOOL.search(rate_key) is not None
        self.stateless: bool = tool is not None and tool.stateless
        # a poll reads a status: its success changes nothing (nor may it hide a loop beside it)
        self.read_only: bool = tool is not None and (tool.read_only or tool.poll)
        own = o.escalation_repeats if isinstance(o, ToolPolicy) else None
        self.escalation_repeats: int = own or config.escalation_repeats
        self.tokens_per_s: float | None = None
        self.token_burst: float = 1.0
        if isinstance(o, ModelPolicy):
            self.rate_key = f"model:{o.rate_key or rate_key}"
            self.rate_per_s: float | None = o.rpm / 60.0 if o.rpm else None
            self.burst: float = float(o.rpm_burst) if o.rpm_burst else max(1.0, (o.rpm or 60.0) / 60.0)
            if o.tpm:
                self.tokens_per_s = o.tpm / 60.0
                self.token_burst = float(o.tpm_burst) if o.tpm_burst else max(1.0, o.tpm / 6.0)
        else:
            self.rate_key = rate_key
            self.rate_per_s = o.rate_limit_per_s or config.rate_limit_per_s
            burst = o.rate_burst or config.rate_burst
            self.burst = float(burst) if burst else max(1.0, float(self.rate_per_s or 1.0))
        self.rated: bool = self.rate_per_s is not None or self.tokens_per_s is not None


class GovernorConfig(BaseSettings):
    """Everything the governor decides by. Defaults are the seeds' measured values."""

    model_config = SettingsConfigDict(
        env_prefix="LOOP_GOVERNOR_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    retry_max_attempts: int = Field(default=3, ge=1, le=100, description="attempts per call, first included")
    retry_base_delay: float = Field(default=0.8, ge=0, description="seconds; doubled each retry")
    retry_max_delay: float = Field(default=8.0, ge=0, description="cap on one backoff, seconds")
    retry_jitter: float = Field(default=0.5, ge=0, le=1, description="delay *= 0.5 + random()*jitter")
    task_retry_budget: int = Field(default=6, ge=0, description="retries shared by all tools of one task")
    breaker_failure_threshold: int = Field(default=5, ge=1)
    breaker_cooldown_s: float = Field(default=60.0, gt=0)
    repeated_error_threshold: int = Field(default=3, ge=1, description="same tool+signature failures")
    max_steps: int | None = Field(
        default=None, ge=1, description="agent iterations per task: a model decision and the tool calls it asked for"
    )
    max_model_calls: int | None = Field(
        default=MAX_MODEL_CALLS,
        ge=1,
        description=f"model calls per task (default {MAX_MODEL_CALLS}: the run is bounded even where the host's "
        "own limit is far off, LangGraph's 10,007; no healthy recorded run came near it); None: no ceiling",
    )
    max_tool_calls: int | None = Field(default=None, ge=1, description="tool calls per task")
    max_tokens: int | None = Field(default=None, ge=1, description="model tokens (in + out) per task")
    max_cost: float | None = Field(default=None, gt=0, description="per task, priced with `prices`")
    max_wall_s: float | None = Field(default=None, gt=0, description="wall-clock seconds per task")
    prices: dict[str, ModelPrice] = Field(default_factory=dict, description='per model; "default" for others')
    no_progress_threshold: int = Field(default=3, ge=2, description="same non-trivial result N times in a row")
    escalation_repeats: int = Field(
        default=2,
        ge=1,
        description="every soft signal has a hard follow-up: after the model was told (a known-bad call, a "
        "repeated error, an open breaker, a rate limit, no progress, a cycle), this many more attempts at the "
        "same thing end the task with NoProgressError",
    )
    cycle_detection: bool = Field(default=True, description="stop periodic repeats of (tool, args, result)")
    trivial_result_chars: int = Field(default=10, ge=0, description="results this short never count as no-progress")
    rate_limit_per_s: float | None = Field(default=None, gt=0, description="per tool, shared through the store")
    rate_burst: int | None = Field(default=None, ge=1)
    unknown_error: ErrorClass = "permanent"
    error_format: ErrorFormat = Field(
        default="text",
        description='how the model reads a governed failure: "text" (Error: <the tool\'s message>, then what to '
        'do) or "json" (the same fields as one compact JSON object)',
    )
    store_url: str = "memory://"
    checkpoint_url: str | None = None
    trace_path: str | None = None
    tools: dict[str, ToolPolicy] = Field(default_factory=dict)
    models: dict[str, ModelPolicy] = Field(
        default_factory=dict, description='per endpoint ("openai:gpt-4o") or provider ("openai")'
    )
    model_max_wait_s: float = Field(
        default=120.0,
        ge=0,
        description="seconds a model call may wait in all for its turn before it fails: the provider's "
        "throttles (429 and Retry-After, retried without spending attempts or the retry budget), the shared "
        "rate limit, an open breaker when no fallback is left; 0 = as tool calls (no wait past retry_max_delay)",
    )
    sdk_retries: Literal["off", "keep"] = Field(
        default="off",
        description="off: adapters switch the provider SDK's own retries off, so the governor's retries are the "
        "only ones; keep: each governed attempt may be several requests",
    )

    @field_validator("store_url")
    @classmethod
    def _check_store_url(cls, value: str) -> str:
        lowered = value.lower()
        if lowered.startswith(("memory://", "sqlite:///", "redis://", "rediss://", "unix://")):
            return value
        if lowered.startswith(("redis+cluster://", "rediss+cluster://", "redis+sentinel://", "rediss+sentinel://")):
            from loop_governor.redaction import mask_url
            from loop_governor.stores.redis_url import parse_redis_url

            parse_redis_url(value, mask_url(value))  # host:port list, service name: malformed fails here
            return value
        raise ValueError(
            "store_url must start with memory://, sqlite:///, redis://, rediss://, "
            "redis+cluster:// or redis+sentinel://"
        )

    @model_validator(mode="after")
    def _check_delays(self) -> GovernorConfig:
        if self.max_cost is not None and not self.prices:
            raise ValueError("max_cost needs a price table: prices={model: ModelPrice(input=..., output=...)}")
        if self.retry_base_delay > self.retry_max_delay:
            raise ValueError(
                f"retry_base_delay ({self.retry_base_delay}) must not exceed retry_max_delay ({self.retry_max_delay})"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        warn_unknown_env(settings_cls.model_fields)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        env_file = os.environ.get("LOOP_GOVERNOR_CONFIG_FILE")
        if env_file:
            path = Path(env_file)
            # Not TomlConfigSettingsSource: it can't read a [loop_governor] table.
            sources.append(InitSettingsSource(settings_cls, init_kwargs=_read_toml_table(path)))
        return tuple(sources)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **overrides: Any) -> GovernorConfig:
        """Load a TOML file (top-level keys or a ``[loop_governor]`` table)."""
        path = Path(path)
        table = _read_toml_table(path)
        # Env still beats the file; explicit overrides beat both.
        env_only = cls(**overrides)
        merged = {**table, **env_only.model_dump(exclude_unset=True), **overrides}
        return cls(**merged)

    def policy_for(self, tool: str) -> ResolvedPolicy:
        override = _lookup(self.tools, tool)
        return ResolvedPolicy(self, override, tool)

    def model_policy_for(self, endpoint: str) -> ResolvedPolicy:
        """``endpoint`` is ``provider:model`` (or a base URL): the exact entry wins, then
        the provider's (the part before the first ``:``)."""
        key = endpoint
        override = _lookup(self.models, endpoint)
        if override is None and ":" in endpoint:
            key = endpoint.split(":", 1)[0]
            override = _lookup(self.models, key)
        return ResolvedPolicy(self, override, key if override is not None else endpoint, model=True)


_P = TypeVar("_P", ToolPolicy, ModelPolicy)


def _lookup(table: dict[str, _P], name: str) -> _P | None:
    found = table.get(name)
    if found is None:
        # Environment variables arrive lower-cased (LOOP_GOVERNOR_TOOLS__sendEmail__RETRY
        # becomes "sendemail"): a policy must not silently vanish because of it.
        folded = name.casefold()
        found = next((p for key, p in table.items() if key.casefold() == folded), None)
    return found


def _read_toml_table(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    if not path.is_file():
        raise FileNotFoundError(f"loop-governor config file not found: {path}")
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    table = data.get("loop_governor", data)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [loop_governor] must be a table")
    return table


ENV_PREFIX = "LOOP_GOVERNOR_"
# Variables read outside GovernorConfig's fields: the config file, the test suite's fleet store.
_OTHER_ENV = frozenset({"LOOP_GOVERNOR_CONFIG_FILE", "LOOP_GOVERNOR_CHECKPOINT_URL", "LOOP_GOVERNOR_STORE_URL"})
_warned_env: set[str] = set()


def warn_unknown_env(fields: Any, environ: Any = None) -> list[str]:
    """Warn (once per name) about each ``LOOP_GOVERNOR_*`` variable that is no setting,
    with the closest setting's name: pydantic-settings ignores them silently, so a typo
    (``LOOP_GOVERNOR_MAX_STEP=2``) would leave the run unbounded. Returns the names."""
    env = os.environ if environ is None else environ
    known = {ENV_PREFIX + name.upper() for name in fields} | _OTHER_ENV
    unknown = []
    for name in env:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper.split("__", 1)[0] in known:
            continue  # a setting, or a nested one (LOOP_GOVERNOR_TOOLS__SEARCH__...)
        unknown.append(name)
        if name in _warned_env:
            continue
        _warned_env.add(name)
        close = difflib.get_close_matches(upper, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.warn(f"unknown environment variable {name} is ignored by loop-governor{hint}", stacklevel=2)
    return unknown


def _kind(value: object) -> str:
    return f"the class {value.__name__}" if isinstance(value, type) else type(value).__name__


def _shown(value: object) -> str:
    """A misused value as an error message names it: its type, and a string's text."""
    if isinstance(value, str):
        return f"the string {value!r}"
    name = getattr(value, "__name__", None)
    if callable(value) and not isinstance(value, type) and isinstance(name, str):
        return f"the function {name}"
    return _kind(value)


def check_tool_list(tools: object, single: Callable[[object], bool], function: str) -> list[object]:
    """``tools`` (an adapter's ``govern_tools`` argument) as a list, or a TypeError naming
    the parameter: a single tool (``single(tools)``), a function, a string, a mapping or
    anything not iterable is refused at construction, not at the agent's first step."""
    if single(tools) or callable(tools) or isinstance(tools, str | bytes | Mapping) or tools is None:
        raise TypeError(
            f"{function}: tools must be a list of tools, got {_shown(tools)}: "
            f"pass [tool], or use {function.removesuffix('s')}(tool, governor)"
        )
    if not isinstance(tools, Iterable):
        raise TypeError(f"{function}: tools must be a list of tools, got {_shown(tools)}")
    try:
        return list(tools)
    except TypeError:
        raise TypeError(f"{function}: tools must be a list of tools, got {_shown(tools)}") from None


def not_a_tool(tool: object, accepted: str, parameter: str = "tool") -> TypeError:
    """The TypeError, naming ``parameter``, for a value that is no tool (``accepted`` says
    what is): a tool's name passed instead of the tool, a class instead of an instance."""
    hint = " (pass the tool object, not its name)" if isinstance(tool, str) else ""
    if isinstance(tool, type):
        hint = " (pass an instance, not the class)"
    return TypeError(f"{parameter} must be {accepted}, got {_shown(tool)}{hint}")


def check_pruner(pruner: object, pruner_factory: object) -> None:
    """Misuse of ``pruner`` / ``pruner_factory`` fails at construction, naming the parameter."""
    if pruner is not None and pruner_factory is not None:
        raise ValueError("pass pruner or pruner_factory, not both")
    if pruner is not None and (isinstance(pruner, type) or not callable(getattr(pruner, "prune", None))):
        hint = " (a function or class that makes one per task goes in pruner_factory=)" if callable(pruner) else ""
        raise TypeError(f"pruner must be an object with a prune(messages) method, got {_kind(pruner)}{hint}")
    if pruner_factory is not None:
        if not isinstance(pruner_factory, type) and callable(getattr(pruner_factory, "prune", None)):
            raise TypeError(
                "pruner_factory must be a function returning a new pruner, got a pruner "
                f"({type(pruner_factory).__name__}); pass it as pruner= to share it"
            )
        if not callable(pruner_factory):
            raise TypeError(f"pruner_factory must be callable, got {type(pruner_factory).__name__}")
