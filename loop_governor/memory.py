"""Governed long-term memory: what may be written to an agent's memory store, once for both frameworks.

Long-term memory is where context poisoning lasts longest: a failed tool result or a
secret saved once is read back into every later run, out of the pruner's reach. crewAI's
``StorageBackend`` wrapper (``crewai_governor.GovernedStorage``) and LangGraph's
``BaseStore`` wrapper (``langchain_governor.GovernedStore``) are thin: each maps its
framework's records onto [`MemoryGuard`][loop_governor.memory.MemoryGuard], which decides here, with no framework
import.

A memory is the user's data, so the filter is as certain as a type error: precision first.

* **failures stay out, and only failures**: a record is dropped when it holds the
  governor's own failure text (either rendering, [`governed_text`][loop_governor.memory.governed_text]: what the model
  was handed for a failed call) or is nothing but a Python traceback
  ([`only_traceback`][loop_governor.memory.only_traceback]). A record that merely mentions an error -- a note quoting a
  traceback, a job record ``{"status": "error"}``, a how-to that starts "Error:" -- is
  kept. A drop is counted, logged and a ``memory_dropped`` event;
* **redaction**: the rule set of every other sink
  ([`loop_governor.redaction.redact_value`][loop_governor.redaction.redact_value]);
* **size**: blobs stripped and long text cut head-and-tail with the pruner's own transforms
  and defaults ([`loop_governor.context.text`][loop_governor.context.text]); nesting deeper than
  [`MAX_DEPTH`][loop_governor.redaction.MAX_DEPTH] is removed. Counted, logged, ``memory_trimmed``;
* **repeats are noticed, never merged**: a record whose content equals one stored under
  another key in the same scope (after whitespace normalization only: numbers, ids,
  quoted values and paths are what make two facts different) is still written under its
  own key, and the other is left alone; it is counted and a ``memory_repeat`` event
  names both keys. A wrapper never writes a record under a key the caller did not give;
* **the backend is governed**: each backend call is ``governor.call("memory:<backend>", ...)``
  (classified, retried, breaker-protected). A failed write degrades to a
  ``memory_save_failed`` event naming the lost keys, a count and a WARNING; a failed read
  raises the typed error like any governed call.

Every drop, trim and lost write is a WARNING of the ``loop_governor`` logger naming the
record's key and the reason ([`loop_governor.memory_log`][loop_governor.memory_log]).

Backend calls run as one-call tasks of their own (outside the caller's task scope): a
memory write is bookkeeping, not a step of the agent, so it must not spend the task's retry
budget, be replayed from or recorded into its checkpoint, or feed its loop guards.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from loop_governor import memory_log
from loop_governor.context.text import head_tail, strip_blobs_text
from loop_governor.errors import AgentToolError
from loop_governor.keys import call_key
from loop_governor.redaction import MAX_DEPTH, redact_value
from loop_governor.scope_vars import _CALL_META, _SCOPE

if TYPE_CHECKING:
    from loop_governor.governor import Governor

T = TypeVar("T")

Reason = Literal["governed_error", "traceback"]
Key = tuple[Hashable, Hashable]  # (scope or namespace, the record's key or id)

# -- the governor's own failure texts ------------------------------------------------------

_TYPES = r"(?:transient|permanent|fatal)"
# GovernedError.to_json_text: {"error":{"message":...,"type":"permanent","outcome":...}},
# also escaped inside another JSON string (\" at any level) and with spaces after the colons.
_JSON_START = re.compile(r'\{\\*"error\\*":\s*\{')
_JSON_TYPE = re.compile(rf'\\*"type\\*":\s*\\*"{_TYPES}\\*"')
# keys only the governor's rendering carries beside "type" (an older one: "retryable")
_JSON_OWN_KEY = re.compile(r'\\*"(?:outcome|retryable|attempts)\\*":')
_JSON_WINDOW = 4000  # the message (<= 500 chars, escaped), the advice and the fields
# GovernedError.to_plain_text: "Error: <message>" then, on the next line, exactly one of
# the governor's classification sentences (a newline may be JSON-escaped as \n). A how-to
# that starts "Error:" has no such line.
_PLAIN = re.compile(
    r"Error: .{0,2000}?(?:\n|\\n)"
    r"(?:Permanent failure|Fatal"
    r"|Temporary failure, (?:retries exhausted after \d+ attempts?|may be retried|not attempted))"
    r"(?:: [^\n]{1,2000}?)?\.?(?=\n|\\n|\\?[\"']|$)",
    re.S,
)


def governed_text(text: str) -> bool:
    """Whether ``text`` holds the governor's model-facing failure text (plain or JSON,
    [`to_model_text`][loop_governor.errors.GovernedError.to_model_text]), anywhere in it: a model
    that relays a failure ("The search said: Error: ...") saves the governor's words."""
    if "rror" not in text:
        return False
    if "Error: " in text and _PLAIN.search(text) is not None:
        return True
    if "error" in text:
        for start in _JSON_START.finditer(text):
            window = text[start.end() : start.end() + _JSON_WINDOW]
            if _JSON_TYPE.search(window) and _JSON_OWN_KEY.search(window):
                return True
    return False


