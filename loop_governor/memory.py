"""Governed long-term memory: what may be written to an agent's memory store, once for both frameworks.

Long-term memory is where context poisoning lasts longest: a failed tool result, a retried
error or a secret saved once is read back into every later run, out of the pruner's reach.
crewAI's ``StorageBackend`` wrapper (``crewai_governor.GovernedStorage``) and LangGraph's
``BaseStore`` wrapper (``langchain_governor.GovernedStore``) are thin: each maps its
framework's records onto [`MemoryGuard`][loop_governor.memory.MemoryGuard], which decides here, with no framework
import:

* **failures stay out**: the governor's error JSON, a raw Python traceback, or a result a
  framework marked failed (``status == "error"``, crewAI's "Error executing tool", a
  ``ToolFailure``) is not written; it is counted and a ``memory_dropped`` event says why;
* **redaction**: the rule set of every other sink ([`loop_governor.redaction`][loop_governor.redaction]);
* **repeats are stored once**: records equal after the normalization error signatures use
  ([`loop_governor.classify.normalize_message`][loop_governor.classify.normalize_message]: numbers, ids, timestamps,
  quoted values, paths) are one record per scope; the newer one updates the older (same id or key);
* **size**: blobs stripped and long text cut head-and-tail with the pruner's own transforms
  and defaults ([`loop_governor.context.text`][loop_governor.context.text]);
* **the backend is governed**: each backend call is ``governor.call("memory:<backend>", ...)``
  (classified, retried, breaker-protected). A failed write degrades to a ``memory_save_failed``
  event and a count; a failed read raises the typed error like any governed call.

Backend calls run as one-call tasks of their own (outside the caller's task scope): a
memory write is bookkeeping, not a step of the agent, so it must not spend the task's retry
budget, be replayed from or recorded into its checkpoint, or feed its loop guards.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from loop_governor.classify import normalize_message

# The error shapes agents actually see as tool results: the governor's JSON, crewAI's "Error
# executing tool", LangGraph's "Error: ..." -- the list the pruner's health figure judges by.
from loop_governor.context.health import _ERROR_PREFIXES as _FAILED_PREFIXES
from loop_governor.context.text import digest, head_tail, map_strings, strip_blobs_text
from loop_governor.errors import AgentToolError
from loop_governor.redaction import is_secret_key, mask_secret, redact
from loop_governor.scope_vars import _CALL_META, _SCOPE

if TYPE_CHECKING:
    from loop_governor.governor import Governor

T = TypeVar("T")

Reason = Literal["governed_error", "traceback", "failed_result"]

# The governor's model-facing JSON (GovernedError.to_model_text), also when it sits escaped
# inside another JSON string (a tool result quoted into a record).
# Whatever its key order (it opens with the tool's message).
_GOVERNED_JSON = re.compile(
    r'\{\\*"error\\*":\s*\{.{0,4000}?\\*"type\\*":\s*\\*"(?:transient|permanent|fatal)\\*"', re.S
)
# ... and its plain-text rendering (the default): "Error: <message>" and the classification line.
_GOVERNED_TEXT = re.compile(r"Error: .{0,4000}?\n(?:Temporary failure|Permanent failure|Fatal)(?:, [^:\n]*)?: ", re.S)
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):|^\s*File \"[^\"\n]+\", line \d+, in ", re.M)
# Keys a record carries its own failure mark under.
_STATUS_KEYS = ("status", "tool_status")

# The pruner's defaults (ContextPruner: trim_threshold=5000, trim_head=1500, trim_tail=1500).
TRIM_THRESHOLD = 5000
TRIM_HEAD = 1500
TRIM_TAIL = 1500
INDEX_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Write:
    """What to do with one record: ``store`` it (``value`` is the cleaned content), ``update``
    the older identical record ``existing`` with it, or ``drop`` it (``reason`` says why)."""

    action: Literal["store", "update", "drop"]
    value: Any = None
    existing: Hashable | None = None
    reason: Reason | None = None


@dataclass
class MemoryStats:
    """What a guard kept out or changed since it was built (one per wrapped backend)."""

    written: int = 0
    dropped: int = 0
    repeats: int = 0
    redacted: int = 0
    trimmed: int = 0
    save_failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def failure_reason(value: Any) -> Reason | None:
    """Why ``value`` (a record's text, or a JSON-like record) must not be remembered, or None.

    Strings: the governor's error JSON anywhere in them, a Python traceback, or a text that
    starts like a failed tool result. Mappings: a failure mark (``"status": "error"``) or any
    string inside that is one of the above. Objects: a ``ToolFailure``-like object (has
    ``message`` and ``reason`` attributes) or a LangChain-like message with ``status="error"``.
    """
    if isinstance(value, str):
        if "error" in value and _GOVERNED_JSON.search(value):
            return "governed_error"
        if "Error: " in value and _GOVERNED_TEXT.search(value):
            return "governed_error"
        if ("Traceback" in value or 'File "' in value) and _TRACEBACK.search(value):
            return "traceback"
        if value.lstrip()[:24].startswith(_FAILED_PREFIXES):
            return "failed_result"
        return None
    if isinstance(value, Mapping):
        for key in _STATUS_KEYS:
            if value.get(key) == "error":
                return "failed_result"
        for item in value.values():
            reason = failure_reason(item)
            if reason is not None:
                return reason
        return None
    if isinstance(value, (list, tuple)):
        for item in value:
            reason = failure_reason(item)
            if reason is not None:
                return reason
        return None
    if getattr(value, "status", None) == "error":
        return "failed_result"
    message = getattr(value, "message", None)
    if isinstance(message, str) and hasattr(value, "reason"):
        return "failed_result"  # crewAI's ToolFailure (and the governor's GovernedToolFailure)
    content = getattr(value, "content", None)
    return failure_reason(content) if isinstance(content, (str, list)) else None


def _redact_value(value: Any) -> Any:
    """[`redact_obj`][loop_governor.redaction.redact_obj] that returns the same object when nothing
    changed (the guard counts redactions by identity) and keeps tuples as tuples."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        changed = False
        out: dict[Any, Any] = {}
        for k, v in value.items():
            nv = mask_secret(v) if isinstance(k, str) and is_secret_key(k) and v is not None else _redact_value(v)
            changed = changed or nv != v
            out[k] = nv
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [_redact_value(v) for v in value]
        if not any(a is not b for a, b in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


class MemoryGuard:
    """The write filter and the governed calls of one wrapped memory backend.

    ``backend`` names it in the governor: its calls are the tool ``memory:<backend>``
    (breaker, retries, ``ToolPolicy`` overrides under that name). ``dedupe`` turns the
    repeat filter off; ``trim_*`` are the pruner's head-and-tail cut. The repeat index is
    per process, bounded to ``index_size`` records (oldest forgotten first).
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
        # (scope, normalized digest) -> id of the record stored for it; and the reverse.
        self._index: OrderedDict[tuple[Hashable, str], Hashable] = OrderedDict()
        self._by_id: dict[tuple[Hashable, Hashable], tuple[Hashable, str]] = {}
        self._lock = threading.Lock()
        self.stats = MemoryStats()

    # -- the write filter ----------------------------------------------------------------

    def clean_text(self, text: str) -> str:
        """``text`` redacted, blobs stripped, cut head-and-tail; the same object when unchanged."""
        out = redact(text)
        if out is not text:
            self._count("redacted")
        stripped = strip_blobs_text(out)
        head, tail, threshold = self._trim
        cut = head_tail(stripped, head, tail, threshold)
        if cut is not out:
            self._count("trimmed")
        return cut

    def clean_value(self, value: Any) -> Any:
        """A JSON-like record cleaned: secret-named keys masked, every string as
        [`clean_text`][loop_governor.memory.MemoryGuard.clean_text]."""
        redacted = _redact_value(value)
        if redacted is not value:
            self._count("redacted")
        head, tail, threshold = self._trim
        cut = map_strings(redacted, lambda s: head_tail(strip_blobs_text(s), head, tail, threshold))
        if cut is not redacted:
            self._count("trimmed")
        return cut

    def admit(self, scope: Hashable, record_id: Hashable, value: Any, *, check: Any = None) -> Write:
        """Decide one record's write: drop a failure, clean it, find an older identical one.

        ``value`` is the record's content (a string, or a JSON-like value); ``check`` is
        anything else the failure filter should look at (metadata, the original object).
        The index learns the record at once, so a repeat later in the same batch is seen.
        """
        reason = failure_reason(value) or (failure_reason(check) if check is not None else None)
        if reason is not None:
            self._count("dropped")
            self.governor.emit("memory_dropped", tool=self.tool, reason=reason, scope=_scope_text(scope))
            return Write("drop", reason=reason)
        cleaned = self.clean_text(value) if isinstance(value, str) else self.clean_value(value)
        if not self.dedupe:
            return Write("store", cleaned)
        key = (scope, _repeat_digest(cleaned))
        with self._lock:
            existing = self._index.get(key)
            if existing is not None and existing != record_id:
                self._index.move_to_end(key)
                repeat = True
            else:
                self._remember(key, record_id)
                repeat = False
        if repeat:
            self._count("repeats")
            self.governor.emit("memory_repeat", tool=self.tool, scope=_scope_text(scope), updates=str(existing))
            return Write("update", cleaned, existing=existing)
        return Write("store", cleaned)

    def _remember(self, key: tuple[Hashable, str], record_id: Hashable) -> None:
        old = self._by_id.pop((key[0], record_id), None)
        if old is not None:
            self._index.pop(old, None)  # the record's content changed: its old form is gone
        self._index[key] = record_id
        self._by_id[(key[0], record_id)] = key
        while len(self._index) > self._index_size:
            (scope, _), rid = self._index.popitem(last=False)
            self._by_id.pop((scope, rid), None)

    def forget(self, ids: Iterable[tuple[Hashable, Hashable]] | None = None) -> None:
        """The backend deleted records ``(scope, id)``; None: it may have deleted anything."""
        with self._lock:
            if ids is None:
                self._index.clear()
                self._by_id.clear()
                return
            for scope_id in ids:
                key = self._by_id.pop(scope_id, None)
                if key is not None:
                    self._index.pop(key, None)

    def forget_ids(self, record_ids: Iterable[Hashable]) -> None:
        """The backend deleted these ids (in whatever scope)."""
        wanted = set(record_ids)
        with self._lock:
            for scope_id in [s for s in self._by_id if s[1] in wanted]:
                self._index.pop(self._by_id.pop(scope_id), None)

    def _count(self, field: str) -> None:
        with self._lock:
            setattr(self.stats, field, getattr(self.stats, field) + 1)

    # -- the governed backend calls ------------------------------------------------------

    def read(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """A backend read (or a user's delete/reset), governed; raises the typed error."""
        with _own_task():
            return self.governor.call(self.tool, fn, *args, **kwargs)

    async def aread(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        with _own_task():
            return await self.governor.acall(self.tool, fn, *args, **kwargs)

    def write(self, fn: Callable[..., Any], /, *args: Any, records: int = 1, **kwargs: Any) -> bool:
        """A backend write, governed; a failure degrades to an event (returns False)."""
        try:
            with _own_task():
                self.governor.call(self.tool, fn, *args, **kwargs)
        except AgentToolError as exc:
            self._save_failed(exc, records)
            return False
        self._written(records)
        return True

    async def awrite(self, fn: Callable[..., Awaitable[Any]], /, *args: Any, records: int = 1, **kwargs: Any) -> bool:
        try:
            with _own_task():
                await self.governor.acall(self.tool, fn, *args, **kwargs)
        except AgentToolError as exc:
            self._save_failed(exc, records)
            return False
        self._written(records)
        return True

    def _written(self, records: int) -> None:
        with self._lock:
            self.stats.written += records

    def _save_failed(self, exc: AgentToolError, records: int) -> None:
        self._count("save_failures")
        self.forget()  # what the index says was stored may not have been
        info = exc.info
        self.governor.emit(
            "memory_save_failed",
            tool=self.tool,
            records=records,
            error_type=info.error_type.value,
            signature=info.signature,
            attempts=info.attempts,
        )


def _repeat_digest(value: Any) -> str:
    """The record's identity for the repeat filter: its strings normalized as error
    signatures are (keys and structure kept: ``{"theme": "dark"}`` is not ``{"lang": "en"}``)."""
    if isinstance(value, str):
        return digest(normalize_message(value, limit=None), 16)
    normalized = map_strings(value, lambda s: normalize_message(s, limit=None))
    return digest(json.dumps(normalized, sort_keys=True, default=str, ensure_ascii=False), 16)


def _scope_text(scope: Hashable) -> str:
    return "/".join(scope) if isinstance(scope, tuple) else str(scope)


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


__all__ = ["MemoryGuard", "MemoryStats", "Write", "failure_reason"]


class Guarded:
    """What a framework's governed memory backend exposes of its [`MemoryGuard`][loop_governor.memory.MemoryGuard]
    (``crewai_governor.GovernedStorage``, ``langchain_governor.GovernedStore``)."""

    guard: MemoryGuard

    @property
    def governor(self) -> Governor:
        return self.guard.governor

    @property
    def stats(self) -> dict[str, int]:
        """Records written, dropped as failures, merged as repeats, redacted, trimmed; failed saves."""
        return self.guard.stats.as_dict()
