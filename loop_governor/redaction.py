"""Secret redaction for anything that leaves the process: model text, traces, checkpoints.

Error messages from HTTP clients routinely echo the request URL, headers or body, and
with them API keys and passwords. The governor puts error text in front of the model and
into traces, so every such text passes through [`redact`][loop_governor.redaction.redact] first, and structured data
(checkpoints, trace records) through [`is_secret_key`][loop_governor.redaction.is_secret_key] /
[`mask_secret`][loop_governor.redaction.mask_secret] as well: one rule set for every sink. No library covers the
provider key formats and the ``name=value`` shapes we see in agent tools (URLs, headers, env files, JSON nested in JSON
strings), hence the hand-written rules.

Each rule carries the lower-case fragments its match needs; a rule whose fragments are
absent from the text is skipped, so text with nothing to find costs one ``lower()`` and a
few substring scans.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from loop_governor.keys import model_json

_MASK = "[REDACTED]"

# --- secret names -------------------------------------------------------------------------

# Names of secrets, as a word of a key ("password", "db_password", "x-api-key"): the one list
# behind :func:`is_secret_key` (dict keys in traces and checkpoints) and the ``name=value``
# rule for text below.
_SECRET_NAMES = (
    r"api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|auth[_-]?token|id[_-]?token|"
    r"secret(?:[_-]?key)?|client[_-]?secret|password|passwd|passphrase|x-api-key|session[_-]?token|"
    r"security[_-]?token|aws[_-]?secret[_-]?access[_-]?key"
)
# As a dict key these count too when they end the key ("Authorization", "ssh_private_key",
# "PGPASSWORD", "basic_auth", "Set-Cookie"), though as a word anywhere in free text they
# would mask ordinary prose. Not "..._token" or "pwd": tool results carry pagination cursors
# ("next_token", "page_token") and working directories ("pwd"), and masking them would
# change what a resumed call returns; real token formats (ghp_, sk-, JWTs...) are caught by
# the value patterns anyway.
_KEY_ONLY_NAMES = (
    r"(?:authorization|private[_-]?key|access[_-]?key|cookies?|credentials?|auth|pass)$|"
    r"[a-z0-9]*(?:password|passwd|secret)$"
)
# A name counts anywhere in a key between separators ("db_password", "OPENAI_API_KEY",
# "x-api-key"); camelCase is split into words first ("userPassword" -> "user_Password").
# "token" alone is a credential far more often than a cursor (``login(user, password,
# token)``); the cursors name themselves: "next_token", "page_token", "cursor".
_SECRET_KEY = re.compile(rf"(?i)^token$|(?:^|[^a-z0-9])(?:(?:{_SECRET_NAMES})(?:$|[^a-z0-9])|(?:{_KEY_ONLY_NAMES}))")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Environment-style names in free text: "GITHUB_TOKEN=", "MYSQL_PWD=", "REDISCLI_AUTH=".
# Upper case only: "next_token=" in a tool result is a pagination cursor; "PWD=" alone is
# the shell's working directory.
_ENV_NAME = re.compile(r"(?:[A-Z][A-Z0-9]*_)+(?:TOKEN|PASS|PWD|AUTH)|TOKEN")
# Names whose unquoted value runs to the end of the line ("Cookie: a=1; b=2").
_LINE_VALUE_NAMES = frozenset({"cookie", "set-cookie", "cookie2", "set-cookie2"})

_KEY_CACHE_MAX_CHARS = 128  # longer names are judged uncached: the cache stays ~4096 x 128 chars


@lru_cache(maxsize=4096)
def _is_secret_key_cached(name: str) -> bool:
    return _SECRET_KEY.search(_CAMEL_BOUNDARY.sub("_", name)) is not None


def is_secret_key(name: str) -> bool:
    """Whether a dict key names a secret (``password``, ``api_key``, ``OPENAI_API_KEY``...).

    Redacting each string on its own misses ``{"password": "hunter2"}``: neither string
    looks secret alone. Every place that writes structured data out (checkpoints, traces,
    [`redact_obj`][loop_governor.redaction.redact_obj]) asks this, so they agree on what a secret-named key is.
    """
    if len(name) > _KEY_CACHE_MAX_CHARS:
        return _SECRET_KEY.search(_CAMEL_BOUNDARY.sub("_", name)) is not None
    return _is_secret_key_cached(name)


# --- rules ----------------------------------------------------------------------------------


class _Rule(NamedTuple):
    hints: tuple[str, ...]  # lower-case fragments, one of which any match contains
    apply: Callable[[str], str]
    scan_alone: bool = False  # its regex scans faster than the fragments are looked up


# "\bAKIA..." written as "AKIA(?<!\w....)...": the same match, but a pattern that starts with
# a literal lets the regex engine skip through the text at memchr speed (~30 us per 100 KB
# instead of ~1.5 ms), cheaper than even a substring pre-check; such rules run unchecked on
# long texts (scan_alone).
_AFTER_4 = r"(?<![A-Za-z0-9_]....)"


def _sub(pattern: str, repl: str, flags: int = 0) -> Callable[[str], str]:
    compiled = re.compile(pattern, flags)
    return lambda text: compiled.sub(repl, text)


# PEM private keys (RSA, EC, OpenSSH, encrypted PKCS#8, PGP): the whole block goes, also
# when the text was cut before its END line or carries it JSON-escaped ("\n" as two chars).
_PEM_BEGIN = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----")
_PEM_BODY = re.compile(r"[A-Za-z0-9+/=\s\\:,.\-]*")
_PEM_MAX = 64 * 1024


def _splice(
    text: str, pattern: re.Pattern[str], edit: Callable[[str, re.Match[str]], tuple[int, int, str] | None]
) -> str:
    """``text`` with a span per match of ``pattern`` replaced, as ``edit`` decides: it returns
    ``(start, stop, replacement)`` or None to leave the match alone. A match inside a span
    already replaced is skipped; the same object comes back when nothing changed."""
    out: list[str] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() < pos:
            continue
        span = edit(text, m)
        if span is None:
            continue
        start, stop, replacement = span
        out.append(text[pos:start])
        out.append(replacement)
        pos = stop
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


def _pem_span(text: str, m: re.Match[str]) -> tuple[int, int, str]:
    label = m.group(1)
    end_marker = f"-----END {label}-----"
    end = text.find(end_marker, m.end(), m.end() + _PEM_MAX)
    if end >= 0:
        stop = end + len(end_marker)
    else:
        body = _PEM_BODY.match(text, m.end())
        stop = body.end() if body else m.end()
    return m.start(), stop, f"-----BEGIN {label}-----{_MASK}-----END {label}-----"


def _redact_pem(text: str) -> str:
    return _splice(text, _PEM_BEGIN, _pem_span)


# scheme://user:password@host -> keep user and host, drop the password. The password may hold
# "@" and "/" (users paste them unencoded): it runs to the last "@" that a plain host follows.
# A user may be empty (redis://:pw@host) or an e-mail address; "host:8080/..." is a port.
_URL_USERINFO = (
    r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/?#\"'<>\\]*):"
    r"(?!\d{1,5}(?:[/?#\s\"'<>\\]|$))"
    r"[^\s\"'<>?#]{1,256}@(?=[^\s\"'<>@/?#\\]*(?:[/?#\s\"'<>\\]|$))"
)

# Query and fragment parameters that carry credentials in signed or keyed URLs (S3/GCS
# presigned URLs, Azure SAS "sig", Google "key", OAuth implicit-flow fragments, session ids).
# Names that are secrets anywhere (access_token, api_key, client_secret...) are caught by
# the name=value rule below; these are secrets only as URL parameters.
_QUERY_PARAM = (
    r"(?i)([?&#;](?:token|key|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token"
    r"|x-goog-signature|x-goog-credential|awsaccesskeyid|googleaccessid|jsessionid|phpsessid|sessionid)=)"
    r"(?!\[REDACTED\])[^&#\s\"'<>\\]+"
)

# name=value, "name": "value", NAME: value, \"name\": \"value\" (JSON inside a JSON string).
# The regex only finds candidates (a secret-ish word at the end of a name, then a separator);
# _redact_pairs reads the whole name and decides with is_secret_key, so text and dict keys
# agree. Quoted values are masked to their real closing quote, whatever they contain
# (spaces, commas, semicolons, escaped quotes, at any JSON nesting level).
_PAIR = re.compile(r"(?i)((?:pass|secret|key|token|auth|pwd|credential|cookie)[\w.\-]*)(\\*[\"'])?[ \t]*([:=])[ \t]*")
_NAME_CHARS = frozenset("_.-")
_OPEN_QUOTE = re.compile(r"(\\*)([\"'])")
_BARE_VALUE = re.compile(r"(?:[^\s\"'&,;}\])<>\\]|\\(?![nrt\"'\\]))+")
_LINE_VALUE = re.compile(r"(?:[^\r\n\"'\\]|\\(?![nr\"']))+")
_JSON_LITERALS = frozenset({"null", "true", "false", "none"})
# "name: value" is also how prose reads ("auth: failed", "credentials: invalid"): there
# only a real secret word counts, not the dict-key-only endings.
_COLON_NAME = re.compile(
    rf"(?:^|[^a-z0-9])(?:{_SECRET_NAMES})(?:$|[^a-z0-9])|(?:password|passwd|secret|cookie2?|private[_-]?key)$", re.I
)


def _name_start(text: str, end: int) -> int:
    """Where the name ending at ``end`` starts (names: letters, digits, ``_ . -``)."""
    start = end
    limit = max(0, end - 64)
    while start > limit and (text[start - 1].isalnum() or text[start - 1] in _NAME_CHARS):
        start -= 1
    return start


def _closing_quote(text: str, start: int, quote: str, level: int) -> int:
    """Index of the backslash run + quote closing a string whose content starts at ``start``.

    At nesting level k (k backslashes before the opening quote: 0 plain JSON, 1 JSON in a
    JSON string, 3 one deeper) the closing quote has a backslash run r with
    r % (2k + 2) == k; a literal quote inside has 2k + 1. -1 when the text ends first.
    """
    i = start
    while True:
        i = text.find(quote, i)
        if i < 0:
            return -1
        run = 0
        while i - run - 1 >= start and text[i - run - 1] == "\\":
            run += 1
        if run % (2 * level + 2) == level:
            return i - level
        i += 1


def _is_secret_pair_name(name: str, quoted: bool, sep: str) -> bool:
    if _ENV_NAME.fullmatch(name) is not None:
        return True
    if quoted or sep == "=":
        return is_secret_key(name)
    return _COLON_NAME.search(_CAMEL_BOUNDARY.sub("_", name)) is not None


def _pair_span(text: str, m: re.Match[str]) -> tuple[int, int, str] | None:
    """The value of a secret-named pair found by ``_PAIR``, to mask; None if it is no secret."""
    name = text[_name_start(text, m.start()) : m.end(1)].strip(".-")
    sep = m.group(3)
    if not name or not _is_secret_pair_name(name, m.group(2) is not None, sep):
        return None
    value_start = m.end()
    if text.startswith(_MASK, value_start):
        return None
    quote = _OPEN_QUOTE.match(text, value_start)
    if quote is not None:
        inner = quote.end()
        close = _closing_quote(text, inner, quote.group(2), len(quote.group(1)))
        if close == inner:
            return None  # an empty string: nothing to hide
        return inner, len(text) if close < 0 else close, _MASK
    line = name.lower() in _LINE_VALUE_NAMES
    bare = (_LINE_VALUE if line else _BARE_VALUE).match(text, value_start)
    if bare is None:
        return None
    value = bare.group(0).rstrip() if line else bare.group(0)
    if value.lower() in _JSON_LITERALS or (sep == ":" and not line and len(value) < 3):
        return None
    return value_start, value_start + len(value), _MASK


def _redact_pairs(text: str) -> str:
    return _splice(text, _PAIR, _pair_span)


# Order matters: whole blocks and URLs before headers, specific formats before name=value.
_RULES: tuple[_Rule, ...] = (
    _Rule(("private key",), _redact_pem),
    _Rule(("://",), _sub(_URL_USERINFO, r"\1:" + _MASK + "@")),
    _Rule(("token=", "key=", "sig=", "signature=", "credential=", "id="), _sub(_QUERY_PARAM, r"\1" + _MASK)),
    # Authorization: <scheme> <credentials>, whatever the scheme
    _Rule(
        ("authorization",),
        _sub(
            r"(?i)(\bauthorization\\*[\"']?\s*[:=]\s*\\*[\"']?)(?:[A-Za-z\-]+\s+)?(?!\[REDACTED\])[^\s\"',;\\]{4,}",
            r"\1" + _MASK,
        ),
    ),
    # Bearer <token> / Basic <base64> elsewhere: only a credential-looking value (it has a
    # digit or base64 punctuation), so "a basic explanation" stays readable.
    _Rule(
        ("bearer", "basic"),
        _sub(r"(?i)\b(bearer|basic)\s+(?=[A-Za-z._~\-]*[0-9+/=])[A-Za-z0-9\-._~+/]{8,}=*", r"\1 " + _MASK),
    ),
    # OpenAI / Anthropic / generic "sk-" keys, Stripe style keys
    _Rule(("k-",), _sub(r"\b(?:sk|rk|pk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{8,}", _MASK)),
    _Rule(("k_",), _sub(r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{8,}", _MASK)),
    # AWS access key ids
    _Rule(
        ("akia", "asia", "agpa", "aida", "aroa"),
        _sub(rf"(?:AKIA|ASIA|AGPA|AIDA|AROA){_AFTER_4}[A-Z0-9]{{12,}}\b", _MASK),
        scan_alone=True,
    ),
    # Google API keys and OAuth access tokens
    _Rule(("aiza",), _sub(rf"AIza{_AFTER_4}[0-9A-Za-z_\-]{{30,}}", _MASK), scan_alone=True),
    _Rule(("ya29.",), _sub(r"\bya29\.[0-9A-Za-z_\-]{20,}", _MASK)),
    # GitHub, GitLab, Slack, Hugging Face tokens
    _Rule(
        ("gh", "github_pat_"),
        _sub(rf"gh[pousr]_{_AFTER_4}[A-Za-z0-9]{{20,}}|github_pat_(?<![A-Za-z0-9_].{{11}})[A-Za-z0-9_]{{20,}}", _MASK),
        scan_alone=True,
    ),
    _Rule(("glpat-",), _sub(r"\bglpat-[A-Za-z0-9_\-]{20,}", _MASK)),
    _Rule(("xox",), _sub(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}", _MASK)),
    _Rule(("hf_",), _sub(r"\bhf_[A-Za-z0-9]{20,}", _MASK)),
    # JSON Web Tokens
    _Rule(("eyj",), _sub(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", _MASK)),
    # name=value / "name": "value" for secret-named keys
    _Rule(("pass", "secret", "key", "token", "auth", "pwd", "credential", "cookie"), _redact_pairs),
)


# Every fragment any rule needs, as one regex: for short strings (tool names, call keys,
# task ids: most strings a trace record holds) one search beats a scan per fragment.
_ANY_HINT = re.compile("|".join(re.escape(hint) for rule in _RULES for hint in rule.hints))
_SHORT = 128


def redact(text: str) -> str:
    """Return ``text`` with API keys, tokens, passwords, cookies and private keys masked.

    Cheap when there is nothing to find: one ``lower()`` and a substring scan per rule,
    and the same object back when nothing matched.
    """
    if not text:
        return text
    lowered = text.lower()
    if len(text) <= _SHORT and _ANY_HINT.search(lowered) is None:
        return text
    short = len(text) <= _SHORT
    for rule in _RULES:
        if rule.scan_alone and not short:
            text = rule.apply(text)
            continue
        for hint in rule.hints:
            if hint in lowered:
                text = rule.apply(text)
                break
    return text


# Nesting deeper than this is no record anyone reads; a cycle nests forever. Deeper
# containers are replaced by TOO_DEEP, so redaction never recurses past the interpreter's
# limit (a RecursionError would escape into the agent, or a secret past a sink).
MAX_DEPTH = 64
TOO_DEEP = "[nested too deeply: removed]"


def mask_secret(value: Any, _depth: int = MAX_DEPTH) -> Any:
    """``value`` as it is stored under a secret-named key: every string in it masked whole.

    Whole, not pattern by pattern: a password has no recognisable shape, and one with a
    space or a comma in it would otherwise survive from that character on.
    """
    if isinstance(value, str):
        return _MASK
    if isinstance(value, (dict, list, tuple)) and _depth <= 0:
        return TOO_DEEP
    if isinstance(value, dict):
        return {k: mask_secret(v, _depth - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_secret(v, _depth - 1) for v in value]
    return value


def redact_obj(value: Any, _depth: int = MAX_DEPTH) -> Any:
    """Redact every string inside a JSON-like structure (dicts, lists, tuples).

    Values under secret-named keys ([`is_secret_key`][loop_governor.redaction.is_secret_key]) are masked whole, at any
    depth (containers nested deeper than [`MAX_DEPTH`][loop_governor.redaction.MAX_DEPTH] become
    [`TOO_DEEP`][loop_governor.redaction.TOO_DEEP]).
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, (dict, list, tuple)) and _depth <= 0:
        return TOO_DEEP
    if isinstance(value, dict):
        return {
            k: mask_secret(v, _depth - 1) if isinstance(k, str) and is_secret_key(k) else redact_obj(v, _depth - 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_obj(v, _depth - 1) for v in value]
    return value


def redact_value(value: Any, *, objects: bool = False, text: Callable[[str], str] = redact) -> Any:
    """[`redact_obj`][loop_governor.redaction.redact_obj] that keeps the shape: a tuple stays a tuple, any mapping comes
    back a dict with the same keys, and the very same object comes back when nothing in
    it changed (callers count redactions by identity). For values handed back to the
    user (``FatalError.partial_results``, memory records).

    ``objects=True``: an object that is none of these is handed back as its redacted
    JSON form (a pydantic model's ``model_dump``, a dataclass's fields) or its redacted
    ``str()``, since its attributes may hold a secret; otherwise it is left as it is.
    Containers deeper than [`MAX_DEPTH`][loop_governor.redaction.MAX_DEPTH] (or a cycle) become
    [`TOO_DEEP`][loop_governor.redaction.TOO_DEEP]. ``text`` redacts each string (a
    [`TextMemo`][loop_governor.redaction.TextMemo] for values that repeat).
    """
    return _redact_shaped(value, objects, MAX_DEPTH, text)


def _mask_shaped(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return _MASK
    if isinstance(value, (Mapping, list, tuple)):
        if depth <= 0:
            return TOO_DEEP
        if isinstance(value, Mapping):
            return {k: _mask_shaped(v, depth - 1) for k, v in value.items()}
        items = [_mask_shaped(v, depth - 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _redact_shaped(value: Any, objects: bool, depth: int, text: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        if depth <= 0:
            return TOO_DEEP
        changed = not isinstance(value, dict)
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and is_secret_key(k) and v is not None:
                nv = _mask_shaped(v, depth - 1)
            else:
                nv = _redact_shaped(v, objects, depth - 1, text)
            changed = changed or nv is not v
            out[k] = nv
        return out if changed else value
    if isinstance(value, (list, tuple)):
        if depth <= 0:
            return TOO_DEEP
        items = [_redact_shaped(v, objects, depth - 1, text) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    if not objects or value is None or isinstance(value, (bool, int, float)):
        return value
    if depth <= 0:
        return TOO_DEEP
    return _redact_shaped(_object_form(value), objects, depth - 1, text)


def _object_form(value: Any) -> Any:
    """An arbitrary object as the JSON-like value redaction can read."""
    dumped = model_json(value)
    if dumped is not None:
        return dumped
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__qualname__}>"


class TextMemo:
    """[`redact`][loop_governor.redaction.redact] memoized for strings that repeat (tool names, task ids, the messages
    a conversation re-sends every turn), bounded in bytes: when full it starts over, which
    costs one redaction per string and keeps the hit path a plain ``dict.get``. Strings
    longer than ``max_chars`` are redacted each time and not kept. Not thread-safe beyond
    what a ``dict`` is: a lost entry is only redacted again."""

    __slots__ = ("_budget", "_bytes", "_max_chars", "_memo")

    def __init__(self, budget: int, max_chars: int = 256) -> None:
        self._memo: dict[str, str] = {}
        self._bytes = 0
        self._budget = budget
        self._max_chars = max_chars

    @property
    def bytes(self) -> int:
        """Estimated bytes the memo holds (<= the budget)."""
        return self._bytes

    def __call__(self, value: str) -> str:
        hit = self._memo.get(value)
        if hit is not None:
            return hit
        out = redact(value)
        if len(value) <= self._max_chars:
            # the key, the value when it is a new string, and the dict slot
            size = sys.getsizeof(value) + (0 if out is value else sys.getsizeof(out)) + 64
            if self._bytes + size > self._budget:
                self._memo.clear()
                self._bytes = 0
            if size <= self._budget:
                self._memo[value] = out
                self._bytes += size
        return out


def mask_url(url: str) -> str:
    """The URL without its password, for titles, events and logs (also ``redis://:pw@host``
    and passwords holding ``@`` or ``/``, which ``urlsplit`` misreads)."""
    return redact(url)


def refuse_ambiguous_password(url: str) -> None:
    """Refuse a URL whose password holds an unencoded ``/``, ``?`` or ``#``.

    URL parsers end the host part at the first of those, so redis-py would connect to a
    host named after the rest of the password and echo it in every connection error (and
    so into traces). The message does not repeat the URL: it holds the password.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() in ("redis", "rediss") and "@" in f"{parts.path}?{parts.query}#{parts.fragment}":
        raise ValueError(
            "the Redis URL's password holds '/', '?' or '#' (or a '@' follows the host): "
            "percent-encode the password (%2F, %3F, %23, %40)"
        )
