"""Token usage of one model call, read from whatever the provider client returned.

Budgets (``max_tokens``, ``max_cost``) and token rate limits need usage after every
model call. Each client reports it in its own shape; this module reads the common ones
by duck typing, so the core needs no provider SDK and no agent framework:

* LangChain messages: ``usage_metadata`` = {input_tokens, output_tokens,
  input_token_details: {cache_read, cache_creation}};
* OpenAI-style (openai SDK objects, crewAI's provider dicts, raw JSON): ``usage`` =
  {prompt_tokens, completion_tokens, prompt_tokens_details: {cached_tokens}};
* Anthropic-style: ``usage`` = {input_tokens, output_tokens, cache_read_input_tokens,
  cache_creation_input_tokens} (input excludes the cached tokens there: added back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one call; ``input_tokens`` includes cached ones, as providers bill them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def fields(self) -> dict[str, Any]:
        """The usage fields of a ``model_call`` event."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_creation_tokens": self.cache_creation_tokens,
            "usage_estimated": self.estimated,
        }


def _get(obj: Any, name: str) -> Any:
    # dict, not Mapping: an ABC check costs more than the rest of this reader (every
    # provider client hands back dicts or attribute objects)
    if isinstance(obj, dict):
        return obj.get(name)
    if obj is None:
        return None
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        return max(0, int(value))
    return 0


def _from_langchain(meta: Any) -> Usage | None:
    if _get(meta, "input_tokens") is None and _get(meta, "output_tokens") is None:
        return None
    details = _get(meta, "input_token_details") or {}
    return Usage(
        _int(_get(meta, "input_tokens")),
        _int(_get(meta, "output_tokens")),
        _int(_get(details, "cache_read")),
        _int(_get(details, "cache_creation")),
    )


def _from_provider(usage: Any) -> Usage | None:
    prompt = _get(usage, "prompt_tokens")
    if prompt is not None or _get(usage, "completion_tokens") is not None:
        details = _get(usage, "prompt_tokens_details") or {}
        cached = _get(details, "cached_tokens")
        if cached is None:  # DeepSeek reports its cache hits at the top level
            cached = _get(usage, "prompt_cache_hit_tokens")
        return Usage(_int(prompt), _int(_get(usage, "completion_tokens")), _int(cached))
    if _get(usage, "input_tokens") is not None or _get(usage, "output_tokens") is not None:
        read = _int(_get(usage, "cache_read_input_tokens"))
        write = _int(_get(usage, "cache_creation_input_tokens"))
        return Usage(_int(_get(usage, "input_tokens")) + read + write, _int(_get(usage, "output_tokens")), read, write)
    return None


def usage_of(result: Any) -> Usage | None:
    """The usage a model call's result reports, or None when it reports none (never raises)."""
    try:
        if isinstance(result, Usage):
            return result
        meta = _get(result, "usage_metadata")
        if meta:
            return _from_langchain(meta)
        usage = _get(result, "usage")
        if usage:
            return _from_provider(usage)
        # LangChain's ModelResponse / ChatResult: the last message carries the usage
        for attr in ("result", "generations", "message"):
            inner = _get(result, attr)
            if isinstance(inner, list) and inner:
                inner = inner[-1]
            if inner is not None and inner is not result:
                nested = _get(inner, "usage_metadata") or _get(_get(inner, "message"), "usage_metadata")
                if nested:
                    return _from_langchain(nested)
    except Exception:
        return None
    return None