def _governed_mapping(value: Mapping[Any, Any]) -> bool:
    """A parsed rendering: ``{"error": {"type": "permanent", "outcome": ..., ...}}``."""
    error = value.get("error") if len(value) == 1 else None
    return (
        isinstance(error, Mapping)
        and error.get("type") in ("transient", "permanent", "fatal")
        and any(k in error for k in ("outcome", "retryable", "attempts"))
    )


# -- tracebacks ----------------------------------------------------------------------------

_TB_HEAD = "Traceback (most recent call last):"
_TB_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# the line that ends a traceback: the exception's (dotted) class name, then its message
_TB_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?::.*)?")


def only_traceback(text: str) -> bool:
    """Whether ``text`` is a Python traceback and nothing else (chained ones included).

    Frames, code lines and carets are indented; each traceback ends with its exception
    line; between tracebacks only Python's chaining sentences. Any other line (the note
    that quotes the traceback, the explanation after it) makes it a record about an error.
    """
    stripped = text.strip()
    if not stripped.startswith(_TB_HEAD):
        return False
    in_frames = False
    ended = False
    for line in stripped.splitlines():
        if line == _TB_HEAD:
            in_frames, ended = True, False
        elif not line.strip() or line[0] in " \t":
            continue  # a frame, its code, carets, an indented note or detail
        elif in_frames:
            if _TB_EXCEPTION.fullmatch(line) is None:
                return False
            in_frames, ended = False, True
        elif line not in _TB_CHAIN:
            return False
    return ended


# -- what a record holds -------------------------------------------------------------------


def _strings(value: Any) -> Iterator[str]:
    """Every string a record holds, without recursion and at most ``MAX_DEPTH`` deep: the
    values of mappings (keys are names, not content), items of lists and tuples, and the
    ``content``/``message`` text of an object (a message, a ``ToolFailure``)."""
    work: list[tuple[Any, int]] = [(value, 0)]
    while work:
        item, depth = work.pop()
        if isinstance(item, str):
            yield item
        elif depth >= MAX_DEPTH:
            continue
        elif isinstance(item, Mapping):
            work.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            work.extend((v, depth + 1) for v in item)
        elif item is not None and not isinstance(item, (bool, int, float)):
            for name in ("content", "message"):
                text = getattr(item, name, None)
                if isinstance(text, (str, list)):
                    work.append((text, depth + 1))


def _mappings(value: Any) -> Iterator[Mapping[Any, Any]]:
    work: list[tuple[Any, int]] = [(value, 0)]
    while work:
        item, depth = work.pop()
        if depth >= MAX_DEPTH:
            continue
        if isinstance(item, Mapping):
            yield item
            work.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            work.extend((v, depth + 1) for v in item)


