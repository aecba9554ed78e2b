"""Secret redaction for anything that leaves the process: model text, traces, checkpoints.

Error messages from HTTP clients routinely echo the request URL, headers or body, and
with them API keys and passwords. The governor puts error text in front of the model and
into traces, so every such text passes through :func:`redact` first. No library covers
the provider key formats we see in agent tools, hence the hand-written patterns.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_MASK = "[REDACTED]"

# Names of secrets: the one list behind both the ``name=value`` text rule below and
# :func:`is_secret_key` (dict keys in traces and checkpoints).
_SECRET_NAMES = (
    r"api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|auth[_-]?token|"
    r"secret(?:[_-]?key)?|client[_-]?secret|password|passwd|x-api-key|session[_-]?token|"
    r"aws[_-]?secret[_-]?access[_-]?key"
)
# As a dict key these count too when they end the key ("Authorization", "ssh_private_key"),
# though in free text they would mask ordinary prose. Not "token" or "pwd": tool results
# carry pagination cursors ("next_token", "page_token") and working directories ("pwd"),
# and masking them would change what a resumed call returns; real token formats (ghp_,
# sk-, JWTs...) are caught by the value patterns anyway.
_KEY_ONLY_NAMES = r"authorization|private[_-]?key"
# A name counts anywhere in a key between separators ("db_password", "OPENAI_API_KEY",
# "x-api-key"); camelCase is split into words first ("userPassword" -> "user_Password").
_SECRET_KEY = re.compile(rf"(?i)(?:^|[^a-z0-9])(?:(?:{_SECRET_NAMES})(?:$|[^a-z0-9])|(?:{_KEY_ONLY_NAMES})$)")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

# Order matters: specific formats before the generic ``key=value`` rule.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host -> keep user, drop password (also redis://:password@host)
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@]*):[^\s@/]+@"), r"\1:" + _MASK + "@"),
    # Authorization: <scheme> <credentials>, whatever the scheme
    (re.compile(r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?)(?:[A-Za-z\-]+\s+)?[^\s\"',;]{4,}"), r"\1" + _MASK),
    # Bearer <token> / Basic <base64> elsewhere: only a credential-looking value (it has a
    # digit or base64 punctuation), so "a basic explanation" stays readable.
    (re.compile(r"(?i)\b(bearer|basic)\s+(?=[A-Za-z._~\-]*[0-9+/=])[A-Za-z0-9\-._~+/]{8,}=*"), r"\1 " + _MASK),
    # OpenAI / Anthropic / generic "sk-" keys, Stripe style keys
    (re.compile(r"\b(?:sk|rk|pk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{8,}"), _MASK),
    (re.compile(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}"), _MASK),
    # AWS access key ids
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{12,}\b"), _MASK),
    # Google API keys
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"), _MASK),
    # GitHub, Slack, Hugging Face tokens
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"), _MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), _MASK),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), _MASK),
    # JSON Web Tokens
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), _MASK),
    # key=value / "key": "value" for secret-looking names
    (
        re.compile(rf"(?i)([\"']?\b(?:{_SECRET_NAMES})\b[\"']?\s*[:=]\s*[\"']?)([^\s\"'&,;}}]{{3,}})"),
        r"\1" + _MASK,
    ),
)


_HINTS = (
    "://",
    "bearer",
    "basic",
    "token",
    "sk-",
    "rk-",
    "pk-",
    "sk_",
    "rk_",
    "pk_",
    "akia",
    "asia",
    "agpa",
    "aida",
    "aroa",
    "aiza",
    "gh",
    "github_pat",
    "xox",
    "hf_",
    "eyj",
    "key",
    "secret",
    "passw",
    "authorization",
)


def redact(text: str) -> str:
    """Return ``text`` with API keys, bearer tokens and passwords masked.

    Cheap when there is nothing to find: a single pass per pattern, no allocation when
    nothing matches.
    """
    if not text:
        return text
    lowered = text.lower()
    # Cheap pre-check (one lower() and a few substring scans, ~20x cheaper than the
    # regexes): every pattern below needs one of these fragments to match.
    if not any(hint in lowered for hint in _HINTS):
        return text
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


@lru_cache(maxsize=4096)
def is_secret_key(name: str) -> bool:
    """Whether a dict key names a secret (``password``, ``api_key``, ``OPENAI_API_KEY``...).

    Redacting each string on its own misses ``{"password": "hunter2"}``: neither string
    looks secret alone. Every place that writes structured data out (checkpoints, traces,
    :func:`redact_obj`) asks this, so they agree on what a secret-named key is.
    """
    return _SECRET_KEY.search(_CAMEL_BOUNDARY.sub("_", name)) is not None


def mask_secret(value: Any) -> Any:
    """``value`` as it is stored under a secret-named key: every string in it masked whole.

    Whole, not pattern by pattern: a password has no recognisable shape, and one with a
    space or a comma in it would otherwise survive from that character on.
    """
    if isinstance(value, str):
        return _MASK
    if isinstance(value, dict):
        return {k: mask_secret(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_secret(v) for v in value]
    return value


def redact_obj(value: Any) -> Any:
    """Redact every string inside a JSON-like structure (dicts, lists, tuples).

    Values under secret-named keys (:func:`is_secret_key`) are masked whole, at any depth.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            k: mask_secret(v) if isinstance(k, str) and is_secret_key(k) else redact_obj(v) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_obj(v) for v in value]
    return value


def mask_url(url: str) -> str:
    """The URL without its password, for titles, events and logs. (``redact`` alone misses
    the usual Redis form ``redis://:password@host``, which has no user name.)"""
    parts = urlsplit(url)
    if parts.password is None:
        return redact(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{_MASK}@{host}"))
