"""What "the same call" and "the same result" mean to the loop guards.

A loop rarely repeats byte for byte: a critic's verdict changes its score ("6/10", then
"7/10"), a status line its timestamp, a pager its page number while every page comes
back empty. So the guards compare

* results after the normalization error signatures use (numbers, ids, uuids,
  timestamps, quoted values, paths:
  [`loop_governor.classify.normalize_message`][loop_governor.classify.normalize_message]), computed in two steps because
  it runs on every governed call: a cheap form first (digits dropped, bounded length: C-speed ``bytes.translate``), and
  the full normalization only when two results have the same shape but differ in the cheap form;
* arguments after whitespace and key-order normalization, with arguments that only walk
  through a collection (``page``, ``offset``, ``cursor``...) masked: walking while the
  result stays the same is no progress.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import xxhash

from loop_governor.classify import normalize_message
from loop_governor.keys import call_key

# Arguments that walk through a collection: a new value is no progress by itself.
WALK_KEYS = frozenset(
    {
        "page",
        "page_number",
        "pagenumber",
        "page_no",
        "offset",
        "start",
        "skip",
        "cursor",
        "page_token",
        "pagetoken",
        "next_token",
        "nexttoken",
        "continuation",
        "after",
        "before",
        "since",
        "from",
        "limit",
        "per_page",
        "page_size",
        "pagesize",
    }
)
_WALKING = "<walk>"
_DIGITS = b"0123456789"
_BOUND = 4096  # results longer than this are compared on their head, tail and length


def result_text(result: Any) -> str | None:
    """The text a model reads from a tool result, or None when there is none to compare.

    Duck-typed so the core needs no framework: a ``str``, an object with a ``str``
    ``.content`` (a LangChain ``ToolMessage``), or a mapping with a ``"content"`` string.
    """
    if isinstance(result, str):
        return result
    content = getattr(result, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(result, dict):
        value = result.get("content")
        if isinstance(value, str):
            return value
    return None


def _bounded(text: str) -> str:
    if len(text) <= _BOUND:
        return text
    half = _BOUND // 2
    return f"{text[:half]}\x00{len(text) // 256}\x00{text[-half:]}"


class Fingerprint:
    """A result as the loop guards compare it (see the module docstring)."""

    __slots__ = ("_full", "_named", "cheap", "size", "slack", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        bounded = _bounded(text).encode("utf-8", "surrogatepass")
        stripped = bounded.translate(None, _DIGITS)
        self.cheap = hash(stripped)
        self.size = size = len(stripped)
        # how far another result's size may be from this one's and still normalize equal
        self.slack = size // 8 if size > 128 else 16
        self._full: str | None = None
        self._named: str | None = None

    @property
    def named(self) -> str:
        """Normalized but for names: numbers, ids and timestamps masked, quoted values and
        paths kept (what a revised question's verdict is compared on: a search echoing its
        new query gives a new answer, a critic's new score the same verdict)."""
        if self._named is None:
            text = self.text
            if len(text) <= _BOUND:
                self._named = normalize_message(text, limit=None, keep_names=True)
            else:
                half = _BOUND // 2
                self._named = (
                    f"{normalize_message(text[:half], limit=None, keep_names=True)}\x00{len(text) // 256}\x00"
                    f"{normalize_message(text[-half:], limit=None, keep_names=True)}"
                )
        return self._named

    @property
    def full(self) -> str:
        if self._full is None:
            text = self.text
            if len(text) <= _BOUND:
                self._full = normalize_message(text, limit=None)
            else:
                half = _BOUND // 2
                self._full = (
                    f"{normalize_message(text[:half], limit=None)}\x00{len(text) // 256}\x00"
                    f"{normalize_message(text[-half:], limit=None)}"
                )
        return self._full

    def same_as(self, other: Fingerprint, *, full: bool = True) -> bool:
        """Equal after normalization. ``full=False``: the cheap form only (numbers and
        timestamps aside), for comparisons made on every call whatever the arguments."""
        if self.cheap == other.cheap:
            return True
        if not full or abs(self.size - other.size) > self.slack:
            return False  # not the same shape: no normalization can make them equal
        return self.full == other.full


_SCALARS = frozenset({int, float, bool, type(None)})


def _spaced(text: str) -> str:
    """Whitespace runs collapsed (cheap checks first: tool arguments are often big)."""
    if len(text) < 64 or "  " in text or "\n" in text or "\t" in text or "\r" in text:
        return " ".join(text.split())
    return text.strip()


def _norm(value: Any, walks: list[Any], depth: int = 0) -> Any:
    kind = type(value)
    if kind is str:
        return _spaced(value)
    if kind in _SCALARS:
        return value
    if depth > 8:
        return repr(kind)
    if kind is dict or isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            name = k if type(k) is str else str(k)
            # strings and scalars inline: they are most values, and a call each adds up
            vkind = type(v)
            if vkind is str:
                normed = _spaced(v)
            elif vkind in _SCALARS:
                normed = v
            else:
                normed = _norm(v, walks, depth + 1)
            if name.lower() in WALK_KEYS:
                walks.append((name, normed))
                items.append((name, _WALKING))
            else:
                items.append((name, normed))
        items.sort()
        return tuple(items)
    if isinstance(value, (list, tuple)):
        return tuple([_norm(v, walks, depth + 1) for v in value])
    if isinstance(value, str):
        return _spaced(value)
    if isinstance(value, (int, float)):
        return value
    return repr(value)[:200]


def args_signature(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """``(the normalized arguments with walking ones masked, the walking values)`` as
    hashes: two calls that differ only in where they walk share the first."""
    walks: list[Any] = []
    try:
        masked = hash((_norm(args, walks), _norm(kwargs, walks) if kwargs else ()))
        return masked, hash(tuple(sorted(walks))) if walks else 0
    except Exception:  # a repr or hash that fails, keys that do not sort: the call key's
        return hash(call_key("", args, dict(kwargs))), 0  # canonical form (never raises)


# -- what a call asks about: its entity, and the content it revises ---------------------
#
# Two calls of one tool ask the same question when they are about the same *entity* (an
# order id, a date, a city, a file, a command), whatever *content* they carry (a draft, a
# query, an amount): a critic handed draft v2 after v1 is asked the same question again,
# while a lookup of order 1043 after order 1042 is a new one. No schema says which
# argument is which, so the names and shapes of the arguments decide (see ``_leaf_role``).
# Hand-written: tool arguments come from every framework and from the model, untyped.

# arguments that carry revisable content: a new value is a revision of the same question
_CONTENT_NAMES = frozenset(
    {
        "draft",
        "text",
        "content",
        "body",
        "message",
        "msg",
        "prompt",
        "query",
        "q",
        "question",
        "search",
        "keywords",
        "terms",
        "answer",
        "response",
        "reply",
        "summary",
        "note",
        "notes",
        "comment",
        "comments",
        "feedback",
        "critique",
        "review",
        "revision",
        "translation",
        "essay",
        "article",
        "paragraph",
        "description",
        "reasoning",
        "thought",
        "thoughts",
        "plan",
        "instructions",
        "instruction",
        "explanation",
        "reason",
        "amount",
        "price",
        "total",
        "cost",
        "quantity",
        "qty",
        "expression",
        "expr",
        "formula",
    }
)
_CONTENT_SUFFIXES = (
    "_text",
    "_draft",
    "_message",
    "_body",
    "_content",
    "_query",
    "_prompt",
    "_summary",
    "_note",
    "_comment",
    "_reason",
    "_description",
    "_amount",
    "_price",
    "_total",
)
# arguments that name the thing asked about (an id, a date, a place, a file; a command or a
# script is the question itself): another value is another question
_ENTITY_NAMES = frozenset(
    {
        "id",
        "ids",
        "uuid",
        "key",
        "sku",
        "name",
        "names",
        "email",
        "phone",
        "number",
        "date",
        "dates",
        "day",
        "dob",
        "path",
        "paths",
        "file",
        "files",
        "filename",
        "dir",
        "directory",
        "url",
        "urls",
        "uri",
        "link",
        "symbol",
        "ticker",
        "city",
        "country",
        "region",
        "address",
        "zip",
        "location",
        "origin",
        "destination",
        "user",
        "username",
        "customer",
        "account",
        "order",
        "reservation",
        "flight",
        "product",
        "item",
        "job",
        "ticket",
        "issue",
        "repo",
        "branch",
        "table",
        "command",
        "cmd",
        "script",
        "code",
        "sql",
        "pattern",
        "regex",
        "build",
        "deployment",
        "workflow",
        "pipeline",
        "execution",
        "operation",
    }
)
_ENTITY_SUFFIXES = (
    "_id",
    "id",
    "_ids",
    "_key",
    "_sku",
    "_name",
    "_names",
    "_email",
    "_number",
    "_no",
    "_num",
    "_date",
    "_dates",
    "_day",
    "_path",
    "_file",
    "_url",
    "_uri",
    "_code",
    "_city",
    "_address",
    "_command",
)
ENTITY, CONTENT, NAMED = 1, 2, 3  # NAMED: an entity by its argument's name (``job_id``), not its shape
_BARE_ENTITY_CHARS = 64  # a string without whitespace up to this long names a thing
_NAME_CHARS, _NAME_WORDS = 40, 4  # "New York", "Mia Li": a few words name a thing too


def _name_role(name: str) -> int:
    """The role an argument's name gives its value (0: the name says nothing). Remembered
    per name (a tool's argument names are few, and asked on every repeat-shaped call)."""
    role = _NAME_ROLES.get(name)
    if role is None:
        role = _role_of_name(name)
        if len(_NAME_ROLES) < _NAME_ROLES_KEPT:  # bounded: names in model-made mappings are data
            _NAME_ROLES[name] = role
    return role


_NAME_ROLES: dict[str, int] = {}
_NAME_ROLES_KEPT = 4096


def _role_of_name(name: str) -> int:
    low = name.lower()
    if low in WALK_KEYS:
        return 0
    if low in _CONTENT_NAMES or low.endswith(_CONTENT_SUFFIXES):
        return CONTENT
    if low in _ENTITY_NAMES or low.endswith(_ENTITY_SUFFIXES):
        return NAMED
    return 0


def _value_role(value: Any) -> int:
    """The role of a value whose name says nothing: short strings and whole numbers name
    things (an id, a date, a city, a count of bags: another one is another question), long
    text is content, as are fractional numbers and flags."""
    if isinstance(value, str):
        text = value.strip()
        size = len(text)
        if size <= _BARE_ENTITY_CHARS:
            # split() and isspace() share one definition of whitespace: one word = none inside
            words = len(text.split())
            if words <= 1 or (size <= _NAME_CHARS and "\n" not in text and words <= _NAME_WORDS):
                return ENTITY
        return CONTENT
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return CONTENT
    if isinstance(value, int):
        return ENTITY
    return CONTENT


# a value shaped like an identifier (INV-2024-0001, #W2378156, a date, an email, a uuid) names a
# thing whatever its argument is called: ``lookup(query="INV-2024-0001")`` asks about an invoice
_ID_SHAPED = re.compile(
    r"\A(?:[A-Za-z][A-Za-z0-9]*[-_#]+\d[\w\-#./]*|#[A-Za-z]?\d+|\d{4}-\d{2}-\d{2}[\w:.+\-]*|[^@\s]+@[^@\s]+\.\w+"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\Z",
    re.I,
)
# a timestamp: beside an argument named like an id, one more thing that varies between polls or tries
_TIMESTAMP = re.compile(r"\A\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}")


def _string_role(value: str, role: int) -> int:
    if role == CONTENT and len(value) <= _BARE_ENTITY_CHARS and _ID_SHAPED.match(value.strip()):
        return ENTITY
    return role or _value_role(value)


def _subject_leaves(value: Any, role: int, path: str, out: list[tuple[int, str, Any]], depth: int = 0) -> None:
    kind = type(value)
    if kind is str:
        out.append((_string_role(value, role), path, _spaced(value)))
        return
    if kind in _SCALARS:
        out.append((role or _value_role(value), path, value))
        return
    if depth > 8:
        out.append((CONTENT, path, repr(kind)))
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            name = k if type(k) is str else str(k)
            if name.lower() in WALK_KEYS:
                continue  # a position in a walk: neither the entity nor a revision
            _subject_leaves(v, _name_role(name) or role, f"{path}.{name}", out, depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _subject_leaves(v, role, f"{path}[{i}]", out, depth + 1)
        return
    if isinstance(value, str):
        out.append((_string_role(value, role), path, _spaced(value)))
    elif isinstance(value, (int, float)):
        out.append((role or _value_role(value), path, value))
    else:
        out.append((CONTENT, path, repr(value)[:200]))


def _digest(parts: tuple[tuple[str, str], ...]) -> int:
    """A hash that is the same in every process (``hash()`` of a str is not): failure counts
    keyed on an entity are shared through the store by a fleet."""
    return xxhash.xxh3_64_intdigest(repr(parts).encode("utf-8", "surrogatepass"))


_NOTHING = _digest(())  # no content: most calls


def _leaves(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[tuple[int, str, Any]]:
    """Every argument value as ``(role, path, normalized value)``, walking positions left out.

    Where arguments are named like ids, an unnamed whole number or a timestamp beside them is
    no entity of its own (``job_id="J-1", attempt=3``): an attempt counter, a retry number, a
    time of asking vary between tries of the same question."""
    leaves: list[tuple[int, str, Any]] = []
    for i, value in enumerate(args):
        _subject_leaves(value, 0, _POSITIONS[i] if i < len(_POSITIONS) else f"[{i}]", leaves)
    for name, value in kwargs.items():
        if name.lower() not in WALK_KEYS:
            _subject_leaves(value, _name_role(name), name, leaves)
    for role, _, _ in leaves:
        if role == NAMED:
            return [
                (CONTENT, p, v)
                if role == ENTITY and ((type(v) is int) or (isinstance(v, str) and _TIMESTAMP.match(v)))
                else (role, p, v)
                for role, p, v in leaves
            ]
    return leaves


_POSITIONS = tuple(f"[{i}]" for i in range(16))


def says_only(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call's arguments are nothing but free text (``think(thought=...)``,
    ``log_note(note=...)``): it says something, it acts on nothing (see
    [`loop_governor.policies.fixes`][loop_governor.policies.fixes]). A call without arguments acts
    (``press_brake()``)."""
    leaves = _leaves(args, kwargs)
    return bool(leaves) and all(role == CONTENT and isinstance(v, str) for role, _, v in leaves)


def args_subject(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int]:
    """``(the entity the call asks about, the content it carries)`` as hashes (walking
    positions in neither): two calls with the same entity and other content are a revision
    of one question; with other entities, two questions."""
    try:
        leaves = _leaves(args, kwargs)
        entity = sorted([(p, repr(v)) for role, p, v in leaves if role != CONTENT])
        content = sorted([(p, repr(v)) for role, p, v in leaves if role == CONTENT])
        return _digest(tuple(entity)), _digest(tuple(content)) if content else _NOTHING
    except Exception:  # an argument whose repr or hash fails: compare it by identity
        return hash((id(args), id(kwargs))), 0


def args_entity(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """The first of [`args_subject`][loop_governor.fingerprint.args_subject] alone (what the loop guards compare),
    without digesting the content: equal to ``args_subject(args, kwargs)[0]`` always."""
    try:
        entity = []
        for role, p, v in _leaves(args, kwargs):
            if role != CONTENT:
                entity.append((p, repr(v)))
            elif type(v) is not str:
                repr(v)  # as args_subject does: a repr that fails (a huge int) falls back alike
        entity.sort()
        return _digest(tuple(entity))
    except Exception:
        return hash((id(args), id(kwargs)))


def args_job(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    """The job a poll asks about: its arguments *named* like ids (``job_id``, ``order``), in
    keywords or in a mapping passed positionally (a LangChain tool call's arguments), as one
    hash -- an attempt counter or a timestamp beside them is the same job again. A lone
    positional value shaped like an id names the job too."""
    try:
        leaves = _leaves(args, kwargs)
        named = [(p, repr(v)) for role, p, v in leaves if role == NAMED]
        if not named:
            named = [(p, repr(v)) for role, p, v in leaves if role == ENTITY and isinstance(v, str)]
        return _digest(tuple(sorted(named)))
    except Exception:
        return 0


def content_values(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    """The revisable text values of the arguments (the content of
    [`args_subject`][loop_governor.fingerprint.args_subject])."""
    try:
        leaves = _leaves(args, kwargs)
    except Exception:
        return []
    return [v for role, _, v in leaves if role == CONTENT and isinstance(v, str) and v]


def echoes(result: str, before: str, mine: list[str], theirs: list[str]) -> bool:
    """Whether two answers differ because each repeats its own question (a search that
    echoes its query: ``results for q3`` after ``results for q2``): answers about what was
    asked, not one verdict."""
    return any(len(m) > 1 and m not in theirs and m in result for m in mine) or any(
        len(t) > 1 and t not in mine and t in before for t in theirs
    )


# Shell programs that only read: a command made of nothing else changes nothing, so it cannot
# be the fix of an earlier failure of the same shell tool (an ``echo`` between two failing
# runs of a script is no edit). Hand-written: no library classifies shell commands this way.
_READING_PROGRAMS = frozenset(
    {
        "cat", "ls", "grep", "egrep", "fgrep", "rg", "find", "head", "tail", "wc", "echo", "printf", "pwd",
        "nl", "sort", "uniq", "cut", "diff", "which", "file", "stat", "tree", "true", "test", "cd", "date",
        "whoami", "env", "less", "more", "du", "df", "awk", "sed", "git", "uname", "hostname", "id", "ps",
        "type", "command", "realpath", "dirname", "basename", "md5sum", "sha256sum", "jq", "xxd", "od", "sleep",
    }
)  # fmt: skip
_READING_PIP = frozenset({"list", "show", "freeze", "check", "--version", "-V"})
_READING_GIT = frozenset({"status", "diff", "log", "show", "grep", "blame", "branch", "ls-files", "rev-parse"})
_COMMAND_KEYS = frozenset({"command", "cmd", "script", "shell", "bash", "code"})
_SEGMENTS = re.compile(r"&&|\|\||[;|\n]")
_WRITES = re.compile(r"(?<![0-9&])>(?!\s*/dev/null)|\btee\b|(?:^|\s)-i\b|--in-place|-exec\b|-delete\b")


def command_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The shell command a call runs, when its arguments are one (a ``command`` argument, or
    a lone positional string): None for other tools (or arguments that cannot be read)."""
    try:
        return _command_of(args, kwargs)
    except Exception:
        return None


def _command_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    for name, value in kwargs.items():
        if name.lower() in _COMMAND_KEYS and isinstance(value, str):
            return value
    if len(args) == 1 and not kwargs:
        only = args[0]
        if isinstance(only, str):
            return only
        if isinstance(only, Mapping):
            for name, value in only.items():
                if isinstance(name, str) and name.lower() in _COMMAND_KEYS and isinstance(value, str):
                    return value
    return None


def reads_only(command: str) -> bool:
    """Whether a shell command only reads (``cat f | grep x``, ``sed -n '1,9p' f``, ``git diff``):
    no redirection into a file, no in-place edit, and every program one that reads."""
    if _WRITES.search(command):
        return False
    for segment in _SEGMENTS.split(command):
        words = segment.split()
        if "#" in words:
            words = words[: words.index("#")]  # a comment
        while words and "=" in words[0] and not words[0].startswith("="):
            words = words[1:]  # VAR=value before the program
        if not words:
            continue
        program = words[0].rsplit("/", 1)[-1]
        if words[1:] in (["--version"], ["-V"], ["version"]):
            continue  # any program asked for its version
        if program in ("pip", "pip3") or (program.startswith("python") and words[1:3] == ["-m", "pip"]):
            rest = words[1:] if program.startswith("pip") else words[3:]
            if rest and rest[0] in _READING_PIP:
                continue
            return False
        if program not in _READING_PROGRAMS:
            return False
        if program == "git" and (len(words) < 2 or words[1] not in _READING_GIT):
            return False
    return True


def args_text(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The arguments as text, bounded (None: an argument's repr failed)."""
    try:
        return repr((args, dict(kwargs)))[:8192]
    except Exception:
        return None


def args_shape(text: str) -> int:
    """The arguments' text ([`args_text`][loop_governor.fingerprint.args_text]) with digits dropped and whitespace
    collapsed, as one hash."""
    return hash(" ".join(text.split()).encode("utf-8", "surrogatepass").translate(None, _DIGITS))


_NUMBER = re.compile(r"\d+")
# a number that moves a window: an end of a range ("400,449p", "10:20", "5-9") or one
# that follows a word naming a position ("offset=50", "--page 3", "head -n 40", "+120")
_RANGE_END = re.compile(r"\d+\s*[,:-]\s*$")
_RANGE_START = re.compile(r"^\s*[,:-]\s*\d")
_POSITION = re.compile(
    r"(?:page|offset|start|skip|limit|cursor|from|after|before|lines?|rows?|-n|-c|\+)[\s=:'\"]*$", re.IGNORECASE
)


# a number inside an identifier with separators (INV-2024-0001, SKU-5531, #W2378156) or a
# date (2024-03-01) names a thing; it never walks, whatever precedes it
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9]*[-_#]+\d|\d+[-./]\d+[-./]\d+|#\d")


def _in_identifier(text: str, start: int, end: int) -> bool:
    left, right = start, end
    while left > 0 and (text[left - 1].isalnum() or text[left - 1] in "-_#"):
        left -= 1
    while right < len(text) and (text[right].isalnum() or text[right] in "-_#"):
        right += 1
    return _IDENTIFIER.search(text, left, right) is not None


def walks(before: str, after: str) -> bool:
    """Whether two argument texts that differ only in numbers differ only in numbers
    that walk (a range or a position moves) -- ``sed -n '400,449p' f`` then ``'450,499p'``
    -- rather than in ones that name another thing (``file2.py``, ``user 17``, an id with
    separators such as ``INV-2024-0001``, a date)."""
    old, new = list(_NUMBER.finditer(before)), list(_NUMBER.finditer(after))
    if len(old) != len(new):
        return False
    moved = False
    for a, b in zip(old, new, strict=True):
        if a.group() == b.group():
            continue
        moved = True
        if _in_identifier(after, b.start(), b.end()):
            return False
        head, tail = after[max(0, b.start() - 16) : b.start()], after[b.end() : b.end() + 4]
        if not (_RANGE_END.search(head) or _RANGE_START.search(tail) or _POSITION.search(head)):
            return False
    return moved