def failure_reason(value: Any) -> Reason | None:
    """Why ``value`` (a record's text, a JSON-like record, a message object) must not be
    remembered, or None: ``"governed_error"`` when any string in it is the governor's
    failure text (or it is that JSON, parsed), ``"traceback"`` when every non-blank
    string in it is nothing but a traceback."""
    if isinstance(value, str):
        if governed_text(value):
            return "governed_error"
        return "traceback" if only_traceback(value) else None
    texts = [s for s in _strings(value) if s.strip()]
    if any(governed_text(s) for s in texts) or any(_governed_mapping(m) for m in _mappings(value)):
        return "governed_error"
    if texts and all(only_traceback(s) for s in texts):
        return "traceback"
    return None


def _depth_exceeds(value: Any, limit: int) -> bool:
    work: list[tuple[Any, int]] = [(value, 0)]
    while work:
        item, depth = work.pop()
        if isinstance(item, (Mapping, list, tuple)):
            if depth >= limit:
                return True
            work.extend((v, depth + 1) for v in (item.values() if isinstance(item, Mapping) else item))
    return False


def _spaced(text: str) -> str:
    return " ".join(text.split())


# -- the guard -----------------------------------------------------------------------------

# The pruner's defaults (ContextPruner: trim_threshold=5000, trim_head=1500, trim_tail=1500).
TRIM_THRESHOLD = 5000
TRIM_HEAD = 1500
TRIM_TAIL = 1500
INDEX_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Write:
    """What to do with one record: ``store`` it (``value`` and ``extra`` cleaned, under the
    caller's own key; ``repeat_of``: another key of its scope holding the same content),
    or ``drop`` it (``reason`` says why)."""

    action: Literal["store", "drop"]
    value: Any = None
    extra: Any = None
    reason: Reason | None = None
    repeat_of: Hashable | None = None


@dataclass
class MemoryStats:
    """What a guard kept out or changed since it was built (one per wrapped backend).

    ``dropped``: records not written (failures); ``trimmed``: records written shorter;
    ``lost``: records a failing backend did not take (``save_failures``: the failed
    writes they were in); ``repeats``: records whose content another key of their scope
    already held (written all the same); ``redacted``: records with a secret masked."""

    written: int = 0
    dropped: int = 0
    repeats: int = 0
    redacted: int = 0
    trimmed: int = 0
    save_failures: int = 0
    lost: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _Cuts:
    """What the size rules took from one record, for its log line."""

    blobs: int = 0
    chars: int = 0
    too_deep: bool = False

    def describe(self) -> str:
        parts = []
        if self.chars:
            parts.append(f"long text cut head-and-tail ({self.chars:,} chars removed)")
        if self.blobs:
            parts.append(f"{self.blobs} base64 blob{'s' if self.blobs != 1 else ''} replaced by a placeholder")
        if self.too_deep:
            parts.append(f"nesting deeper than {MAX_DEPTH} levels removed")
        return "; ".join(parts)


class MemoryGuard:
    """The write filter and the governed calls of one wrapped memory backend.

    ``backend`` names it in the governor: its calls are the tool ``memory:<backend>``
    (breaker, retries, ``ToolPolicy`` overrides under that name). ``dedupe=False`` turns
    the repeat count off (no index is kept); ``trim_*`` are the pruner's head-and-tail
    cut. The repeat index is per process, bounded to ``index_size`` records (oldest
    forgotten first).
    """

    def __init__(
        self,
        governor: Governor,
        backend: str,
        *,
        dedupe: bool = True,
        trim_threshold: int = TRIM_THRESHOLD,
        trim_head: int = TRIM_HEAD,
        trim_tail: int = TRIM_TAIL,
        index_size: int = INDEX_SIZE,
    ) -> None:
        if not backend:
            raise ValueError("backend: a non-empty name is required (the tool is 'memory:<backend>')")
        if trim_head < 0 or trim_tail < 0 or trim_threshold < trim_head + trim_tail:
            raise ValueError("trim_threshold: must be >= trim_head + trim_tail (both >= 0)")
        if index_size < 1:
            raise ValueError("index_size: must be >= 1")
        self.governor = governor
        self.backend = backend
        self.tool = f"memory:{backend}"
        self.dedupe = dedupe
        self._trim = (trim_head, trim_tail, trim_threshold)
        self._index_size = index_size
        # (scope, content digest) -> the key last stored with it; (scope, key) -> its digest
        self._index: OrderedDict[tuple[Hashable, str], Hashable] = OrderedDict()
        self._by_id: dict[tuple[Hashable, Hashable], tuple[Hashable, str]] = {}
        self._lock = threading.Lock()
        self.stats = MemoryStats()

    # -- the write filter ----------------------------------------------------------------

    def _clean(self, value: Any, cuts: _Cuts) -> tuple[Any, bool]:
        """``value`` redacted, blobs stripped, long strings cut; and whether a secret was
        masked. The same object when nothing changed."""
        if not isinstance(value, (str, Mapping, list, tuple)):
            return value, False
        if not isinstance(value, str) and _depth_exceeds(value, MAX_DEPTH):
            cuts.too_deep = True
        redacted = redact_value(value)
        head, tail, threshold = self._trim

        def shorten(text: str) -> str:
            stripped = strip_blobs_text(text)
            if stripped is not text:
                cuts.blobs += stripped.count(" data removed: ")
            cut = head_tail(stripped, head, tail, threshold)
            if cut is not stripped:
                cuts.chars += len(stripped) - head - tail
            return cut

        if isinstance(redacted, str):
            return shorten(redacted), redacted is not value
        # a second pass over the redacted value: masked values are the mask itself, unchanged
        return redact_value(redacted, text=shorten), redacted is not value and not cuts.too_deep

    def admit(self, scope: Hashable, key: Hashable, value: Any, *, extra: Any = None) -> Write:
        """Decide one record's write: drop a failure, clean it, notice a repeat.

        ``value`` is the record's content (a string, or a JSON-like value); ``extra`` is
        what else the record carries (crewAI's metadata): cleaned too, and a record whose
        ``extra`` holds the governor's failure text is dropped. ``key`` is the caller's
        key or id: the record is always written under it. The index learns the record at
        once, so a repeat later in the same batch is seen.
        """
        reason = failure_reason(value)
        if reason is None and extra is not None and failure_reason(extra) == "governed_error":
            reason = "governed_error"
        if reason is not None:
            self._count("dropped")
            self._report("memory_dropped", key=str(key), scope=_scope_text(scope), reason=reason)
            return Write("drop", reason=reason)
        cuts = _Cuts()
        cleaned, masked = self._clean(value, cuts)
        cleaned_extra, masked_extra = self._clean(extra, cuts)
        if masked or masked_extra:
            self._count("redacted")
        if cuts.describe():
            self._count("trimmed")
            self._report("memory_trimmed", key=str(key), scope=_scope_text(scope), detail=cuts.describe())
        repeat_of = self._learn(scope, key, cleaned) if self.dedupe else None
        if repeat_of is not None:
            self._count("repeats")
            self._report("memory_repeat", key=str(key), scope=_scope_text(scope), same_as=str(repeat_of))
        return Write("store", cleaned, cleaned_extra, repeat_of=repeat_of)

    def _learn(self, scope: Hashable, key: Hashable, value: Any) -> Hashable | None:
        """Index the record; the other key of its scope that holds the same content, if any."""
        content = _spaced(value) if isinstance(value, str) else redact_value(value, text=_spaced)
        entry = (scope, call_key("", (content,)))  # canonical for any shape, never raises
        with self._lock:
            other = self._index.get(entry)
            old = self._by_id.pop((scope, key), None)
            if old is not None and self._index.get(old) == key:
                del self._index[old]  # this key's older content is gone
            self._index[entry] = key
            self._index.move_to_end(entry)
            self._by_id[(scope, key)] = entry
            while len(self._index) > self._index_size:
                (old_scope, _), old_key = self._index.popitem(last=False)
                self._by_id.pop((old_scope, old_key), None)
        return other if other is not None and other != key else None

    def forget(self, ids: Iterable[tuple[Hashable, Hashable]] | None = None) -> None:
        """The backend deleted records ``(scope, key)``; None: it may have deleted anything."""
        with self._lock:
            if ids is None:
                self._index.clear()
                self._by_id.clear()
                return
            for scope_id in ids:
                entry = self._by_id.pop(scope_id, None)
                if entry is not None and self._index.get(entry) == scope_id[1]:
                    del self._index[entry]

    def forget_ids(self, record_ids: Iterable[Hashable]) -> None:
        """The backend deleted these ids (in whatever scope)."""
        wanted = set(record_ids)
        self.forget([s for s in list(self._by_id) if s[1] in wanted])

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    # -- the governed backend calls ------------------------------------------------------

    def read(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """A backend read (or a user's delete/reset), governed; raises the typed error."""
        with _own_task():
            return self.governor.call(self.tool, fn, *args, **kwargs)

    async def aread(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        with _own_task():
            return await self.governor.acall(self.tool, fn, *args, **kwargs)

    def write(self, fn: Callable[..., Any], /, *args: Any, keys: Sequence[Key] = (), **kwargs: Any) -> bool:
        """A backend write of the records ``keys`` (``(scope, key)`` pairs), governed; a
        failure degrades to an event and a WARNING naming the lost keys (returns False)."""
        try:
            with _own_task():
                self.governor.call(self.tool, fn, *args, **kwargs)
        except AgentToolError as exc:
            self._save_failed(exc, keys)
            return False
        self._count("written", len(keys))
        return True

    async def awrite(
        self, fn: Callable[..., Awaitable[Any]], /, *args: Any, keys: Sequence[Key] = (), **kwargs: Any
    ) -> bool:
        try:
            with _own_task():
                await self.governor.acall(self.tool, fn, *args, **kwargs)
        except AgentToolError as exc:
            self._save_failed(exc, keys)
            return False
        self._count("written", len(keys))
        return True

    def _save_failed(self, exc: AgentToolError, keys: Sequence[Key]) -> None:
        with self._lock:
            self.stats.save_failures += 1
            self.stats.lost += len(keys)
        self.forget(keys)  # the index must not say they are stored
        info = exc.info
        self._report(
            "memory_save_failed",
            records=len(keys),
            keys=[_key_text(scope, key) for scope, key in keys],
            error_type=info.error_type.value,
            signature=info.signature,
            attempts=info.attempts,
        )

    def _report(self, kind: str, **fields: Any) -> None:
        """An event for subscribers and, for a lost or changed record, a WARNING line."""
        self.governor.emit(kind, tool=self.tool, **fields)
        memory_log.log({"event": kind, "tool": self.tool, **fields})


def _key_text(scope: Hashable, key: Hashable) -> str:
    """A record's key as a log line names it: a LangGraph item's namespace and key, a crewAI
    record's id (unique across scopes)."""
    return f"{_scope_text(scope)}/{key}" if isinstance(scope, tuple) else str(key)


def _scope_text(scope: Hashable) -> str:
    return "/".join(str(part) for part in scope) if isinstance(scope, tuple) else str(scope)


@contextlib.contextmanager
def _own_task() -> Iterator[None]:
    """Run the backend call outside the caller's task scope (see the module docstring); its
    events still name the caller's task, so the trace shows the call inside that task."""
    scope = _SCOPE.get()
    token = _SCOPE.set(None)
    meta = _CALL_META.set({**(_CALL_META.get() or {}), "task_id": scope.task_id}) if scope is not None else None
    try:
        yield
    finally:
        if meta is not None:
            _CALL_META.reset(meta)
        _SCOPE.reset(token)


__all__ = ["MemoryGuard", "MemoryStats", "Write", "failure_reason", "governed_text", "only_traceback"]


class Guarded:
    """What a framework's governed memory backend exposes of its [`MemoryGuard`][loop_governor.memory.MemoryGuard]
    (``crewai_governor.GovernedStorage``, ``langchain_governor.GovernedStore``)."""

    guard: MemoryGuard

    @property
    def governor(self) -> Governor:
        return self.guard.governor

    @property
    def stats(self) -> dict[str, int]:
        """Records written, dropped as failures, noticed as repeats, redacted, trimmed,
        lost to a failing backend; failed writes."""
        return self.guard.stats.as_dict()
